"""The flags of a program's plain-HTTP endpoints, shared by every server: `--metrics-addr`
(tensile-kube's and virtual-kubelet's name), `--metrics-insecure` and `--healthz-addr`.

Plain HTTP asks no caller who it is, so `/metrics` is served there only on a loopback
address (127.0.0.0/8, ::1, localhost: a sidecar or `kubectl port-forward` reads it), as the
kubelet binds its own plain healthz endpoint to 127.0.0.1 by default: on any other address
the command refuses to start, naming the flag, unless `--metrics-insecure` says to serve it
there anyway. A network scrape goes to the HTTPS port instead, behind TokenReview and
SubjectAccessReview (`tensile.serving.delegated`; the virtual node: the kubelet API's
`nodes/metrics`). `--healthz-addr` serves only `/healthz` and `/readyz` (kube-proxy's
--healthz-bind-address), on any address: what kubelet probes need of a program whose
HTTPS port cannot answer them (the virtual node's kubelet API authorizes every call and
listens only once its certificate is issued; the descheduler's probes stay where they were
before it served `/metrics` on its `--secure-port`).
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable
from typing import Any

from tensile.serving.flags import UsageError, address

METRICS_ADDR = "--metrics-addr"
METRICS_INSECURE = "--metrics-insecure"
HEALTHZ_ADDR = "--healthz-addr"


def add_flags(add: Callable[..., Any], *, healthz: bool = False) -> None:
    """Add `--metrics-addr` and `--metrics-insecure` with `add` (a parser's add_argument),
    and `--healthz-addr` when `healthz`."""
    add(
        METRICS_ADDR,
        default="",
        help="host:port of a plain-HTTP /metrics, /healthz and /readyz, without "
        f"authentication: a loopback address unless {METRICS_INSECURE} (default: none; "
        "scrape /metrics on the HTTPS port with a token)",
    )
    add(
        METRICS_INSECURE,
        action="store_true",
        help=f"serve {METRICS_ADDR} on an address other than loopback: /metrics to anyone "
        "who can reach it, unauthenticated",
    )
    if healthz:
        add(
            HEALTHZ_ADDR,
            default="",
            help="host:port of a plain-HTTP /healthz and /readyz (no metrics), for kubelet "
            "probes (default: none)",
        )


def metrics_addr(args: argparse.Namespace) -> str:
    """Return `--metrics-addr` as host:port ("" none). Raises UsageError naming the flag
    when it is not loopback and `--metrics-insecure` is not given (see the module
    docstring)."""
    if not args.metrics_addr:
        return ""
    addr = address(args.metrics_addr, METRICS_ADDR)
    host = addr.rpartition(":")[0]
    if not args.metrics_insecure and not is_loopback(host):
        raise UsageError(
            f"{METRICS_ADDR}={args.metrics_addr} would serve /metrics over plain HTTP, "
            f"unauthenticated, on {host}: give a loopback address (127.0.0.1:PORT), scrape "
            f"/metrics on the HTTPS port with a token, or add {METRICS_INSECURE} to serve it "
            "there anyway"
        )
    return addr


def healthz_addr(args: argparse.Namespace) -> str:
    """Return `--healthz-addr` as host:port ("" none). Raises UsageError naming the flag."""
    return address(args.healthz_addr, HEALTHZ_ADDR) if args.healthz_addr else ""


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP address, bracketed or not, or a name) is only reachable from
    this machine: a loopback address or "localhost" (pure)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name: it may resolve to anything
