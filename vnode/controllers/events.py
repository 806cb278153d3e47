"""Events about upper pods, as a kubelet records them (`kubectl describe pod` shows them)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

from vnode.controllers.status import now_rfc3339
from vnode.kube import errors
from vnode.kube.client import ApiClient
from vnode.kube.resources import EVENTS

logger = logging.getLogger(__name__)


class EventRecorder:
    """Writes core/v1 Events to the upper cluster; failures are logged, never raised."""

    def __init__(self, upper: ApiClient, *, component: str, host: str) -> None:
        """`component` is the source component (virtual-kubelet uses "<node>/pod-controller")."""
        self._upper = upper
        self._source = {"component": component, "host": host}

    async def record(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        """Record an Event of `type` (Normal, Warning) about `obj`."""
        meta: Mapping[str, Any] = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta.get('name')}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type,
            "reason": reason,
            "message": message[:1024],
            "source": self._source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._upper.request("POST", EVENTS.path(namespace=namespace), body=event)
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("could not record event %s on %s: %s", reason, meta.get("name"), exc)
