"""`tensile-devcluster up|down|env --dir DIR`: the local cluster pair for people.

`up` returns once the pair is ready and leaves it running, with `upper.kubeconfig`,
`lower.kubeconfig`, the certificates a virtual node needs and a state file in DIR;
`down` stops it and removes what `up` wrote; `env` prints shell `export` lines (also in
DIR/env.sh).
Exit codes: 0 success, 1 the pair failed to start or stop, 2 bad usage or missing binaries.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from vnode.testing import binaries, cluster, processes
from vnode.testing.pair import ENV_FILE, ClusterPair, remove_created, stop_leftovers
from vnode.testing.rest import ApiStatusError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensile-devcluster",
        description="Run a local upper + lower Kubernetes control-plane pair.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the pair and return when it is ready")
    up.add_argument("--dir", required=True, type=Path, help="state directory")
    up.add_argument(
        "--lower-nodes", type=_non_negative, default=3, help="kwok nodes in the lower cluster"
    )
    up.add_argument("--node-cpu", default="32", help="CPU of each kwok node (quantity)")
    up.add_argument("--node-memory", default="256Gi", help="memory of each kwok node (quantity)")
    up.add_argument("--node-pods", default="110", help="pod capacity of each kwok node")
    for flag, what in (
        ("--etcd-port", "etcd"),
        ("--upper-port", "upper apiserver"),
        ("--lower-port", "lower apiserver"),
    ):
        up.add_argument(
            flag,
            type=_port,
            default=0,
            help=f"preferred {what} port on 127.0.0.1; another is chosen if it is in use",
        )
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    down = sub.add_parser("down", help="stop the pair and remove its state")
    down.add_argument("--dir", required=True, type=Path, help="state directory")
    env = sub.add_parser("env", help="print export lines for the pair")
    env.add_argument("--dir", required=True, type=Path, help="state directory")
    return parser


def _port(text: str) -> int:
    value = _non_negative(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def env_lines(pair: ClusterPair) -> list[str]:
    """Return `export` lines for the kubeconfigs and the virtual-node material of `pair`."""
    values = {
        "TENSILE_UPPER_KUBECONFIG": str(pair.upper.kubeconfig),
        "TENSILE_LOWER_KUBECONFIG": str(pair.lower.kubeconfig),
        "KUBECONFIG": str(pair.upper.kubeconfig),
        **pair.vnode.env(),
    }
    return [f"export {key}={shlex.quote(value)}" for key, value in values.items()]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = _parser().parse_args(argv)
    directory: Path = args.dir.resolve()
    if args.command == "up":
        return _up(args, directory)
    if args.command == "down":
        return _down(directory)
    try:
        pair = ClusterPair.attach(directory)
    except FileNotFoundError:
        print(
            f"error: no running pair in {directory} (run `tensile-devcluster up`)", file=sys.stderr
        )
        return 2
    print("\n".join(env_lines(pair)))
    return 0


def _up(args: argparse.Namespace, directory: Path) -> int:
    if (directory / cluster.STATE_FILE).exists():
        running = ClusterPair.attach(directory)
        alive = running.running()
        if alive and len(alive) == len(running.refs):
            print(f"a pair is already running in {directory}", file=sys.stderr)
            return 0
        print(f"removing what is left of a stopped pair in {directory}", file=sys.stderr)
        running.stop()
    # An `up` killed outright leaves only its process list: stop those and start afresh.
    stop_leftovers(directory)
    directory.mkdir(parents=True, exist_ok=True)
    settings = cluster.PairSettings(
        lower_nodes=args.lower_nodes,
        node_cpu=args.node_cpu,
        node_memory=args.node_memory,
        node_pods=args.node_pods,
        etcd_port=args.etcd_port,
        upper_port=args.upper_port,
        lower_port=args.lower_port,
        die_with_parent=False,
        startup_timeout=args.timeout,
    )
    try:
        with _signals_raise():
            pair = ClusterPair.start(directory=directory, settings=settings)
    except binaries.MissingBinaries as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (processes.ComponentDied, TimeoutError, OSError, ApiStatusError) as exc:
        print(f"error: the cluster pair did not start: {exc}", file=sys.stderr)
        return 1
    (directory / ENV_FILE).write_text("\n".join(env_lines(pair)) + "\n")
    print(f"cluster pair ready in {directory}")
    print(f"  upper: {pair.upper.server}  kubeconfig {pair.upper.kubeconfig}")
    print(f"  lower: {pair.lower.server}  kubeconfig {pair.lower.kubeconfig}")
    print(f"stop it with: tensile-devcluster down --dir {shlex.quote(str(directory))}")
    return 0


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into SystemExit, so an interrupted start-up cleans up."""

    def raise_exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, raise_exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _down(directory: Path) -> int:
    try:
        pair = ClusterPair.attach(directory)
    except FileNotFoundError:
        if stop_leftovers(directory):
            print(f"stopped the leftovers of an interrupted start in {directory}")
            return 0
        print(f"no pair in {directory}; nothing to stop", file=sys.stderr)
        return 0
    pair.stop(remove_state=False)
    leftover = pair.running()
    if leftover:
        # The state stays, so `down` can be run again.
        print(f"error: still running after stop: {', '.join(leftover)}", file=sys.stderr)
        return 1
    remove_created(directory, owns_directory=False)
    print(f"cluster pair in {directory} stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
