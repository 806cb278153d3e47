"""`tensile-devcluster up|down|env|shell --dir DIR`: a local fleet of clusters for people.

`up` returns once every cluster is ready and leaves them running, with `upper.kubeconfig`,
`lower.kubeconfig` (`upper-2.kubeconfig`, `lower-2.kubeconfig`, ... for the others), the
certificates a virtual node needs and a state file in DIR; `down` stops them and removes
what `up` wrote; `env` prints shell `export` lines (also in DIR/env.sh); `shell` runs a
shell, or a command, inside the fleet's private network with those variables set.
Exit codes: 0 success, 1 the fleet failed to start or stop, 2 bad usage or missing
binaries; `shell` exits with its command's code.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from devcluster import binaries, cluster, netns, processes
from devcluster.fleet import ENV_FILE, Fleet, remove_created, stop_leftovers
from devcluster.rest import ApiStatusError
from tensile.contracts.labels import is_label_value
from tensile.kube import quantity
from tensile.kube.names import qualified_name_problem

_CAPACITY_KEYS = ("cpu", "memory", "pods")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensile-devcluster",
        description="Run a local fleet of Kubernetes clusters: uppers and lowers on one etcd.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="start the fleet and return when it is ready",
        epilog=(
            "CLUSTER is a lower cluster's name: lower, lower-2, ... Examples: "
            "--lowers 2 --lower-nodes lower-2=1 --node-capacity lower-2:cpu=2,memory=4Gi "
            "--node-label lower:0:disk=ssd"
        ),
    )
    up.add_argument("--dir", required=True, type=Path, help="state directory")
    up.add_argument("--uppers", type=_positive, default=1, help="upper clusters (default 1)")
    up.add_argument("--lowers", type=_positive, default=1, help="lower clusters (default 1)")
    up.add_argument(
        "--lower-nodes",
        action="append",
        default=[],
        metavar="[CLUSTER=]N",
        help="kwok nodes per lower cluster (default 3); CLUSTER=N for one cluster; repeatable",
    )
    up.add_argument("--node-cpu", default="32", help="CPU of each kwok node (quantity)")
    up.add_argument("--node-memory", default="256Gi", help="memory of each kwok node (quantity)")
    up.add_argument("--node-pods", default="110", help="pod capacity of each kwok node")
    up.add_argument(
        "--node-capacity",
        action="append",
        default=[],
        metavar="CLUSTER:cpu=Q,memory=Q,pods=N",
        help="capacity of every node of one lower cluster (any of the three keys); repeatable",
    )
    up.add_argument(
        "--node-label",
        action="append",
        default=[],
        metavar="CLUSTER:INDEX:KEY=VALUE",
        help="a label of node INDEX (from 0) of lower cluster CLUSTER; repeatable",
    )
    up.add_argument(
        "--network",
        choices=cluster.NETWORK_MODES,
        default="auto",
        help="private: a network namespace of its own where nodes publish 192.0.2.x "
        "addresses (root on Linux); host: loopback only; auto (default): private if possible",
    )
    up.add_argument(
        "--no-metrics-server",
        action="store_true",
        help="do not run metrics-server for the upper clusters",
    )
    up.add_argument(
        "--scheduler-extender",
        action="store_true",
        help="run the upper kube-schedulers with tensile-scheduler as their (ignorable) "
        "extender, on a port reserved for it (devcluster.schedulers starts it)",
    )
    for flag, what in (
        ("--etcd-port", "etcd"),
        ("--upper-port", "first upper apiserver"),
        ("--lower-port", "first lower apiserver"),
    ):
        up.add_argument(
            flag,
            type=_port,
            default=0,
            help=f"preferred {what} port on 127.0.0.1; another is chosen if it is in use",
        )
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    down = sub.add_parser("down", help="stop the fleet and remove its state")
    down.add_argument("--dir", required=True, type=Path, help="state directory")
    env = sub.add_parser("env", help="print export lines for the fleet")
    env.add_argument("--dir", required=True, type=Path, help="state directory")
    shell = sub.add_parser(
        "shell",
        help="run a shell (or COMMAND) inside the fleet's network, with its variables set",
    )
    shell.add_argument("--dir", required=True, type=Path, help="state directory")
    shell.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    return parser


def _port(text: str) -> int:
    value = _non_negative(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


class _Usage(Exception):
    """A flag value is invalid; the message says which and why."""


def fleet_settings(args: argparse.Namespace) -> cluster.FleetSettings:
    """Turn `up`'s flags into FleetSettings. Raises _Usage naming the bad flag value."""
    names = cluster.cluster_names("lower", args.lowers)
    defaults = {
        "cpu": _quantity("--node-cpu", args.node_cpu),
        "memory": _quantity("--node-memory", args.node_memory),
        "pods": _quantity("--node-pods", args.node_pods),
    }
    counts = dict.fromkeys(names, 3)
    for item in args.lower_nodes:
        target, sep, value = item.rpartition("=")
        count = _count(f"--lower-nodes {item}", value)
        if sep:
            counts[_lower(f"--lower-nodes {item}", target, names)] = count
        else:
            counts = dict.fromkeys(names, count)
    capacity = {name: dict(defaults) for name in names}
    for item in args.node_capacity:
        target, sep, spec = item.partition(":")
        if not sep or not spec:
            raise _Usage(f"--node-capacity {item!r}: expected CLUSTER:cpu=Q,memory=Q,pods=N")
        name = _lower(f"--node-capacity {item}", target, names)
        for part in spec.split(","):
            key, eq, value = part.partition("=")
            if not eq or key not in _CAPACITY_KEYS:
                raise _Usage(
                    f"--node-capacity {item!r}: {part!r} is not one of cpu=Q, memory=Q, pods=N"
                )
            capacity[name][key] = _quantity(f"--node-capacity {item}", value)
    labels: dict[str, dict[int, dict[str, str]]] = {name: {} for name in names}
    for item in args.node_label:
        parts = item.split(":", 2)
        if len(parts) != 3 or "=" not in parts[2]:
            raise _Usage(f"--node-label {item!r}: expected CLUSTER:INDEX:KEY=VALUE")
        name = _lower(f"--node-label {item}", parts[0], names)
        index = _count(f"--node-label {item}", parts[1])
        if index >= counts[name]:
            raise _Usage(f"--node-label {item!r}: {name} has {counts[name]} nodes (indexes from 0)")
        key, _, value = parts[2].partition("=")
        if qualified_name_problem(key) is not None or not is_label_value(value):
            raise _Usage(f"--node-label {item!r}: not a valid label key=value")
        labels[name].setdefault(index, {})[key] = value
    return cluster.FleetSettings(
        uppers=args.uppers,
        lowers=tuple(
            cluster.LowerClusterSettings(
                nodes=counts[name],
                cpu=capacity[name]["cpu"],
                memory=capacity[name]["memory"],
                pods=capacity[name]["pods"],
                node_labels=labels[name],
            )
            for name in names
        ),
        network=args.network,
        metrics_server=not args.no_metrics_server,
        etcd_port=args.etcd_port,
        upper_port=args.upper_port,
        lower_port=args.lower_port,
        die_with_parent=False,
        startup_timeout=args.timeout,
        scheduler_extender=args.scheduler_extender,
    )


def _lower(flag: str, name: str, names: tuple[str, ...]) -> str:
    if name not in names:
        raise _Usage(f"{flag!r}: no lower cluster {name!r} (have {', '.join(names)})")
    return name


def _count(flag: str, text: str) -> int:
    try:
        return _non_negative(text)
    except argparse.ArgumentTypeError as exc:
        raise _Usage(f"{flag!r}: {exc}") from None


def _quantity(flag: str, text: str) -> str:
    try:
        value = quantity.parse_quantity(text)
    except ValueError as exc:
        raise _Usage(f"{flag} {text!r}: not a Kubernetes quantity ({exc})") from None
    if value <= 0:
        raise _Usage(f"{flag} {text!r}: must be more than zero")
    return text


def env_values(fleet: Fleet) -> dict[str, str]:
    """Return the variables of `fleet`: a kubeconfig per cluster, the virtual-node material
    of the first upper + lower cluster, the node address."""
    values = {
        f"TENSILE_{name.upper().replace('-', '_')}_KUBECONFIG": str(c.kubeconfig)
        for name, c in fleet.clusters.items()
    }
    values["KUBECONFIG"] = str(fleet.upper.kubeconfig)
    values["TENSILE_NODE_IP"] = fleet.node_ip
    values.update(fleet.vnode.env())
    return values


def env_lines(fleet: Fleet) -> list[str]:
    """Return `export` lines for `env_values(fleet)`, with a note on entering its network."""
    lines = [f"export {key}={shlex.quote(value)}" for key, value in env_values(fleet).items()]
    if fleet.network.private:
        lines.append(
            "# The fleet runs in a private network namespace: use these inside it, e.g. "
            f"`tensile-devcluster shell --dir {shlex.quote(str(fleet.directory))}`"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = _parser().parse_args(argv)
    directory: Path = args.dir.resolve()
    if args.command == "up":
        try:
            settings = fleet_settings(args)
        except _Usage as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return _up(settings, directory)
    if args.command == "down":
        return _down(directory)
    try:
        fleet = Fleet.attach(directory)
    except FileNotFoundError:
        print(
            f"error: no running fleet in {directory} (run `tensile-devcluster up`)",
            file=sys.stderr,
        )
        return 2
    if args.command == "env":
        print("\n".join(env_lines(fleet)))
        return 0
    return _shell(fleet, args.argv)


def _up(settings: cluster.FleetSettings, directory: Path) -> int:
    if (directory / cluster.STATE_FILE).exists():
        running = Fleet.attach(directory)
        alive = running.running()
        if alive and len(alive) == len(running.refs):
            print(f"a fleet is already running in {directory}", file=sys.stderr)
            return 0
        print(f"removing what is left of a stopped fleet in {directory}", file=sys.stderr)
        running.stop()
    # An `up` killed outright leaves only its process list: stop those and start afresh.
    stop_leftovers(directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with _signals_raise():
            fleet = Fleet.start(directory=directory, settings=settings)
    except (binaries.MissingBinaries, netns.NetworkError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (processes.ComponentDied, TimeoutError, OSError, ApiStatusError) as exc:
        print(f"error: the fleet did not start: {exc}", file=sys.stderr)
        return 1
    (directory / ENV_FILE).write_text("\n".join(env_lines(fleet)) + "\n")
    quoted = shlex.quote(str(directory))
    print(f"fleet ready in {directory} ({netns.describe(fleet.network)})")
    for c in fleet.clusters.values():
        nodes = f", nodes {', '.join(c.nodes)}" if c.nodes else ""
        print(f"  {c.name}: {c.server}  kubeconfig {c.kubeconfig}{nodes}")
    if fleet.network.private:
        print(f"enter its network: tensile-devcluster shell --dir {quoted}  (kubectl is set up)")
        print(f"  or run one command: tensile-devcluster shell --dir {quoted} -- kubectl get nodes")
    print(f"stop it with: tensile-devcluster down --dir {quoted}")
    return 0


def _shell(fleet: Fleet, argv: Sequence[str]) -> int:
    command = list(argv[1:] if argv and argv[0] == "--" else argv)
    try:
        fleet.join_network()
    except netns.NetworkError as exc:
        print(f"error: cannot enter the fleet's network: {exc}", file=sys.stderr)
        return 2
    env = {**os.environ, **env_values(fleet)}
    # kubectl comes with the test extra, beside this Python; helm (for the install guide's
    # `helm install`) is built with the control plane, when it is there.
    helm = binaries.cache_dir() / "helm"
    paths = [str(Path(sys.executable).parent), *([str(helm.parent)] if helm.exists() else [])]
    env["PATH"] = os.pathsep.join((*paths, env.get("PATH", "")))
    if not command:
        command = [env.get("SHELL") or "/bin/sh"]
        print(
            f"a shell in the fleet's network ({fleet.node_ip}); KUBECONFIG is "
            f"{fleet.upper.name}'s; exit to leave",
            file=sys.stderr,
        )
    try:
        os.execvpe(command[0], command, env)  # noqa: S606 - the user's own command
    except OSError as exc:
        print(f"error: cannot run {command[0]!r}: {exc}", file=sys.stderr)
    return 127


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
        fleet = Fleet.attach(directory)
    except FileNotFoundError:
        if stop_leftovers(directory):
            print(f"stopped the leftovers of an interrupted start in {directory}")
            return 0
        print(f"no fleet in {directory}; nothing to stop", file=sys.stderr)
        return 0
    fleet.stop(remove_state=False)
    leftover = fleet.running()
    if leftover:
        # The state stays, so `down` can be run again.
        print(f"error: still running after stop: {', '.join(leftover)}", file=sys.stderr)
        return 1
    remove_created(directory, owns_directory=False)
    print(f"fleet in {directory} stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
