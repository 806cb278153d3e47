"""client-go's leader-election flags (component-base's names: --leader-elect,
--leader-elect-lease-duration, --leader-elect-renew-deadline, --leader-elect-retry-period,
--leader-elect-resource-namespace, --leader-elect-resource-name), one definition for every
tensile command that runs replicas (the descheduler, the virtual node)."""

from __future__ import annotations

import argparse
import socket
import uuid

from tensile.kube.leaderelection import ElectionConfigError, LeaderElectionSettings
from tensile.serving import flags
from tensile.serving.flags import UsageError


def add_flags(
    parser: argparse.ArgumentParser,
    *,
    elect: bool,
    namespace: str,
    name: str,
    name_help: str = "",
) -> None:
    """Add the six flags to `parser`. `elect` is --leader-elect's default, `namespace` and
    `name` the Lease's defaults ("" for `name`: the command derives it, `name_help` says
    how). Durations are seconds or Go durations; defaults are client-go's (15s, 10s, 2s)."""
    a = parser.add_argument
    a(
        "--leader-elect",
        type=flags.boolean,
        nargs="?",
        const=True,
        default=elect,
        help=f"compete for a Lease; only its holder acts (default {str(elect).lower()})",
    )
    a(
        "--leader-elect-lease-duration",
        type=flags.duration,
        default=15.0,
        help="how long a standby waits after the Lease last changed before it takes over "
        "(default 15s)",
    )
    a(
        "--leader-elect-renew-deadline",
        type=flags.duration,
        default=10.0,
        help="how long the leader tries to renew before it stops leading (default 10s)",
    )
    a(
        "--leader-elect-retry-period",
        type=flags.duration,
        default=2.0,
        help="time between attempts to acquire or renew the Lease (default 2s)",
    )
    a(
        "--leader-elect-resource-namespace",
        default=namespace,
        help=f"namespace of the Lease (default {namespace})",
    )
    a(
        "--leader-elect-resource-name",
        default=name,
        help=f"name of the Lease (default {name or name_help})",
    )


def identity() -> str:
    """Return this process's holderIdentity: host name, "_", a fresh UUID (client-go's
    convention: unique even for two processes on one host)."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def election_settings(
    args: argparse.Namespace, *, holder: str | None = None, name: str = ""
) -> LeaderElectionSettings | None:
    """Return the settings the flags of `add_flags` give (None with --leader-elect=false).
    `holder` is the identity (default: `identity()`); `name` replaces an empty
    --leader-elect-resource-name. Raises UsageError naming the flag."""
    if not args.leader_elect:
        return None
    try:
        return LeaderElectionSettings(
            namespace=flags.namespace_name(
                args.leader_elect_resource_namespace, "--leader-elect-resource-namespace"
            ),
            name=flags.object_name(
                args.leader_elect_resource_name or name, "--leader-elect-resource-name"
            ),
            identity=holder or identity(),
            lease_duration=args.leader_elect_lease_duration,
            renew_deadline=args.leader_elect_renew_deadline,
            retry_period=args.leader_elect_retry_period,
        )
    except ElectionConfigError as exc:
        raise UsageError(f"--leader-elect-*: {exc}") from None
