"""Command lines of the control-plane components (pure: paths and ports in, argv out).

Flags follow the components' own documentation (kube-apiserver, kube-controller-manager,
kube-scheduler and etcd reference pages) with the choices a two-cluster test bed needs:
loopback only, no leader election, no fsync, the Node and RBAC authorizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vnode.testing.pki import KeyPair
from vnode.testing.ports import LOOPBACK


@dataclass(frozen=True, kw_only=True)
class ApiserverFiles:
    """The files one kube-apiserver is started with."""

    ca: KeyPair
    serving: KeyPair
    service_account: KeyPair
    kubelet_client: KeyPair
    kubelet_ca: Path | None
    """CA that signs the kubelets' serving certificates, or None to not verify them."""
    etcd_ca: Path
    etcd_client: KeyPair


def etcd_argv(
    *, binary: Path, data_dir: Path, client_port: int, peer_port: int, ca: Path, serving: KeyPair
) -> list[str]:
    """Return the argv of a single-member etcd on loopback, tuned for throw-away data.

    Clients and peers must present a certificate signed by `ca`: loopback alone does not
    keep other local users from both clusters' data.
    """
    client = f"https://{LOOPBACK}:{client_port}"
    peer = f"https://{LOOPBACK}:{peer_port}"
    return [
        str(binary),
        "--name=tensile",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=tensile={peer}",
        "--initial-cluster-state=new",
        f"--cert-file={serving.cert}",
        f"--key-file={serving.key}",
        "--client-cert-auth=true",
        f"--trusted-ca-file={ca}",
        f"--peer-cert-file={serving.cert}",
        f"--peer-key-file={serving.key}",
        "--peer-client-cert-auth=true",
        f"--peer-trusted-ca-file={ca}",
        # Test data is disposable; fsync dominates apiserver write latency on small disks.
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_argv(
    *,
    binary: Path,
    port: int,
    etcd_port: int,
    etcd_prefix: str,
    service_cidr: str,
    files: ApiserverFiles,
    compaction_interval: str,
) -> list[str]:
    """Return the argv of a kube-apiserver bound to loopback `port`, storing under `etcd_prefix`."""
    argv = [
        str(binary),
        f"--etcd-servers=https://{LOOPBACK}:{etcd_port}",
        f"--etcd-cafile={files.etcd_ca}",
        f"--etcd-certfile={files.etcd_client.cert}",
        f"--etcd-keyfile={files.etcd_client.key}",
        f"--etcd-prefix={etcd_prefix}",
        f"--etcd-compaction-interval={compaction_interval}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--tls-cert-file={files.serving.cert}",
        f"--tls-private-key-file={files.serving.key}",
        f"--client-ca-file={files.ca.cert}",
        f"--service-account-key-file={files.service_account.cert}",
        f"--service-account-signing-key-file={files.service_account.key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--api-audiences=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        f"--service-cluster-ip-range={service_cidr}",
        # Endpoints of the `kubernetes` Service may not name a loopback address; nothing
        # in these clusters routes to it, so the reconciler is off.
        "--endpoint-reconciler-type=none",
        f"--kubelet-client-certificate={files.kubelet_client.cert}",
        f"--kubelet-client-key={files.kubelet_client.key}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--profiling=false",
        "--max-requests-inflight=800",
        "--max-mutating-requests-inflight=400",
        "--v=1",
    ]
    if files.kubelet_ca is not None:
        argv.append(f"--kubelet-certificate-authority={files.kubelet_ca}")
    return argv


def controller_manager_argv(
    *,
    binary: Path,
    kubeconfig: Path,
    port: int,
    ca: KeyPair,
    service_account_key: Path,
    cluster_cidr: str,
) -> list[str]:
    """Return the argv of a kube-controller-manager for one cluster (CSR signing with `ca`)."""
    return [
        *_controller_flags(binary=binary, kubeconfig=kubeconfig, port=port),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={ca.cert}",
        f"--cluster-signing-cert-file={ca.cert}",
        f"--cluster-signing-key-file={ca.key}",
        f"--cluster-cidr={cluster_cidr}",
    ]


def scheduler_argv(*, binary: Path, kubeconfig: Path, port: int) -> list[str]:
    """Return the argv of a kube-scheduler for one cluster."""
    return _controller_flags(binary=binary, kubeconfig=kubeconfig, port=port)


def _controller_flags(*, binary: Path, kubeconfig: Path, port: int) -> list[str]:
    """Flags kube-controller-manager and kube-scheduler share: one identity, loopback serving."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        "--leader-elect=false",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--profiling=false",
        "--v=1",
    ]
