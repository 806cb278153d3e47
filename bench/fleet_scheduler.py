"""The fleet benchmark's upper scheduling: a kube-scheduler of its own per configuration,
in place of the fleet's (stopped for the benchmark), started once every pod of the
configuration exists, so it starts on a full queue; configured with or without the
tensile-scheduler extender; the extender itself and its latency.

It is the default profile ("default-scheduler"): a pod naming a scheduler of its own would
take the name below too, where no scheduler of that name runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import fleet_plan as plan
import harness
import yaml

from devcluster import binaries, components, ports, schedulers
from devcluster.fleet import Fleet
from devcluster.ports import LOOPBACK
from devcluster.programs import Program


class UpperScheduler(Program):
    """kube-scheduler for the upper cluster, configured as the fleet's would be with the
    extender (`devcluster.components.scheduler_configuration`), or without it: the same
    configuration less its `extenders`. Ready when its /readyz answers (always allowed
    without credentials)."""

    def __init__(self, fleet: Fleet, *, config: str, extender: bool, log_dir: Path) -> None:
        kubeconfig = fleet.directory / "pki" / "upper-scheduler.kubeconfig"
        settings = yaml.safe_load(
            components.scheduler_configuration(
                kubeconfig=kubeconfig,
                url=f"https://{LOOPBACK}:{fleet.ports[EXTENDER_PORT]}",
                ca=fleet.upper.ca,
                client=schedulers.extender_client(fleet),
            )
        )
        if not extender:
            del settings["extenders"]
        path = log_dir / f"upper-scheduler-{config}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(settings))
        port = ports.pick()
        binary = binaries.ensure(build=False)["kube-scheduler"]
        super().__init__(
            process_name=f"upper-scheduler-{config}",
            argv=[
                str(binary),
                f"--config={path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                "--profiling=false",
                "--v=1",
            ],
            log=log_dir / f"upper-scheduler-{config}.log",
            endpoint=f"https://{LOOPBACK}:{port}",
        )


# -- the extender ---------------------------------------------------------------------------------

EXTENDER_PORT = "upper-scheduler-extender"
"""Where the fleet (started with `scheduler_extender`) reserved the extender's port."""


def extender_missing() -> str | None:
    """Why configurations with the extender cannot run here (None: they can)."""
    if importlib.util.find_spec("scheduler") is None:
        return "the extender configurations need the tensile-scheduler program (package scheduler)"
    return None


def extender(fleet: Fleet, *, config: str, slices: bool, log_dir: Path) -> Program:
    """The tensile-scheduler extender for configuration `config` (with namespace quota
    slices when `slices`), on the port the fleet reserved; not started yet."""
    return schedulers.SchedulerExtenderProcess(
        fleet, log_dir=log_dir, name=f"extender-{config}", args=["--log-level=info"]
    )


EXTENDER_HISTOGRAM = "tensile_scheduler_extender_duration_seconds"


def extender_latency(metrics: str) -> tuple[float | None, float | None]:
    """(p50, p99) seconds of the extender's calls, from its request duration histogram in
    its `metrics` text (every verb together)."""
    buckets: dict[float, float] = {}
    for labels, value in harness.samples(metrics, EXTENDER_HISTOGRAM + "_bucket").items():
        le = dict(labels)["le"]
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + value
    return plan.histogram_quantile(0.5, buckets), plan.histogram_quantile(0.99, buckets)
