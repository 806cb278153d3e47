"""The `tensile-webhook` command: flags + env -> settings -> run (the start, the exits and
the signals are every program's: `tensile.serving.program`).

Exit codes: 0 after a clean stop (SIGTERM/SIGINT) and for `version`/`--version`; 1 when the
webhook cannot start (a busy port, certificate or CA files that cannot be loaded); 2 for
invalid flags or an upper cluster configuration that cannot be loaded.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from tensile.kube import config
from tensile.serving import program
from webhook import cli
from webhook.service import Webhook
from webhook.settings import Settings

logger = logging.getLogger("webhook")


def _load(settings: Settings) -> config.ConnectionInfo:
    """The upper cluster's kubeconfig (--kubeconfig, --master). Raises config.ConfigError."""
    return config.load(settings.kubeconfig, server=settings.master)


async def _run(
    settings: Settings, upper: config.ConnectionInfo, stopping: program.Stopping
) -> None:
    """The webhook's assembly: run until stopped."""
    webhook = Webhook(settings, upper=upper)
    with stopping.calls(webhook.stop):
        logger.info(
            "tensile-webhook starting (upper %s, pods %r)",
            settings.kubeconfig or "in-cluster or $KUBECONFIG",
            settings.mutation.pod_selector.text,
        )
        await webhook.run()


PROGRAM = program.Program(
    name="tensile-webhook",
    parse=cli.parse,
    logging=program.logging_of,
    load=_load,
    run=_run,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the webhook; returns the exit code (see the module docstring)."""
    return program.main(PROGRAM, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
