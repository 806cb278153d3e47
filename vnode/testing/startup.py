"""The start-up sequence of the local pair: PKI, etcd, apiservers, controllers, kwok, nodes.

Order matters: etcd before the apiservers, both apiservers ready before their controller
managers and schedulers, kwok and its Nodes last. A component that dies is reported with
the tail of its log; one that lost its port to a race is restarted on another.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import shutil
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from vnode.testing import binaries, components, kwok, ports, processes
from vnode.testing.cluster import (
    ATTACH_LOG,
    FORWARD_TARGET_TEXT,
    LOG_LINES,
    PREVIOUS_LOG_LINES,
    PROCESSES_FILE,
    Cluster,
    PairSettings,
    VirtualNodeMaterial,
    wait_nodes_ready,
)
from vnode.testing.kubeconfig import write_kubeconfig
from vnode.testing.pki import CertificateAuthority, KeyPair, write_signing_key
from vnode.testing.rest import ApiStatusError, RestClient

_SERVICE_CIDRS = {"upper": "10.96.0.0/16", "lower": "10.97.0.0/16"}
_SERVICE_IPS = {"upper": "10.96.0.1", "lower": "10.97.0.1"}
_CLUSTER_CIDRS = {"upper": "10.200.0.0/16", "lower": kwok.POD_CIDR}


@dataclass(frozen=True, kw_only=True)
class Started:
    """What a successful start-up produced."""

    upper: Cluster
    lower: Cluster
    vnode: VirtualNodeMaterial
    processes: Mapping[str, processes.Process]
    ports: Mapping[str, int]
    exec_dir: Path
    logs_file: Path
    forward_port: int


class Startup:
    """The start-up sequence of a pair; holds what it started so a failure can undo it."""

    def __init__(self, *, directory: Path, settings: PairSettings, paths: Mapping[str, Path]):
        self.directory = directory.resolve()
        self.settings = settings
        self.paths = paths
        self.procs: dict[str, processes.Process] = {}
        """The current process of each component."""
        self.every_process: list[processes.Process] = []
        """Every process started, replaced ones included, so a failure can stop them all."""
        self.taken: set[int] = set()
        self.deadline = time.monotonic() + settings.startup_timeout
        self.pki = self.directory / "pki"
        self.logs = self.directory / "logs"
        self.data = self.directory / "data"

    def stop_all(self) -> None:
        for proc in reversed(self.every_process):
            proc.stop()

    def run(self) -> Started:
        for d in (self.pki, self.logs, self.data):
            # Whatever an earlier, failed start left here (old etcd data above all) goes.
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        material = self._make_pki()
        etcd_port = self._start_etcd(material)
        api_ports = self._start_apiservers(etcd_port=etcd_port, material=material)
        clusters = {
            name: self._write_kubeconfigs(name=name, port=api_ports[name], material=material)
            for name in ("upper", "lower")
        }
        forward_port = self._start_forward_target()
        control_ports = self._start_controllers(material=material)
        exec_dir, logs_file, kwok_port = self._start_kwok(forward_port=forward_port)
        lower = clusters["lower"].rest()
        nodes = [
            kwok.FakeNode(
                name=f"lower-node-{i}",
                cpu=self.settings.node_cpu,
                memory=self.settings.node_memory,
                pods=self.settings.node_pods,
                labels={kwok.NODE_INDEX_LABEL: str(i), **self.settings.node_labels.get(i, {})},
            )
            for i in range(self.settings.lower_nodes)
        ]
        for node in nodes:
            lower.request("POST", "/api/v1/nodes", body=kwok.node_manifest(node))
        wait_nodes_ready(
            lower, names=[n.name for n in nodes], timeout=self._left(), check=self._check
        )
        for cluster in clusters.values():
            self._wait_default_service_account(cluster.rest())
        return Started(
            upper=clusters["upper"],
            lower=clusters["lower"],
            vnode=VirtualNodeMaterial(
                upper_kubeconfig=clusters["upper"].kubeconfig,
                lower_kubeconfig=clusters["lower"].kubeconfig,
                client_ca=material["upper-ca"].cert,
                serving=material["vnode-serving"],
            ),
            processes=dict(self.procs),
            ports={
                "etcd": etcd_port,
                "upper-apiserver": api_ports["upper"],
                "lower-apiserver": api_ports["lower"],
                "kwok": kwok_port,
                "forward-target": forward_port,
                **control_ports,
            },
            exec_dir=exec_dir,
            logs_file=logs_file,
            forward_port=forward_port,
        )

    # -- steps ----------------------------------------------------------------------------

    def _make_pki(self) -> dict[str, KeyPair]:
        out: dict[str, KeyPair] = {}
        etcd_ca = CertificateAuthority.create(directory=self.pki, name="etcd-ca")
        out["etcd-ca"] = etcd_ca.pair
        out["etcd-serving"] = etcd_ca.issue(
            directory=self.pki,
            name="etcd-serving",
            common_name="etcd",
            dns_names=("localhost",),
            ip_addresses=(ports.LOOPBACK,),
            server=True,
            client=True,  # also its peer certificate
        )
        out["etcd-client"] = etcd_ca.issue(
            directory=self.pki, name="etcd-client", common_name="kube-apiserver", client=True
        )
        for name in ("upper", "lower"):
            ca = CertificateAuthority.create(directory=self.pki, name=f"{name}-ca")
            out[f"{name}-ca"] = ca.pair
            out[f"{name}-serving"] = ca.issue(
                directory=self.pki,
                name=f"{name}-apiserver",
                common_name="kube-apiserver",
                dns_names=(
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ),
                ip_addresses=(ports.LOOPBACK, _SERVICE_IPS[name]),
                server=True,
            )
            users = {
                "admin": ("kubernetes-admin", ("system:masters",)),
                "controller-manager": ("system:kube-controller-manager", ()),
                "scheduler": ("system:kube-scheduler", ()),
                "kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
                "kwok": ("kwok", ("system:masters",)),
            }
            for user, (cn, groups) in users.items():
                out[f"{name}-{user}"] = ca.issue(
                    directory=self.pki,
                    name=f"{name}-{user}",
                    common_name=cn,
                    organizations=groups,
                    client=True,
                )
            out[f"{name}-sa"] = write_signing_key(directory=self.pki, name=f"{name}-sa")
            if name == "upper":
                out["vnode-serving"] = ca.issue(
                    directory=self.pki,
                    name="vnode-serving",
                    common_name="system:node:tensile-virtual-node",
                    organizations=("system:nodes",),
                    dns_names=("localhost",),
                    ip_addresses=(ports.LOOPBACK,),
                    server=True,
                )
        return out

    def _start_etcd(self, material: Mapping[str, KeyPair]) -> int:
        def spawn(port: int) -> processes.Process:
            peer = ports.pick(taken=self.taken)
            return self._spawn(
                "etcd",
                components.etcd_argv(
                    binary=self.paths["etcd"],
                    data_dir=self.data / "etcd",
                    client_port=port,
                    peer_port=peer,
                    ca=material["etcd-ca"].cert,
                    serving=material["etcd-serving"],
                ),
            )

        context = ssl.create_default_context(cafile=str(material["etcd-ca"].cert))
        client = material["etcd-client"]
        context.load_cert_chain(str(client.cert), str(client.key))

        def ready(port: int) -> bool:
            try:
                with urllib.request.urlopen(
                    f"https://{ports.LOOPBACK}:{port}/health", timeout=1, context=context
                ) as r:
                    return bool(json.loads(r.read()).get("health") == "true")
            except OSError:
                return False

        return self._start_with_port_retry(
            "etcd", preferred=self.settings.etcd_port, spawn=spawn, ready=ready
        )

    def _start_apiservers(
        self, *, etcd_port: int, material: Mapping[str, KeyPair]
    ) -> dict[str, int]:
        preferred = {"upper": self.settings.upper_port, "lower": self.settings.lower_port}
        result: dict[str, int] = {}
        # Both apiservers start at once: each takes several seconds to become ready.
        pending: dict[str, int] = {}
        for name in ("upper", "lower"):
            port = ports.pick(preferred[name], taken=self.taken)
            self._spawn(f"{name}-apiserver", self._apiserver_argv(name, port, etcd_port, material))
            pending[name] = port
        for name, port in pending.items():

            def spawn(p: int, name: str = name) -> processes.Process:
                return self._spawn(
                    f"{name}-apiserver", self._apiserver_argv(name, p, etcd_port, material)
                )

            def ready(p: int, name: str = name) -> bool:
                return self._apiserver_ready(name, p, material)

            result[name] = self._wait_or_respawn(
                f"{name}-apiserver", port=port, spawn=spawn, ready=ready
            )
        return result

    def _apiserver_argv(
        self, name: str, port: int, etcd_port: int, material: Mapping[str, KeyPair]
    ) -> list[str]:
        files = components.ApiserverFiles(
            ca=material[f"{name}-ca"],
            serving=material[f"{name}-serving"],
            service_account=material[f"{name}-sa"],
            kubelet_client=material[f"{name}-kubelet-client"],
            # The upper cluster verifies its kubelets (the virtual node) like a hardened
            # cluster does; kwok's kubelet endpoint has only a self-signed certificate.
            kubelet_ca=material["upper-ca"].cert if name == "upper" else None,
            etcd_ca=material["etcd-ca"].cert,
            etcd_client=material["etcd-client"],
        )
        return components.apiserver_argv(
            binary=self.paths["kube-apiserver"],
            port=port,
            etcd_port=etcd_port,
            etcd_prefix=f"/{name}",
            service_cidr=_SERVICE_CIDRS[name],
            files=files,
            compaction_interval=self.settings.compaction_interval,
        )

    def _apiserver_ready(self, name: str, port: int, material: Mapping[str, KeyPair]) -> bool:
        client = RestClient(
            server=f"https://{ports.LOOPBACK}:{port}",
            ca=material[f"{name}-ca"].cert,
            cert=material[f"{name}-admin"].cert,
            key=material[f"{name}-admin"].key,
        )
        try:
            status, _ = client.get_text("/readyz")
        except OSError:
            return False
        return status == 200

    def _write_kubeconfigs(
        self, *, name: str, port: int, material: Mapping[str, KeyPair]
    ) -> Cluster:
        server = f"https://{ports.LOOPBACK}:{port}"
        ca = material[f"{name}-ca"].cert
        for user in ("controller-manager", "scheduler", "kwok"):
            write_kubeconfig(
                path=self.pki / f"{name}-{user}.kubeconfig",
                cluster=name,
                server=server,
                ca=ca,
                user=user,
                credentials=material[f"{name}-{user}"],
            )
        kubeconfig = write_kubeconfig(
            path=self.directory / f"{name}.kubeconfig",
            cluster=name,
            server=server,
            ca=ca,
            user=f"{name}-admin",
            credentials=material[f"{name}-admin"],
        )
        return Cluster(
            name=name, server=server, kubeconfig=kubeconfig, ca=ca, admin=material[f"{name}-admin"]
        )

    def _start_controllers(self, *, material: Mapping[str, KeyPair]) -> dict[str, int]:
        started: dict[str, int] = {}
        for name in ("upper", "lower"):
            kcm_port = ports.pick(taken=self.taken)
            self._spawn(
                f"{name}-controller-manager",
                components.controller_manager_argv(
                    binary=self.paths["kube-controller-manager"],
                    kubeconfig=self.pki / f"{name}-controller-manager.kubeconfig",
                    port=kcm_port,
                    ca=material[f"{name}-ca"],
                    service_account_key=material[f"{name}-sa"].key,
                    cluster_cidr=_CLUSTER_CIDRS[name],
                ),
            )
            started[f"{name}-controller-manager"] = kcm_port
            sched_port = ports.pick(taken=self.taken)
            self._spawn(
                f"{name}-scheduler",
                components.scheduler_argv(
                    binary=self.paths["kube-scheduler"],
                    kubeconfig=self.pki / f"{name}-scheduler.kubeconfig",
                    port=sched_port,
                ),
            )
            started[f"{name}-scheduler"] = sched_port
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs of kcm / scheduler
        for component, port in started.items():

            def healthy(port: int = port) -> bool:
                try:
                    with urllib.request.urlopen(
                        f"https://{ports.LOOPBACK}:{port}/healthz", timeout=1, context=insecure
                    ) as r:
                        return bool(r.status == 200)
                except OSError:
                    return False

            self._poll(component, healthy)
        return started

    def _start_forward_target(self) -> int:
        www = self.data / "www"
        www.mkdir(parents=True, exist_ok=True)
        (www / "index.html").write_text(FORWARD_TARGET_TEXT)

        def spawn(port: int) -> processes.Process:
            return self._spawn(
                "forward-target",
                [
                    sys.executable,
                    "-m",
                    "http.server",
                    str(port),
                    "--bind",
                    ports.LOOPBACK,
                    "--directory",
                    str(www),
                ],
            )

        return self._start_with_port_retry(
            "forward-target", preferred=0, spawn=spawn, ready=ports.is_listening
        )

    def _start_kwok(self, *, forward_port: int) -> tuple[Path, Path, int]:
        stages = self.paths["kwok"].parent / "kwok-stages"
        stage_files = sorted(stages.glob("*.yaml"))
        if not stage_files:
            raise binaries.MissingBinaries(
                f"kwok's stage definitions are missing from {stages}; "
                "rebuild with `make controlplane` (hack/build-control-plane.sh)"
            )
        exec_dir = self.data / "exec"
        exec_dir.mkdir(parents=True, exist_ok=True)
        logs_file = self.data / "container.log"
        previous = self.data / "container-previous.log"
        start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
        logs_file.write_text(kwok.cri_log_lines(LOG_LINES, start=start))
        previous.write_text(kwok.cri_log_lines(PREVIOUS_LOG_LINES, start=start))
        attach_file = logs_file.with_name(ATTACH_LOG)
        attach_file.touch()
        kwok_dir = self.data / "kwok"
        kwok_dir.mkdir(parents=True, exist_ok=True)
        config = kwok_dir / "simulation.yaml"
        config.write_text(
            yaml.safe_dump_all(
                kwok.simulation_documents(
                    logs_file=logs_file,
                    previous_logs_file=previous,
                    attach_file=attach_file,
                    exec_dir=exec_dir,
                    forward_port=forward_port,
                )
            )
        )

        def spawn(port: int) -> processes.Process:
            return self._spawn(
                "kwok",
                kwok.kwok_argv(
                    binary=self.paths["kwok"],
                    kubeconfig=self.pki / "lower-kwok.kubeconfig",
                    configs=[*stage_files, config],
                    port=port,
                ),
                # kwok always reads $KWOK_WORKDIR/kwok.yaml: keep it inside our state.
                env_extra={"KWOK_WORKDIR": str(kwok_dir), "HOME": str(kwok_dir)},
            )

        port = self._start_with_port_retry(
            "kwok", preferred=0, spawn=spawn, ready=ports.is_listening
        )
        return exec_dir, logs_file, port

    def _wait_default_service_account(self, client: RestClient) -> None:
        def exists() -> bool:
            try:
                client.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            except ApiStatusError:
                return False
            return True

        self._poll("the default ServiceAccount", exists)

    # -- mechanics ------------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], *, env_extra: Mapping[str, str] | None = None
    ) -> processes.Process:
        env = {**os.environ, **env_extra} if env_extra else None
        previous = self.procs.get(name)
        if previous is not None:
            previous.stop()
        proc = processes.Process(
            name=name,
            argv=argv,
            log=self.logs / f"{name}.log",
            env=env,
            cwd=self.data,
            die_with_parent=self.settings.die_with_parent,
        )
        self.procs[name] = proc
        self.every_process.append(proc)
        record = {n: {"pid": p.ref.pid, "start": p.ref.start} for n, p in self.procs.items()}
        (self.directory / PROCESSES_FILE).write_text(json.dumps(record))
        return proc

    def _start_with_port_retry(
        self,
        name: str,
        *,
        preferred: int,
        spawn: Callable[[int], processes.Process],
        ready: Callable[[int], bool],
    ) -> int:
        port = ports.pick(preferred, taken=self.taken)
        spawn(port)
        return self._wait_or_respawn(name, port=port, spawn=spawn, ready=ready)

    def _wait_or_respawn(
        self,
        name: str,
        *,
        port: int,
        spawn: Callable[[int], processes.Process],
        ready: Callable[[int], bool],
    ) -> int:
        """Wait for `name` to be ready on `port`; if it lost the port to a race, use another."""
        for _attempt in range(3):
            current = port
            try:
                self._poll(name, functools.partial(ready, current))
            except processes.ComponentDied as exc:
                # Only this component's own lost port race is retried; its log holds only
                # the current attempt.
                lost_port = "address already in use" in processes.tail(exc.log, lines=200)
                if exc.name != name or not lost_port:
                    raise
                port = ports.pick(taken=self.taken)
                spawn(port)
                continue
            return port
        raise processes.ComponentDied(name=name, returncode=None, log=self.logs / f"{name}.log")

    def _poll(self, what: str, condition: Callable[[], bool]) -> None:
        while not condition():
            self._check()
            if time.monotonic() > self.deadline:
                raise TimeoutError(
                    f"{what} not ready after {self.settings.startup_timeout:.0f}s; "
                    f"component logs are in {self.logs}"
                )
            time.sleep(0.1)

    def _check(self) -> None:
        for proc in self.procs.values():
            proc.check()

    def _left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())
