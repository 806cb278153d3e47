"""Would kube-scheduler put a pod on this lower node? (pure)

The filters of the default scheduler profile that a node's own state decides, each named
after the plugin it mirrors (k8s.io/kubernetes pkg/scheduler/framework/plugins):

- `NodeUnschedulable` (nodeunschedulable/node_unschedulable.go): a cordoned node
  (`spec.unschedulable`) takes only pods tolerating `node.kubernetes.io/unschedulable:NoSchedule`;
- Ready: a node whose Ready condition is not "True" takes only pods tolerating
  `node.kubernetes.io/not-ready`, the taint the node lifecycle controller gives it
  (the scheduler itself sees only that taint; counting the condition too keeps pods off a
  node in the seconds before the taint lands, and never refuses a pod that tolerates it);
- `NodeAffinity` (nodeaffinity/node_affinity.go): the nodeSelector and the required node
  affinity of the *lower* pod (after `tensile.placement.lower`: what `clusterSelector` asks);
- `TaintToleration` (tainttoleration/taint_toleration.go): every NoSchedule/NoExecute
  taint must be tolerated;
- `NodePorts` (nodeports/node_ports.go, HostPortInfo.CheckConflict in framework/types.go):
  a host port (protocol, port) is taken when an existing pod holds it on the same IP or
  either side binds 0.0.0.0;
- `NodeResourcesFit` (noderesources/fit.go, `fitsRequest`): one more pod than
  `allocatable.pods` is "Too many pods"; every resource the pod requests (as
  `requests.pod_requests` counts it: init containers, sidecars, overhead, extended
  resources) must fit in allocatable minus what the node's pods request.

Left out, because a node's own state does not decide them or the lower scheduler would
need the whole cluster: pod (anti-)affinity, topology spread, volume limits and zones,
DRA. For those the answer may be a stale "yes" (the descheduler's case), never a wrong
"no".

Amounts are integers: cpu in millicores, everything else in its whole unit (bytes, counts),
each rounded up as `resource.Quantity.MilliValue()`/`Value()` round, which is what
fit.go compares.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from tensile.contracts.objects import as_list, as_mapping, meta_of
from tensile.contracts.scheduling import FILTERED_EFFECTS, REQUIRED, selector_matches, tolerates
from tensile.kube.quantity import parse_quantity
from tensile.placement.requests import pod_requests

UNSCHEDULABLE_TAINT: Final = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
"""What NodeUnschedulable asks a pod to tolerate to go onto a cordoned node."""
NOT_READY_TAINTS: Final = (
    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
)
"""The taints a node whose Ready condition is not "True" gets from the node lifecycle
controller; a pod tolerating one of them is not kept off such a node here."""

REASON_UNSCHEDULABLE: Final = "node(s) were unschedulable"
REASON_NOT_READY: Final = "node(s) were not ready"
REASON_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
REASON_PORTS: Final = "node(s) didn't have free ports for the requested pod ports"
REASON_TOO_MANY_PODS: Final = "Too many pods"
"""The scheduler's own wording (each plugin's ErrReason), so a FailedScheduling event reads
the same whether the lower scheduler or the extender said it."""

WILDCARD_IP: Final = "0.0.0.0"  # noqa: S104 - a host port's "every address", not a bind

HostPort = tuple[str, str, int]
"""(host IP, protocol, port) of a container port with a hostPort; IP "" is 0.0.0.0."""


@dataclass(frozen=True, kw_only=True)
class PodNeed:
    """What a pod asks of a lower node: built once per pod by `need_of`, checked against
    many nodes by `unfit`."""

    requests: Mapping[str, int]
    """Resource name -> amount in units (cpu millicores; "pods" is always 1)."""
    node_selector: Mapping[str, str]
    required: Mapping[str, Any] | None
    """The required node affinity's NodeSelector, or None."""
    tolerations: tuple[Any, ...]
    host_ports: frozenset[HostPort]

    @property
    def names_node(self) -> bool:
        """Whether the placement names nodes one by one (the hostname label or a
        metadata.name field): then a node's name matters, not only its labels' class."""
        if "kubernetes.io/hostname" in self.node_selector:
            return True
        for item in as_list((self.required or {}).get("nodeSelectorTerms")):
            term = as_mapping(item)
            if as_list(term.get("matchFields")):
                return True
            for expression in as_list(term.get("matchExpressions")):
                if as_mapping(expression).get("key") == "kubernetes.io/hostname":
                    return True
        return False


@dataclass(frozen=True, kw_only=True)
class NodeRoom:
    """A lower node as the filters see it."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...] = ()
    ready: bool = True
    unschedulable: bool = False
    free: Mapping[str, int]
    """Resource name -> allocatable minus what its pods request, in units (may be < 0)."""
    host_ports: frozenset[HostPort] = frozenset()
    allocatable: Mapping[str, int] = field(default_factory=dict)
    """Resource name -> allocatable, in units (only the summary's totals read it)."""


def units(amounts: Mapping[str, Fraction]) -> dict[str, int]:
    """Return `amounts` (resource name -> exact amount) in the integer units fit.go compares:
    cpu in millicores, the rest whole; rounded up, like Quantity.MilliValue()/Value()."""
    return {
        name: math.ceil(amount * 1000) if name == "cpu" else math.ceil(amount)
        for name, amount in amounts.items()
    }


def host_ports(spec: Mapping[str, Any]) -> frozenset[HostPort]:
    """Return the host ports the containers of a pod with `spec` hold (hostPort > 0).

    Only `containers`: a port the scheduler would count that this leaves out can give a
    stale "yes", never a wrong "no" (as `NodePorts`, hostIP "" and protocol "" are
    0.0.0.0 and TCP)."""
    found: set[HostPort] = set()
    for container in as_list(spec.get("containers")):
        for item in as_list(as_mapping(container).get("ports")):
            port = as_mapping(item)
            number = port.get("hostPort")
            if isinstance(number, int) and number > 0:
                ip = str(port.get("hostIP") or WILDCARD_IP)
                found.add((ip, str(port.get("protocol") or "TCP"), number))
    return frozenset(found)


def need_of(spec: Mapping[str, Any]) -> PodNeed:
    """Return what a pod with the lower `spec` (its placement already translated for the
    lower cluster) needs. Raises ValueError for a malformed quantity."""
    affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(affinity.get(REQUIRED)) or None
    return PodNeed(
        requests=units(pod_requests({"spec": spec})),
        node_selector={str(k): str(v) for k, v in as_mapping(spec.get("nodeSelector")).items()},
        required=required,
        tolerations=tuple(as_list(spec.get("tolerations"))),
        host_ports=host_ports(spec),
    )


def node_room(
    node: Mapping[str, Any],
    *,
    requested: Mapping[str, Fraction],
    held_ports: Iterable[HostPort] = (),
) -> NodeRoom:
    """Return the `NodeRoom` of `node` (a Node object) whose pods request `requested`
    (summed `pod_requests`, "pods" their count) and hold `held_ports`.
    Raises ValueError for a malformed quantity."""
    meta = meta_of(node)
    spec = as_mapping(node.get("spec"))
    status = as_mapping(node.get("status"))
    allocatable = units(
        {str(k): parse_quantity(str(v)) for k, v in as_mapping(status.get("allocatable")).items()}
    )
    used = units(requested)
    free = {name: amount - used.get(name, 0) for name, amount in allocatable.items()}
    for name, amount in used.items():
        free.setdefault(name, -amount)
    conditions = as_list(status.get("conditions"))
    return NodeRoom(
        name=str(meta.get("name") or ""),
        labels={str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()},
        taints=tuple(as_mapping(t) for t in as_list(spec.get("taints"))),
        ready=any(
            as_mapping(c).get("type") == "Ready" and as_mapping(c).get("status") == "True"
            for c in conditions
        ),
        unschedulable=bool(spec.get("unschedulable")),
        free=free,
        host_ports=frozenset(held_ports),
        allocatable=allocatable,
    )


def unfit_placement(need: PodNeed, room: NodeRoom) -> str | None:
    """Return why the node's state, labels or taints keep the pod off it (the first reason,
    in the scheduler's plugin order), or None. Resources and ports are `unfit_room`'s."""
    if room.unschedulable and not tolerates(list(need.tolerations), UNSCHEDULABLE_TAINT):
        return REASON_UNSCHEDULABLE
    if not room.ready and not any(tolerates(list(need.tolerations), t) for t in NOT_READY_TAINTS):
        return REASON_NOT_READY
    if any(room.labels.get(k) != v for k, v in need.node_selector.items()):
        return REASON_AFFINITY
    if need.required is not None and not selector_matches(
        need.required, node_name=room.name, node_labels=room.labels
    ):
        return REASON_AFFINITY
    for taint in room.taints:
        if taint.get("effect") in FILTERED_EFFECTS and not tolerates(list(need.tolerations), taint):
            value = taint.get("value") or ""
            return f"node(s) had untolerated taint {{{taint.get('key')}: {value}}}"
    return None


def unfit_room(need: PodNeed, room: NodeRoom) -> tuple[str, ...]:
    """Return every reason the node's free room or host ports refuse the pod (NodePorts,
    then NodeResourcesFit's "Too many pods" and "Insufficient <name>" in resource-name
    order), or () when it fits."""
    return unfit_free(need, free=room.free, host_ports=room.host_ports)


def unfit_free(
    need: PodNeed, *, free: Mapping[str, int], host_ports: frozenset[HostPort]
) -> tuple[str, ...]:
    """`unfit_room` of a node given by its `free` room (resource name -> units) and the
    host ports it holds alone: what a summary's rows carry, judged without a `NodeRoom`
    each (a filter explaining why none of thousands of rows fits builds none)."""
    reasons: list[str] = []
    if need.host_ports and _ports_conflict(need.host_ports, host_ports):
        reasons.append(REASON_PORTS)
    if free.get("pods", 0) < 1:
        reasons.append(REASON_TOO_MANY_PODS)
    for name in sorted(need.requests):
        amount = need.requests[name]
        if name != "pods" and amount > 0 and free.get(name, 0) < amount:
            reasons.append(f"Insufficient {name}")
    return tuple(reasons)


def unfit(need: PodNeed, room: NodeRoom) -> tuple[str, ...]:
    """Return why kube-scheduler would not put the pod on the node (see the module
    docstring), or () when it would."""
    placement = unfit_placement(need, room)
    return (placement,) if placement is not None else unfit_room(need, room)


def tightness(need: PodNeed, free: Mapping[str, int]) -> float:
    """Return how much of a fitting node's free cpu and memory the pod takes, 0..1 (the
    mean over those it requests; 0 when it requests neither): a best fit takes the node
    where this is largest, so large holes stay large."""
    shares = [
        need.requests[name] / free[name]
        for name in ("cpu", "memory")
        if need.requests.get(name, 0) > 0 and free.get(name, 0) > 0
    ]
    return min(1.0, sum(shares) / len(shares)) if shares else 0.0


def _ports_conflict(wanted: frozenset[HostPort], held: frozenset[HostPort]) -> bool:
    for ip, protocol, port in wanted:
        for held_ip, held_protocol, held_port in held:
            if (
                port == held_port
                and protocol == held_protocol
                and (ip == held_ip or WILDCARD_IP in (ip, held_ip))
            ):
                return True
    return False
