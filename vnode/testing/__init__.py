"""Test doubles for code built on the virtual node, for unit and component tests.

- `vnode.testing.fakeapi`: `FakeApi`, an in-memory stand-in for `tensile.kube.client.ApiClient`
  (objects per resource, the apiserver's errors for the same cases, injected faults).
- `vnode.testing.fakeprovider`: `FakeProvider`, a scripted provider for the kubelet API's
  roles (logs, exec/attach, port-forward, metrics), typed to `vnode.provider`'s Protocols.

Nothing here imports pytest or the node's runtime (controllers, kubelet API, providers).
Real control planes (the binaries, their command lines and processes, ports, PKI and
kubeconfigs) are the local fleet's, `devcluster` (`tensile-devcluster`).
"""
