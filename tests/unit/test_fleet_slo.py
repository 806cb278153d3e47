"""The fleet benchmark's latency objectives (bench/fleet_slo.py): each stage is measured
between the right two points of a pod's upper and lower timelines, per lower cluster; a
pod missing a point is left out of that stage and said so; the baselines come from the
pods each cluster ran alone; and a stage meets its objective only when its p99 is within
one second of its baseline's; the extender's slow collector pauses are counted from its
histogram."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fleet_inside
import fleet_scheduler
import fleet_slo as slo


def _crossing(cluster: str, start: float) -> slo.Crossing:
    return slo.Crossing(
        cluster=cluster,
        upper=slo.Timeline(seen=start, running=start + 3.0, deleting=start + 10.0, gone=start + 12),
        lower=slo.Timeline(seen=start + 0.5, running=start + 2.0, gone=start + 11.0),
    )


def test_each_stage_is_measured_between_its_two_points_per_cluster() -> None:
    partial = slo.Crossing(cluster="lower-2", upper=slo.Timeline(seen=0.0))  # never made below
    stages = slo.stage_samples([_crossing("lower", 0.0), _crossing("lower-2", 5.0), partial])
    assert stages["created"] == {"lower": [0.5], "lower-2": [0.5]}
    assert stages["running"] == {"lower": [1.0], "lower-2": [1.0]}
    assert stages["deleted"] == {"lower": [1.0], "lower-2": [1.0]}
    assert stages["end to end"] == {"lower": [3.0], "lower-2": [3.0]}


def test_baselines_come_from_each_cluster_alone() -> None:
    lines = {"lower": [slo.Timeline(sent=1.0, seen=1.25, running=2.0, delete_sent=5.0, gone=5.5)]}
    assert slo.baseline_samples(lines, side="lower") == {
        "lower create -> seen": {"lower": [0.25]},
        "lower create -> Running": {"lower": [1.0]},
        "lower delete -> gone": {"lower": [0.5]},
    }


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 0.99, None), ([3.0, 1.0, 2.0], 0.5, 2.0), (list(range(1, 101)), 0.99, 99)],
)
def test_quantile_is_nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert slo.quantile(values, q) == expected


def test_a_stage_meets_its_objective_only_within_a_second_of_its_baseline() -> None:
    stages = {
        "created": {"lower": [0.2] * 99 + [1.2]},  # p99 0.2 s
        "running": {"lower": [1.6] * 100},  # 1.5 s beyond
        "deleted": {},
        "end to end": {"lower": [2.0] * 100},
    }
    baselines = {
        "lower create -> seen": {"lower": [0.1] * 100},
        "upper create -> seen": {"upper": [0.1] * 100},
        "lower delete -> gone": {"lower": [0.1] * 100},
        "upper create -> Running": {"upper": [1.5] * 100},
    }
    met = {v.stage: v.met for v in slo.verdicts(stages, baselines)}
    assert met == {"created": True, "running": False, "deleted": False}  # end to end: none
    lines = slo.report(stages, baselines, pods=100)
    verdicts = [line for line in lines if line.startswith("SLO")]
    assert verdicts[0].endswith("beyond +100 ms (objective <= 1000 ms): met")
    assert "beyond +1500 ms" in verdicts[1]
    assert "NOT met" in verdicts[1]
    assert "100 of 100 pods not seen through it" in verdicts[2]
    # the upper cluster's baseline stands for every lower cluster's "running" row
    running_rows = [line for line in lines if line.startswith("lower Running -> upper Running")]
    assert [row.split()[-2] for row in running_rows] == ["100", "100"]
    end_to_end = [line for line in lines if line.startswith("upper bind -> upper Running")]
    assert [row.split()[-1] for row in end_to_end] == ["+500", "+500"]


def test_the_extenders_slow_collector_pauses_are_counted_from_its_histogram() -> None:
    text = "\n".join(
        [
            'tensile_scheduler_gc_pause_seconds_bucket{generation="0",le="0.005"} 40.0',
            'tensile_scheduler_gc_pause_seconds_bucket{generation="0",le="+Inf"} 41.0',
            'tensile_scheduler_gc_pause_seconds_bucket{generation="2",le="0.005"} 1.0',
            'tensile_scheduler_gc_pause_seconds_bucket{generation="2",le="+Inf"} 3.0',
        ]
    )
    assert fleet_scheduler.slow_pauses(text) == 3.0
    assert fleet_scheduler.slow_pauses("") is None


def test_the_stages_begin_when_a_watch_could_know_and_the_upper_share_is_reported_apart() -> None:
    # The create was answered at 0 but the upper told its watchers at 3 (a loaded
    # apiserver): the 3 s are the upper's, not the virtual node's.
    slow = slo.Crossing(
        cluster="lower",
        upper=slo.Timeline(
            committed=0.0, seen=3.0, running=6.0, delete_committed=10.0, deleting=12.0
        ),
        lower=slo.Timeline(seen=3.5, running=5.0, gone=12.5),
    )
    stages = slo.stage_samples([slow])
    assert stages["created"] == {"lower": [0.5]}
    assert stages["deleted"] == {"lower": [0.5]}
    assert stages["end to end"] == {"lower": [6.0]}  # what a user waits: from the answer
    delivery = slo.upper_delivery([slow])
    assert delivery == {"bound": {"lower": [3.0]}, "deleting": {"lower": [2.0]}}
    lines = slo.report(stages, {}, pods=1, delivery=delivery)
    share = [line for line in lines if line.startswith("upper bind answered -> seen")]
    assert len(share) == 1
    assert share[0].split()[-2:] == ["3000", "3000"]


def test_the_extender_meets_its_target_alone_or_by_what_it_adds_to_its_baseline() -> None:
    assert fleet_scheduler.verdict(0.004, None).endswith("met]")
    assert fleet_scheduler.verdict(0.030, None).endswith("MISSED]")
    assert fleet_scheduler.verdict(0.030, 0.027).endswith("+3.00 ms its own [<= 5 ms: met]")
    assert fleet_scheduler.verdict(0.030, 0.020).endswith("MISSED]")


def test_inside_the_virtual_nodes_counts_the_rounds_samples_of_every_node() -> None:
    def text(fast: float, slow: float) -> str:
        name = "tensile_workqueue_queue_duration_seconds_bucket"
        return "\n".join(
            [
                f'{name}{{le="0.1",queue="pods_from_upper"}} {fast}',
                f'{name}{{le="+Inf",queue="pods_from_upper"}} {fast + slow}',
                f'{name}{{le="0.1",queue="status_from_lower"}} 1000.0',
                f'{name}{{le="+Inf",queue="status_from_lower"}} 1000.0',
            ]
        )

    before = [text(5, 0), text(0, 0)]
    after = [text(55, 0), text(100, 2)]  # 150 quick and 2 slow keys in the round
    buckets = fleet_inside.round_buckets(
        before,
        after,
        "tensile_workqueue_queue_duration_seconds",
        {"queue": "pods_from_upper"},
    )
    assert buckets == {0.1: 150.0, float("inf"): 152.0}
    lines = fleet_inside.report(before, after)
    assert lines[1].split()[-3:] == ["152", "51", "100"]  # count, p50, p99 (ms), interpolated
    assert lines[3].split()[-3:] == ["0", "-", "-"]  # nothing of status_from_lower moved
