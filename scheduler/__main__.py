"""The `tensile-scheduler` command: flags -> settings -> run.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT) and for --version; 1 when it cannot start
(a busy port, certificate files that cannot be loaded); 2 for invalid flags or an upper
cluster configuration that cannot be loaded.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

from scheduler import cli
from scheduler.service import Extender
from tensile.kube import config
from tensile.serving import flags, logs, shutdown
from tensile.serving.lifecycle import StartupError

logger = logging.getLogger("scheduler")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the extender; returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_version(args):
        print(f"tensile-scheduler {importlib.metadata.version('tensile')}")
        return 0
    try:
        settings = cli.parse(args)
    except flags.UsageError as exc:
        print(f"tensile-scheduler: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    try:
        upper = config.load(settings.kubeconfig)
    except config.ConfigError as exc:
        print(f"tensile-scheduler: error: {exc}", file=sys.stderr)
        return 2
    extender = Extender(settings, upper=upper)
    try:
        asyncio.run(_run(extender))
    except StartupError as exc:
        logger.error("tensile-scheduler stopped: %s", exc)
        return 1
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C
        return 130
    return 0


async def _run(extender: Extender) -> None:
    with shutdown.stop_on_signals(extender.stop):
        logger.info(
            "tensile-scheduler starting (upper %s, virtual nodes %r)",
            extender.settings.kubeconfig or "in-cluster or $KUBECONFIG",
            extender.settings.virtual_node_selector,
        )
        await extender.run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
