"""The `virtual-node` command: flags + env -> settings -> clients + provider -> run.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 1 when a cluster cannot be reached, the
node cannot start (caches not synced, a busy KUBELET_PORT, a certificate or CA file that
cannot be loaded) or, with --leader-elect, the Lease was lost after leading (the process
comes back as a fresh standby), 2 for invalid flags or environment (a --cert-dir that
cannot be written included).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import sys
import urllib.parse
from collections.abc import Sequence

from tensile.contracts.labels import DEFAULT_TAINT_KEY
from tensile.kube import config, errors, retry
from tensile.kube.client import ApiClient
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.leaderelection import LeaseLost
from tensile.serving import flags, logs, shutdown, version
from tensile.serving.lifecycle import StartupError
from vnode import cli
from vnode.api import auth
from vnode.controllers.node_objects import node_labels
from vnode.node import UpperClients, VirtualNode
from vnode.provider import Provider
from vnode.providers.k2k import assembly
from vnode.providers.k2k.provider import PING_TIMEOUT, K2KProvider
from vnode.providers.k2k.scrape import (
    BearerTokenFile,
    KubeletAccess,
    ThroughApiserver,
    ToKubelets,
    access_warnings,
)
from vnode.providers.k2k.translate import TranslationPolicy
from vnode.providers.mock import MockProvider, MockSettings, load_config
from vnode.settings import ClientSettings, Settings

logger = logging.getLogger("vnode")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the virtual node; returns the exit code."""
    settings = _settings(sys.argv[1:] if argv is None else argv)
    if isinstance(settings, int):
        return settings
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    for note in settings.notes:
        logger.warning("%s", note)
    mock: MockSettings | None = None
    lower_info: config.ConnectionInfo | None = None
    try:
        upper_info = config.load(settings.upper.kubeconfig, server=settings.upper.server)
        if settings.provider == "mock":
            mock = load_config(settings.provider_config, node_name=settings.node.name)
        else:
            lower_info = config.load(settings.lower.kubeconfig)
    except (config.ConfigError, ValueError) as exc:
        print(f"virtual-node: error: {exc}", file=sys.stderr)
        return 2
    if not settings.api.verify_clients:
        logger.warning("--no-verify-clients: the kubelet API accepts ANY caller; development only")
    kubelet_token: BearerTokenFile | None = None
    if settings.lower_kubelets.token_file:
        kubelet_token = BearerTokenFile(settings.lower_kubelets.token_file)
        try:
            kubelet_token.authorization()  # unreadable at start is a configuration error
        except (OSError, ValueError) as exc:
            print(f"virtual-node: error: --lower-kubelet-token-file: {exc}", file=sys.stderr)
            return 2
    for level, message in access_warnings(
        direct=settings.lower_kubelets.access == "direct",
        insecure_tls=settings.lower_kubelets.insecure_tls,
        token_file=kubelet_token is not None,
    ):
        logger.log(level, "%s", message)
    try:
        asyncio.run(_run(settings, upper_info, lower_info, kubelet_token=kubelet_token, mock=mock))
    except (errors.ApiUnavailable, errors.ApiError, StartupError, LeaseLost) as exc:
        # A lost Lease: kube-controller-manager's choice, start again as a fresh standby
        # rather than lead again with memory built while leading.
        logger.error("virtual-node stopped: %s", exc)
        return 1
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C
        return 130
    return 0


def _settings(argv: Sequence[str]) -> Settings | int:
    """Return the settings of `argv`, or the exit code after printing the version (0) or
    what is wrong with the command line (2)."""
    try:
        settings = cli.parse(argv)
        cli.check_cert_dir(settings.api)
    except flags.VersionRequested:
        print(version.text("virtual-node"))
        return 0
    except flags.UsageError as exc:
        print(f"virtual-node: error: {exc}", file=sys.stderr)
        return 2
    return settings


async def _run(
    settings: Settings,
    upper_info: config.ConnectionInfo,
    lower_info: config.ConnectionInfo | None,
    *,
    kubelet_token: BearerTokenFile | None,
    mock: MockSettings | None,
) -> None:
    node_ip = settings.node.internal_ip or _reachable_address(upper_info.server)
    settings = _with_ip(settings, node_ip)
    agent = f"tensile-virtual-node/{settings.node.name}"

    def client(info: config.ConnectionInfo, name: str, limits: ClientSettings) -> ApiClient:
        return ApiClient(info, name=name, qps=limits.qps, burst=limits.burst, user_agent=agent)

    async with (
        client(upper_info, "upper", settings.upper) as upper,
        upper.sibling(
            name="upper-heartbeat",
            qps=0,
            burst=1,
            timeout=max(5.0, settings.node.lease_renew_interval),
            connections=2,
        ) as heartbeat,
        upper.sibling(
            name="upper-events",
            qps=settings.events.qps,
            burst=settings.events.burst,
            timeout=30.0,
            connections=4,
        ) as events,
        upper.sibling(
            name="upper-reviews",
            qps=0,
            burst=1,
            timeout=auth.REVIEW_TIMEOUT,
            connections=auth.REVIEWS_IN_FLIGHT,
        ) as reviews,
        upper.sibling(
            name="upper-patrol",
            qps=settings.patrol.qps,
            burst=settings.patrol.burst,
            timeout=60.0,
            connections=2,
        ) as upper_patrol,
        contextlib.AsyncExitStack() as stack,
    ):
        # The patrol's lists have a budget of their own: a patrol of 10,000 pods never
        # delays a status write or a heartbeat.
        patrol_clients = {upper.name: upper_patrol}
        # Both clusters must answer before anything is registered (tensile-kube: fatal).
        await upper.request("GET", "/version")
        cluster_id = settings.pods.cluster_id or await _upper_cluster_id(upper)
        informers = InformerFactory()
        provider: Provider
        if lower_info is None:
            provider = MockProvider(node_ip=node_ip, settings=mock)
            lower_server = "none (mock provider)"
        else:
            lower = await stack.enter_async_context(client(lower_info, "lower", settings.lower))
            # The pings that gate Lease renewals, apart from pods, logs, exec and mirrors
            # (which share --client-qps and the request pool), as the upper heartbeat client.
            lower_heartbeat = await stack.enter_async_context(
                lower.sibling(
                    name="lower-heartbeat", qps=0, burst=1, timeout=PING_TIMEOUT, connections=2
                )
            )
            # The placement summary's writes, apart from pod statuses (and not counted as
            # theirs): at most one per --placement-summary-interval.
            upper_placement = await stack.enter_async_context(
                upper.sibling(name="upper-placement", qps=0, burst=1, timeout=30.0, connections=1)
            )
            provider = await _k2k_provider(
                settings,
                upper=upper,
                upper_placement=upper_placement,
                events=events,
                lower=lower,
                lower_heartbeat=lower_heartbeat,
                informers=informers,
                stack=stack,
                cluster_id=cluster_id,
                node_ip=node_ip,
                kubelet_token=kubelet_token,
            )
            lower_server = lower_info.server
            patrol_clients[lower.name] = await stack.enter_async_context(
                lower.sibling(
                    name="lower-patrol",
                    qps=settings.patrol.qps,
                    burst=settings.patrol.burst,
                    timeout=60.0,
                    connections=2,
                )
            )
        node = VirtualNode(
            settings=settings,
            upper=UpperClients(main=upper, heartbeat=heartbeat, events=events, reviews=reviews),
            provider=provider,
            informers=informers,
            patrol_clients=patrol_clients,
        )
        with shutdown.stop_on_signals(node.stop):
            logger.info(
                "virtual node %s starting (upper %s, cluster ID %s, lower %s, InternalIP %s)",
                settings.node.name,
                upper_info.server,
                cluster_id,
                lower_server,
                node_ip,
            )
            await node.run()
    logger.info("virtual node %s stopped", settings.node.name)


async def _k2k_provider(
    settings: Settings,
    *,
    upper: ApiClient,
    upper_placement: ApiClient,
    events: ApiClient,
    lower: ApiClient,
    lower_heartbeat: ApiClient,
    informers: InformerFactory,
    stack: contextlib.AsyncExitStack,
    cluster_id: str,
    node_ip: str,
    kubelet_token: BearerTokenFile | None,
) -> K2KProvider:
    """Return the Kubernetes-to-Kubernetes provider for the `lower` cluster (the node starts
    it as its first component)."""
    kubelets: KubeletAccess = ThroughApiserver(lower)
    if settings.lower_kubelets.access == "direct":
        verify = not settings.lower_kubelets.insecure_tls
        kubelets = await stack.enter_async_context(
            ToKubelets(lower, verify=verify, token=kubelet_token)
        )
    return assembly.build(
        upper=upper,
        upper_events=events,
        lower=lower,
        lower_heartbeat=lower_heartbeat,
        informers=informers,
        policy=TranslationPolicy(
            node_name=settings.node.name,
            cluster_id=cluster_id,
            node_labels=node_labels(settings.node),
            namespace_prefix=settings.pods.namespace_prefix,
            ignore_labels=settings.pods.ignore_labels,
            enable_service_account=settings.pods.enable_service_account,
            pod_security_level=settings.pods.pod_security_level,
            taint_key=settings.node.taint.key if settings.node.taint else DEFAULT_TAINT_KEY,
            priority_classes=settings.pods.priority_class_map,
            upper_api_address=settings.serviceaccount.upper_api_address,
        ),
        node_ip=node_ip,
        upper_namespace=settings.pods.namespace,
        kubelets=kubelets,
        workers=settings.pods.workers,
        controllers=settings.controllers,
        namespace_labels=settings.pods.lower_namespace_labels,
        namespace_annotations=settings.pods.lower_namespace_annotations,
        adopt_tensile_kube=settings.migration.adopt_tensile_kube,
        token_refresh_fraction=settings.serviceaccount.token_refresh_fraction,
        summary_interval=settings.node.placement_summary_interval,
        upper_placement=upper_placement,
    )


async def _upper_cluster_id(upper: ApiClient) -> str:
    """Return the upper cluster's identity: the UID of its kube-system namespace, the common
    cluster-ID convention (a namespace that exists in every cluster and is never re-made).

    A transient failure (unreachable, 429, 5xx) is retried with backoff (0.5 s doubling to
    30 s, `tensile.kube.retry.until_done`, as the node's registration), never a crash. A
    refusal (401, 403, 404) is not: it raises ApiError saying what to grant, since no retry
    would succeed without a change of RBAC or --cluster-id."""

    async def read() -> str:
        namespace = await upper.request("GET", "/api/v1/namespaces/kube-system")
        return str(namespace["metadata"]["uid"])

    try:
        return await retry.until_done(
            "reading the upper cluster's identity (namespace kube-system)",
            read,
            retried=errors.TRANSIENT,
        )
    except errors.ApiError as exc:
        message = (
            f"cannot read the upper cluster's identity (namespace kube-system: {exc.message}); "
            "grant get on it (manifests/vnode/upper-rbac.yaml does) or set --cluster-id"
        )
        raise type(exc)(code=exc.code, status={**exc.status, "message": message}) from exc


def _reachable_address(server: str) -> str:
    """Return the local address the upper apiserver can reach us at (the route toward it)."""
    parsed = urllib.parse.urlsplit(server)
    host = parsed.hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, parsed.port or 443))  # no packet is sent for UDP connect
            return str(s.getsockname()[0])
    except OSError as exc:
        raise errors.ApiUnavailable(
            f"cannot find the address the upper cluster reaches this node at ({exc}); "
            "set VKUBELET_POD_IP"
        ) from exc


def _with_ip(settings: Settings, ip: str) -> Settings:
    return dataclasses.replace(settings, node=dataclasses.replace(settings.node, internal_ip=ip))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
