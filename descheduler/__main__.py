"""The `tensile-descheduler` command: flags -> settings -> client -> caches -> rounds (the
start, the exits and the signals are every program's: `tensile.serving.program`).

`/metrics` goes to the network on the HTTPS `--secure-port`, for callers the upper cluster
allows `get` on the non-resource URL `/metrics` (TokenReview and SubjectAccessReview,
`tensile.serving.delegated`), as kube-controller-manager serves its own; its certificate is
`--tls-cert-file`'s, or self-signed (`tensile.serving.generated`).

Exit codes: 0 after SIGTERM/SIGINT (the Lease released) or after the one round of
`--descheduling-interval=0`, and for `version`/`--version`; 1 when the upper cluster cannot
be reached at start, the secure port or the metrics address cannot be listened on, the
certificate files cannot be loaded, or the Lease or the
avoidance record could never be written (`preflight`: a missing namespace it may not create,
missing RBAC); 2 for invalid flags, a bad policy file or kubeconfig.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Sequence

from aiohttp import web

from descheduler import cli, preflight
from descheduler.loop import Descheduler
from descheduler.settings import Settings
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.serving import delegated, election_flags, endpoints, generated, program
from tensile.serving.endpoints import Health, healthz_server, metrics_server
from tensile.serving.https import HttpsServer, certificate_files, serving
from tensile.serving.lifecycle import Runner
from tensile.serving.preflight import PreflightFailed

logger = logging.getLogger("descheduler")


def _parse(argv: Sequence[str]) -> Settings:
    """The settings of `argv` (`descheduler.cli`), the policy file's warnings among the
    start-up notes. Raises UsageError, VersionRequested."""
    settings, warnings = cli.parse(argv)
    return dataclasses.replace(settings, notes=(*settings.notes, *warnings))


def _load(settings: Settings) -> config.ConnectionInfo:
    """The upper cluster's kubeconfig (--kubeconfig). Raises config.ConfigError."""
    return config.load(settings.kubeconfig)


def _secure_server(settings: Settings, *, reviews: ApiClient, health: Health) -> HttpsServer | None:
    """The HTTPS server of --secure-port: `/metrics` behind the upper cluster's reviews of
    its callers (`reviews`), `/healthz` and `/readyz` of `health` (None: --secure-port=0)."""
    server = settings.server
    if server is None:
        return None
    app = web.Application(
        middlewares=[delegated.metrics_guard(delegated.reviews(reviews), label="descheduler")]
    )
    endpoints.add_routes(app, health=health)
    tls = (
        certificate_files(server, label="descheduler")
        if server.from_files
        else generated.GeneratedCertificate(
            names=generated.host_names(server.address), label="descheduler"
        )
    )
    return HttpsServer(
        server, app=app, tls=tls, name="secure-serving", label="descheduler", health=health
    )


async def _run(settings: Settings, info: config.ConnectionInfo, stopping: program.Stopping) -> None:
    """The descheduler's assembly: client, caches, rounds; until stopped or, with
    --descheduling-interval=0, after one round."""
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
        delegated.review_client(client) as reviews,
    ):
        await client.request("GET", "/version")  # reachable at start, or exit 1
        await preflight.ensure(client, settings)  # the Lease and the record can be kept, or exit 1
        descheduler = Descheduler(client=client, events=events, settings=settings, identity=holder)
        health = Health()
        health.add_check("informers", descheduler.not_synced)
        # The one round of interval 0 ends the program; a signal ends any other.
        runner = Runner(startup_timeout=0, shutdown_timeout=None, stop_when_done=True)
        secure = _secure_server(settings, reviews=reviews, health=health)
        async with (
            metrics_server(settings.metrics_addr, health=health),
            healthz_server(settings.healthz_addr, health=health),
            serving(secure) if secure is not None else contextlib.nullcontext(),
        ):
            logger.info(
                "tensile-descheduler %s starting (upper %s, every %gs%s%s)",
                holder,
                info.server,
                settings.interval,
                ", dry run" if settings.moves.dry_run else "",
                "" if settings.leader_election else ", without leader election",
            )
            with stopping.calls(runner.stop):
                await runner.run([descheduler])
    logger.info("tensile-descheduler %s stopped", holder)


PROGRAM = program.Program(
    name="tensile-descheduler",
    parse=_parse,
    logging=program.logging_of,
    load=_load,
    run=_run,
    failures=(errors.ApiUnavailable, errors.ApiError, OSError, PreflightFailed),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the descheduler; returns the exit code (see the module docstring)."""
    return program.main(PROGRAM, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
