"""`kubectl-tensile` (run as `kubectl tensile ...`): flags -> clusters -> report -> stdout.

    kubectl tensile status [-o text|json|yaml] [--lower NODE=KUBECONFIG ...]
    kubectl tensile why POD [-n NAMESPACE] [-o ...] [--lower NODE=KUBECONFIG ...]

The upper cluster is found as kubectl finds it: --kubeconfig, else $KUBECONFIG, else
~/.kube/config (else in-cluster), with --context choosing a context; the namespace of `why`
is -n, else the context's, else "default".

Exit codes: 0 reported (and for `version`/`--version`); 1 the upper cluster did not answer
or the pod does not exist; 2 invalid flags or kubeconfig (the parsing, the version and the
exits are every program's: `tensile.serving.program`).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kubectl_tensile import gather, render
from tensile.contracts import avoidance
from tensile.kube import config, errors
from tensile.serving import flags, program


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


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the command line asks for."""

    command: str
    """status or why."""
    pod: str | None
    """why: the pod's name."""
    namespace: str | None
    """why: -n (None: the context's, else "default")."""
    output: str
    """text, json or yaml."""
    kubeconfig: str | None
    context: str | None
    lowers: tuple[str, ...]
    """--lower NODE=KUBECONFIG items."""
    avoid_configmap: tuple[str, str]


def parse(argv: Sequence[str]) -> Request:
    """The request of `argv`. Raises flags.UsageError naming the flag, VersionRequested."""
    args = _parser().parse_args(list(argv))
    if args.command == "why" and not args.pod:
        raise flags.UsageError("why needs the pod's name: kubectl tensile why POD")
    if args.command == "status" and args.pod:
        raise flags.UsageError(f"status takes no pod (got {args.pod!r})")
    return Request(
        command=args.command,
        pod=args.pod,
        namespace=args.namespace,
        output=args.output,
        kubeconfig=args.kubeconfig,
        context=args.context,
        lowers=tuple(args.lower),
        avoid_configmap=flags.namespaced(args.avoid_configmap, "--avoid-configmap"),
    )


def _load(request: Request) -> gather.Target:
    """The clusters to read. Raises config.ConfigError, flags.UsageError."""
    return gather.Target(
        upper=config.load(request.kubeconfig, context=request.context),
        lowers=_lowers(request.lowers),
        avoid_configmap=request.avoid_configmap,
    )


async def _run(request: Request, target: gather.Target, _stopping: program.Stopping) -> None:
    """Gather the report and write it on stdout. Raises gather.NoSuchPod, errors.ApiError,
    errors.ApiUnavailable."""
    now = dt.datetime.now(dt.UTC)
    if request.command == "status":
        report = await gather.status_report(target, now=now)
    else:
        assert request.pod is not None  # parse: why has its pod
        namespace = request.namespace or _context_namespace(request.kubeconfig, request.context)
        report = await gather.why_report(target, namespace=namespace, name=request.pod, now=now)
    sys.stdout.write(render.render(report, command=request.command, output=request.output))


PROGRAM = program.Program(
    name="kubectl-tensile",
    parse=parse,
    load=_load,
    run=_run,
    failures=(gather.NoSuchPod, errors.ApiError, errors.ApiUnavailable),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the plugin; returns the exit code (see the module docstring)."""
    return program.main(PROGRAM, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
