"""What the webhook does to a pod (pure): which pods it converts, and the RFC 6902 JSON patch
that converts them. No I/O; inputs are never mutated.

A pod is converted when the request is a CREATE, its namespace (the request's, not the
object's: tensile-kube read the object's, which may be empty) is not excluded, its labels
match `--pod-selector` (a pod without labels matches no selector that asks for one), and it
was not re-created by the descheduler (`create-by-descheduler=true`: its spec is converted
already). Conversion runs `STEPS` in order on a `Draft`:

1. `convert_placement`: nodeSelector entries and required node-affinity requirements meant
   for lower nodes move into the `clusterSelector` annotation (`tensile.contracts`); what
   targets the virtual nodes stays on the pod for the upper scheduler (`Keeper`): keys in
   `--ignore-selector-keys`, `type=virtual-kubelet`, and `kubernetes.io/hostname` (or
   matchFields `metadata.name`) requirements whose values all name virtual nodes.
   Per term, as tensile-kube: each term's moved requirements become one annotation term;
   terms left without requirements are dropped from the pod.
2. `pin_to_volume_node`: a pod using a PVC that is bound (`claim_node`) and names a node
   (`volume.kubernetes.io/selected-node`) gets the required requirement
   `kubernetes.io/hostname In [<node>]` in every term, kept on the pod, so the upper
   scheduler (with its resource checks) places it there; tensile-kube set `spec.nodeName`,
   which skips the scheduler and its checks altogether. An unbound claim's node is only
   the scheduler's choice so far: a provisioner that fails takes it back (the annotation
   removed) so the scheduler may choose again, which a pin, immutable, would forbid.
3. `keep_off_avoided_nodes`: a pod whose controller the descheduler's avoidance record
   names (the replacement of a pod evicted from a virtual node whose lower cluster could
   not place it) gets `kubernetes.io/hostname NotIn [<virtual nodes to avoid>]` in every
   required node-selector term (`tensile.contracts.avoidance.avoiding`), on the pod itself:
   it is for the upper scheduler, never moved into the annotation. The nodes the pod did
   not exclude already are noted in annotation `tensile.io/avoided-nodes`, so the
   descheduler can tell the webhook's NotIn values from the template's.
4. `convert_tolerations`: the pod's tolerations are copied into the annotation; upstairs,
   its not-ready/unreachable NoExecute ones are replaced by the configured ones and the
   virtual nodes' taint is tolerated (`clusterselector.added_tolerations`).

A converted pod always carries the annotation (`{}` when nothing was moved), which is how
the virtual node tells the webhook's tolerations from the user's. Converting a converted
pod changes nothing: the annotation is merged into, not replaced, and only what is not in
it yet is added. A step that needs something of the cluster reads it through `Lookups`,
built by the server from its informers; a new step adds its lookup there and itself to
`STEPS`.

Nothing is copied deeply (a deep copy of a pod costs more than the whole decision): steps
build new containers where they change something and share the rest with the input, so
the input, the draft and the patch must all be treated as read-only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tensile.contracts import avoidance, clusterselector, selectors
from tensile.contracts import labels as contract_labels
from tensile.contracts.objects import annotations_of, as_list, as_mapping, meta_of
from webhook import patches

SELECTED_NODE_ANNOTATION = contract_labels.SELECTED_NODE_ANNOTATION
"""On a PVC: the node its volume was (or is being) provisioned for."""
METADATA_NAME = "metadata.name"
"""The one field node-affinity matchFields may select on."""
TERM_RULES: Final[clusterselector.TermRules] = {
    "max_terms": clusterselector.MAX_TERMS,
    "overflow": "refuse",
    "drop_empty": False,
    "dedupe": True,
}
"""How the webhook ANDs the annotation's required terms (left) with newly moved ones
(right): see `clusterselector.and_terms`, which says why these differ from the virtual
node's."""
CREATE = "CREATE"


class _Refused(Exception):
    """The pod cannot be converted without losing a constraint; the message says why."""


@dataclass(frozen=True, kw_only=True)
class MutationSettings:
    """What the webhook converts and how (flags in parentheses)."""

    pod_selector: selectors.Selector = field(
        default_factory=lambda: selectors.parse("virtual-pod=true")
    )
    """Pods converted (--pod-selector)."""
    excluded_namespaces: frozenset[str] = frozenset({"kube-system"})
    """Namespaces whose pods are never converted (--excluded-namespaces)."""
    ignore_selector_keys: frozenset[str] = frozenset({"clusterID"})
    """Node label keys that stay on the pod: they target virtual nodes
    (--ignore-selector-keys, tensile-kube's)."""
    taint_key: str = contract_labels.DEFAULT_TAINT_KEY
    """Key of the virtual nodes' taint, tolerated on converted pods (--taint)."""
    not_ready_seconds: int | None = clusterselector.DEFAULT_TOLERATION_SECONDS
    """tolerationSeconds of node.kubernetes.io/not-ready on converted pods; None: unlimited
    (--default-not-ready-toleration-seconds, -1 for unlimited)."""
    unreachable_seconds: int | None = clusterselector.DEFAULT_TOLERATION_SECONDS
    """Likewise for node.kubernetes.io/unreachable (--default-unreachable-toleration-seconds)."""


@dataclass(frozen=True, kw_only=True)
class Lookups:
    """What the steps may know of the upper cluster, as functions (the server answers them
    from informer caches; tests pass plain functions)."""

    is_virtual_node: Callable[[str], bool] = lambda _name: False
    """Whether a Node of this name is a virtual node (matches --virtual-node-selector)."""
    claim: Callable[[str, str], Mapping[str, Any] | None] = lambda _namespace, _name: None
    """PVC (namespace, name) as cached (at least its `selected-node` annotation,
    `spec.volumeName` and `status.phase`), or None."""
    avoided_nodes: Callable[[str], frozenset[str]] = lambda _owner_uid: frozenset()
    """The virtual nodes the pods of the controller with this UID must avoid now (the
    descheduler's avoidance record; expired entries already left out)."""


@dataclass(frozen=True, kw_only=True)
class PodAdmission:
    """The parts of an AdmissionRequest the decision needs."""

    operation: str
    """CREATE, UPDATE, DELETE or CONNECT."""
    namespace: str
    """The request's namespace (authoritative: the object's may be empty on CREATE)."""
    pod: Mapping[str, Any]
    """The pod as the apiserver will store it (`request.object`)."""


@dataclass(frozen=True, kw_only=True)
class Mutation:
    """The decision: a JSON patch (empty: change nothing) and warnings for the client."""

    patch: tuple[patches.Operation, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: str | None = None
    """Why the pod was left alone without being considered (not selected, ...), or None."""


@dataclass(kw_only=True)
class Draft:
    """A pod being converted: copies of the fields the steps rewrite, and the annotation
    being built. Steps change it in place; the original pod is never touched."""

    admission: PodAdmission
    node_selector: dict[str, str]
    affinity: dict[str, Any]
    tolerations: list[Any]
    lower_node_selector: dict[str, str]
    """The annotation's nodeSelector."""
    lower_affinity: dict[str, Any]
    """The annotation's affinity (only its required node affinity is written by steps)."""
    lower_tolerations: list[Any]
    """The annotation's tolerations."""
    previous: dict[str, Any] | None
    """The annotation the pod carried (parsed), when it had a usable one: the pod was
    converted before (or someone wrote it by hand)."""
    volume_nodes: tuple[str, ...]
    """Nodes of the bound PVCs the pod uses (`claim_node`), in volume order."""
    avoided_nodes: frozenset[str] = frozenset()
    """Virtual nodes the pod's controller must avoid (the descheduler's record)."""
    added_avoidances: frozenset[str] = frozenset()
    """Of those, the ones whose NotIn the webhook put on the pod, not the pod's own
    (`avoidance.ADDED_ANNOTATION`)."""
    warnings: list[str] = field(default_factory=list)


Step = Callable[[Draft, MutationSettings, Lookups], None]


def skip_reason(admission: PodAdmission, *, settings: MutationSettings) -> str | None:
    """Return why the pod of `admission` is not converted, or None when it is."""
    if admission.operation != CREATE:
        return f"operation {admission.operation or '(none)'}: only CREATE is converted"
    if admission.namespace in settings.excluded_namespaces:
        return f"namespace {admission.namespace} is excluded"
    labels = _string_map(meta_of(admission.pod).get("labels"))
    if (
        labels.get(contract_labels.CREATED_BY_DESCHEDULER_LABEL)
        == contract_labels.VIRTUAL_POD_VALUE
    ):
        return "re-created by the descheduler: converted already"
    if not settings.pod_selector.matches(labels):
        return f"labels do not match {settings.pod_selector.text!r}"
    return None


def mutate(admission: PodAdmission, *, settings: MutationSettings, lookups: Lookups) -> Mutation:
    """Return the decision for `admission` (see the module docstring).

    Never raises for any JSON-shaped pod whose `metadata.annotations` is an object or null
    (`review.parse` refuses other shapes): a pod whose constraints could not be converted
    without losing one is left unchanged, with a warning saying why.
    """
    reason = skip_reason(admission, settings=settings)
    if reason is not None:
        return Mutation(skipped=reason)
    draft = _draft(admission, lookups=lookups)
    try:
        for step in STEPS:
            step(draft, settings, lookups)
    except _Refused as exc:
        return Mutation(warnings=(f"tensile-webhook: pod left unchanged: {exc}",))
    return Mutation(patch=tuple(_patch(draft)), warnings=tuple(draft.warnings))


def claim_node(claim: Mapping[str, Any] | None) -> str | None:
    """Return the node a PVC's volume is on for good: its `selected-node` once the claim is
    bound (phase Bound, `spec.volumeName` set), else None. Before that the annotation is
    the scheduler's choice in progress (volumebinding's AssumePodVolumes), which a failed
    provisioning removes so the scheduler chooses again (pv_controller
    rescheduleProvisioning; `vnode.providers.k2k.provisioner`)."""
    if claim is None:
        return None
    meta = meta_of(claim)
    node = as_mapping(meta.get("annotations")).get(SELECTED_NODE_ANNOTATION)
    bound = as_mapping(claim.get("status")).get("phase") == "Bound" and bool(
        as_mapping(claim.get("spec")).get("volumeName")
    )
    return node if bound and isinstance(node, str) and node else None


# -- what stays upstairs ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Keeper:
    """Tells what targets the virtual nodes, and so stays on the upper pod."""

    settings: MutationSettings
    lookups: Lookups
    volume_nodes: tuple[str, ...] = ()
    avoided_nodes: frozenset[str] = frozenset()

    def names_upper_node(self, name: object) -> bool:
        """Whether `name` is a virtual node, the node a volume of the pod is bound to, or
        one its controller must avoid (the last two even before the node cache holds them:
        what the webhook itself put on the pod is never moved below on reinvocation)."""
        return isinstance(name, str) and (
            name in self.volume_nodes
            or name in self.avoided_nodes
            or self.lookups.is_virtual_node(name)
        )

    def keeps_entry(self, key: str, value: str) -> bool:
        """Whether the nodeSelector entry `key: value` stays on the pod."""
        return (
            key in self.settings.ignore_selector_keys
            or (key, value) == (contract_labels.NODE_TYPE_LABEL, contract_labels.VIRTUAL_NODE_TYPE)
            or (key == contract_labels.HOSTNAME_LABEL and self.names_upper_node(value))
        )

    def keeps_requirement(self, requirement: object, *, fields: bool) -> bool:
        """Whether a node-affinity requirement (of matchFields when `fields`, else of
        matchExpressions) stays on the pod."""
        if not isinstance(requirement, Mapping):
            return False
        key, operator = requirement.get("key"), requirement.get("operator")
        values = requirement.get("values")
        if key in self.settings.ignore_selector_keys:
            return True
        names_nodes = (
            operator in ("In", "NotIn")
            and isinstance(values, list)
            and bool(values)
            and all(self.names_upper_node(v) for v in values)
        )
        if fields:
            return key == METADATA_NAME and names_nodes
        if key == contract_labels.HOSTNAME_LABEL:
            return names_nodes
        return (
            key == contract_labels.NODE_TYPE_LABEL
            and operator == "In"
            and values == [contract_labels.VIRTUAL_NODE_TYPE]
        )


# -- the steps ----------------------------------------------------------------------------------


def convert_placement(draft: Draft, settings: MutationSettings, lookups: Lookups) -> None:
    """Move nodeSelector entries and required node-affinity requirements meant for lower
    nodes into the annotation (module docstring, step 1)."""
    keeper = Keeper(
        settings=settings,
        lookups=lookups,
        volume_nodes=draft.volume_nodes,
        avoided_nodes=draft.avoided_nodes,
    )
    moved = {k: v for k, v in draft.node_selector.items() if not keeper.keeps_entry(k, v)}
    draft.node_selector = {k: v for k, v in draft.node_selector.items() if k not in moved}
    draft.lower_node_selector.update(moved)
    kept_terms: list[dict[str, Any]] = []
    moved_terms: list[dict[str, Any]] = []
    for term in clusterselector.required_terms(draft.affinity):
        kept, lower = _split_term(term, keeper)
        if kept or not lower:
            # A term with no requirement at all selects no node; it stays as it was.
            kept_terms.append(kept if lower else term)
        if lower:
            moved_terms.append(lower)
    if moved_terms:
        draft.affinity = clusterselector.with_required_terms(draft.affinity, kept_terms)
        terms = _and_terms(clusterselector.required_terms(draft.lower_affinity), moved_terms)
        draft.lower_affinity = clusterselector.with_required_terms(draft.lower_affinity, terms)


def pin_to_volume_node(draft: Draft, settings: MutationSettings, lookups: Lookups) -> None:
    """Require the node the pod's volumes were provisioned for (module docstring, step 2)."""
    del settings, lookups  # the volume nodes were looked up with the draft
    spec = as_mapping(draft.admission.pod.get("spec"))
    if not draft.volume_nodes or spec.get("nodeName"):
        return  # a pod bound at creation is not scheduled: nothing to pin
    node = draft.volume_nodes[0]
    others = sorted(set(draft.volume_nodes) - {node})
    if others:
        draft.warnings.append(
            f"tensile-webhook: the pod's volumes were provisioned for different nodes "
            f"({', '.join([node, *others])}); it is pinned to {node}"
        )
    requirement = {"key": contract_labels.HOSTNAME_LABEL, "operator": "In", "values": [node]}
    terms = clusterselector.required_terms(draft.affinity) or [{}]
    for term in terms:
        expressions = as_list(term.get("matchExpressions"))
        if requirement not in expressions:
            term["matchExpressions"] = [*expressions, requirement]
    draft.affinity = clusterselector.with_required_terms(draft.affinity, terms)


def keep_off_avoided_nodes(draft: Draft, settings: MutationSettings, lookups: Lookups) -> None:
    """Require the pod off the virtual nodes its controller must avoid (module docstring,
    step 3). After `convert_placement`, so the requirement is never moved below; merging it
    again into a pod that has it changes nothing."""
    del settings, lookups  # the avoided nodes were looked up with the draft
    if not draft.avoided_nodes:
        return
    # Noted on the pod, so the descheduler can tell them from a NotIn of the template:
    # nodes the pod excludes already are its own. On reinvocation the NotIn holds what the
    # first call added, which its note tells; a note the pod came with counts only for
    # nodes avoided now.
    own = avoidance.excluded_by_name(draft.affinity)
    noted = avoidance.added_nodes(draft.admission.pod) & draft.avoided_nodes
    draft.added_avoidances = noted | (draft.avoided_nodes - own)
    draft.affinity = avoidance.avoiding(draft.affinity or None, sorted(draft.avoided_nodes)) or {}


def convert_tolerations(draft: Draft, settings: MutationSettings, lookups: Lookups) -> None:
    """Copy the pod's tolerations into the annotation and put the webhook's on the pod
    (module docstring, step 4)."""
    del lookups
    if draft.previous is None:
        copied = list(draft.tolerations)
    else:
        # Converted before: what the webhook added then is not the user's.
        copied = [
            t
            for t in draft.tolerations
            if not clusterselector.is_added_toleration(t, taint_key=settings.taint_key)
        ]
    draft.lower_tolerations = clusterselector.union(draft.lower_tolerations, copied)
    upper = [t for t in draft.tolerations if not _tolerates_node_problem_eviction(t)]
    added = clusterselector.added_tolerations(
        taint_key=settings.taint_key,
        not_ready_seconds=settings.not_ready_seconds,
        unreachable_seconds=settings.unreachable_seconds,
    )
    draft.tolerations = clusterselector.union(upper, added)


STEPS: tuple[Step, ...] = (
    convert_placement,
    pin_to_volume_node,
    keep_off_avoided_nodes,
    convert_tolerations,
)
"""The conversion, in order: placement first (so a pin is never moved below), tolerations
last."""


# -- helpers ----------------------------------------------------------------------------------


def _draft(admission: PodAdmission, *, lookups: Lookups) -> Draft:
    pod = admission.pod
    spec = as_mapping(pod.get("spec"))
    annotations = annotations_of(pod)
    previous = clusterselector.parse(annotations.get(clusterselector.ANNOTATION))
    owner = avoidance.controller_of(pod)
    if clusterselector.ANNOTATION in annotations and previous is None:
        warnings = [
            "tensile-webhook: the pod's clusterSelector annotation is not valid (the virtual "
            "node would ignore it); it is replaced"
        ]
    else:
        warnings = []
    return Draft(
        admission=admission,
        node_selector=_string_map(spec.get("nodeSelector")),
        affinity=dict(as_mapping(spec.get("affinity"))),
        tolerations=list(as_list(spec.get("tolerations"))),
        lower_node_selector=dict((previous or {}).get("nodeSelector") or {}),
        lower_affinity=dict((previous or {}).get("affinity") or {}),
        lower_tolerations=list((previous or {}).get("tolerations") or []),
        previous=previous,
        volume_nodes=_volume_nodes(spec, namespace=admission.namespace, lookups=lookups),
        avoided_nodes=lookups.avoided_nodes(owner.uid) if owner is not None else frozenset(),
        warnings=warnings,
    )


def _volume_nodes(spec: Mapping[str, Any], *, namespace: str, lookups: Lookups) -> tuple[str, ...]:
    nodes: list[str] = []
    for volume in as_list(spec.get("volumes")):
        claim = as_mapping(as_mapping(volume).get("persistentVolumeClaim")).get("claimName")
        if isinstance(claim, str) and claim:
            node = claim_node(lookups.claim(namespace, claim))
            if node and node not in nodes:
                nodes.append(node)
    return tuple(nodes)


def _split_term(term: Mapping[str, Any], keeper: Keeper) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (what of `term` stays on the pod, what moves below), each without empty parts."""
    kept: dict[str, Any] = {}
    lower: dict[str, Any] = {}
    for name, fields in (("matchExpressions", False), ("matchFields", True)):
        for requirement in as_list(term.get(name)):
            side = kept if keeper.keeps_requirement(requirement, fields=fields) else lower
            side.setdefault(name, []).append(requirement)
    return kept, lower


def _and_terms(
    existing: Sequence[Mapping[str, Any]], moved: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Return the terms equal to (OR of `existing`) AND (OR of `moved`) (`TERM_RULES`).
    Raises _Refused beyond `clusterselector.MAX_TERMS`."""
    try:
        return clusterselector.and_terms(existing, moved, **TERM_RULES)
    except clusterselector.TooManyTerms as exc:
        raise _Refused(
            f"its clusterSelector has {exc.left} node-affinity terms and {exc.right} more "
            f"would be ANDed to them (over {exc.limit} terms)"
        ) from None


def _tolerates_node_problem_eviction(toleration: object) -> bool:
    """Whether a toleration applies to the not-ready/unreachable NoExecute taints (an empty
    effect tolerates every effect)."""
    return (
        isinstance(toleration, Mapping)
        and toleration.get("key") in clusterselector.NODE_PROBLEM_TAINTS
        and toleration.get("effect") in (None, "", "NoExecute")
    )


def _patch(draft: Draft) -> list[patches.Operation]:
    pod = draft.admission.pod
    operations: list[patches.Operation] = []
    for name, value in (
        ("nodeSelector", draft.node_selector),
        ("affinity", draft.affinity),
        ("tolerations", draft.tolerations),
    ):
        if value:
            operations += patches.set_member(pod, ("spec", name), value)
        else:
            operations += patches.remove_member(pod, ("spec", name))
    annotation = clusterselector.render(
        node_selector=draft.lower_node_selector,
        affinity=draft.lower_affinity,
        tolerations=draft.lower_tolerations,
    )
    changes: dict[str, str | None] = {}
    if draft.previous is None or json.loads(annotation) != draft.previous:
        # Else nothing new below: the annotation stays as it was written.
        changes[clusterselector.ANNOTATION] = annotation
    added = draft.added_avoidances
    changes[avoidance.ADDED_ANNOTATION] = avoidance.render_added(added) if added else None
    return operations + _annotation_patch(pod, changes)


def _annotation_patch(
    pod: Mapping[str, Any], changes: Mapping[str, str | None]
) -> list[patches.Operation]:
    """The operations that set (a string) or remove (None) each annotation of `changes`:
    one `add` of the whole map when the pod has no annotations yet (an `add` per key would
    each replace the map the one before made)."""
    current = meta_of(pod).get("annotations")
    if not isinstance(current, Mapping):
        values = {k: v for k, v in changes.items() if v is not None}
        return patches.set_member(pod, ("metadata", "annotations"), values) if values else []
    operations: list[patches.Operation] = []
    for key, value in changes.items():
        path = ("metadata", "annotations", key)
        if value is None:
            operations += patches.remove_member(pod, path)
        else:
            operations += patches.set_member(pod, path, value)
    return operations


def _string_map(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
