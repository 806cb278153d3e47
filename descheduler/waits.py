"""How long pods have been unplaceable below, measured on one clock: this process's own.

The PodScheduled condition the virtual node mirrors onto an upper pod carries the
`lastTransitionTime` the lower scheduler wrote, by the lower cluster's clock. Compared with
the descheduler's clock, a lower clock 60 s behind made a pod look a minute unschedulable
the moment it became so, and it was evicted at once; a clock ahead delayed every move. So
the wait is this process's monotonic clock from the moment it first saw the pod
unplaceable (an informer event) to now; the transition time is only compared with itself,
for equality, to tell a new spell (the pod was placed below, then was not again) from the
same one (`sighting`).

Every replica watches the pods, standbys included, so one that takes over the Lease has
been counting since it started watching, and judges as the leader did. A restarted
replica starts counting at its first list: pods already waiting then wait up to one
`--unschedulable-timeout` more, never less, so a restart or a leader change never makes
an eviction early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import descheduling
from tensile.contracts.objects import uid_of
from tensile.kube.informer import Handlers


@dataclass(frozen=True, kw_only=True)
class Sighting:
    """When this process first saw a pod's current spell of being unplaceable."""

    since: float
    """Its monotonic clock then, in seconds."""
    transition: str
    """The condition's lastTransitionTime as written ("" when absent): compared for
    equality only, never with a clock."""


def sighting(previous: Sighting | None, pod: Mapping[str, Any], *, at: float) -> Sighting | None:
    """Return the sighting of `pod` as it is now, seen at monotonic second `at`: None when it
    is not unplaceable (`descheduling.unplaceable_condition`), `previous` when it is the same
    spell (same transition time, whatever the message says now), else a new one from `at`."""
    condition = descheduling.unplaceable_condition(pod)
    if condition is None:
        return None
    transition = condition.get("lastTransitionTime")
    written = transition if isinstance(transition, str) else ""
    if previous is not None and previous.transition == written:
        return previous
    return Sighting(since=at, transition=written)


class Waits:
    """The sightings of the pods an informer shows (fed by `handlers`), by pod UID."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` is a monotonic clock in seconds."""
        self._clock = clock
        self._seen: dict[str, Sighting] = {}

    def handlers(self) -> Handlers:
        """The informer callbacks that keep the sightings."""
        return Handlers(on_add=self.observe, on_modify=self.observe, on_delete=self.forget)

    def observe(self, pod: Mapping[str, Any]) -> None:
        """Note `pod` as it is now."""
        uid = uid_of(pod)
        if not uid:
            return
        found = sighting(self._seen.get(uid), pod, at=self._clock())
        if found is None:
            self._seen.pop(uid, None)
        else:
            self._seen[uid] = found

    def forget(self, pod: Mapping[str, Any]) -> None:
        """Drop `pod` (deleted, or no longer Pending)."""
        self._seen.pop(uid_of(pod), None)

    def waited(self) -> dict[str, float]:
        """Seconds each unplaceable pod (by UID) has been seen so, as of now."""
        now = self._clock()
        return {uid: now - seen.since for uid, seen in self._seen.items()}
