"""How long the descheduler has seen pods unplaceable (`descheduler.waits`): one clock, its
own; the lower cluster's transition times only tell one spell from the next."""

from __future__ import annotations

from typing import Any

import pytest

from descheduler.waits import Sighting, Waits, sighting

T0 = "2026-03-01T12:00:00Z"
T1 = "2026-03-01T12:05:00Z"


def pod(
    *,
    status: str = "False",
    reason: str = "Unschedulable",
    transition: str | None = T0,
    phase: str = "Pending",
    message: str = "0/4 nodes are available: 4 Insufficient cpu.",
    uid: str = "u1",
    **meta: Any,
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": "PodScheduled", "status": status, "reason": reason, "message": message,
    }  # fmt: skip
    if transition is not None:
        condition["lastTransitionTime"] = transition
    return {
        "metadata": {"name": "web-1", "namespace": "shop", "uid": uid, **meta},
        "status": {"phase": phase, "conditions": [condition]},
    }


SEEN = Sighting(since=10.0, transition=T0)


@pytest.mark.parametrize(
    ("previous", "found", "expected"),
    [
        (None, pod(), Sighting(since=50.0, transition=T0)),  # first seen now
        (SEEN, pod(), SEEN),  # the same spell: counted from when it was first seen
        (SEEN, pod(message="0/4 nodes: 4 Too many pods."), SEEN),  # the scheduler retried
        (SEEN, pod(reason="SchedulerError"), SEEN),
        (SEEN, pod(transition=T1), Sighting(since=50.0, transition=T1)),  # a new spell
        (SEEN, pod(transition=None), Sighting(since=50.0, transition="")),
        (Sighting(since=1.0, transition=""), pod(transition=None),
         Sighting(since=1.0, transition="")),
        (SEEN, pod(status="True", reason=""), None),  # placed below
        (SEEN, pod(reason="SchedulingGated"), None),
        (SEEN, pod(phase="Running"), None),
        (SEEN, pod(deletionTimestamp=T1), None),
        (None, {"metadata": {"uid": "u1"}}, None),
        (None, {"metadata": "x", "status": ["y"]}, None),
    ],
)  # fmt: skip
def test_a_sighting_lasts_as_long_as_the_spell(
    previous: Sighting | None, found: dict[str, Any], expected: Sighting | None
) -> None:
    assert sighting(previous, found, at=50.0) == expected


def test_waits_count_on_the_descheduler_clock_from_the_first_sight() -> None:
    now = [100.0]
    waits = Waits(clock=lambda: now[0])
    handlers = waits.handlers()
    assert handlers.on_add is not None
    assert handlers.on_modify is not None
    assert handlers.on_delete is not None
    # Stamped an hour ago by a lower clock far behind: it counts from now all the same.
    handlers.on_add(pod(transition="2026-03-01T11:00:00Z"))
    handlers.on_add(pod(uid="u2", status="True", reason=""))  # placed: nothing to count
    now[0] = 130.0
    handlers.on_modify(pod(transition="2026-03-01T11:00:00Z", message="again"))
    assert waits.waited() == {"u1": 30.0}
    handlers.on_modify(pod(uid="u2"))
    now[0] = 161.0
    assert waits.waited() == {"u1": 61.0, "u2": 31.0}
    handlers.on_modify(pod(status="True", reason=""))  # placed below after all
    handlers.on_modify(pod(transition=T1))  # and unplaceable again: a new spell
    handlers.on_delete(pod(uid="u2"))
    now[0] = 170.0
    assert waits.waited() == {"u1": 9.0}
    handlers.on_add({"metadata": {}})  # no UID: nothing to key it by
    assert waits.waited() == {"u1": 9.0}
