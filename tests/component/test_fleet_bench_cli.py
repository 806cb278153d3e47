"""bench/fleet.py's command line: it still runs as `make bench-fleet` runs it (the fleet
benchmark runs only by hand, so nothing else would notice its imports rot), and a scale or
a configuration it cannot run is refused at once, naming the flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import fleet  # noqa: E402 - the bench's modules import each other from bench/


def test_the_benchmark_runs_as_a_script_and_describes_its_flags() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "fleet.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--lower-clusters", "--nodes-per-cluster", "--pods", "--configs"):
        assert flag in done.stdout


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--lower-clusters", "1"], "--lower-clusters must be at least 2"),
        (["--pods", "10"], "--pods must be at least 50"),
        (
            ["--lower-clusters", "2", "--nodes-per-cluster", "20", "--pods", "2000"],
            "raise --nodes-per-cluster to 157",
        ),
        (["--configs", "a,x"], "--configs: a comma-separated list of distinct a, b, c"),
        (["--configs", "a,a"], "--configs: a comma-separated list of distinct a, b, c"),
        (["--unschedulable-timeout", "0"], "--unschedulable-timeout must be > 0"),
        (["--configs=", "--slo-pods=0"], "empty only with --slo-pods"),
        (["--slo-rate", "0"], "--slo-rate > 0"),
    ],
)
def test_a_run_it_cannot_do_is_refused_before_anything_starts(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        fleet.parse(args)
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


def test_the_defaults_are_the_full_scale_run() -> None:
    args = fleet.parse([])
    assert (args.lower_clusters, args.nodes_per_cluster, args.pods) == (10, 1000, 10_000)
    assert args.configs == ["a", "b", "c"]
    assert (args.slo_pods, args.slo_rate) == (2000, 40.0)


def test_quick_is_the_smallest_run_and_flags_given_win() -> None:
    args = fleet.parse(["--quick", "--slo-pods", "50"])
    assert (args.lower_clusters, args.nodes_per_cluster, args.pods) == (2, 20, 200)
    assert args.configs == ["b"]
    assert (args.slo_pods, args.slo_rate) == (50, 20.0)


def test_the_latency_objectives_may_run_alone() -> None:
    assert fleet.parse(["--configs="]).configs == []
