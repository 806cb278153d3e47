"""The placement summary of the lower cluster, published on the virtual Node.

Every `interval` seconds the publisher looks at the lower nodes and what every lower pod
takes of them (`LowerPodBook.rooms`), renders the compact summary (`tensile.placement.summary`)
and, when it differs from what it last wrote, merge-patches it into the upper Node's
annotation `summary.ANNOTATION`, where `tensile-scheduler` reads it through its Node
informer (docs/scheduler.md says why this and not a question to each virtual node).
A write that fails is tried again at the next look; nothing else depends on it. An
unchanged summary is written again every `RESYNC` seconds, so a Node deleted and registered
anew (without the annotation) has it back within that time; until then the extender lets
the node pass untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.informer import Informer
from tensile.kube.resources import NODES
from tensile.placement import summary
from vnode.providers.k2k.lowerpods import LowerPodBook

logger = logging.getLogger(__name__)

RESYNC = 60.0
"""Seconds after which an unchanged summary is written again."""


class SummaryPublisher:
    """Writes the lower cluster's placement summary on the upper Node `node_name`."""

    name = "placement-summary"

    def __init__(
        self,
        *,
        upper: ApiClient,
        node_name: str,
        book: LowerPodBook,
        nodes: Informer,
        pods: Informer,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`book` counts the lower pods (`pods`, the lower pods informer, feeds it);
        `nodes` is the lower nodes informer; `interval` seconds between two looks (> 0);
        `clock` tells the seconds `RESYNC` is counted in."""
        self._upper = upper
        self._node_name = node_name
        self._book = book
        self._nodes = nodes
        self._pods = pods
        self._interval = interval
        self._stop = asyncio.Event()
        self._written: str | None = None
        self._written_at = 0.0
        self._clock = clock
        self._running = False

    def informers(self) -> Sequence[Informer]:
        """The lower nodes and pods: the summary is theirs."""
        return [self._nodes, self._pods]

    async def start(self) -> None:
        """Nothing to do before the informers run."""

    def ready(self) -> bool:
        """Whether it has begun publishing."""
        return self._running

    async def run(self) -> None:
        """Publish until `shut_down()`."""
        self._running = True
        while not self._stop.is_set():
            await self.publish()
            try:
                async with asyncio.timeout(self._interval):
                    await self._stop.wait()
            except TimeoutError:
                pass  # time for the next look

    async def shut_down(self) -> None:
        """Stop after the write in flight."""
        self._stop.set()

    async def publish(self) -> bool:
        """Write the summary if it changed since the last write or that write is `RESYNC`
        seconds old; return whether it wrote. An upper cluster that refuses or does not
        answer is logged, not raised."""
        text = summary.render(summary.summarize(self._book.rooms(self._nodes.store)))
        now = self._clock()
        if text == self._written and now - self._written_at < RESYNC:
            return False
        patch = {"metadata": {"annotations": {summary.ANNOTATION: text}}}
        try:
            await self._upper.request(
                "PATCH", NODES.path(name=self._node_name), body=patch, content_type=MERGE_PATCH
            )
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("placement summary not written: %s", exc)
            return False
        self._written, self._written_at = text, now
        return True
