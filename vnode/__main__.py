"""The `virtual-node` command: flags + env -> settings -> clients + provider -> run (the
start, the exits and the signals are every program's: `tensile.serving.program`).

Exit codes: 0 after a clean stop (SIGTERM/SIGINT) and for `version`/`--version`, 1 when a
cluster cannot be reached, the node cannot start (caches not synced, a busy KUBELET_PORT, a
certificate or CA file that cannot be loaded) or, with --leader-elect, the Lease cannot be
kept (its namespace missing and not creatable by this identity, RBAC refusing it:
`vnode.preflight`) or was lost after leading (the process comes back as a fresh standby),
or, with --cert-secret, the serving certificate's Secret cannot be read or written (RBAC,
a missing Secret this identity may not create: `vnode.preflight` too), 2 for invalid flags
or environment (a --cert-dir that cannot be written included).

With --leader-elect, every client of the leading components, below and upstairs, is fenced
by the elector (`ApiClient.fenced`): no write leaves this process past the Lease's renew
deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import sys
import urllib.parse
from collections.abc import Sequence

from tensile.contracts import selectors
from tensile.contracts.labels import DEFAULT_TAINT_KEY
from tensile.kube import config, errors, retry
from tensile.kube.client import ApiClient, WriteGate
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.leaderelection import LeaderElector, LeaseLost
from tensile.serving import delegated, flags, program, tracing
from tensile.serving.preflight import PreflightFailed
from vnode import cli, preflight
from vnode.controllers.node_objects import node_labels
from vnode.node import UpperClients, VirtualNode
from vnode.provider import Provider
from vnode.providers.k2k import assembly, pool, tokens
from vnode.providers.k2k.provider import PING_TIMEOUT, K2KProvider
from vnode.providers.k2k.scrape import (
    BearerTokenFile,
    KubeletAccess,
    ThroughApiserver,
    ToKubelets,
    access_warnings,
)
from vnode.providers.k2k.translate import TranslationPolicy
from vnode.providers.k2k.volumes import StorageClassMap
from vnode.providers.mock import MockProvider, MockSettings, load_config
from vnode.settings import ClientSettings, Settings

logger = logging.getLogger("vnode")
PROGRAM_NAME = "virtual-node"
"""The command's name (its version line, errors, and the default service.name of its
spans)."""


def _parse(argv: Sequence[str]) -> Settings:
    """The settings of `argv` (`vnode.cli`), the --cert-dir checked writable. Raises
    UsageError, VersionRequested."""
    settings = cli.parse(argv)
    cli.check_cert_dir(settings.api)
    return settings


def _notes(settings: Settings) -> list[program.Note]:
    """What the kubelet API's and the lower kubelets' settings deserve a word about."""
    notes: list[program.Note] = []
    if not settings.api.verify_clients:
        message = "--no-verify-clients: the kubelet API accepts ANY caller; development only"
        notes.append((logging.WARNING, message))
    notes += access_warnings(
        direct=settings.lower_kubelets.access == "direct",
        insecure_tls=settings.lower_kubelets.insecure_tls,
        token_file=bool(settings.lower_kubelets.token_file),
    )
    return notes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Loaded:
    """What the node reads once at start."""

    upper: config.ConnectionInfo
    lower: config.ConnectionInfo | None
    """None with the mock provider."""
    mock: MockSettings | None
    """The mock provider's configuration (None: the k8s provider)."""
    kubelet_token: BearerTokenFile | None
    """--lower-kubelet-token-file, read once to check it (re-read when it changes)."""
    upper_tokens: config.ConnectionInfo | None = None
    """--upper-token-kubeconfig (None: not given)."""


def _load(settings: Settings) -> Loaded:
    """Load the kubeconfigs, the mock provider's configuration and the lower kubelets'
    token. Raises config.ConfigError, UsageError."""
    upper = config.load(settings.upper.kubeconfig, server=settings.upper.server)
    mock: MockSettings | None = None
    lower: config.ConnectionInfo | None = None
    if settings.provider == "mock":
        try:
            mock = load_config(settings.provider_config, node_name=settings.node.name)
        except ValueError as exc:
            raise flags.UsageError(str(exc)) from None
    else:
        lower = config.load(settings.lower.kubeconfig)
    kubelet_token: BearerTokenFile | None = None
    if settings.lower_kubelets.token_file:
        kubelet_token = BearerTokenFile(settings.lower_kubelets.token_file)
        try:
            kubelet_token.authorization()  # unreadable at start is a configuration error
        except (OSError, ValueError) as exc:
            raise flags.UsageError(f"--lower-kubelet-token-file: {exc}") from None
    token_kubeconfig = settings.serviceaccount.token_kubeconfig
    upper_tokens = config.load(token_kubeconfig) if token_kubeconfig else None
    return Loaded(
        upper=upper,
        lower=lower,
        mock=mock,
        kubelet_token=kubelet_token,
        upper_tokens=upper_tokens,
    )


async def _run(settings: Settings, loaded: Loaded, stopping: program.Stopping) -> None:
    """The node's assembly: clients, the provider, the node; run until stopped."""
    upper_info, lower_info = loaded.upper, loaded.lower
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
        delegated.review_client(upper) as reviews,
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
        traced = await stack.enter_async_context(
            tracing.running(settings.tracing, service_name=PROGRAM_NAME)
        )
        # Both clusters must answer before anything is registered (tensile-kube: fatal).
        await upper.request("GET", "/version")
        # With --leader-elect: the Lease can be kept, with --cert-secret: the Secret can,
        # or exit 1 saying what to do.
        await preflight.ensure(upper, settings)
        elector = (
            LeaderElector(heartbeat, settings=settings.leader_election)
            if settings.leader_election is not None
            else None
        )
        patrol_clients = {upper.name: upper_patrol.fenced(elector)}
        cluster_id = settings.pods.cluster_id or await _upper_cluster_id(upper)
        informers = InformerFactory()
        provider: Provider
        if lower_info is None:
            provider = MockProvider(node_ip=node_ip, settings=loaded.mock)
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
            settings = await _with_pool_labels(settings, lower)
            provider = await _k2k_provider(
                settings,
                upper=upper,
                upper_placement=upper_placement,
                events=events,
                lower=lower,
                lower_heartbeat=lower_heartbeat,
                gate=elector,
                informers=informers,
                stack=stack,
                cluster_id=cluster_id,
                node_ip=node_ip,
                kubelet_token=loaded.kubelet_token,
                upper_tokens=loaded.upper_tokens,
                traced=traced,
            )
            lower_server = lower_info.server
            lower_patrol = await stack.enter_async_context(
                lower.sibling(
                    name="lower-patrol",
                    qps=settings.patrol.qps,
                    burst=settings.patrol.burst,
                    timeout=60.0,
                    connections=2,
                )
            )
            patrol_clients[lower.name] = lower_patrol.fenced(elector)
        node = VirtualNode(
            settings=settings,
            upper=UpperClients(main=upper, heartbeat=heartbeat, events=events, reviews=reviews),
            provider=provider,
            informers=informers,
            patrol_clients=patrol_clients,
            elector=elector,
            tracing=traced,
        )
        with stopping.calls(node.stop):
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
    upper_tokens: config.ConnectionInfo | None,
    gate: WriteGate | None,
    traced: tracing.Tracing = tracing.NO_TRACING,
) -> K2KProvider:
    """Return the Kubernetes-to-Kubernetes provider for the `lower` cluster (the node starts
    it as its first component). The provider and everything it brings lead: every client
    it writes through, below and upstairs, is fenced by `gate` (the elector with
    --leader-elect; `ApiClient.fenced`). With `upper_tokens` (--upper-token-kubeconfig), the
    upper tokens are asked for with it once it is shown to be this node's identity (raises
    StartupError otherwise); `traced` makes spans of traced pods' creates."""
    minter: ApiClient | None = None
    if upper_tokens is not None:
        minter = await stack.enter_async_context(
            ApiClient(
                upper_tokens,
                name="upper-tokens",
                qps=settings.upper.qps,
                burst=settings.upper.burst,
                user_agent=f"tensile-virtual-node/{settings.node.name}",
            )
        )
        await tokens.check_identity(minter, node_name=settings.node.name)  # every replica
        minter = minter.fenced(gate)
    kubelets: KubeletAccess = ThroughApiserver(lower)
    if settings.lower_kubelets.access == "direct":
        verify = not settings.lower_kubelets.insecure_tls
        kubelets = await stack.enter_async_context(
            ToKubelets(lower, verify=verify, token=kubelet_token)
        )
    return assembly.build(
        upper=upper.fenced(gate),
        upper_events=events.fenced(gate),
        lower=lower.fenced(gate),
        lower_heartbeat=lower_heartbeat.fenced(gate),
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
            scheduler_names=settings.pods.scheduler_name_map,
            runtime_classes=settings.pods.runtime_class_map,
            volume_types=settings.pods.allowed_volume_types,
            storage_classes=StorageClassMap(
                classes=settings.controllers.lower_storage_classes,
                default=settings.controllers.lower_storage_class_default,
            ),
            upper_api_address=settings.serviceaccount.upper_api_address,
            lower_node_selector=settings.node.lower_node_selector,
        ),
        node_ip=node_ip,
        upper_namespace=settings.pods.namespace,
        kubelets=kubelets,
        workers=settings.pods.workers,
        controllers=settings.controllers,
        namespace_labels=settings.pods.lower_namespace_labels,
        namespace_annotations=settings.pods.lower_namespace_annotations,
        adopt_tensile_kube_before=settings.migration.adopt_before,
        token_refresh_fraction=settings.serviceaccount.token_refresh_fraction,
        token_minter=minter,
        summary_interval=settings.node.placement_summary_interval,
        namespace_role=settings.pods.lower_namespace_role,
        upper_placement=upper_placement.fenced(gate),
        tracing=traced,
    )


async def _with_pool_labels(settings: Settings, lower: ApiClient) -> Settings:
    """`settings` with the pool's shared labels (--lower-node-labels-to-copy, read from the
    lower nodes of --lower-node-selector once, at start) added to the virtual Node's labels.
    Raises the lower API server's errors."""
    node = settings.node
    keys = node.lower_node_labels_to_copy
    copied = await pool.pool_labels(lower, pool=node.lower_node_selector, keys=keys)
    if missing := [key for key in keys if key not in copied]:
        logger.warning(
            "--lower-node-labels-to-copy: %s not copied: not shared by every lower node of "
            "the pool (%s)",
            ", ".join(missing),
            selectors.render(node.lower_node_selector) or "every node",
        )
    if not copied:
        return settings
    labels = dict(node.extra_labels)
    labels.update({key: value for key, value in copied.items() if key not in labels})
    return dataclasses.replace(
        settings, node=dataclasses.replace(node, extra_labels=tuple(labels.items()))
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


PROGRAM = program.Program(
    name=PROGRAM_NAME,
    parse=_parse,
    logging=program.logging_of,
    notes=_notes,
    load=_load,
    run=_run,
    # A lost Lease: kube-controller-manager's choice, start again as a fresh standby rather
    # than lead again with memory built while leading.
    failures=(errors.ApiUnavailable, errors.ApiError, LeaseLost, PreflightFailed),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the virtual node; returns the exit code (see the module docstring)."""
    return program.main(PROGRAM, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
