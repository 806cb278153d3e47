"""The running local pair: attach to it, stop it, add kwok Nodes, describe it as state."""

from __future__ import annotations

import contextlib
import json
import shutil
import ssl
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vnode.testing import binaries, kwok, processes
from vnode.testing.cluster import (
    ATTACH_LOG,
    PROCESSES_FILE,
    STATE_FILE,
    Cluster,
    PairSettings,
    VirtualNodeMaterial,
    wait_nodes_ready,
)
from vnode.testing.pki import KeyPair
from vnode.testing.startup import Startup

ENV_FILE = "env.sh"
_CREATED = (
    "pki", "logs", "data", "upper.kubeconfig", "lower.kubeconfig",
    ENV_FILE, PROCESSES_FILE, STATE_FILE,
)  # fmt: skip


class ClusterPair:
    """A running upper + lower pair. Build it with `start` (or `attach` to a running one)."""

    def __init__(
        self,
        *,
        directory: Path,
        upper: Cluster,
        lower: Cluster,
        vnode: VirtualNodeMaterial,
        refs: Mapping[str, processes.ProcessRef],
        ports_in_use: Mapping[str, int],
        exec_dir: Path,
        logs_file: Path,
        forward_port: int,
        processes_: Mapping[str, processes.Process] | None = None,
        owns_directory: bool = False,
    ) -> None:
        self.directory = directory
        self.upper = upper
        self.lower = lower
        self.vnode = vnode
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
        self._owns_directory = owns_directory

    # -- life cycle ----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        *,
        directory: Path,
        settings: PairSettings | None = None,
        binary_paths: Mapping[str, Path] | None = None,
        owns_directory: bool = False,
    ) -> ClusterPair:
        """Start the pair with its state in `directory` and return once it is ready.

        Ready means both apiservers answer /readyz, the controller managers have made the
        `default` ServiceAccount, and every kwok Node is Ready. Raises MissingBinaries,
        ComponentDied (with the tail of the component's log), TimeoutError, or the
        apiserver's ApiStatusError; whatever was started is stopped again and the state it
        wrote is removed before the error propagates.
        """
        settings = settings or PairSettings()
        paths = dict(binary_paths) if binary_paths is not None else binaries.ensure()
        startup = Startup(directory=directory, settings=settings, paths=paths)
        try:
            started = startup.run()
        except BaseException:
            startup.stop_all()
            remove_created(startup.directory, owns_directory=owns_directory)
            raise
        pair = cls(
            directory=startup.directory,
            upper=started.upper,
            lower=started.lower,
            vnode=started.vnode,
            refs={name: p.ref for name, p in started.processes.items()},
            ports_in_use=started.ports,
            exec_dir=started.exec_dir,
            logs_file=started.logs_file,
            forward_port=started.forward_port,
            processes_=started.processes,
            owns_directory=owns_directory,
        )
        (pair.directory / STATE_FILE).write_text(json.dumps(pair.state(), indent=2))
        return pair

    @classmethod
    def attach(cls, directory: Path) -> ClusterPair:
        """Describe the pair whose state `tensile-devcluster up` wrote into `directory`.

        Raises FileNotFoundError if there is no state file there.
        """
        state = json.loads((directory / STATE_FILE).read_text())
        return cls(
            directory=directory,
            upper=_cluster_from_state(state["clusters"]["upper"]),
            lower=_cluster_from_state(state["clusters"]["lower"]),
            vnode=VirtualNodeMaterial(
                upper_kubeconfig=Path(state["vnode"]["upper_kubeconfig"]),
                lower_kubeconfig=Path(state["vnode"]["lower_kubeconfig"]),
                client_ca=Path(state["vnode"]["client_ca"]),
                serving=KeyPair(
                    cert=Path(state["vnode"]["serving_cert"]),
                    key=Path(state["vnode"]["serving_key"]),
                ),
            ),
            refs={
                name: processes.ProcessRef(pid=int(ref["pid"]), start=int(ref["start"]))
                for name, ref in state["processes"].items()
            },
            ports_in_use=state["ports"],
            exec_dir=Path(state["exec_dir"]),
            logs_file=Path(state["logs_file"]),
            forward_port=int(state["forward_port"]),
        )

    def stop(self, *, remove_state: bool = True) -> None:
        """Stop every component (SIGTERM, then SIGKILL) and remove the state it wrote."""
        # Stop clients of the apiservers first, then the apiservers, then etcd: no component
        # spends its shutdown retrying a peer that is already gone.
        order = ["kwok", "forward-target", "upper-scheduler", "lower-scheduler",
                 "upper-controller-manager", "lower-controller-manager",
                 "upper-apiserver", "lower-apiserver", "etcd"]  # fmt: skip
        names = sorted(self.refs, key=lambda n: order.index(n) if n in order else -1)
        for name in names:
            proc = self._processes.get(name)
            if proc is not None:
                proc.stop()
            else:
                processes.stop_recorded(self.refs[name])
        if remove_state:
            remove_created(self.directory, owns_directory=self._owns_directory)

    def check(self) -> None:
        """Raise ComponentDied if a component this process started has exited."""
        for proc in self._processes.values():
            proc.check()

    # -- faults, for tests ------------------------------------------------------------------

    def component(self, name: str) -> processes.Process:
        """Return a component this process started. Raises KeyError for an attached pair."""
        try:
            return self._processes[name]
        except KeyError:
            raise KeyError(f"{name}: not a component this process started") from None

    def stop_component(self, name: str) -> None:
        """Stop one component (e.g. "lower-apiserver") as a crash or an outage would."""
        self.component(name).stop()

    def start_component(self, name: str, *, timeout: float = 60.0) -> None:
        """Start a stopped component again on the same port; for an apiserver, wait for /readyz."""
        proc = self.component(name)
        proc.restart()
        self.refs[name] = proc.ref
        if name.endswith("-apiserver"):
            client = (self.upper if name.startswith("upper") else self.lower).rest()
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

    def add_lower_node(self, node: kwok.FakeNode, *, timeout: float = 60.0) -> None:
        """Create a kwok Node in the lower cluster and wait until it is Ready (`timeout` s)."""
        self.lower.rest().request("POST", "/api/v1/nodes", body=kwok.node_manifest(node))
        wait_nodes_ready(self.lower.rest(), names=[node.name], timeout=timeout, check=self.check)

    def state(self) -> dict[str, Any]:
        """Return what `attach` needs to describe this pair again (JSON-serialisable)."""
        return {
            "processes": {
                name: {"pid": ref.pid, "start": ref.start} for name, ref in self.refs.items()
            },
            "ports": self.ports,
            "exec_dir": str(self.exec_dir),
            "logs_file": str(self.logs_file),
            "forward_port": self.forward_port,
            "clusters": {c.name: _cluster_state(c) for c in (self.upper, self.lower)},
            "vnode": {
                "upper_kubeconfig": str(self.vnode.upper_kubeconfig),
                "lower_kubeconfig": str(self.vnode.lower_kubeconfig),
                "client_ca": str(self.vnode.client_ca),
                "serving_cert": str(self.vnode.serving.cert),
                "serving_key": str(self.vnode.serving.key),
            },
        }


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
    """Remove what a pair wrote into `directory` (all of it if the pair owns the directory)."""
    if owns_directory:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for name in _CREATED:
        path = directory / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()  # only if nothing else was left there


def _cluster_state(cluster: Cluster) -> dict[str, str]:
    return {
        "name": cluster.name,
        "server": cluster.server,
        "kubeconfig": str(cluster.kubeconfig),
        "ca": str(cluster.ca),
        "admin_cert": str(cluster.admin.cert),
        "admin_key": str(cluster.admin.key),
    }


def _cluster_from_state(state: Mapping[str, str]) -> Cluster:
    return Cluster(
        name=state["name"],
        server=state["server"],
        kubeconfig=Path(state["kubeconfig"]),
        ca=Path(state["ca"]),
        admin=KeyPair(cert=Path(state["admin_cert"]), key=Path(state["admin_key"])),
    )
