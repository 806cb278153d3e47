"""The avoidance record's ConfigMap, as the descheduler keeps it (the format and its rules
are `tensile.contracts.avoidance`'s).

Reads for planning come from an informer on that one ConfigMap. Writes read the current
object, change its data, and update it with that resourceVersion as precondition: a write
that raced another (a second descheduler during a leader change, an operator's edit) gets
409 Conflict and is redone on the fresh object, so no one's entry is lost. The ConfigMap is
created when absent.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensile.contracts import avoidance
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.kube.resources import CONFIG_MAPS

logger = logging.getLogger(__name__)

WRITE_ATTEMPTS = 5
MANAGED_BY = {"app.kubernetes.io/managed-by": "tensile-descheduler"}


class RecordConflict(Exception):
    """The record changed under every one of our attempts to write it."""


class AvoidanceRecord:
    """The ConfigMap NAMESPACE/NAME holding the avoidance record."""

    def __init__(self, client: ApiClient, *, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self._client = client
        self.informer = Informer(
            client,
            CONFIG_MAPS,
            name="avoidance-record",
            namespace=namespace,
            field_selector=f"metadata.name={name}",
        )

    def data(self) -> Mapping[str, str] | None:
        """Return the record's data as the informer last saw it (None: no ConfigMap)."""
        found = self.informer.store.get(f"{self.namespace}/{self.name}")
        return None if found is None else dict(found.get("data") or {})

    async def avoid(
        self,
        entries: Sequence[tuple[avoidance.Owner, str]],
        *,
        until: dt.datetime,
        now: dt.datetime,
    ) -> set[str]:
        """Record in one write that each (owner, virtual node) of `entries` is avoided until
        `until`, pruning what expired. Returns the UIDs of the owners the record had no room
        for (avoidance.RecordFull: their moves must wait).

        Raises RecordConflict, errors.ApiError (e.g. 403, or 404 when the namespace does not
        exist) and errors.ApiUnavailable.
        """
        refused: set[str] = set()

        def change(data: Mapping[str, str] | None) -> dict[str, str]:
            refused.clear()
            result = avoidance.pruned(data, now=now)
            for owner, node in entries:
                try:
                    result = avoidance.with_avoidance(
                        result, owner=owner, nodes=[node], until=until, now=now
                    )
                except avoidance.RecordFull:
                    refused.add(owner.uid)
            return result

        await self._update(change)
        return set(refused)

    async def prune(self, *, now: dt.datetime) -> bool:
        """Remove expired and unreadable entries, if there are any (no write otherwise).
        Returns whether it wrote. Raises like `avoid`, RecordFull excepted."""
        current = self.data()
        if current is None or avoidance.pruned(current, now=now) == current:
            return False
        return await self._update(lambda data: avoidance.pruned(data, now=now))

    async def _update(self, change: Callable[[Mapping[str, str] | None], dict[str, str]]) -> bool:
        path = CONFIG_MAPS.path(namespace=self.namespace, name=self.name)
        for _ in range(WRITE_ATTEMPTS):
            try:
                current: dict[str, Any] | None = await self._client.request("GET", path)
            except errors.NotFound:
                current = None
            before = None if current is None else dict(current.get("data") or {})
            data = change(before)
            if data == before:
                return False
            try:
                if current is None:
                    await self._client.request(
                        "POST", CONFIG_MAPS.path(namespace=self.namespace), body=self._new(data)
                    )
                else:
                    await self._client.request("PUT", path, body={**current, "data": data})
                return True
            except (errors.Conflict, errors.AlreadyExists):
                logger.debug(
                    "avoidance record %s/%s changed meanwhile; again", self.namespace, self.name
                )
        raise RecordConflict(
            f"the avoidance record {self.namespace}/{self.name} changed under each of "
            f"{WRITE_ATTEMPTS} writes"
        )

    def _new(self, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": MANAGED_BY},
            "data": data,
        }
