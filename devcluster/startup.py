"""The start-up sequence of a local fleet: PKI, etcd, apiservers, controllers, kwok, nodes,
metrics-server.

Order matters: etcd before the apiservers, every apiserver ready before its controller
manager and scheduler, kwok and its Nodes after, metrics-server last (it needs the Nodes'
addresses). Clusters of one step start together: each apiserver takes several seconds. A
component that dies is reported with the tail of its log; one that lost its port to a
race is restarted on another.
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
from typing import Any

import yaml

from devcluster import binaries, components, kwok, metricsserver, ports, processes
from devcluster.cluster import (
    ATTACH_LOG,
    FORWARD_TARGET_TEXT,
    LOG_LINES,
    PREVIOUS_LOG_LINES,
    PROCESSES_FILE,
    Cluster,
    FleetSettings,
    host_node_name,
    lower_node_name,
    wait_nodes_ready,
)
from devcluster.kubeconfig import write_kubeconfig
from devcluster.netns import Network
from devcluster.pki import CertificateAuthority, KeyPair, write_signing_key
from devcluster.rest import ApiStatusError, RestClient

_METRICS_TOKEN_SECONDS = 30 * 24 * 3600
HOST_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
"""An upper cluster's host Node is tainted like a kubeadm control-plane Node: only pods
that tolerate it (a deployed virtual node, say) run there."""


@dataclass(frozen=True, kw_only=True)
class Started:
    """What a successful start-up produced."""

    clusters: Mapping[str, Cluster]
    """Every cluster by name: the upper ones first, then the lower ones, each in order."""
    network: Network
    vnode_serving: Mapping[str, KeyPair]
    """Per upper cluster: a kubelet serving certificate for the network's node address."""
    processes: Mapping[str, processes.Process]
    ports: Mapping[str, int]
    exec_dir: Path
    logs_file: Path
    forward_port: int


def _service_cidr(index: int) -> str:
    return f"10.{96 + index}.0.0/16"


def _service_ip(index: int) -> str:
    return f"10.{96 + index}.0.1"


def _pod_cidr(lower_index: int) -> str:
    # The first lower cluster keeps kwok.POD_CIDR; pod IPs never overlap between clusters.
    return f"10.{244 + lower_index}.0.0/16"


class Startup:
    """The start-up sequence of a fleet; holds what it started so a failure can undo it."""

    def __init__(
        self,
        *,
        directory: Path,
        settings: FleetSettings,
        paths: Mapping[str, Path],
        network: Network,
    ) -> None:
        self.directory = directory.resolve()
        self.settings = settings
        self.paths = paths
        self.network = network
        self.uppers = settings.upper_names
        self.lowers = settings.lower_names
        self.names = (*self.uppers, *self.lowers)
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

    def kwok_address(self, name: str) -> str:
        """Where the kwok of cluster `name` serves its Nodes' kubelet API (their InternalIP)."""
        if name in self.uppers:
            return self.network.host_address(self.uppers.index(name))
        return self.network.node_ip

    def run(self) -> Started:
        for d in (self.pki, self.logs, self.data):
            # Whatever an earlier, failed start left here (old etcd data above all) goes.
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        material = self._make_pki()
        etcd_port = self._start_etcd(material)
        api_ports = self._start_apiservers(etcd_port=etcd_port, material=material)
        for name in self.names:
            self._write_kubeconfigs(name=name, port=api_ports[name], material=material)
        forward_port = self._start_forward_target()
        control_ports = self._start_controllers(material=material)
        simulation = self._write_simulation(forward_port=forward_port)
        kwok_ports = {
            name: self._start_kwok(name, material=material, configs=simulation.configs)
            for name in self.names
        }
        admins = {name: self._admin(name, api_ports[name], material) for name in self.names}
        nodes = self._create_nodes(admins)
        for name in self.names:
            wait_nodes_ready(
                admins[name], names=nodes[name], timeout=self._left(), check=self._check
            )
            self._wait_default_service_account(admins[name])
        clusters = {
            name: Cluster(
                name=name,
                server=self._server(api_ports[name]),
                kubeconfig=self.directory / f"{name}.kubeconfig",
                ca=material[f"{name}-ca"].cert,
                admin=material[f"{name}-admin"],
                kubelet_client=material[f"{name}-kubelet-client"],
                nodes=tuple(nodes[name]),
            )
            for name in self.names
        }
        metrics_ports: dict[str, int] = {}
        if self.network.private and self.settings.metrics_server:
            for name in self.uppers:
                metrics_ports[f"{name}-metrics-server"] = self._start_metrics_server(
                    clusters[name], material=material
                )
            for name in self.uppers:
                self._wait_metrics_api(clusters[name])
        return Started(
            clusters=clusters,
            network=self.network,
            vnode_serving={name: material[f"{name}-vnode-serving"] for name in self.uppers},
            processes=dict(self.procs),
            ports={
                "etcd": etcd_port,
                **{f"{name}-apiserver": port for name, port in api_ports.items()},
                **{f"{name}-kwok": port for name, port in kwok_ports.items()},
                "forward-target": forward_port,
                **control_ports,
                **metrics_ports,
            },
            exec_dir=simulation.exec_dir,
            logs_file=simulation.logs_file,
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
        for index, name in enumerate(self.names):
            self._cluster_pki(name, index, out)
        return out

    def _cluster_pki(self, name: str, index: int, out: dict[str, KeyPair]) -> None:
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
            ip_addresses=(ports.LOOPBACK, _service_ip(index)),
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
        # The aggregation layer trusts a CA of its own, as kubeadm's front-proxy CA.
        front_proxy = CertificateAuthority.create(directory=self.pki, name=f"{name}-front-proxy-ca")
        out[f"{name}-front-proxy-ca"] = front_proxy.pair
        out[f"{name}-front-proxy-client"] = front_proxy.issue(
            directory=self.pki,
            name=f"{name}-front-proxy-client",
            common_name=components.FRONT_PROXY_CLIENT,
            client=True,
        )
        # kwok's kubelet endpoint is verified like a kubelet's: signed by the cluster CA.
        out[f"{name}-kwok-serving"] = ca.issue(
            directory=self.pki,
            name=f"{name}-kwok-serving",
            common_name="kwok",
            ip_addresses=(self.kwok_address(name),),
            server=True,
        )
        if name in self.uppers:
            out[f"{name}-vnode-serving"] = ca.issue(
                directory=self.pki,
                name=f"{name}-vnode-serving",
                common_name="system:node:tensile-virtual-node",
                organizations=("system:nodes",),
                dns_names=("localhost",),
                ip_addresses=tuple(dict.fromkeys((self.network.node_ip, ports.LOOPBACK))),
                server=True,
            )
            out[f"{name}-scheduler-extender"] = ca.issue(
                directory=self.pki,
                name=f"{name}-scheduler-extender",
                common_name="tensile-scheduler",
                ip_addresses=(ports.LOOPBACK,),
                server=True,
            )
            # kube-scheduler's client certificate for the extender, from a CA of its own
            # (as the front-proxy CA): the cluster CA signs every user's and node's.
            callers = CertificateAuthority.create(
                directory=self.pki, name=f"{name}-scheduler-extender-client-ca"
            )
            out[f"{name}-scheduler-extender-client-ca"] = callers.pair
            out[f"{name}-scheduler-extender-client"] = callers.issue(
                directory=self.pki,
                name=f"{name}-scheduler-extender-client",
                common_name="system:kube-scheduler",
                client=True,
            )
            out[f"{name}-metrics-server"] = ca.issue(
                directory=self.pki,
                name=f"{name}-metrics-server",
                common_name=metricsserver.SERVICE_DNS_NAME,
                dns_names=(metricsserver.SERVICE_DNS_NAME,),
                server=True,
            )

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
        preferred = {
            self.uppers[0]: self.settings.upper_port,
            self.lowers[0]: self.settings.lower_port,
        }
        result: dict[str, int] = {}
        # Every apiserver starts at once: each takes several seconds to become ready.
        pending: dict[str, int] = {}
        for name in self.names:
            port = ports.pick(preferred.get(name, 0), taken=self.taken)
            self._spawn(f"{name}-apiserver", self._apiserver_argv(name, port, etcd_port, material))
            pending[name] = port
        for name, port in pending.items():

            def spawn(p: int, name: str = name) -> processes.Process:
                return self._spawn(
                    f"{name}-apiserver", self._apiserver_argv(name, p, etcd_port, material)
                )

            def ready(p: int, name: str = name) -> bool:
                try:
                    status, _ = self._admin(name, p, material).get_text("/readyz")
                except OSError:
                    return False
                return status == 200

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
            # Kubelets (kwok, virtual nodes) are verified as a hardened cluster does.
            kubelet_ca=material[f"{name}-ca"].cert,
            etcd_ca=material["etcd-ca"].cert,
            etcd_client=material["etcd-client"],
            front_proxy_ca=material[f"{name}-front-proxy-ca"].cert,
            front_proxy_client=material[f"{name}-front-proxy-client"],
        )
        return components.apiserver_argv(
            binary=self.paths["kube-apiserver"],
            port=port,
            etcd_port=etcd_port,
            etcd_prefix=f"/{name}",
            service_cidr=_service_cidr(self.names.index(name)),
            files=files,
            compaction_interval=self.settings.compaction_interval,
            admission_plugins=(
                self.settings.lowers[self.lowers.index(name)].admission_plugins
                if name in self.lowers
                else ()
            ),
        )

    def _server(self, port: int) -> str:
        return f"https://{ports.LOOPBACK}:{port}"

    def _admin(self, name: str, port: int, material: Mapping[str, KeyPair]) -> RestClient:
        return RestClient(
            server=self._server(port),
            ca=material[f"{name}-ca"].cert,
            cert=material[f"{name}-admin"].cert,
            key=material[f"{name}-admin"].key,
        )

    def _write_kubeconfigs(self, *, name: str, port: int, material: Mapping[str, KeyPair]) -> None:
        server = self._server(port)
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
        write_kubeconfig(
            path=self.directory / f"{name}.kubeconfig",
            cluster=name,
            server=server,
            ca=ca,
            user=f"{name}-admin",
            credentials=material[f"{name}-admin"],
        )

    def _start_controllers(self, *, material: Mapping[str, KeyPair]) -> dict[str, int]:
        started: dict[str, int] = {}
        for index, name in enumerate(self.names):
            kcm_port = ports.pick(taken=self.taken)
            cluster_cidr = (
                _pod_cidr(self.lowers.index(name))
                if name in self.lowers
                else f"10.{200 + index}.0.0/16"
            )
            self._spawn(
                f"{name}-controller-manager",
                components.controller_manager_argv(
                    binary=self.paths["kube-controller-manager"],
                    kubeconfig=self.pki / f"{name}-controller-manager.kubeconfig",
                    port=kcm_port,
                    ca=material[f"{name}-ca"],
                    service_account_key=material[f"{name}-sa"].key,
                    cluster_cidr=cluster_cidr,
                    node_monitor_grace_period=self.settings.node_monitor_grace_period,
                    controllers=(
                        self.settings.lowers[self.lowers.index(name)].controllers
                        if name in self.lowers
                        else ()
                    ),
                ),
            )
            started[f"{name}-controller-manager"] = kcm_port
            sched_port = ports.pick(taken=self.taken)
            config = None
            if self.settings.scheduler_extender and name in self.uppers:
                extender_port = ports.pick(taken=self.taken)
                started[f"{name}-scheduler-extender"] = extender_port
                config = self.data / f"{name}-scheduler-config.yaml"
                config.write_text(
                    components.scheduler_configuration(
                        kubeconfig=self.pki / f"{name}-scheduler.kubeconfig",
                        url=f"https://{ports.LOOPBACK}:{extender_port}",
                        ca=material[f"{name}-ca"].cert,
                        client=material[f"{name}-scheduler-extender-client"],
                    )
                )
            self._spawn(
                f"{name}-scheduler",
                components.scheduler_argv(
                    binary=self.paths["kube-scheduler"],
                    kubeconfig=self.pki / f"{name}-scheduler.kubeconfig",
                    port=sched_port,
                    config=config,
                ),
            )
            started[f"{name}-scheduler"] = sched_port
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs of kcm / scheduler
        for component, port in started.items():
            if component.endswith("-scheduler-extender"):
                continue  # reserved for tensile-scheduler, which the fleet does not run

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

    def _write_simulation(self, *, forward_port: int) -> _Simulation:
        """Write the files every kwok reads: stages, logs, exec directory, rules."""
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
        config = self.data / "kwok-simulation.yaml"
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
        return _Simulation(configs=(*stage_files, config), exec_dir=exec_dir, logs_file=logs_file)

    def _start_kwok(
        self, name: str, *, material: Mapping[str, KeyPair], configs: Sequence[Path]
    ) -> int:
        kwok_dir = self.data / f"{name}-kwok"
        kwok_dir.mkdir(parents=True, exist_ok=True)
        address = self.kwok_address(name)
        cidr = _pod_cidr(self.lowers.index(name)) if name in self.lowers else "10.199.0.0/16"
        lease_seconds = (
            self.settings.lowers[self.lowers.index(name)].node_lease_seconds
            if name in self.lowers
            else kwok.DEFAULT_NODE_LEASE_SECONDS
        )

        def spawn(port: int) -> processes.Process:
            return self._spawn(
                f"{name}-kwok",
                kwok.kwok_argv(
                    binary=self.paths["kwok"],
                    kubeconfig=self.pki / f"{name}-kwok.kubeconfig",
                    configs=configs,
                    address=address,
                    port=port,
                    serving=material[f"{name}-kwok-serving"],
                    cidr=cidr,
                    lease_seconds=lease_seconds,
                ),
                # kwok always reads $KWOK_WORKDIR/kwok.yaml: keep it inside our state.
                env_extra={"KWOK_WORKDIR": str(kwok_dir), "HOME": str(kwok_dir)},
            )

        port = ports.pick(taken=self.taken, host=address)
        spawn(port)
        return self._wait_or_respawn(
            f"{name}-kwok",
            port=port,
            spawn=spawn,
            ready=functools.partial(_listening_on, address),
        )

    def _create_nodes(self, admins: Mapping[str, RestClient]) -> dict[str, list[str]]:
        """Create every cluster's kwok Nodes; return their names by cluster."""
        created: dict[str, list[str]] = {}
        for name in self.names:
            if name in self.uppers:
                nodes = [
                    kwok.FakeNode(
                        name=host_node_name(name),
                        labels={"node-role.kubernetes.io/control-plane": ""},
                        taints=(HOST_TAINT,),
                    )
                ]
            else:
                lower = self.settings.lowers[self.lowers.index(name)]
                nodes = [
                    kwok.FakeNode(
                        name=lower_node_name(name, i),
                        cpu=lower.cpu,
                        memory=lower.memory,
                        pods=lower.pods,
                        labels={kwok.NODE_INDEX_LABEL: str(i), **lower.node_labels.get(i, {})},
                    )
                    for i in range(lower.nodes)
                ]
            for node in nodes:
                admins[name].request("POST", "/api/v1/nodes", body=kwok.node_manifest(node))
            created[name] = [n.name for n in nodes]
        return created

    def _start_metrics_server(self, cluster: Cluster, *, material: Mapping[str, KeyPair]) -> int:
        """Start metrics-server for an upper cluster as its ServiceAccount, register it."""
        client = cluster.rest()
        address = self.network.node_ip
        port = ports.pick(taken=self.taken, host=address)
        objects = metricsserver.objects(
            address=address, port=port, ca_bundle=cluster.ca.read_bytes()
        )
        for obj in objects[:-2]:  # the EndpointSlice and APIService once it listens
            _create(client, obj)
        token = client.request(
            "POST",
            f"/api/v1/namespaces/{metricsserver.NAMESPACE}/serviceaccounts/"
            f"{metricsserver.NAME}/token",
            body=metricsserver.token_request(seconds=_METRICS_TOKEN_SECONDS),
        )["status"]["token"]
        token_file = self.pki / f"{cluster.name}-metrics-server.token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        kubeconfig = write_kubeconfig(
            path=self.pki / f"{cluster.name}-metrics-server.kubeconfig",
            cluster=cluster.name,
            server=cluster.server,
            ca=cluster.ca,
            user="metrics-server",
            token_file=token_file,
        )
        name = f"{cluster.name}-metrics-server"

        def spawn(p: int) -> processes.Process:
            return self._spawn(
                name,
                components.metrics_server_argv(
                    binary=self.paths["metrics-server"],
                    kubeconfig=kubeconfig,
                    address=address,
                    port=p,
                    serving=material[f"{cluster.name}-metrics-server"],
                    kubelet_ca=cluster.ca,
                ),
            )

        spawn(port)
        port = self._wait_or_respawn(
            name, port=port, spawn=spawn, ready=functools.partial(_listening_on, address)
        )
        for obj in metricsserver.objects(
            address=address, port=port, ca_bundle=cluster.ca.read_bytes()
        )[-2:]:
            _create(client, obj)
        return port

    def _wait_metrics_api(self, cluster: Cluster) -> None:
        client = cluster.rest()

        def available() -> bool:
            found = client.request(
                "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{metricsserver.API_SERVICE}"
            )
            return metricsserver.available(found)

        self._poll(f"{cluster.name}'s metrics.k8s.io API", available)

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


@dataclass(frozen=True, kw_only=True)
class _Simulation:
    configs: tuple[Path, ...]
    exec_dir: Path
    logs_file: Path


def _listening_on(address: str, port: int) -> bool:
    return ports.is_listening(port, host=address)


def _create(client: RestClient, obj: dict[str, Any]) -> None:
    """Create `obj`; one that exists already (a restarted fleet on kept data) is fine."""
    try:
        client.request("POST", metricsserver.collection_path(obj), body=obj)
    except ApiStatusError as exc:
        if exc.code != 409:
            raise
