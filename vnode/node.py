"""One virtual node: a list of components around a provider; start order; stop.

The node is a list of components (`tensile.serving.lifecycle.Component`): the provider and
what it brings (mirrors of pods' dependencies, of Services and volumes as
--enable-controllers chose), the pod controller, the kubelet API server and the node
controller, run by a `lifecycle.Runner` like every program's, and last the patrol
(`vnode.controllers.patrol`), which compares all their state with the clusters. Start order
(virtual-kubelet's): each component's `start()` in list order; then every informer runs
(one per selection, shared through an `InformerFactory`) and has synced before any
component's `run()` begins, so the node controller registers the Node only once pods can
be served. `stop()` (SIGTERM) shuts every component down, lets in-flight work finish for
up to `shutdown_timeout` seconds, then cancels everything; every task is named, owned by a
TaskGroup and awaited.

With --leader-elect, replicas of one node run side by side: every replica serves the
kubelet API and keeps every cache warm; only the holder of the Lease runs the rest
(`tensile.serving.leadership`), and those write through clients fenced by the elector
(`ApiClient.fenced`: no write is sent past the renew deadline), upstairs here and below
in the provider the command builds with the same elector. The Node's addresses and kubelet
port are those of the replica that writes its status, the leader, so the upper apiserver's
logs and exec follow the leader; a standby answers too (it reads the same caches and the
lower cluster), so a caller that still holds an old address is served.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Gauge

from tensile.kube.client import ApiClient, WriteGate
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.leaderelection import LeaderElector
from tensile.kube.mirror.engine import Mirror
from tensile.kube.namespaced import NamespacedInformer
from tensile.kube.resources import EVENTS
from tensile.kube.workqueue import FairQueuing
from tensile.serving import endpoints, lifecycle
from tensile.serving.leadership import Leadership
from tensile.serving.lifecycle import Component
from tensile.serving.tracing import NO_TRACING, Tracing
from vnode.api.certmanager import (
    Clock,
)
from vnode.api.component import KubeletApiServer
from vnode.controllers.node import NodeController
from vnode.controllers.node_objects import node_addresses, node_taints
from vnode.controllers.patrol import Audit, Patrol
from vnode.controllers.patrol_checks import Check, MirrorCheck, PodCheck
from vnode.controllers.pod_traces import pod_traces
from vnode.controllers.pods import PodController
from vnode.provider import Provider
from vnode.settings import Settings

logger = logging.getLogger(__name__)

NODE_INFO = Gauge(
    "tensile_virtual_node_info",
    "1, labelled with the virtual node this process runs (--nodename): joins the process's "
    "other metrics to its Node (`* on(instance, job) group_left(node) tensile_virtual_node_info`).",
    ["node"],
)


@dataclass(frozen=True, kw_only=True)
class UpperClients:
    """The node's clients of the upper cluster. Each has its own connections and rate
    budget, so no kind of traffic waits behind another: the kubelet splits its main,
    heartbeat and event clients the same way (cmd/kubelet/app/server.go), and hostile
    kubelet API callers get a fourth, so their reviews never cost a pod status write."""

    main: ApiClient
    """Informers, pods and their statuses, CSRs: --kube-api-qps/--kube-api-burst."""
    heartbeat: ApiClient
    """Node registration, node status and Lease renewals: no client-side limit (as the
    kubelet's heartbeat client) and a few connections of its own."""
    events: ApiClient
    """Events recorded and mirrored from below: --event-qps/--event-burst."""
    reviews: ApiClient
    """TokenReviews and SubjectAccessReviews of kubelet API callers, bounded in concurrency
    by `auth.ReviewGate`."""

    @classmethod
    def sharing(cls, client: ApiClient) -> UpperClients:
        """All four roles on one client (tests and tools that do not need the split)."""
        return cls(main=client, heartbeat=client, events=client, reviews=client)

    def fenced(self, gate: WriteGate | None) -> UpperClients:
        """These clients with the writes of the leading components' roles (main, heartbeat,
        events) fenced by `gate` (`ApiClient.fenced`); reviews are every replica's."""
        return UpperClients(
            main=self.main.fenced(gate),
            heartbeat=self.heartbeat.fenced(gate),
            events=self.events.fenced(gate),
            reviews=self.reviews,
        )


IN_EVERY_REPLICA: tuple[type, ...] = (KubeletApiServer,)
"""The components every replica runs with --leader-elect: they serve and read (the kubelet
API's only write is its own serving certificate's CSR, per replica). Every other component
writes (pods, copies, the Node, its Lease, Events) and runs only in the
leader (`tensile.serving.leadership`), so a new component leads unless it is named here."""


def _in_every_replica(component: Component) -> bool:
    return isinstance(component, IN_EVERY_REPLICA)


class VirtualNode:
    """Runs one virtual node until `stop()` or cancellation."""

    def __init__(
        self,
        *,
        settings: Settings,
        upper: UpperClients,
        provider: Provider,
        informers: InformerFactory,
        clock: Clock | None = None,
        patrol_clients: Mapping[str, ApiClient] | None = None,
        elector: LeaderElector | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """`informers` is the factory the provider made its informers with (so the node's
        own components share them); `clock` (default: the system clock) times
        serving-certificate renewals; `patrol_clients` are the patrol's own clients, by the
        name of the client whose informers they audit ("upper", "lower"; an informer of
        another client is not audited); `elector` is the election of
        `settings.leader_election` (default: one made here on `upper.heartbeat`), whose
        fence the leading components' upper writes pass (the provider's clients are fenced
        by whoever built it: the command, with the same elector). Raises ValueError for an
        `elector` without `settings.leader_election`.
        `tracing` makes each pod's forwarding a trace (--trace-exporter; the provider's own
        spans are the provider's)."""
        self.settings = settings
        NODE_INFO.labels(node=settings.node.name).set(1)
        self._runner = lifecycle.Runner(
            startup_timeout=settings.startup_timeout, shutdown_timeout=settings.shutdown_timeout
        )
        if elector is not None and settings.leader_election is None:
            raise ValueError("an elector was given, but the settings elect no leader")
        if elector is None and settings.leader_election is not None:
            elector = LeaderElector(upper.heartbeat, settings=settings.leader_election)
        self.elector = elector
        """The election (None: no --leader-elect, every component runs here)."""
        serving = upper
        upper = upper.fenced(elector)
        recorder = EventRecorder(
            upper.events, component=f"{settings.node.name}/pod-controller", host=settings.node.name
        )
        self.pods = PodController(
            upper=upper.main,
            informers=informers,
            provider=provider,
            node_name=settings.node.name,
            namespace=settings.pods.namespace,
            workers=settings.pods.workers,
            recorder=recorder,
            fairness=FairQueuing(weights=dict(settings.pods.namespace_weights)),
            traces=pod_traces(tracing, node_name=settings.node.name),
            taints=node_taints([], settings=settings.node),
        )
        self.node = NodeController(
            upper=upper.main,
            informers=informers,
            heartbeat=upper.heartbeat,
            provider=provider,
            settings=settings.node,
        )
        self.node.on_recovered(self._backend_recovered)
        self.components: list[Component] = [
            provider,
            *provider.components(),
            self.pods,
            KubeletApiServer(
                settings=settings,
                upper=serving.main,
                reviews=serving.reviews,
                pods=self.pods.informer,
                provider=provider,
                addresses=node_addresses(settings.node),
                clock=clock,
            ),
            self.node,
        ]
        """Everything the node runs, in start order (see the module docstring); with
        --leader-elect, the leading ones in a `Leadership`, first."""
        self.patrol = self._patrol(settings, provider, patrol_clients or {})
        self.components.append(self.patrol)
        self.leadership: Leadership | None = None
        """With --leader-elect: what runs the leading components (None: all run here)."""
        if elector is not None:
            everything = self.components
            self.leadership = Leadership(
                elector=elector,
                leading=[c for c in everything if not _in_every_replica(c)],
                watch=serving.main,
            )
            self.components = [self.leadership, *filter(_in_every_replica, everything)]

    def _patrol(
        self, settings: Settings, provider: Provider, clients: Mapping[str, ApiClient]
    ) -> Patrol:
        """The patrol over every informer and queue of the components above."""
        # Events are left out: best effort, never state (the apiserver drops them after an
        # hour), and a busy cluster's are its longest list.
        audits = [
            Audit(informer=informer, client=clients[informer.selection.client.name])
            for informer in self.informers()
            if informer.selection.client.name in clients
            and informer.selection.resource != EVENTS
            # Watched namespace by namespace (--lower-namespace-role): no cluster-wide list
            # to audit against; the mirrors' own checks still compare both sides.
            and not isinstance(informer, NamespacedInformer)
        ]
        checks: list[Check] = [PodCheck(pods=self.pods, provider=provider)]
        checks += [MirrorCheck(c) for c in self.components if isinstance(c, Mirror)]
        return Patrol(period=settings.patrol.period, audits=audits, checks=checks)

    def informers(self) -> list[Informer]:
        """Every informer of every component, each once."""
        return lifecycle.informers_of(self.components)

    def ready(self) -> bool:
        """Whether every component does its work (the Node registered included)."""
        return all(component.ready() for component in self.components)

    def _backend_recovered(self) -> None:
        logger.info("the provider is reachable again: resuming watches and pending pods")
        for informer in self.informers():
            informer.retry_now()
        self.pods.resync()

    def stop(self) -> None:
        """Ask `run` to stop gracefully (safe to call from a signal handler)."""
        self._runner.stop()

    async def run(self) -> None:
        """Run until `stop()`. Raises StartupError if the caches do not sync in time, and
        whatever a component's `start()` or `run()` raised. `/readyz` on --metrics-addr
        and --healthz-addr has one check per component (its caches synced, the Node
        registered, ...), so a probe says which part is not ready."""
        health = lifecycle.health_of(self.components)
        async with (
            endpoints.metrics_server(self.settings.metrics_addr, health=health),
            endpoints.healthz_server(self.settings.healthz_addr, health=health),
        ):
            await self._runner.run(self.components)
