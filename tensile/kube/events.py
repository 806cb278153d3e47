"""Events about objects, as client-go's recorder writes them (`kubectl describe` shows them):
the virtual node's about its pods and the Services and claims it mirrors, the
descheduler's about the pods it moves.

Repeats are aggregated as client-go's EventCorrelator does: an event identical to one
recorded before (same object, type, reason and message) bumps that Event's `count` and
`lastTimestamp` instead of adding a new Event, so a pod retried every few seconds shows one
line "(x12 over 3m)" rather than a page of them.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from tensile.contracts.objects import meta_of
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.resources import EVENTS
from tensile.kube.timestamps import rfc3339

logger = logging.getLogger(__name__)


_Seen = tuple[str, str, str, str, str]
"""(involved UID, namespace, type, reason, message): what makes two events the same."""


class EventRecorder:
    """Writes core/v1 Events to one cluster; failures are logged, never raised."""

    def __init__(
        self, client: ApiClient, *, component: str, host: str, remembered: int = 4096
    ) -> None:
        """`component` is the source component (virtual-kubelet uses "<node>/pod-controller");
        `remembered` bounds how many distinct recent events are kept for aggregation (client-go
        keeps 4096 too)."""
        self._client = client
        self._source = {"component": component, "host": host}
        self._remembered = remembered
        self._seen: OrderedDict[_Seen, tuple[str, int]] = OrderedDict()
        """Recent events -> (Event name, count), least recently recorded first."""

    async def record(
        self,
        obj: Mapping[str, Any],
        *,
        type: str,
        reason: str,
        message: str,
        kind: str | None = None,
        api_version: str | None = None,
    ) -> None:
        """Record an Event of `type` (Normal, Warning) about `obj`, or count a repeat.

        `kind`/`api_version` name the involved object's type when `obj` does not (objects
        from a list carry neither; default: its own, else a v1 Pod)."""
        meta: Mapping[str, Any] = meta_of(obj)
        namespace = str(meta.get("namespace") or "default")
        message = message[:1024]
        now = rfc3339(dt.datetime.now(dt.UTC))
        seen_key = (str(meta.get("uid")), namespace, type, reason, message)
        seen = self._seen.get(seen_key)
        if seen is not None:
            name, count = seen
            self._seen.move_to_end(seen_key)
            if await self._count_repeat(namespace, name, count=count + 1, now=now):
                self._seen[seen_key] = (name, count + 1)
                return
        name = f"{meta.get('name')}.{secrets.token_hex(8)}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name,
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": api_version or obj.get("apiVersion", "v1"),
                "kind": kind or obj.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type,
            "reason": reason,
            "message": message,
            "source": self._source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._client.request("POST", EVENTS.path(namespace=namespace), body=event)
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("could not record event %s on %s: %s", reason, meta.get("name"), exc)
            return
        self._seen[seen_key] = (name, 1)
        self._seen.move_to_end(seen_key)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)

    async def _count_repeat(self, namespace: str, name: str, *, count: int, now: str) -> bool:
        # False when the Event is gone (expired after the apiserver's --event-ttl, or deleted):
        # the caller then records a new one, as client-go does.
        patch = {"count": count, "lastTimestamp": now}
        try:
            await self._client.request(
                "PATCH",
                EVENTS.path(namespace=namespace, name=name),
                body=patch,
                content_type=MERGE_PATCH,
            )
        except errors.NotFound:
            return False
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("could not count a repeat of event %s/%s: %s", namespace, name, exc)
        return True
