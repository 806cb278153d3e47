"""Which pods move, and where they may not go (pure: no I/O, inputs never mutated).

One round of the descheduler is `plan(...)`: from the upper cluster's Pending pods and
nodes, the avoidance record and the PodDisruptionBudgets, the decision for every pod that a
lower cluster could not place. The loop (`loop.py`) carries decisions out.

A pod is *due* when it is Pending on a virtual node and either its PodScheduled condition has
been False with reason Unschedulable or SchedulerError (the lower scheduler's verdict, which
the virtual node mirrors onto the upper pod) for `unschedulable_timeout`, as the
descheduler's own clock measured it (`waits`; the condition's time is by the lower
cluster's clock), or it has been Pending longer than the policy's PodLifeTime
`maxPodLifeTimeSeconds` (tensile-kube's strategy). It never moves when it is in
kube-system, a mirror or static pod, or a DaemonSet's (their node or controller puts them
straight back); nor, unless the annotation `descheduler.alpha.kubernetes.io/evict` forces
it, when its priority is system-critical or above, or it has local storage (emptyDir,
hostPath) and `evict_local_storage_pods` is off (the rules of sigs.k8s.io/descheduler's
IsEvictable).

A pod found with no virtual node left (every one tried, or ruled out by its own placement)
is marked so by the mover and never judged again (`descheduling.LEFT_ALONE_ANNOTATION`): it
waits on its virtual node for its lower cluster to have room. The mark is per pod, not per owner,
so the owner's avoidances expire as always and its other pods may use every virtual node
again; judged again instead, the pod would go back to a full lower cluster each time an
avoidance expired, and the next pod on to the other, forever.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tensile.contracts import (
    avoidance,
    descheduling,
    labels,
    lowerhealth,
    scheduling,
    selectors,
)
from tensile.contracts.objects import (
    as_list,
    as_mapping,
    deletion_timestamp_of,
    labels_of,
    meta_of,
    name_of,
)
from tensile.kube.timestamps import parse_rfc3339

EVICT_ANNOTATION = "descheduler.alpha.kubernetes.io/evict"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
SOURCE_ANNOTATION = "kubernetes.io/config.source"
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""scheduling.SystemCriticalPriority: system-cluster-critical and above never move."""
POD_SELECTOR = f"{labels.VIRTUAL_POD_LABEL}={labels.VIRTUAL_POD_VALUE}"
"""The webhook's default --pod-selector (tensile-kube's label)."""


@dataclass(frozen=True, kw_only=True)
class Criteria:
    """Which pods are due to move, and from which virtual nodes; durations in seconds."""

    unschedulable_timeout: float = 60.0
    """How long PodScheduled must have been False (Unschedulable, SchedulerError), as the
    descheduler has seen it (`waits`)."""
    max_pod_lifetime: float | None = None
    """PodLifeTime's maxPodLifeTimeSeconds: move pods Pending longer than this (None: off)."""
    evict_local_storage_pods: bool = False
    """Also move pods with emptyDir or hostPath volumes."""
    node_selector: selectors.Selector = field(default_factory=lambda: selectors.EVERYTHING)
    """Virtual nodes considered, both to move pods off and to move them to."""
    pod_selector: selectors.Selector = field(default_factory=lambda: selectors.parse(POD_SELECTOR))
    """The webhook's pod selector: a pod with a controller moves only when its replacement
    passes the webhook, which keeps it off the virtual nodes to avoid."""
    max_pods_per_node: int = 0
    """Moves off one virtual node per round (0: no limit)."""


Action = Literal["evict", "recreate", "exhausted", "blocked"]


class Lookup(Protocol):
    """Objects by key (a dict, or an informer's store): "namespace/name", or the name of a
    cluster-scoped object."""

    def get(self, key: str, /) -> Mapping[str, Any] | None:
        """Return the object with `key`, or None."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What to do with one due pod.

    - evict: record that `owner` avoids `node`, then evict the pod (its controller replaces it);
    - recreate: a bare pod: create its replacement avoiding `avoid`, then delete it;
    - exhausted: every considered virtual node has been tried, or the pod's own node
      selection (nodeSelector, required node affinity, tolerations) or the node affinity
      of its volumes admits none of the others; the pod stays where it is -- for good
      (`for_good`) unless a considered virtual node it has not tried is merely not usable
      now;
    - blocked: a PodDisruptionBudget does not allow it now (`message` says which).
    """

    action: Action
    pod: Mapping[str, Any]
    node: str
    """The virtual node the pod is on."""
    reason: str
    """Why it is due: the lower cluster's message, or the lifetime exceeded."""
    owner: avoidance.Owner | None
    avoid: frozenset[str]
    """Virtual nodes the pod (or its owner) is kept off after the move, `node` included."""
    message: str = ""
    for_good: bool = False
    """exhausted only: no virtual node is left for it whatever the avoidances' expiry, so it
    is marked (`descheduling.LEFT_ALONE_ANNOTATION`) and never judged again. False while an
    untried considered virtual node is not Ready or cordoned: judged again every round."""


@dataclass(frozen=True, kw_only=True)
class Round:
    """The decisions of one round, and how many pods were looked at."""

    decisions: tuple[Decision, ...]
    considered: int
    """Pending pods on considered virtual nodes that were examined."""
    deferred: int = 0
    """Due pods left for a later round by the per-node limit."""


def is_virtual_node(node: Mapping[str, Any]) -> bool:
    """Tell whether `node` is a virtual node (label type=virtual-kubelet)."""
    return _labels(node).get(labels.NODE_TYPE_LABEL) == labels.VIRTUAL_NODE_TYPE


def node_usable(node: Mapping[str, Any]) -> bool:
    """Tell whether the upper scheduler may place pods on `node` now: Ready, not cordoned,
    and its lower control plane answers (`lowerhealth.lower_unreachable`). The pods of a
    node whose lower control plane does not answer are not judged either: their status is
    as last seen, and a pod Pending there may be running below by now."""
    if as_mapping(node.get("spec")).get("unschedulable") or lowerhealth.lower_unreachable(node):
        return False
    conditions = as_list(as_mapping(node.get("status")).get("conditions"))
    return any(
        as_mapping(c).get("type") == "Ready" and as_mapping(c).get("status") == "True"
        for c in conditions
    )


def considered_nodes(
    nodes: Iterable[Mapping[str, Any]], *, criteria: Criteria
) -> dict[str, Mapping[str, Any]]:
    """Return the usable virtual nodes that `criteria.node_selector` selects, by name."""
    return {
        name_of(n): n
        for n in nodes
        if is_virtual_node(n) and node_usable(n) and criteria.node_selector.matches(_labels(n))
    }


def due(
    pod: Mapping[str, Any], *, criteria: Criteria, now: dt.datetime, waited: float | None
) -> str | None:
    """Return why `pod` is due to move (the lower cluster's reason and message, or the
    lifetime it exceeded), or None when it is not (yet). `waited` is how long, in seconds,
    the descheduler has seen the pod unplaceable by its own clock (`waits.Waits`; None: not
    seen so); the condition's lastTransitionTime, by the lower cluster's clock, is never
    compared with `now`. `now` (the descheduler's wall clock) is compared with the upper
    pod's creationTimestamp for PodLifeTime only."""
    meta = meta_of(pod)
    if as_mapping(pod.get("status")).get("phase") != "Pending" or meta.get("deletionTimestamp"):
        return None
    scheduled = descheduling.unplaceable_condition(pod)
    why = ""
    if scheduled is not None:
        why = f"{scheduled.get('reason')}: {scheduled.get('message') or 'no message'}"
        if waited is not None and waited >= criteria.unschedulable_timeout:
            return why
    created = parse_rfc3339(meta.get("creationTimestamp"))
    limit = criteria.max_pod_lifetime
    if limit is not None and created is not None and (now - created).total_seconds() > limit:
        lifetime = f"Pending for more than {limit:.0f}s (PodLifeTime)"
        return f"{lifetime}; {why}" if why else lifetime
    return None


def exclusion(pod: Mapping[str, Any], *, criteria: Criteria) -> str | None:
    """Return why `pod` must never be moved, or None when it may be."""
    return next(_exclusions(pod, criteria=criteria), None)


def _exclusions(pod: Mapping[str, Any], *, criteria: Criteria) -> Iterator[str]:
    meta = meta_of(pod)
    annotations = as_mapping(meta.get("annotations"))
    if meta.get("namespace") == "kube-system":
        yield "in kube-system"
    if MIRROR_ANNOTATION in annotations:
        yield "a mirror pod"
    if annotations.get(SOURCE_ANNOTATION) in ("file", "http"):
        yield "a static pod"
    if any(as_mapping(r).get("kind") == "DaemonSet" for r in as_list(meta.get("ownerReferences"))):
        yield "a DaemonSet's pod"
    if descheduling.is_gated(pod):
        yield "a replacement waiting for the pod it replaces to go"
    if descheduling.is_left_alone(pod):
        # Not overridden by the evict annotation: removing this mark is how to undo it.
        yield f"no virtual node was left for it ({descheduling.LEFT_ALONE_ANNOTATION})"
    pod_labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    if avoidance.controller_of(pod) is not None and not criteria.pod_selector.matches(pod_labels):
        yield (
            "its replacement would not pass the webhook, which keeps it off the virtual "
            "node (its labels do not match --pod-selector)"
        )
    if EVICT_ANNOTATION in annotations:
        return  # forced past the rules below, as in sigs.k8s.io/descheduler
    spec = as_mapping(pod.get("spec"))
    priority = spec.get("priority")
    if isinstance(priority, int) and priority >= SYSTEM_CRITICAL_PRIORITY:
        yield f"priority {priority} is system-critical"
    if not criteria.evict_local_storage_pods and any(
        "emptyDir" in as_mapping(v) or "hostPath" in as_mapping(v)
        for v in as_list(spec.get("volumes"))
    ):
        yield "it has local storage (emptyDir/hostPath; see --evict-local-storage-pods)"


def disruption_blocker(pod: Mapping[str, Any], budgets: Iterable[Mapping[str, Any]]) -> str | None:
    """Return why the PodDisruptionBudgets selecting `pod` do not allow moving it now, or
    None when they do.

    The Eviction API never consults budgets for a Pending pod (canIgnorePDB in
    pkg/registry/core/pod/storage/eviction.go): so the descheduler applies itself the rule
    that API applies to a pod that is not Ready -- allowed when the budget's
    unhealthyPodEvictionPolicy is AlwaysAllow, or it is met (currentHealthy >=
    desiredHealthy > 0), or it allows a disruption; refused when more than one budget
    selects the pod, or the budget's status is not up to date yet.
    """
    meta = meta_of(pod)
    pod_labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    matching = []
    for budget in budgets:
        bmeta = meta_of(budget)
        if bmeta.get("namespace") != meta.get("namespace"):
            continue
        selector = selectors.from_object(as_mapping(budget.get("spec")).get("selector"))
        if selector is not None and selector.matches(pod_labels):
            matching.append(budget)
    if not matching:
        return None
    names = sorted(name_of(b) for b in matching)
    if len(matching) > 1:
        return f"more than one PodDisruptionBudget selects it ({', '.join(names)})"
    return _budget_blocker(matching[0], name=names[0])


def _budget_blocker(budget: Mapping[str, Any], *, name: str) -> str | None:
    spec, status = as_mapping(budget.get("spec")), as_mapping(budget.get("status"))
    current, desired = _int(status.get("currentHealthy")), _int(status.get("desiredHealthy"))
    if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or current >= desired > 0:
        return None
    generation = _int(meta_of(budget).get("generation"))
    if _int(status.get("observedGeneration")) < generation:
        return f"PodDisruptionBudget {name} is still being processed"
    if _int(status.get("disruptionsAllowed")) > 0:
        return None
    return (
        f"PodDisruptionBudget {name} allows no disruption: it needs {desired} healthy "
        f"pods and has {current}"
    )


def plan(
    pods: Iterable[Mapping[str, Any]],
    *,
    nodes: Iterable[Mapping[str, Any]],
    record: Mapping[str, str] | None,
    budgets: Sequence[Mapping[str, Any]],
    criteria: Criteria,
    now: dt.datetime,
    waited: Callable[[str], float | None],
    claims: Lookup | None = None,
    volumes: Lookup | None = None,
) -> Round:
    """Decide one round: every due, movable pod on a considered virtual node gets a
    Decision, oldest pods first, at most `criteria.max_pods_per_node` moves per node
    (exhausted and blocked pods do not count against it). `waited(pod UID)` is how long the
    descheduler has seen that pod unplaceable, in seconds (None: not seen so; see `due`).
    `claims` holds the upper
    PersistentVolumeClaims by "namespace/name" and `volumes` the upper PersistentVolumes
    by name (None: none), so that a pod whose volume only some nodes reach is not moved
    where its replacement could not follow (`pinned_volumes`).

    An owner's pods move one at a time: at most one per round, and none while another of
    its pods is still going away, so an owner never has more than one pod beyond its
    replicas (tensile-kube's re-creations left one surplus pod per move).
    """
    pods, nodes = list(pods), list(nodes)
    usable = considered_nodes(nodes, criteria=criteria)
    # Selected but not Ready, or cordoned: a pod that has not tried one of these is not
    # given up on for good (a lower cluster's outage must not pin pods elsewhere forever).
    unusable = frozenset(
        name_of(n)
        for n in nodes
        if is_virtual_node(n) and criteria.node_selector.matches(_labels(n))
    ) - set(usable)
    leaving = {
        controller.uid
        for pod in pods
        if deletion_timestamp_of(pod) and (controller := avoidance.controller_of(pod)) is not None
    }
    considered = 0
    found: list[tuple[dt.datetime, Decision]] = []
    for pod in pods:
        node = str(as_mapping(pod.get("spec")).get("nodeName") or "")
        if node not in usable:
            continue
        considered += 1
        uid = meta_of(pod).get("uid")
        why = due(
            pod, criteria=criteria, now=now, waited=waited(uid) if isinstance(uid, str) else None
        )
        if why is None or exclusion(pod, criteria=criteria) is not None:
            continue
        owner = avoidance.controller_of(pod)
        if owner is not None:
            tried = avoidance.avoided_nodes(record, owner_uid=owner.uid, now=now)
        else:
            tried = avoidance.avoided_by_affinity(as_mapping(pod.get("spec")).get("affinity"))
        avoid = frozenset({*tried, node})
        created = parse_rfc3339(meta_of(pod).get("creationTimestamp")) or now
        decision = _decide(
            pod,
            node=node,
            why=why,
            owner=owner,
            avoid=avoid,
            usable=usable,
            unusable=unusable,
            budgets=budgets,
            pins=pinned_volumes(pod, claims=claims or _NOTHING, volumes=volumes or _NOTHING),
        )
        found.append((created, decision))
    found.sort(key=lambda item: item[0])
    moves: Counter[str] = Counter()
    decisions: list[Decision] = []
    deferred = 0
    for _, decision in found:
        if decision.action in ("evict", "recreate"):
            uid = decision.owner.uid if decision.owner is not None else None
            full = bool(criteria.max_pods_per_node) and (
                moves[decision.node] >= criteria.max_pods_per_node
            )
            if full or (uid is not None and uid in leaving):
                deferred += 1
                continue
            moves[decision.node] += 1
            if uid is not None:
                leaving.add(uid)
        decisions.append(decision)
    return Round(decisions=tuple(decisions), considered=considered, deferred=deferred)


def _decide(
    pod: Mapping[str, Any],
    *,
    node: str,
    why: str,
    owner: avoidance.Owner | None,
    avoid: frozenset[str],
    usable: Mapping[str, Mapping[str, Any]],
    unusable: frozenset[str],
    budgets: Sequence[Mapping[str, Any]],
    pins: Sequence[tuple[str, Mapping[str, Any]]],
) -> Decision:
    base = Decision(action="evict", pod=pod, node=node, reason=why, owner=owner, avoid=avoid)
    others = sorted(set(usable) - avoid)
    untried = sorted(unusable - avoid)
    which = "usable " if untried else ""  # untried ones are down: said so, not for good
    if not others:
        tried = ", ".join(sorted(avoid))
        message = f"every {which}virtual node has been tried ({tried})"
        return _exhausted(base, untried=untried, message=message)
    # The replacement keeps the pod's own node selection (plus the NotIn): where that rules
    # out every other virtual node, moving it would leave it unschedulable for good, while
    # left where it is it runs once its lower cluster has room.
    spec = as_mapping(pod.get("spec"))
    if owner is not None:
        # The controller's next pod is made from its template: the NotIn values the webhook
        # added at an earlier move are not in it (the avoidances in force are `avoid`, from
        # the record), but a NotIn of the template is. A pod without the webhook's note of
        # what it added (made before it kept one) is judged as it is: never a move whose
        # replacement fits nowhere, at worst a node left untried.
        added = avoidance.added_nodes(pod)
        affinity = avoidance.without_avoidances(as_mapping(spec.get("affinity")), added)
        spec = {**spec, "affinity": affinity}
    unfit = {
        name: scheduling.unfit(spec, usable[name]) or _volume_unfit(pins, usable[name])
        for name in others
    }
    left = [name for name in others if unfit[name] is None]
    if not left:
        why_not = "; ".join(f"{name}: {unfit[name]}" for name in others)
        message = f"no other {which}virtual node admits it ({why_not})"
        return _exhausted(base, untried=untried, message=message)
    blocker = disruption_blocker(pod, budgets)
    if blocker is not None:
        return dataclasses.replace(base, action="blocked", message=blocker)
    return dataclasses.replace(
        base,
        action="evict" if owner is not None else "recreate",
        message=f"may go to {', '.join(left)}",
    )


def _exhausted(base: Decision, *, untried: Sequence[str], message: str) -> Decision:
    """`base` as an exhausted decision: for good, unless `untried` names considered virtual
    nodes that are not usable now (not Ready, cordoned) -- the pod may go there once they
    are, so it is judged again each round meanwhile."""
    if untried:
        names = ", ".join(untried)
        message = (
            f"{message}; it stays Pending on {base.node} while {names} "
            f"{'is' if len(untried) == 1 else 'are'} not Ready or cordoned"
        )
        return dataclasses.replace(base, action="exhausted", message=message)
    message = f"{message}; it stays on {base.node} for good"
    return dataclasses.replace(base, action="exhausted", message=message, for_good=True)


def pinned_volumes(
    pod: Mapping[str, Any], *, claims: Lookup, volumes: Lookup
) -> list[tuple[str, Mapping[str, Any]]]:
    """Return (description, required NodeSelector) for each PersistentVolume of `pod`
    whose node affinity limits the nodes that reach it: the volumes of its claims
    (`persistentVolumeClaim` volumes, and the `<pod>-<volume>` claims of generic ephemeral
    volumes) bound through `spec.volumeName`. The scheduler's VolumeBinding filter keeps a
    pod off nodes such a volume's affinity does not select; a virtual node provisions its
    volumes pinned to itself, so a pod of such a claim can only ever run there.
    """
    meta, spec = meta_of(pod), as_mapping(pod.get("spec"))
    namespace, pod_name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    found: list[tuple[str, Mapping[str, Any]]] = []
    for item in as_list(spec.get("volumes")):
        volume = as_mapping(item)
        claim_name = as_mapping(volume.get("persistentVolumeClaim")).get("claimName")
        if claim_name is None and "ephemeral" in volume:
            claim_name = f"{pod_name}-{volume.get('name')}"
        if not isinstance(claim_name, str):
            continue
        claim = as_mapping(claims.get(f"{namespace}/{claim_name}"))
        pv_name = as_mapping(claim.get("spec")).get("volumeName")
        if not isinstance(pv_name, str) or not pv_name:
            continue
        affinity = as_mapping(as_mapping(volumes.get(pv_name)).get("spec")).get("nodeAffinity")
        required = as_mapping(as_mapping(affinity).get("required"))
        if required:
            found.append((f"its volume {pv_name} (claim {claim_name})", required))
    return found


_NOTHING: Mapping[str, Mapping[str, Any]] = {}


def _volume_unfit(
    pins: Sequence[tuple[str, Mapping[str, Any]]], node: Mapping[str, Any]
) -> str | None:
    meta = meta_of(node)
    name = str(meta.get("name") or "")
    node_labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    for what, required in pins:
        if not scheduling.selector_matches(required, node_name=name, node_labels=node_labels):
            return f"{what} is not reachable from it (the volume's node affinity)"
    return None


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    found = labels_of(obj)
    return {str(k): str(v) for k, v in found.items()}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
