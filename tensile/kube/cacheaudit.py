"""Cache audit: does an informer's store still equal its server's state?

An informer's store is what the event path decides on; a watch event it never got (a bug,
a proxy that lost a line, a fault) leaves it wrong for good, since a watch resumed from a
later resourceVersion never replays it. The audit lists the informer's selection again
from the server, metadata only (PartialObjectMetadataList, in pages: `ApiClient.pages`), and
compares keys and resourceVersions with the store page by page (`page_suspects`,
`unlisted_suspects`: pure), holding the listed keys only, never a second copy of the
objects. A difference may just be an event on its way: each suspect is confirmed by a
fresh look at the server, after the watch had `settle` seconds to deliver, against the
store at that moment (`confirmed`: pure), and one that still disagrees is looked at again
after longer waits, up to `settle_max` seconds (a loaded apiserver's watch lags by
seconds). The store is corrected by the reflector's own relist (`Informer.relist`), so
handlers see every difference as events and the event path's queues get the keys; a
relist caused by a race costs time, never correctness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from tensile.contracts.objects import resource_version_of
from tensile.kube.client import METADATA_LIST, ApiClient
from tensile.kube.informer import Informer
from tensile.kube.resources import object_key

logger = logging.getLogger(__name__)

Reason = Literal["missed_add", "missed_update", "missed_delete"]
"""How a store differs from its server: an object it lacks, holds at another
resourceVersion, or holds although the server has it no more."""

Versions = Callable[[str], str | None]
"""Key -> resourceVersion of the stored object, None when the store has no such key."""


@dataclass(frozen=True, kw_only=True)
class Suspect:
    """A key whose stored state differed from a list of the server."""

    key: str
    reason: Reason
    cached: str | None
    """The stored resourceVersion when compared (None: not stored)."""


def page_suspects(listed: Iterable[tuple[str, str]], cached: Versions) -> list[Suspect]:
    """Compare one list page, (key, resourceVersion) pairs, with the store: the keys the
    store lacks or holds at another resourceVersion."""
    suspects = []
    for key, version in listed:
        stored = cached(key)
        if stored is None:
            suspects.append(Suspect(key=key, reason="missed_add", cached=None))
        elif stored != version:
            suspects.append(Suspect(key=key, reason="missed_update", cached=stored))
    return suspects


def unlisted_suspects(stored: Iterable[str], listed: set[str], cached: Versions) -> list[Suspect]:
    """The stored keys a complete list did not name (`listed`: a set of keys)."""
    return [
        Suspect(key=key, reason="missed_delete", cached=cached(key))
        for key in stored
        if key not in listed
    ]


def confirmed(suspect: Suspect, *, server: str | None, cached_now: str | None) -> bool:
    """Whether `suspect` is drift: the server's look at it (`server`, its resourceVersion
    now; None when the selection no longer has it), taken after the watch had its time to
    deliver, still disagrees with the store (`cached_now`) and the store has not moved
    since the comparison. An object created, changed or deleted after the list is not."""
    match suspect.reason:
        case "missed_add":
            return server is not None and cached_now is None
        case "missed_delete":
            return server is None and cached_now is not None and cached_now == suspect.cached
        case "missed_update":
            return (
                server is not None
                and cached_now is not None
                and cached_now == suspect.cached
                and server != cached_now
            )


def repaired(suspect: Suspect, *, cached_now: str | None) -> bool:
    """Whether the store no longer shows the drift `suspect` (after a relist)."""
    if suspect.reason == "missed_add":
        return cached_now is not None
    return cached_now != suspect.cached


@dataclass(frozen=True, kw_only=True)
class AuditSettings:
    """Bounds of one audit."""

    page_size: int = 500
    """Items per metadata-only list page."""
    settle: float = 1.0
    """Seconds the watch has to deliver what a list showed before a suspect is looked at
    again: longer than a healthy watch lags, so an event on its way is not drift."""
    settle_max: float = 8.0
    """Seconds a suspect that still looks like drift is given in all, looked at again after
    waits doubling from `settle`: a loaded apiserver's watch lags by seconds (the fleet
    benchmark measured 4.6 s at p99 between an answer and its watch event), and only a
    store that has not moved for this long is relisted."""
    max_confirm: int = 20
    """Suspects looked up at most per look (the first look's; later looks take only those
    still disagreeing): one confirmed is enough to relist, which corrects them all."""


async def audit(
    informer: Informer,
    *,
    client: ApiClient,
    settings: AuditSettings,
    stopped: Callable[[], bool] = lambda: False,
) -> list[Suspect]:
    """List `informer`'s selection through `client` (metadata only, in pages) and return
    the confirmed drift of its store (at most `settings.max_confirm`). Raises kube errors
    when the server cannot be listed (the store is then left alone). Once `stopped()` says
    so (the caller shuts down), no suspect is looked at again: what is confirmed so far is
    returned."""
    selection = informer.selection
    store = informer.store
    path = selection.resource.path(namespace=selection.namespace)
    listed: set[str] = set()
    suspects: list[Suspect] = []
    async for page in client.pages(
        path, limit=settings.page_size, params=selection.selectors, accept=METADATA_LIST
    ):
        if page.restarted:
            # The continue token expired and the list began again (`ApiClient.pages`):
            # compare the store with the new list only.
            listed.clear()
            suspects.clear()
        pairs = [(object_key(item), resource_version_of(item)) for item in page.items]
        listed.update(key for key, _ in pairs)
        suspects += page_suspects(pairs, store.version)
        if not page.last:
            await asyncio.sleep(0)  # let the watches and workers run between pages
    suspects += unlisted_suspects(store.keys(), listed, store.version)
    del listed
    if not suspects:
        return []
    return await _confirmed(
        suspects[: settings.max_confirm], informer, client, settings, stopped=stopped
    )


async def _confirmed(
    suspects: list[Suspect],
    informer: Informer,
    client: ApiClient,
    settings: AuditSettings,
    *,
    stopped: Callable[[], bool],
) -> list[Suspect]:
    """The `suspects` still drift after the watch had its time: looked up after
    `settings.settle` seconds, and those still disagreeing again after waits that double,
    until `settings.settle_max` seconds in all (one look when `settle` is 0, none more once
    `stopped()`)."""
    waited, wait = 0.0, settings.settle
    while True:
        await asyncio.sleep(wait)
        waited += wait
        drift = []
        for suspect in suspects:
            server = await _server_version(client, informer, suspect.key)
            if confirmed(suspect, server=server, cached_now=informer.store.version(suspect.key)):
                drift.append(suspect)
        left = settings.settle_max - waited
        if not drift or wait <= 0 or left <= 0 or stopped():
            return drift
        suspects, wait = drift, min(2 * wait, left)


async def _server_version(client: ApiClient, informer: Informer, key: str) -> str | None:
    """The resourceVersion of `key` in the informer's selection now (None: not in it). A
    list narrowed to the name, so the selectors still apply: an object that left the
    selection is gone for the informer although a GET would find it."""
    selection = informer.selection
    namespace, _, name = key.rpartition("/")
    field = f"metadata.name={name}"
    if selection.selectors.get("fieldSelector"):
        field = f"{selection.selectors['fieldSelector']},{field}"
    params = {**selection.selectors, "fieldSelector": field}
    path = selection.resource.path(namespace=namespace or None)
    page = await client.request("GET", path, params=params, accept=METADATA_LIST)
    for item in page.get("items") or []:
        if object_key(item) == key:
            return resource_version_of(item)
    return None
