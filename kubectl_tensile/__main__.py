"""`kubectl-tensile` (run as `kubectl tensile ...`): flags -> clusters -> report -> stdout.

    kubectl tensile status [-o text|json|yaml] [--lower NODE=KUBECONFIG ...]
    kubectl tensile why POD [-n NAMESPACE] [-o ...] [--lower NODE=KUBECONFIG ...]

The upper cluster is found as kubectl finds it: --kubeconfig, else $KUBECONFIG, else
~/.kube/config (else in-cluster), with --context choosing a context; the namespace of `why`
is -n, else the context's, else "default".

Exit codes: 0 reported; 1 the upper cluster did not answer or the pod does not exist;
2 invalid flags or kubeconfig.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path

from kubectl_tensile import gather, render
from tensile.contracts import avoidance
from tensile.kube import config, errors
from tensile.serving import flags, version

PROGRAM = "kubectl-tensile"


def _parser() -> flags.Parser:
    p = flags.Parser(
        prog="kubectl tensile",
        description="The virtual nodes of tensile (status) and where a pod runs or why it "
        "does not (why POD).",
    )
    a = p.add_argument
    a("command", choices=("status", "why"), help="status: the virtual nodes; why POD: one pod")
    a("pod", nargs="?", default=None, help="why: the pod's name")
    a("--kubeconfig", default=None, help="kubeconfig of the upper cluster (as kubectl's)")
    a("--context", default=None, help="context of the kubeconfig to use (as kubectl's)")
    a("-n", "--namespace", default=None, help="why: the pod's namespace (as kubectl's)")
    a(
        "-o",
        "--output",
        default="text",
        choices=render.OUTPUTS,
        help="text (fits 80 columns), json or yaml",
    )
    a(
        "--lower",
        action="append",
        default=[],
        help="NODE=KUBECONFIG: read virtual node NODE's lower cluster with this kubeconfig "
        "(its /readyz in status; the lower pod, its node and Events in why); repeatable",
    )
    a(
        "--avoid-configmap",
        default=avoidance.DEFAULT_CONFIGMAP,
        help="NAMESPACE/NAME of the descheduler's avoidance record (default "
        f"{avoidance.DEFAULT_CONFIGMAP}; the descheduler's flag of that name)",
    )
    return p


def _lowers(items: Sequence[str]) -> dict[str, config.ConnectionInfo]:
    lowers = {}
    for item in items:
        node, sep, path = item.partition("=")
        if not sep or not node or not path:
            raise flags.UsageError(f"--lower must be NODE=KUBECONFIG, got {item!r}")
        if node in lowers:
            raise flags.UsageError(f"--lower: {node} is given twice")
        if not Path(path).is_file():
            raise flags.UsageError(f"--lower {node}: kubeconfig {path} does not exist")
        try:
            lowers[node] = config.load(path)
        except config.ConfigError as exc:
            raise flags.UsageError(f"--lower {node}: {exc}") from None
    return lowers


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context (kubectl's default for -n), else "default"."""
    from kubernetes.config import kube_config  # noqa: PLC0415 - only `why` needs it

    try:
        contexts, active = kube_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=kubeconfig
        )
    except Exception:  # noqa: BLE001 - no kubeconfig (in-cluster): kubectl says "default"
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the plugin; returns the exit code."""
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.command == "why" and not args.pod:
            raise flags.UsageError("why needs the pod's name: kubectl tensile why POD")
        if args.command == "status" and args.pod:
            raise flags.UsageError(f"status takes no pod (got {args.pod!r})")
        avoid = flags.namespaced(args.avoid_configmap, "--avoid-configmap")
        target = gather.Target(
            upper=config.load(args.kubeconfig, context=args.context),
            lowers=_lowers(args.lower),
            avoid_configmap=avoid,
        )
    except flags.VersionRequested:
        print(version.text(PROGRAM))
        return 0
    except (flags.UsageError, config.ConfigError) as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.UTC)
    try:
        if args.command == "status":
            report = asyncio.run(gather.status_report(target, now=now))
        else:
            namespace = args.namespace or _context_namespace(args.kubeconfig, args.context)
            report = asyncio.run(
                gather.why_report(target, namespace=namespace, name=args.pod, now=now)
            )
    except (gather.NoSuchPod, errors.ApiError, errors.ApiUnavailable) as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render.render(report, command=args.command, output=args.output))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
