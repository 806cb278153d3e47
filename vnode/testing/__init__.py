"""What a library user tests with: real control planes, and a fake provider.

Sized like controller-runtime's envtest: the pieces to run real etcd and kube-apiserver
processes for a test, and nothing that decides how a fleet of clusters is laid out.

- `vnode.testing.binaries`: where the control-plane binaries come from
  (`$KUBEBUILDER_ASSETS`, the build cache, a build with `go`); `ensure()` returns name ->
  path or raises `MissingBinaries` saying what to install or set.
- `vnode.testing.components`: the command lines of etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler and metrics-server (pure: paths and ports in,
  argv out).
- `vnode.testing.processes`: start, watch and stop those processes (`Process`, each in its
  own process group, logging to a file; `ComponentDied` carries the log's tail).
- `vnode.testing.ports`: free loopback ports to start them on.
- `vnode.testing.pki`: CAs, serving and client certificates, signing keys, as PEM files.
- `vnode.testing.kubeconfig`: a kubeconfig file for a server and a user.
- `vnode.testing.fakeprovider`: `FakeProvider`, a scripted provider for the kubelet API's
  roles (logs, exec/attach, port-forward, metrics), typed to `vnode.provider`'s Protocols.

Nothing here imports pytest or the node's runtime (controllers, kubelet API, providers).
The local fleet of upper and lower clusters built from these pieces (kwok nodes, network
namespace, program runners) is a program of its own, `devcluster` (`tensile-devcluster`),
beside the shipped packages.
"""
