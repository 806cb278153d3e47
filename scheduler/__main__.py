"""The `tensile-scheduler` command: flags -> settings -> run (the start, the exits and the
signals are every program's: `tensile.serving.program`).

Exit codes: 0 after a clean stop (SIGTERM/SIGINT) and for `version`/`--version`; 1 when it
cannot start (a busy port, certificate files that cannot be loaded); 2 for invalid flags or
an upper cluster configuration that cannot be loaded.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from scheduler import cli
from scheduler.service import Extender
from scheduler.settings import Settings
from tensile.kube import config
from tensile.serving import program

logger = logging.getLogger("scheduler")


def _load(settings: Settings) -> config.ConnectionInfo:
    """The upper cluster's kubeconfig (--kubeconfig). Raises config.ConfigError."""
    return config.load(settings.kubeconfig)


async def _run(
    settings: Settings, upper: config.ConnectionInfo, stopping: program.Stopping
) -> None:
    """The extender's assembly: run until stopped."""
    extender = Extender(settings, upper=upper)
    with stopping.calls(extender.stop):
        logger.info(
            "tensile-scheduler starting (upper %s, virtual nodes %r)",
            settings.kubeconfig or "in-cluster or $KUBECONFIG",
            settings.virtual_node_selector,
        )
        await extender.run()


PROGRAM = program.Program(
    name="tensile-scheduler",
    parse=cli.parse,
    logging=program.logging_of,
    load=_load,
    run=_run,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the extender; returns the exit code (see the module docstring)."""
    return program.main(PROGRAM, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
