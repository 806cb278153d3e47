"""The mirror's writes in flight (`tensile.kube.mirror.inflight.WritesInFlight`), as a table.

Each row is what happened at one target key, in order: the mirror's own writes (`creating`
a create sent, `created` its answer, `abandoned` a create that made nothing, `deleted`) and
what the target informer showed (`shown` an add or change, `gone` a deletion); then the
target as the mirror knows it, given what the cache holds at the end, and how many writes
it still remembers. The pure correction itself (`known_target`) is tabled in
test_mirror_decide.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tensile.contracts.objects import Obj
from tensile.kube.mirror.inflight import WritesInFlight

TARGET_KEY = "ns/cfg"


def obj(uid: str) -> Obj:
    return {"metadata": {"name": "cfg", "namespace": "ns", "uid": uid}}


MADE = obj("made")
"""What the mirror's create made."""
OLD = obj("old")
"""The copy there before (replaced by the mirror, or deleted by someone)."""

Step = tuple[str, Obj | None]


@dataclass(frozen=True, kw_only=True)
class Row:
    steps: tuple[Step, ...]
    cached: Obj | None
    """What the target informer's cache holds at the key at the end."""
    known: Obj | None
    remembered: int = 0
    """Writes still remembered at the end (after `known` was asked)."""


ROWS = [
    pytest.param(
        Row(steps=(("creating", None), ("created", MADE)), cached=None, known=MADE, remembered=1),
        id="made, not yet shown: taken as present",
    ),
    pytest.param(
        Row(
            steps=(("creating", None), ("created", MADE), ("shown", MADE)), cached=MADE, known=MADE
        ),
        id="made, shown: the cache has it, nothing remembered",
    ),
    pytest.param(
        Row(
            steps=(("creating", None), ("created", MADE), ("shown", MADE), ("gone", MADE)),
            cached=None,
            known=None,
        ),
        id="made, shown, deleted by someone before the worker looked: gone, not masked",
    ),
    pytest.param(
        Row(
            steps=(("creating", None), ("created", MADE), ("gone", MADE)),
            cached=None,
            known=None,
        ),
        id="made, its add shown before the answer, then its deletion: gone",
    ),
    pytest.param(
        Row(
            steps=(("creating", None), ("shown", MADE), ("gone", MADE), ("created", MADE)),
            cached=None,
            known=None,
        ),
        id="made, shown and deleted before the create's answer came: gone, not remembered",
    ),
    pytest.param(
        Row(
            steps=(("deleted", OLD), ("creating", None), ("gone", OLD), ("created", MADE)),
            cached=None,
            known=MADE,
            remembered=1,
        ),
        id="replaced: the old copy's deletion shown meanwhile does not forget the new one",
    ),
    pytest.param(
        Row(
            steps=(("creating", None), ("created", MADE), ("gone", OLD)),
            cached=None,
            known=MADE,
            remembered=1,
        ),
        id="made, another object's deletion shown: still taken as present",
    ),
    pytest.param(
        Row(steps=(("deleted", OLD),), cached=OLD, known=None, remembered=1),
        id="deleted, still cached: taken as gone",
    ),
    pytest.param(
        Row(steps=(("deleted", OLD), ("gone", OLD)), cached=None, known=None),
        id="deleted, its deletion shown: nothing remembered",
    ),
    pytest.param(
        Row(steps=(("creating", None), ("abandoned", None)), cached=None, known=None),
        id="a create that made nothing: nothing remembered",
    ),
]


@pytest.mark.parametrize("row", ROWS)
def test_writes_in_flight(row: Row) -> None:
    writes = WritesInFlight()
    for step, target in row.steps:
        match step, target:
            case "creating", None:
                writes.creating(TARGET_KEY)
            case "abandoned", None:
                writes.abandoned(TARGET_KEY)
            case "created", dict():
                writes.created(TARGET_KEY, target)
                writes.abandoned(TARGET_KEY)  # as the engine does after every create
            case "deleted", dict():
                writes.deleted(TARGET_KEY, target["metadata"]["uid"])
            case "shown", dict():
                writes.shown(TARGET_KEY, target)
            case "gone", dict():
                writes.shown_gone(TARGET_KEY, target)
            case _:
                raise AssertionError(f"unknown step {step!r}")
    assert writes.known(TARGET_KEY, row.cached) == row.known
    assert len(writes) == row.remembered
