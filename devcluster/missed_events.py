"""Run the `virtual-node` command with a fault the test harness switches on: lost watch
events (for the patrol's tests; never for production).

`python -m devcluster.missed_events <virtual-node flags>` is the command with its
reflectors patched: while the file named by $TENSILE_MISS_EVENTS_WHILE exists, the watch
events (ADDED, MODIFIED, DELETED) of the informers named in $TENSILE_MISS_EVENTS_OF
(comma-separated informer names, e.g. "lower-pods") are dropped, and their
resourceVersion is taken as delivered. A watch resumed later never replays them, so the
cache differs from its server until something lists again: the drift a missed event
leaves, which no real fault of the fleet (an outage, a compaction) can make, since the
reflector lists again after those.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tensile.contracts.objects import meta_of
from tensile.kube import reflector

GATE = "TENSILE_MISS_EVENTS_WHILE"
"""Environment: the path of the file whose existence switches the fault on."""
INFORMERS = "TENSILE_MISS_EVENTS_OF"
"""Environment: the informers whose events are lost, comma-separated."""
_LOST = ("ADDED", "MODIFIED", "DELETED")


def patch(*, gate: Path, informers: frozenset[str]) -> None:
    """Patch `Reflector._handle` to lose the events of `informers` while `gate` exists."""
    original = reflector.Reflector._handle

    def handle(self: reflector.Reflector, event: object) -> None:
        if (
            self.name in informers
            and isinstance(event, dict)
            and event.get("type") in _LOST
            and isinstance(event.get("object"), dict)
            and gate.exists()
        ):
            meta = meta_of(event["object"])
            self._rv = str(meta.get("resourceVersion") or "") or self._rv
            return
        original(self, event)

    reflector.Reflector._handle = handle  # type: ignore[method-assign]


def main() -> int:
    """Patch as the environment says, then run the command with the process's argv."""
    names = frozenset(n for n in os.environ.get(INFORMERS, "").split(",") if n)
    if GATE in os.environ and names:
        patch(gate=Path(os.environ[GATE]), informers=names)
    from vnode.__main__ import main as command  # noqa: PLC0415 - after the patch

    return command(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
