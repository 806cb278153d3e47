"""The `tensile-scheduler` command line, parsed into frozen `Settings`. Invalid values raise
UsageError (the command exits 2 with its one-line message)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from scheduler.extender import Policy
from scheduler.server import MAX_IN_FLIGHT, MAX_REQUEST_BYTES, Callers
from scheduler.settings import DEFAULT_SERVER, Settings
from scheduler.slices.flags import add_slice_flags, slice_settings
from tensile.contracts import selectors
from tensile.contracts.labels import DEFAULT_TAINT_KEY, VIRTUAL_NODE_SELECTOR
from tensile.serving import flags, metrics_flags
from tensile.serving.flags import UsageError
from tensile.serving.https import ServerSettings


def _parser() -> argparse.ArgumentParser:
    p = flags.Parser(
        prog="tensile-scheduler",
        description="kube-scheduler extender: filters out virtual nodes whose lower cluster "
        "has no node for the pod, scores the others by best fit.",
    )
    a = p.add_argument
    a("--address", default="0.0.0.0", help="listen address (default 0.0.0.0)")  # noqa: S104
    a("--port", type=int, default=8443, help="HTTPS listen port (default 8443)")
    a("--tls-cert-file", default="", help="serving certificate file (required; reloaded)")
    a("--tls-private-key-file", default="", help="its private key file (required)")
    a(
        "--client-ca-file",
        default="",
        help="the CA whose client certificates callers must present on every route but "
        "/healthz and /readyz (required: kube-scheduler's extender tlsConfig certFile)",
    )
    a(
        "--kubeconfig",
        default=None,
        help="kubeconfig of the upper cluster (env KUBECONFIG; then ~/.kube/config, then "
        "in-cluster)",
    )
    a(
        "--virtual-node-selector",
        default=VIRTUAL_NODE_SELECTOR,
        help="label selector of the virtual nodes whose placement summaries are read "
        "(default type=virtual-kubelet)",
    )
    a(
        "--headroom",
        type=float,
        default=0.0,
        help="share 0..1 of each lower cluster's allocatable cpu and memory a placement "
        "should leave free; a virtual node that would go below it scores 0 (default 0)",
    )
    a(
        "--taint-key",
        default=DEFAULT_TAINT_KEY,
        help=f"the virtual nodes' taint key (default {DEFAULT_TAINT_KEY})",
    )
    a(
        "--max-request-bytes",
        type=int,
        default=MAX_REQUEST_BYTES,
        help=f"largest request body accepted, bytes (default {MAX_REQUEST_BYTES})",
    )
    a(
        "--max-requests-inflight",
        type=int,
        default=MAX_IN_FLIGHT,
        help="filter and prioritize calls answered at once; more get 429 at once "
        f"(default {MAX_IN_FLIGHT})",
    )
    metrics_flags.add_flags(a)
    a(
        "--shutdown-delay",
        type=flags.duration,
        default=DEFAULT_SERVER.shutdown_delay,
        help="seconds (default 2s)",
    )
    a(
        "--shutdown-timeout",
        type=flags.duration,
        default=DEFAULT_SERVER.shutdown_timeout,
        help="seconds (default 5s)",
    )
    add_slice_flags(p, headroom=False)  # the quota slices keep the same --headroom free
    flags.add_logging_flags(p)
    return p


def parse(argv: Sequence[str]) -> Settings:
    """Return the settings of the command line `argv`. Raises UsageError naming the flag,
    VersionRequested."""
    args = _parser().parse_args(list(argv))
    if not args.tls_cert_file or not args.tls_private_key_file:
        raise UsageError("--tls-cert-file and --tls-private-key-file are required (HTTPS only)")
    if not args.client_ca_file:
        raise UsageError(
            "--client-ca-file is required: the CA of the client certificate kube-scheduler "
            "presents (its extender tlsConfig certFile and keyFile)"
        )
    if args.max_requests_inflight < 1:
        raise UsageError(
            f"--max-requests-inflight must be at least 1, got {args.max_requests_inflight}"
        )
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1-65535, got {args.port}")
    if not 0.0 <= args.headroom < 1.0:
        raise UsageError(f"--headroom must be a share in [0, 1), got {args.headroom}")
    if args.max_request_bytes < 1024:
        raise UsageError(f"--max-request-bytes must be at least 1024, got {args.max_request_bytes}")
    try:
        selectors.parse(args.virtual_node_selector)
    except selectors.SelectorError as exc:
        raise UsageError(f"--virtual-node-selector: {exc}") from None
    metrics_addr = metrics_flags.metrics_addr(args)
    log_choice = flags.logging_choice(args)
    return Settings(
        server=ServerSettings(
            address=args.address,
            port=args.port,
            cert_file=args.tls_cert_file,
            key_file=args.tls_private_key_file,
            client_ca_file=args.client_ca_file,
            require_client_certificate=False,  # probes present none: the routes ask (Callers)
            max_request_bytes=args.max_request_bytes,
            metrics_addr=metrics_addr,
            shutdown_delay=args.shutdown_delay,
            shutdown_timeout=args.shutdown_timeout,
        ),
        callers=Callers(max_in_flight=args.max_requests_inflight),
        policy=Policy(headroom=args.headroom, taint_key=args.taint_key),
        kubeconfig=args.kubeconfig,
        virtual_node_selector=args.virtual_node_selector,
        slices=slice_settings(args),
        log_level=log_choice.level,
        log_format=log_choice.format,
        notes=log_choice.notes,
    )
