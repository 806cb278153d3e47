"""The `tensile-webhook` command: flags + env -> settings -> run.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT) and for --version; 1 when the webhook
cannot start (a busy port, certificate or CA files that cannot be loaded); 2 for invalid
flags or an upper cluster configuration that cannot be loaded.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from tensile.kube import config
from tensile.serving import flags, logs, shutdown, version
from tensile.serving.lifecycle import StartupError
from webhook import cli
from webhook.service import Webhook

logger = logging.getLogger("webhook")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the webhook; returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        settings = cli.parse(args)
    except flags.VersionRequested:
        print(version.text("tensile-webhook"))
        return 0
    except flags.UsageError as exc:
        print(f"tensile-webhook: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    for note in settings.notes:
        logger.warning("%s", note)
    try:
        upper = config.load(settings.kubeconfig, server=settings.master)
    except config.ConfigError as exc:
        print(f"tensile-webhook: error: {exc}", file=sys.stderr)
        return 2
    webhook = Webhook(settings, upper=upper)
    try:
        asyncio.run(_run(webhook))
    except StartupError as exc:
        logger.error("tensile-webhook stopped: %s", exc)
        return 1
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C
        return 130
    return 0


async def _run(webhook: Webhook) -> None:
    with shutdown.stop_on_signals(webhook.stop):
        logger.info(
            "tensile-webhook starting (upper %s, pods %r)",
            webhook.settings.kubeconfig or "in-cluster or $KUBECONFIG",
            webhook.settings.mutation.pod_selector.text,
        )
        await webhook.run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
