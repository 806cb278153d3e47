"""What `status` and `why` read, from the upper cluster and the lower clusters given with
`--lower NODE=KUBECONFIG` (I/O only; the reports are built by `status` and `why`).

Lower clusters: a virtual node publishes nothing upstairs that says how to reach its lower
cluster (its address and credentials are the lower administrator's, and anyone who may
read nodes upstairs would see them), so the plugin reads the upper cluster only, unless the
user names a lower kubeconfig per virtual node. Upstairs already tell the lower cluster's
health (the node's Ready condition and Lease, which stop when the lower cluster does not
answer) and the lower pod's Events (the virtual node copies them onto the upper pod).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubectl_tensile import status, why
from tensile.contracts import labels, ownership
from tensile.contracts.objects import name_of, namespace_of, uid_of
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.kube.resources import CONFIG_MAPS, EVENTS, LEASES, NODES, PODS

NODE_LEASE_NAMESPACE = "kube-node-lease"
LOWER_TIMEOUT = 5.0
"""Seconds a lower cluster gets to answer before it is reported as not answering."""


class NoSuchPod(Exception):
    """The pod asked about does not exist; the message names it and its namespace, as
    kubectl's does (the API's `errors.NotFound`, which it replaces, prints an HTTP status)."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where to read: the upper connection and the lower ones by virtual node."""

    upper: config.ConnectionInfo
    lowers: Mapping[str, config.ConnectionInfo] = field(default_factory=dict)
    avoid_configmap: tuple[str, str] = ("tensile-system", "tensile-avoid")


def _client(info: config.ConnectionInfo, name: str) -> ApiClient:
    return ApiClient(info, name=name, qps=0, burst=1, timeout=15.0, user_agent="kubectl-tensile")


async def _items(client: ApiClient, path: str, **params: str) -> list[dict[str, Any]]:
    answer = await client.request("GET", path, params=params or None)
    return list(answer.get("items") or [])


async def _record(client: ApiClient, target: Target) -> dict[str, str] | None:
    namespace, name = target.avoid_configmap
    try:
        found = await client.request("GET", CONFIG_MAPS.path(namespace=namespace, name=name))
    except (errors.NotFound, errors.Forbidden):
        return None  # no descheduler has recorded anything, or we may not read it
    return {str(k): str(v) for k, v in (found.get("data") or {}).items()}


async def _readyz(info: config.ConnectionInfo, node: str) -> str:
    try:
        async with _client(info, f"lower-{node}") as lower:
            await asyncio.wait_for(lower.request("GET", "/readyz"), LOWER_TIMEOUT)
    except TimeoutError:
        return f"no answer within {LOWER_TIMEOUT:g}s"
    except (errors.ApiError, errors.ApiUnavailable) as exc:
        return str(exc)
    return "ok"


async def status_report(target: Target, *, now: dt.datetime) -> dict[str, Any]:
    """Read what `status.status` needs and return its report. Raises errors.ApiError and
    errors.ApiUnavailable for the upper cluster."""
    async with _client(target.upper, "upper") as upper:
        nodes = await _items(
            upper,
            NODES.path(),
            labelSelector=labels.VIRTUAL_NODE_SELECTOR,
        )
        leases = await _items(upper, LEASES.path(namespace=NODE_LEASE_NAMESPACE))
        pods = await _items(
            upper, PODS.path(), fieldSelector="status.phase!=Succeeded,status.phase!=Failed"
        )
        record = await _record(upper, target)
    names = {name_of(n) for n in nodes}
    ready = {
        node: await _readyz(info, node) for node, info in target.lowers.items() if node in names
    }
    return status.status(
        nodes=nodes,
        leases={name_of(lease): lease for lease in leases},
        pods=pods,
        record=record,
        lower_ready=ready,
        now=now,
    )


async def why_report(
    target: Target, *, namespace: str, name: str, now: dt.datetime
) -> dict[str, Any]:
    """Read what `why.why` needs about pod `namespace`/`name` and return its report.
    Raises NoSuchPod, errors.ApiError, errors.ApiUnavailable (upper cluster)."""
    async with _client(target.upper, "upper") as upper:
        try:
            pod = await upper.request("GET", PODS.path(namespace=namespace, name=name))
        except errors.NotFound:
            raise NoSuchPod(f"pod {name} not found in namespace {namespace}") from None
        bound = str((pod.get("spec") or {}).get("nodeName") or "")
        node = None
        if bound:
            try:
                node = await upper.request("GET", NODES.path(name=bound))
            except errors.NotFound:
                node = None
        events = await _items(
            upper,
            EVENTS.path(namespace=namespace),
            fieldSelector=f"involvedObject.uid={uid_of(pod)}",
        )
        record = await _record(upper, target)
    lower = None
    if bound in target.lowers:
        lower = await _lower(target.lowers[bound], node_name=bound, pod=pod)
    return why.why(pod=pod, node=node, pod_events=events, record=record, lower=lower, now=now)


async def _lower(
    info: config.ConnectionInfo, *, node_name: str, pod: Mapping[str, Any]
) -> dict[str, Any]:
    """The lower pod of `pod` (by the virtual node's ownership marks) and its Events, or
    {"error": ...} when the lower cluster does not answer."""
    uid = uid_of(pod)
    try:
        async with _client(info, f"lower-{node_name}") as lower:
            candidates = await asyncio.wait_for(
                _items(
                    lower,
                    PODS.path(),
                    labelSelector=f"{ownership.NODE_LABEL}={ownership.label_value(node_name)}",
                ),
                LOWER_TIMEOUT,
            )
            found = next(
                (p for p in candidates if ownership.upper_uid_of(p) == uid),
                None,
            )
            if found is None:
                return {"pod": None}
            events = await asyncio.wait_for(
                _items(
                    lower,
                    EVENTS.path(namespace=namespace_of(found)),
                    fieldSelector=f"involvedObject.uid={uid_of(found)}",
                ),
                LOWER_TIMEOUT,
            )
    except TimeoutError:
        return {"error": f"no answer within {LOWER_TIMEOUT:g}s"}
    except (errors.ApiError, errors.ApiUnavailable) as exc:
        return {"error": str(exc)}
    return {"pod": found, "events": events}
