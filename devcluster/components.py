"""Command lines of the control-plane components, and the kube-scheduler's configuration
with tensile-scheduler as its extender (pure: paths and ports in, argv and YAML out).

Flags follow the components' own documentation (kube-apiserver, kube-controller-manager,
kube-scheduler and etcd reference pages) with the choices a two-cluster test bed needs:
apiservers on loopback, no leader election, no fsync, the Node and RBAC authorizers, the
aggregation layer configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from devcluster.pki import KeyPair
from devcluster.ports import LOOPBACK

FRONT_PROXY_CLIENT = "front-proxy-client"
"""Common name of the aggregation layer's client certificate."""
EXTENDER_WEIGHT = 2
"""The extender's prioritize weight (its 0..10 scores count as 0..100 times this, beside
each plugin's 0..100 times its weight)."""
EXTENDER_TIMEOUT = "2s"
"""How long kube-scheduler waits for an extender call before going on without it."""


@dataclass(frozen=True, kw_only=True)
class ApiserverFiles:
    """The files one kube-apiserver is started with."""

    ca: KeyPair
    serving: KeyPair
    service_account: KeyPair
    kubelet_client: KeyPair
    kubelet_ca: Path
    """CA that signs the kubelets' serving certificates (kwok's and virtual nodes')."""
    etcd_ca: Path
    etcd_client: KeyPair
    front_proxy_ca: Path
    """CA of the aggregation layer's client certificate (--requestheader-client-ca-file)."""
    front_proxy_client: KeyPair
    """The certificate the apiserver calls aggregated APIs with (CN front-proxy-client)."""


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
    admission_plugins: tuple[str, ...] = (),
) -> list[str]:
    """Return the argv of a kube-apiserver bound to loopback `port`, storing under
    `etcd_prefix`, with NodeRestriction and `admission_plugins` enabled beyond the default
    ones."""
    # NodeRestriction, as kubeadm enables it: a node's credentials (system:node:<name>) may
    # then only ask for tokens bound to pods bound to that node (docs/serviceaccount.md).
    enabled = ",".join(dict.fromkeys(("NodeRestriction", *admission_plugins)))
    return [
        str(binary),
        f"--enable-admission-plugins={enabled}",
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
        f"--kubelet-certificate-authority={files.kubelet_ca}",
        # The aggregation layer (kube-apiserver's "Configure the Aggregation Layer" page):
        # requests to aggregated APIs (metrics.k8s.io) carry the user in headers, vouched
        # for by the front-proxy client certificate; endpoints are called directly, as no
        # kube-proxy routes Service IPs here.
        f"--requestheader-client-ca-file={files.front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={files.front_proxy_client.cert}",
        f"--proxy-client-key-file={files.front_proxy_client.key}",
        "--enable-aggregator-routing=true",
        "--allow-privileged=true",
        "--profiling=false",
        "--max-requests-inflight=800",
        "--max-mutating-requests-inflight=400",
        "--v=1",
    ]


def controller_manager_argv(
    *,
    binary: Path,
    kubeconfig: Path,
    port: int,
    ca: KeyPair,
    service_account_key: Path,
    cluster_cidr: str,
    node_monitor_grace_period: str = "50s",
    controllers: tuple[str, ...] = (),
) -> list[str]:
    """Return the argv of a kube-controller-manager for one cluster (CSR signing with `ca`);
    `node_monitor_grace_period` (a Go duration) is how long a Node may go without a
    heartbeat before the node lifecycle controller marks it NotReady; `controllers` are
    the only controllers run (--controllers; empty: every on-by-default one)."""
    only = [f"--controllers={','.join(controllers)}"] if controllers else []
    return [
        *_controller_flags(binary=binary, kubeconfig=kubeconfig, port=port),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={ca.cert}",
        f"--cluster-signing-cert-file={ca.cert}",
        f"--cluster-signing-key-file={ca.key}",
        f"--cluster-cidr={cluster_cidr}",
        f"--node-monitor-grace-period={node_monitor_grace_period}",
        *only,
    ]


def scheduler_argv(
    *, binary: Path, kubeconfig: Path, port: int, config: Path | None = None
) -> list[str]:
    """Return the argv of a kube-scheduler for one cluster; `config`: a
    KubeSchedulerConfiguration file, which then also carries the client connection and
    leader election (kube-scheduler ignores those deprecated flags beside --config)."""
    argv = _controller_flags(binary=binary, kubeconfig=kubeconfig, port=port)
    return [*argv, f"--config={config}"] if config is not None else argv


def scheduler_configuration(*, kubeconfig: Path, url: str, ca: Path, client: KeyPair) -> str:
    """Return a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1, YAML) whose one
    extender is `tensile-scheduler` at `url` (HTTPS, its certificate signed by `ca`, and
    kube-scheduler presenting the `client` certificate: `tlsConfig.certFile`/`keyFile`, which
    the extender verifies against its --client-ca-file): filter and prioritize, node names
    only, ignorable."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": EXTENDER_WEIGHT,
                "enableHTTPS": True,
                "tlsConfig": {
                    "caFile": str(ca),
                    "certFile": str(client.cert),
                    "keyFile": str(client.key),
                },
                "nodeCacheCapable": True,
                "ignorable": True,
                "httpTimeout": EXTENDER_TIMEOUT,
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


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


def metrics_server_argv(
    *,
    binary: Path,
    kubeconfig: Path,
    address: str,
    port: int,
    serving: KeyPair,
    kubelet_ca: Path,
) -> list[str]:
    """Return the argv of a metrics-server for one upper cluster, serving on `address:port`.

    It authenticates to the apiserver and to kubelets with the ServiceAccount token in
    `kubeconfig`, verifies kubelet certificates against `kubelet_ca`, reaches each Node at
    its InternalIP, and scrapes every 10 s (its minimum resolution) with a 5 s timeout.
    """
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={address}",
        f"--secure-port={port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--kubelet-certificate-authority={kubelet_ca}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        "--metric-resolution=10s",
        "--kubelet-request-timeout=5s",  # below the resolution, as metrics-server requires
        "--v=1",
    ]
