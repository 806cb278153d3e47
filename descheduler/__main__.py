"""The `tensile-descheduler` command: flags -> settings -> client -> caches -> rounds.

Exit codes: 0 after SIGTERM/SIGINT (the Lease released) or after the one round of
`--descheduling-interval=0`, and for `version`/`--version`; 1 when the upper cluster cannot
be reached at start, the metrics address cannot be listened on, or the Lease or the
avoidance record could never be written (`preflight`: a missing namespace it may not create,
missing RBAC); 2 for invalid flags, a bad policy file or kubeconfig.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from descheduler import cli, preflight
from descheduler.loop import Descheduler
from descheduler.settings import Settings
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.serving import election_flags, logs, version
from tensile.serving.endpoints import Health, metrics_server
from tensile.serving.flags import UsageError, VersionRequested
from tensile.serving.lifecycle import Runner
from tensile.serving.shutdown import stop_on_signals

logger = logging.getLogger("descheduler")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the descheduler; returns the exit code."""
    try:
        settings, warnings = cli.parse(sys.argv[1:] if argv is None else argv)
    except VersionRequested:
        print(version.text("tensile-descheduler"))
        return 0
    except UsageError as exc:
        print(f"tensile-descheduler: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    for warning in (*settings.notes, *warnings):
        logger.warning("%s", warning)
    try:
        info = config.load(settings.kubeconfig)
    except config.ConfigError as exc:
        print(f"tensile-descheduler: error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(settings, info))
    except (errors.ApiUnavailable, errors.ApiError, OSError, preflight.PreflightFailed) as exc:
        logger.error("tensile-descheduler stopped: %s", exc)
        return 1
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C
        return 130
    return 0


async def _run(settings: Settings, info: config.ConnectionInfo) -> None:
    holder = (
        settings.leader_election.identity if settings.leader_election else election_flags.identity()
    )
    async with (
        ApiClient(
            info,
            name="upper",
            qps=settings.qps,
            burst=settings.burst,
            user_agent=f"tensile-descheduler/{holder}",
        ) as client,
        # Events wait behind neither moves nor Lease renewals (the kubelet's split).
        client.sibling(
            name="upper-events", qps=10.0, burst=50, timeout=30.0, connections=2
        ) as events,
    ):
        await client.request("GET", "/version")  # reachable at start, or exit 1
        await preflight.ensure(client, settings)  # the Lease and the record can be kept, or exit 1
        descheduler = Descheduler(client=client, events=events, settings=settings, identity=holder)
        health = Health()
        health.add_check("informers", descheduler.not_synced)
        # The one round of interval 0 ends the program; a signal ends any other.
        runner = Runner(startup_timeout=0, shutdown_timeout=None, stop_when_done=True)
        async with metrics_server(settings.metrics_addr, health=health):
            logger.info(
                "tensile-descheduler %s starting (upper %s, every %gs%s%s)",
                holder,
                info.server,
                settings.interval,
                ", dry run" if settings.moves.dry_run else "",
                "" if settings.leader_election else ", without leader election",
            )
            with stop_on_signals(runner.stop):
                await runner.run([descheduler])
    logger.info("tensile-descheduler %s stopped", holder)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
