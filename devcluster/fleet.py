"""The running local fleet: start it or attach to it, stop it, add kwok Nodes, describe it
as state.

A fleet is any number of upper and lower clusters on one etcd (`FleetSettings`); the
default is one of each, a pair. `fleet.upper` and `fleet.lower` are the first of each.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import ssl
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devcluster import binaries, kwok, netns, processes
from devcluster.cluster import (
    ATTACH_LOG,
    PROCESSES_FILE,
    STATE_FILE,
    Cluster,
    FleetSettings,
    VirtualNodeMaterial,
    wait_nodes_ready,
)
from devcluster.pki import KeyPair
from devcluster.startup import Startup

logger = logging.getLogger(__name__)

ENV_FILE = "env.sh"
_CREATED = ("pki", "logs", "data", ENV_FILE, PROCESSES_FILE, STATE_FILE)
_CREATED_GLOBS = ("upper*.kubeconfig", "lower*.kubeconfig")
# Clients of the apiservers stop first, then the apiservers, then etcd: no component spends
# its shutdown retrying a peer that is already gone.
_STOP_ORDER = ("-metrics-server", "-kwok", "forward-target", "-scheduler", "-controller-manager",
               "-apiserver", "etcd")  # fmt: skip


class Fleet:
    """Running upper and lower clusters. Build it with `start` (or `attach` to a running one)."""

    def __init__(
        self,
        *,
        directory: Path,
        clusters: Mapping[str, Cluster],
        network: netns.Network,
        vnode_serving: Mapping[str, KeyPair],
        refs: Mapping[str, processes.ProcessRef],
        ports_in_use: Mapping[str, int],
        exec_dir: Path,
        logs_file: Path,
        forward_port: int,
        processes_: Mapping[str, processes.Process] | None = None,
        owns_directory: bool = False,
    ) -> None:
        self.directory = directory
        self.clusters = dict(clusters)
        """Every cluster by name, the upper ones first."""
        self.network = network
        self._vnode_serving = dict(vnode_serving)
        self.refs = dict(refs)
        """Each component's process (it also leads the component's process group)."""
        self.ports = dict(ports_in_use)
        self.exec_dir = exec_dir
        """Working directory of commands run by `kubectl exec` in lower pods."""
        self.logs_file = logs_file
        """The CRI log file every lower container's log is read from (append to it)."""
        self.attach_file = logs_file.with_name(ATTACH_LOG)
        """CRI log lines appended here are the output of every `kubectl attach`."""
        self.forward_port = forward_port
        """Loopback port every lower pod port forwards to (serves FORWARD_TARGET_TEXT)."""
        self._processes = dict(processes_ or {})
        self._stopped: set[str] = set()
        """Components stopped on purpose (`stop_component`), until started again: `check`
        does not report them."""
        self._owns_directory = owns_directory

    # -- the clusters ----------------------------------------------------------------------

    @property
    def uppers(self) -> list[Cluster]:
        """The upper clusters, in order."""
        return [c for c in self.clusters.values() if c.is_upper]

    @property
    def lowers(self) -> list[Cluster]:
        """The lower clusters, in order."""
        return [c for c in self.clusters.values() if not c.is_upper]

    @property
    def upper(self) -> Cluster:
        """The first upper cluster."""
        return self.uppers[0]

    @property
    def lower(self) -> Cluster:
        """The first lower cluster."""
        return self.lowers[0]

    @property
    def node_ip(self) -> str:
        """The address kwok Nodes and local virtual nodes publish (and listen on)."""
        return self.network.node_ip

    def cluster(self, name: str) -> Cluster:
        """Return the cluster `name` ("upper", "lower-2", ...). Raises KeyError."""
        try:
            return self.clusters[name]
        except KeyError:
            raise KeyError(f"no cluster {name!r} (have {', '.join(self.clusters)})") from None

    def material(self, *, upper: str = "upper", lower: str = "lower") -> VirtualNodeMaterial:
        """Return what a virtual node between cluster `upper` and cluster `lower` is started
        with (their kubeconfigs, the upper CA, a serving certificate for the node address)."""
        up, low = self.cluster(upper), self.cluster(lower)
        if not up.is_upper or low.is_upper:
            raise ValueError(f"{upper} must be an upper and {lower} a lower cluster")
        return VirtualNodeMaterial(
            upper_kubeconfig=up.kubeconfig,
            lower_kubeconfig=low.kubeconfig,
            client_ca=up.ca,
            serving=self._vnode_serving[upper],
            node_ip=self.node_ip,
        )

    @property
    def vnode(self) -> VirtualNodeMaterial:
        """The material of a virtual node between the first upper and first lower cluster."""
        return self.material()

    # -- life cycle ----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        *,
        directory: Path,
        settings: FleetSettings | None = None,
        binary_paths: Mapping[str, Path] | None = None,
        owns_directory: bool = False,
    ) -> Fleet:
        """Start the fleet with its state in `directory` and return once it is ready.

        Ready means every apiserver answers /readyz, the controller managers have made the
        `default` ServiceAccounts, every kwok Node is Ready and (in a private network) each
        upper cluster serves metrics.k8s.io. The network is chosen by `settings.network`
        (see `resolve_network`). Raises MissingBinaries, NetworkError, ComponentDied (with
        the tail of the component's log), TimeoutError, or the apiserver's ApiStatusError;
        whatever was started is stopped again and the state it wrote is removed before the
        error propagates.
        """
        settings = settings or FleetSettings()
        paths = (
            dict(binary_paths)
            if binary_paths is not None
            # From inside a private network, a build still needs the Go module proxy.
            else binaries.ensure(preexec_fn=netns.in_host_network())
        )
        network = resolve_network(settings.network)
        startup = Startup(directory=directory, settings=settings, paths=paths, network=network)
        try:
            started = startup.run()
        except BaseException:
            startup.stop_all()
            remove_created(startup.directory, owns_directory=owns_directory)
            raise
        fleet = cls(
            directory=startup.directory,
            clusters=started.clusters,
            network=started.network,
            vnode_serving=started.vnode_serving,
            refs={name: p.ref for name, p in started.processes.items()},
            ports_in_use=started.ports,
            exec_dir=started.exec_dir,
            logs_file=started.logs_file,
            forward_port=started.forward_port,
            processes_=started.processes,
            owns_directory=owns_directory,
        )
        (fleet.directory / STATE_FILE).write_text(json.dumps(fleet.state(), indent=2))
        return fleet

    @classmethod
    def attach(cls, directory: Path) -> Fleet:
        """Describe the fleet whose state `tensile-devcluster up` wrote into `directory`.

        Raises FileNotFoundError if there is no state file there. To talk to a fleet in a
        private network, `join_network()` first.
        """
        state = json.loads((directory / STATE_FILE).read_text())
        return cls(
            directory=directory,
            clusters={name: _cluster_from_state(c) for name, c in state["clusters"].items()},
            network=netns.Network(**state["network"]),
            vnode_serving={
                name: KeyPair(cert=Path(pair["cert"]), key=Path(pair["key"]))
                for name, pair in state["vnode_serving"].items()
            },
            refs={
                name: processes.ProcessRef(pid=int(ref["pid"]), start=int(ref["start"]))
                for name, ref in state["processes"].items()
            },
            ports_in_use=state["ports"],
            exec_dir=Path(state["exec_dir"]),
            logs_file=Path(state["logs_file"]),
            forward_port=int(state["forward_port"]),
        )

    def network_holder(self) -> int | None:
        """Return the pid of a running component (they all share the fleet's network), or
        None if none runs."""
        for ref in self.refs.values():
            if processes.recorded_alive(ref):
                return ref.pid
        return None

    def join_network(self) -> None:
        """Move this process into the fleet's network (nothing to do for a host network).

        Raises NetworkError if no component runs or the namespace cannot be joined.
        """
        if not self.network.private:
            return
        holder = self.network_holder()
        if holder is None:
            raise netns.NetworkError(f"no component of the fleet in {self.directory} runs")
        netns.join(holder, network=self.network)

    def stop(self, *, remove_state: bool = True) -> None:
        """Stop every component (SIGTERM, then SIGKILL) and remove the state it wrote."""
        for name in sorted(self.refs, key=_stop_rank):
            proc = self._processes.get(name)
            if proc is not None:
                proc.stop()
            else:
                processes.stop_recorded(self.refs[name])
        if remove_state:
            remove_created(self.directory, owns_directory=self._owns_directory)

    def check(self) -> None:
        """Raise ComponentDied if a component this process started has exited, but one
        stopped on purpose (`stop_component`)."""
        for name, proc in self._processes.items():
            if name not in self._stopped:
                proc.check()

    # -- faults, for tests ------------------------------------------------------------------

    def component(self, name: str) -> processes.Process:
        """Return a component this process started. Raises KeyError for an attached fleet."""
        try:
            return self._processes[name]
        except KeyError:
            raise KeyError(f"{name}: not a component this process started") from None

    def stop_component(self, name: str) -> None:
        """Stop one component (e.g. "lower-apiserver") as a crash or an outage would;
        `check` leaves it out until `start_component`."""
        self.component(name).stop()
        self._stopped.add(name)

    def start_component(self, name: str, *, timeout: float = 60.0) -> None:
        """Start a stopped component again on the same port; for an apiserver, wait for /readyz."""
        proc = self.component(name)
        proc.restart()
        self._stopped.discard(name)
        self.refs[name] = proc.ref
        if name.endswith("-apiserver"):
            client = self.cluster(name.removesuffix("-apiserver")).rest()
            deadline = time.monotonic() + timeout
            while True:
                proc.check()
                try:
                    if client.get_text("/readyz")[0] == 200:
                        return
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not ready {timeout:.0f}s after a restart")
                time.sleep(0.2)

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the apiserver does every
        --etcd-compaction-interval); watches from older resourceVersions then get 410 Gone.
        Returns the revision compacted at."""
        pki = self.directory / "pki"
        context = ssl.create_default_context(cafile=str(pki / "etcd-ca.crt"))
        context.load_cert_chain(str(pki / "etcd-client.crt"), str(pki / "etcd-client.key"))
        base = f"https://127.0.0.1:{self.ports['etcd']}"

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(  # noqa: S310 - loopback https URL we built
                base + path,
                data=json.dumps(body).encode(),
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, context=context, timeout=10) as r:  # noqa: S310
                result: dict[str, Any] = json.loads(r.read())
                return result

        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def pids(self) -> set[int]:
        """Return the process ids of the components (each also leads its process group)."""
        return {ref.pid for ref in self.refs.values()}

    def running(self) -> list[str]:
        """Return the names of the components still running (checked by pid and start time)."""
        return [name for name, ref in self.refs.items() if processes.recorded_alive(ref)]

    # -- conveniences for tests and the demo ----------------------------------------------

    def add_lower_node(
        self, node: kwok.FakeNode, *, cluster: str = "lower", timeout: float = 60.0
    ) -> None:
        """Create a kwok Node in lower cluster `cluster` and wait until it is Ready
        (`timeout` s)."""
        client = self.cluster(cluster).rest()
        client.request("POST", "/api/v1/nodes", body=kwok.node_manifest(node))
        wait_nodes_ready(client, names=[node.name], timeout=timeout, check=self.check)

    def state(self) -> dict[str, Any]:
        """Return what `attach` needs to describe this fleet again (JSON-serialisable)."""
        return {
            "processes": {
                name: {"pid": ref.pid, "start": ref.start} for name, ref in self.refs.items()
            },
            "ports": self.ports,
            "exec_dir": str(self.exec_dir),
            "logs_file": str(self.logs_file),
            "forward_port": self.forward_port,
            "network": {"private": self.network.private, "node_ip": self.network.node_ip},
            "clusters": {name: _cluster_state(c) for name, c in self.clusters.items()},
            "vnode_serving": {
                name: {"cert": str(pair.cert), "key": str(pair.key)}
                for name, pair in self._vnode_serving.items()
            },
        }


_warned_host_network = False


def resolve_network(mode: str) -> netns.Network:
    """Return the network a fleet of network mode `mode` runs in, entering a private one
    if needed: "host" -> the host's loopback; "private" -> a private namespace (raises
    NetworkError where impossible); "auto" -> private where possible, else the host's
    loopback, said once per process."""
    global _warned_host_network  # noqa: PLW0603 - say it once per process
    if mode == "host":
        return netns.HOST
    if netns.current().private:
        return netns.current()
    if mode == "private":
        return netns.enter_private()
    reason = netns.unavailable_reason()
    if reason is None:
        try:
            return netns.enter_private()
        except netns.NetworkError as exc:
            reason = str(exc)
    if not _warned_host_network:
        logger.warning(
            "running the fleet on the host's loopback (%s): nodes publish 127.0.0.1, so the "
            "apiservers' node proxy, metrics-server and `kubectl top` do not work",
            reason,
        )
        _warned_host_network = True
    return netns.HOST


def _stop_rank(name: str) -> int:
    for rank, suffix in enumerate(_STOP_ORDER):
        if name.endswith(suffix):
            return rank
    return -1


def stop_leftovers(directory: Path) -> bool:
    """Stop the components a start-up recorded in `directory` before it was killed.

    Returns whether there was such a record; the record and the rest of the state are
    removed. Processes whose pid now belongs to another program are left alone.
    """
    path = directory / PROCESSES_FILE
    try:
        recorded = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False
    for ref in recorded.values():
        processes.stop_recorded(processes.ProcessRef(pid=int(ref["pid"]), start=int(ref["start"])))
    remove_created(directory, owns_directory=False)
    return True


def remove_created(directory: Path, *, owns_directory: bool) -> None:
    """Remove what a fleet wrote into `directory` (all of it if the fleet owns the directory)."""
    if owns_directory:
        shutil.rmtree(directory, ignore_errors=True)
        return
    paths = [directory / name for name in _CREATED]
    for pattern in _CREATED_GLOBS:
        paths += directory.glob(pattern)
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()  # only if nothing else was left there


def _cluster_state(cluster: Cluster) -> dict[str, Any]:
    return {
        "name": cluster.name,
        "server": cluster.server,
        "kubeconfig": str(cluster.kubeconfig),
        "ca": str(cluster.ca),
        "admin_cert": str(cluster.admin.cert),
        "admin_key": str(cluster.admin.key),
        "kubelet_client_cert": str(cluster.kubelet_client.cert),
        "kubelet_client_key": str(cluster.kubelet_client.key),
        "nodes": list(cluster.nodes),
    }


def _cluster_from_state(state: Mapping[str, Any]) -> Cluster:
    return Cluster(
        name=state["name"],
        server=state["server"],
        kubeconfig=Path(state["kubeconfig"]),
        ca=Path(state["ca"]),
        admin=KeyPair(cert=Path(state["admin_cert"]), key=Path(state["admin_key"])),
        kubelet_client=KeyPair(
            cert=Path(state["kubelet_client_cert"]), key=Path(state["kubelet_client_key"])
        ),
        nodes=tuple(state["nodes"]),
    )
