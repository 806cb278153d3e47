"""The virtual node's own objects, built purely from its settings: the Node (labels, taints,
addresses, status) and its Lease (virtual-kubelet's node/node.go behaviour, in our words).

No I/O and no mutation of inputs; `node.py` writes these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tensile.contracts import labels as contract_labels
from vnode.controllers import lower_outage
from vnode.settings import NodeSettings

# -- the Node ---------------------------------------------------------------------------------


def node_labels(settings: NodeSettings) -> dict[str, str]:
    """Return the labels of the virtual node (virtual-kubelet's and tensile-kube's set)."""
    labels = {
        contract_labels.NODE_TYPE_LABEL: contract_labels.VIRTUAL_NODE_TYPE,
        "kubernetes.io/role": "agent",
        contract_labels.HOSTNAME_LABEL: settings.name,
        "kubernetes.io/os": settings.operating_system,
        "beta.kubernetes.io/os": settings.operating_system,
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/exclude-from-external-load-balancers": "true",
    }
    labels.update(dict(settings.extra_labels))
    return labels


def node_taints(
    existing: Iterable[Mapping[str, Any]], *, settings: NodeSettings
) -> list[dict[str, Any]]:
    """Return the Node's taints: others' kept, ours (by key) replaced or removed."""
    key = settings.taint.key if settings.taint else contract_labels.DEFAULT_TAINT_KEY
    taints = [dict(t) for t in existing if t.get("key") != key]
    if settings.taint is not None:
        taints.append(
            {
                "key": settings.taint.key,
                "value": settings.taint.value,
                "effect": settings.taint.effect,
            }
        )
    return taints


def node_object(settings: NodeSettings) -> dict[str, Any]:
    """Return the Node to create (status follows in a separate status update)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": settings.name, "labels": node_labels(settings)},
        "spec": {"taints": node_taints([], settings=settings)},
    }


_PRESSURES = (
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)


HEALTHY: tuple[Mapping[str, str], ...] = lower_outage.stance(
    policy="keep", grace=0.0, outage=None, now=0.0
).conditions
"""Ready True and LowerControlPlaneReachable True (the lower apiserver answers)."""


def node_status(
    current: Mapping[str, Any] | None,
    *,
    settings: NodeSettings,
    capacity: Mapping[str, str],
    node_info: Mapping[str, str],
    now: str,
    health: Sequence[Mapping[str, str]] = HEALTHY,
) -> dict[str, Any]:
    """Return the strategic merge patch body for `nodes/<name>/status`.

    `health` are the Ready and LowerControlPlaneReachable conditions (type, status, reason,
    message: `lower_outage.Stance.conditions`); Ready comes first, the pressures (always
    False) after it, the others last. Conditions keep their lastTransitionTime while their
    status is unchanged and carry a fresh heartbeat; addresses are InternalIP (and
    ExternalIP if set), never a Hostname (which would win over InternalIP on apiservers
    with the default address order and need to resolve).
    """
    previous = {
        c.get("type"): c for c in ((current or {}).get("status") or {}).get("conditions") or []
    }
    rows = [
        *[(c["type"], c["status"], c["reason"], c["message"]) for c in health[:1]],
        *_PRESSURES,
        *[(c["type"], c["status"], c["reason"], c["message"]) for c in health[1:]],
    ]
    conditions = []
    for ctype, status, reason, message in rows:
        old = previous.get(ctype) or {}
        transition = old.get("lastTransitionTime") if old.get("status") == status else None
        conditions.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": transition or now,
            }
        )
    return {
        "status": {
            "capacity": offered(current, capacity, field="capacity"),
            "allocatable": offered(current, capacity, field="allocatable"),
            "conditions": conditions,
            "addresses": node_addresses(settings),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": settings.kubelet_port}},
            "nodeInfo": {**dict(node_info), "operatingSystem": settings.operating_system},
            "phase": "Running",
        }
    }


def node_status_news(current: Mapping[str, Any] | None, body: Mapping[str, Any]) -> bool:
    """Tell whether the status patch `body` (from `node_status`) changes more than the
    heartbeat times of `current` (the Node as last seen). The kubelet likewise patches its
    Node only when the status changed or once its report interval has passed (the Lease is
    the heartbeat)."""
    have = (current or {}).get("status") or {}
    for field, wanted in (body.get("status") or {}).items():
        want, got = wanted, have.get(field)
        if field == "conditions":
            want, got = _without_heartbeats(want), _without_heartbeats(got)
        elif field == "nodeInfo" and isinstance(got, Mapping):
            got = {k: got.get(k) for k in want}  # the apiserver keeps fields we do not set
        if want != got:
            return True
    return False


def _without_heartbeats(conditions: object) -> list[dict[str, Any]]:
    if not isinstance(conditions, list):
        return []
    return [
        {k: v for k, v in c.items() if k != "lastHeartbeatTime"}
        for c in conditions
        if isinstance(c, Mapping)
    ]


def node_addresses(settings: NodeSettings) -> list[dict[str, str]]:
    """Return the Node's `status.addresses`: InternalIP, and ExternalIP if set, never a
    Hostname (see `node_status`). The serving certificate names exactly these."""
    addresses = [{"type": "InternalIP", "address": settings.internal_ip}]
    if settings.external_ip:
        addresses.append({"type": "ExternalIP", "address": settings.external_ip})
    return addresses


def lease_object(*, settings: NodeSettings, node_uid: str, now: str) -> dict[str, Any]:
    """Return the node's Lease in kube-node-lease, owned by the Node (deleted with it)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": settings.name,
            "namespace": "kube-node-lease",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": settings.name, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": settings.name,
            "leaseDurationSeconds": settings.lease_duration,
            "renewTime": now,
        },
    }


def offered(
    current: Mapping[str, Any] | None, capacity: Mapping[str, str], *, field: str
) -> dict[str, str]:
    """Return `capacity` as the Node's status `field` ("capacity" or "allocatable") is to
    be patched: every resource the Node shows there now but `capacity` lacks is written as
    "0". A strategic merge patch keeps the keys it does not name, so a resource the lower
    cluster stopped offering (its last GPU node gone, or out of the virtual node's pool)
    would otherwise stay advertised. The kubelet does the same for a device plugin's
    resource once the plugin is gone: 0, not dropped (pkg/kubelet/nodestatus/setters.go,
    MachineInfo, the removed device plugins)."""
    shown = ((current or {}).get("status") or {}).get(field)
    stale = dict.fromkeys(shown, "0") if isinstance(shown, Mapping) else {}
    return {**{name: value for name, value in stale.items() if name not in capacity}, **capacity}
