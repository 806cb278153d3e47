"""Translation of pods between the upper and the lower cluster (objects in, objects out).

Upper pod -> the lower pod to create or the patch to apply to it, and the ConfigMaps, Secrets
and ServiceAccount it needs there; lower pod -> the status and labels the upper pod should
show. This is tensile-kube's TrimPod / GetUpdatedPod / status mirroring, without the defects
listed in research/tensile-kube.md section 10 (by-index image copy, annotations replaced
wholesale, env flattening, legacy-only ServiceAccount handling). Pure functions only: nothing
here does I/O, and no input is ever mutated.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import clusterselector, ownership, podpolicy, selectors
from tensile.contracts.labels import DEFAULT_TAINT_KEY
from tensile.contracts.objects import as_list, as_mapping, dicts_in, meta_of
from tensile.kube import codec
from tensile.kube.quantity import parse_quantity
from tensile.placement.lower import lower_placement, lower_tolerations
from vnode.providers.k2k import boundtokens, naming, volumes
from vnode.settings import PodSecurityLevel

# Server-set or upper-only metadata: the lower API server assigns its own, or rejects them.
_DROPPED_METADATA = (
    "uid", "resourceVersion", "selfLink", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "generation", "ownerReferences", "managedFields",
    "finalizers", "generateName",
)  # fmt: skip
_CONTAINER_GROUPS = ("initContainers", "containers")
_STATUS_COPIED = (
    "phase", "conditions", "message", "reason", "podIP", "podIPs", "startTime", "qosClass",
    "containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses", "resize",
    "resourceClaimStatuses",
)  # fmt: skip
# The pod conditions of a resize (KEP-1287): the node's (kubelet's) to report, so the lower
# pod's, never kept from the upper status once the lower pod stops reporting them.
RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")
# What the `resize` subresource may change: each container's cpu and memory requests and
# limits (pkg/registry/core/pod/strategy.go, podResizeStrategy).
_RESIZABLE = ("cpu", "memory")
_RESOURCE_LISTS = ("requests", "limits")
# Volume-name prefixes, not credentials.
_MODERN_TOKEN_PREFIX = "kube-api-access-"  # noqa: S105
_LEGACY_TOKEN_PREFIX = "default-token-"  # noqa: S105
# Pod volume sources that name a Secret through `secretRef` (a LocalObjectReference).
_SECRET_REF_SOURCES = ("cephfs", "cinder", "rbd", "flexVolume", "iscsi", "scaleIO", "storageos")
# Published into every namespace by the lower cluster's own controller, with the lower CA,
# which is what a lower pod must trust; an upper copy would be wrong and collide with it.
_ROOT_CA = "kube-root-ca.crt"
CONFIG_MAP = "ConfigMap"
SECRET = "Secret"  # noqa: S105 (a kind name)


@dataclass(frozen=True, kw_only=True)
class TranslationPolicy:
    """Settings of one virtual node that the translation depends on."""

    node_name: str
    cluster_id: str
    """The upper cluster's identity, recorded on every lower object (see
    `ownership.NodeIdentity`)."""
    node_labels: Mapping[str, str]
    namespace_prefix: str = ""
    ignore_labels: tuple[str, ...] = ()
    enable_service_account: bool = True
    pod_security_level: PodSecurityLevel = "baseline"
    """The Pod Security Standard pods must meet to go below (see `podsecurity`)."""
    taint_key: str = DEFAULT_TAINT_KEY
    """Key of the virtual node's taint: the webhook's toleration of it stays upstairs."""
    priority_classes: tuple[tuple[str, str], ...] = ()
    """--priority-class-map (upper class, lower class) pairs (`podpolicy.PRIORITY_CLASSES`)."""
    scheduler_names: tuple[tuple[str, str], ...] = ()
    """--scheduler-name-map (upper, lower) pairs (`podpolicy.SCHEDULER_NAMES`)."""
    runtime_classes: tuple[tuple[str, str], ...] = ()
    """--runtime-class-map (upper, lower) pairs (`podpolicy.RUNTIME_CLASSES`)."""
    volume_types: frozenset[str] = frozenset()
    """--allowed-volume-types: the volume types of `podpolicy.OUTSIDE_VOLUMES` that cross."""
    storage_classes: volumes.StorageClassMap = dataclasses.field(
        default_factory=volumes.StorageClassMap
    )
    """--lower-storage-class: the lower class of an ephemeral volume's claim template (as of
    a copied claim's)."""
    lower_node_selector: selectors.Selector = selectors.EVERYTHING
    """--lower-node-selector: the lower nodes this virtual node stands for; its lower pods
    are confined to them (`placement.lower.pool_term`)."""
    upper_api_address: str = ""
    """--upper-api-address ("host:port" lower pods reach the upper apiserver at): with
    `enable_service_account`, lower pods get tokens of their upper ServiceAccount and this
    address instead of the lower cluster's (`boundtokens`); "": the lower cluster's."""

    @property
    def pods(self) -> podpolicy.PodPolicy:
        """The pod table's settings (`podpolicy`) among these."""
        return podpolicy.PodPolicy(
            scheduler_names=self.scheduler_names,
            runtime_classes=self.runtime_classes,
            priority_classes=self.priority_classes,
            volume_types=self.volume_types,
            pod_security_level=self.pod_security_level,
        )

    @property
    def upper_tokens(self) -> bool:
        """Whether lower pods get upper ServiceAccount tokens (`boundtokens`)."""
        return self.enable_service_account and bool(self.upper_api_address)

    @property
    def owner(self) -> ownership.NodeIdentity:
        """The owner marked on the lower objects of this virtual node."""
        return ownership.NodeIdentity(node_name=self.node_name, cluster_id=self.cluster_id)


@dataclass(frozen=True, kw_only=True)
class RefusedResize:
    """A resize of an upper pod the lower cluster refused (its apiserver: for one, the
    PodResizeValidator admission of Kubernetes 1.37 refuses requests above the lower node's
    allocatable, which the virtual node's summed allocatable let through upstairs)."""

    generation: int
    """The upper pod's `metadata.generation` the refused resize made."""
    message: str
    """The lower apiserver's message."""
    at: str
    """When it was refused (RFC 3339), the condition's lastTransitionTime."""


@dataclass(frozen=True)
class Dependencies:
    """What a pod needs to exist in its lower namespace before it can start there."""

    config_maps: frozenset[str]
    secrets: frozenset[str]
    service_account: str | None


def lower_pod(
    upper: Mapping[str, Any],
    *,
    policy: TranslationPolicy,
    absent: frozenset[tuple[str, str]] = frozenset(),
    provisioned: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Return the pod to create in the lower cluster for the upper pod `upper`.

    Mirrors tensile-kube's TrimPod, fixed: same name, namespace `prefix + namespace`; labels
    in `policy.ignore_labels` move to the `tripped-labels` annotation; ownership marks, the
    upper UID and namespace are added; server-set metadata is dropped, and so are the spec
    fields the pod table drops (`podpolicy.DROPPED_SPEC`), while those it maps (scheduler
    name, runtime and priority class, `podpolicy.CLASS_MAPS`) are mapped or dropped;
    placement follows `placement.lower_placement`; the volumes the upper ServiceAccount
    admission injected are removed so the lower one injects its own token; env fieldRefs
    that would resolve differently below become literals. With
    `policy.enable_service_account` False the pod runs as the lower namespace's `default`
    ServiceAccount, which always exists, so no ServiceAccount has to be copied.

    `absent` are the ("ConfigMap"|"Secret", name) pairs that are not copied below (optional
    and missing upstairs, or not copyable): every reference to them is removed, so the
    lower pod never resolves them to an object of the same name that belongs to someone
    else (see `without_references`).

    `provisioned` names the pod's generic ephemeral volumes whose claims the virtual node
    provisions (their class is a virtual-node class): below, each mounts the lower claim the
    node made, `<pod>-<volume>` (`persistentVolumeClaim`), instead of keeping the `ephemeral`
    source, whose claim the lower ephemeral volume controller would insist on making for
    the lower pod itself (it refuses a claim of that name it did not make). The others stay
    `ephemeral`: the lower cluster makes their claims, owned by the lower pod, of the lower
    StorageClass `policy.storage_classes` gives their template's class.

    The pod's refusals (`podpolicy.refusals`: a claim template picking a volume, volume
    types the node does not allow) are the caller's to check first: what they refuse is
    passed through here as written.
    """
    meta = meta_of(upper)
    namespace = str(meta.get("namespace") or "default")
    annotation = as_mapping(meta.get("annotations")).get(clusterselector.ANNOTATION)
    spec = lower_placement(
        _spec(upper),
        cluster_selector=clusterselector.parse(annotation),
        node_name=policy.node_name,
        node_labels=policy.node_labels,
        taint_key=policy.taint_key,
        pool=policy.lower_node_selector,
    )
    for key in podpolicy.DROPPED_SPEC:
        spec.pop(key, None)
    for mapped in podpolicy.CLASS_MAPS:
        lower, _ = podpolicy.lower_class(mapped, spec.get(mapped.key), policy=policy.pods)
        if lower is None:
            spec.pop(mapped.key, None)
        else:
            spec[mapped.key] = lower
    token_volumes = {
        str(v.get("name")) for v in dicts_in(spec.get("volumes")) if _is_injected_token_volume(v)
    }
    bound = (
        {str(v.get("name")) for v in boundtokens.token_volumes({"spec": spec})}
        if policy.upper_tokens
        else set()
    )
    if bound:
        # The upper token, kept below by the node (`boundtokens`), where the injected one was
        # (a legacy token Secret volume is dropped as before: no upper token is asked for it).
        name = boundtokens.secret_name(str(meta.get("name")), str(meta.get("uid") or ""))
        spec["volumes"] = [
            boundtokens.lower_volume(v, secret=name, upper_ca=True) if v.get("name") in bound else v
            for v in dicts_in(spec["volumes"])
        ]
        token_volumes -= bound
    if token_volumes:
        spec["volumes"] = [
            v for v in dicts_in(spec["volumes"]) if v.get("name") not in token_volumes
        ]
        if not spec["volumes"]:
            del spec["volumes"]
    if not policy.enable_service_account:
        spec["serviceAccountName"] = spec["serviceAccount"] = "default"
    if absent:
        _remove_references(spec, absent)
    _lower_ephemeral_volumes(spec, pod=upper, provisioned=provisioned, policy=policy)
    for group in _CONTAINER_GROUPS:
        for container in dicts_in(spec.get(group)):
            _lower_container(container, upper_meta=meta, token_volumes=token_volumes, policy=policy)
            if policy.upper_tokens:
                _upper_api_env(container, address=policy.upper_api_address)
    metadata = codec.deep_copy({k: v for k, v in meta.items() if k not in _DROPPED_METADATA})
    metadata["namespace"] = naming.lower_namespace(namespace, prefix=policy.namespace_prefix)
    metadata["labels"], metadata["annotations"] = _lower_marks(meta, policy=policy)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def dropped_classes(
    upper: Mapping[str, Any], *, policy: TranslationPolicy
) -> list[tuple[str, str]]:
    """Return (reason, message) of the Warning for each field of the upper pod `upper` that
    `lower_pod` drops although the tenant asked for something (`podpolicy.lower_class`): a
    scheduler name, runtime or priority class no flag maps."""
    spec = _spec(upper)
    found = []
    for mapped in podpolicy.CLASS_MAPS:
        _, dropped = podpolicy.lower_class(mapped, spec.get(mapped.key), policy=policy.pods)
        if dropped is not None:
            found.append((mapped.reason, dropped))
    return found


def dependencies(upper: Mapping[str, Any]) -> Dependencies:
    """Return the ConfigMaps, Secrets and ServiceAccount the upper pod `upper` references.

    Covers what tensile-kube missed (projected sources, CSI and other secret-backed volumes,
    env and envFrom of every container kind), plus imagePullSecrets. Left out: the token
    volumes `lower_pod` removes or rewrites (legacy `default-token-*`; of a projected
    `kube-api-access-*`, the sources the admission injects, `boundtokens.injected_source`),
    and ConfigMap `kube-root-ca.crt`, which every lower namespace has of its own. The
    ServiceAccount is `serviceAccountName` (or the deprecated `serviceAccount`), else
    `default` as in Kubernetes.
    """
    refs = list(_references(upper))
    spec = as_mapping(upper.get("spec"))
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    return Dependencies(
        config_maps=frozenset(name for kind, name, _ in refs if kind == CONFIG_MAP),
        secrets=frozenset(name for kind, name, _ in refs if kind == SECRET),
        service_account=str(account),
    )


def optional_references(upper: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """Return the ("ConfigMap"|"Secret", name) pairs the pod can start without.

    A pair qualifies when every reference to it is `optional: true`, as a kubelet then starts
    the pod without it. imagePullSecrets count as optional: a kubelet pulls without a missing
    pull secret (it only warns).
    """
    refs = list(_references(upper))
    required = {(kind, name) for kind, name, optional in refs if not optional}
    return frozenset((k, n) for k, n, _ in refs if (k, n) not in required)


def upper_status(
    lower: Mapping[str, Any],
    *,
    upper: Mapping[str, Any],
    node_ip: str,
    refused: RefusedResize | None = None,
) -> dict[str, Any]:
    """Return the status to write to the upper pod `upper`, mirrored from its lower pod `lower`.

    Like tensile-kube the lower status is copied (phase, conditions, IPs, container statuses,
    ...), but hostIP(s) become `node_ip`, the virtual node's address the upper cluster knows,
    and nominatedNodeName (a lower node) is not copied. Upper conditions of types the lower
    pod does not report (e.g. set by upper controllers for readiness gates) are kept, and the
    upper pod's readinessGates gate Ready as a kubelet's would (reason ReadinessGatesNotReady).
    A resize's conditions (`RESIZE_CONDITIONS`) are the lower pod's only. Generations are
    the upper pod's: `status.observedGeneration` and the observedGeneration of the lower
    conditions become what `observed_generation` says (the upper pod's current generation
    once the lower pod has observed its own and has the upper's resources; else the upper
    status keeps what it had). A resize the lower cluster `refused`, for the upper pod's
    current generation, is told as a kubelet tells one it cannot take: condition
    PodResizePending, reason Infeasible, the lower message, that generation observed.
    """
    status = as_mapping(lower.get("status"))
    mirrored = codec.deep_copy({key: status[key] for key in _STATUS_COPIED if key in status})
    mirrored["hostIP"] = node_ip
    mirrored["hostIPs"] = [{"ip": node_ip}]
    upper_now = as_mapping(upper.get("status"))
    observed = observed_generation(upper=upper, lower=lower)
    held = upper_now.get("observedGeneration")
    if observed is not None:
        mirrored["observedGeneration"] = observed
    elif isinstance(held, int):
        mirrored["observedGeneration"] = held
    conditions = dicts_in(mirrored.get("conditions"))
    upper_conditions = dicts_in(upper_now.get("conditions"))
    _upper_generations(conditions, upper_conditions, lower=lower, observed=observed)
    reported = {c.get("type") for c in conditions}
    conditions += [
        codec.deep_copy(c)
        for c in upper_conditions
        if c.get("type") not in reported and c.get("type") not in RESIZE_CONDITIONS
    ]
    gates = [
        as_mapping(g).get("conditionType") for g in as_list(_spec(upper).get("readinessGates"))
    ]
    for ready in conditions:
        if ready.get("type") == "Ready" and ready.get("status") == "True":
            unready = _unready_gates(gates, conditions)
            if unready:
                ready.update(status="False", reason="ReadinessGatesNotReady", message=unready)
    if refused is not None and refused.generation == meta_of(upper).get("generation"):
        conditions = [c for c in conditions if c.get("type") != "PodResizePending"]
        conditions.append(infeasible_condition(refused))
        mirrored["observedGeneration"] = refused.generation
    if conditions:
        mirrored["conditions"] = conditions
    return mirrored


def infeasible_condition(refused: RefusedResize) -> dict[str, Any]:
    """Return the PodResizePending condition of a resize the lower cluster refused: reason
    Infeasible (`v1.PodReasonInfeasible`, what a kubelet reports of a resize it can never
    take), the lower apiserver's message, the upper generation it was for."""
    return {
        "type": "PodResizePending",
        "status": "True",
        "reason": "Infeasible",
        "message": refused.message,
        "observedGeneration": refused.generation,
        "lastTransitionTime": refused.at,
    }


def observed_generation(*, upper: Mapping[str, Any], lower: Mapping[str, Any]) -> int | None:
    """Return the upper pod's generation its status may say is observed, or None.

    The two pods count generations apart (each apiserver bumps its own at each spec change),
    so the lower pod's `status.observedGeneration` cannot go up as it is. It stands for the
    upper pod's current `metadata.generation` when the lower pod has observed its own
    current generation and holds what the upper pod asks of a resize (`resize_patch` finds
    nothing to send); otherwise None: the lower node has not caught up yet.
    """
    observed = as_mapping(lower.get("status")).get("observedGeneration")
    current = meta_of(lower).get("generation")
    generation = meta_of(upper).get("generation")
    if not isinstance(generation, int) or not isinstance(observed, int) or observed != current:
        return None
    return generation if resize_patch(upper, lower) is None else None


def _upper_generations(
    conditions: list[dict[str, Any]],
    upper_conditions: list[dict[str, Any]],
    *,
    lower: Mapping[str, Any],
    observed: int | None,
) -> None:
    # `conditions` are upper_status's own copies of the lower ones: changed in place.
    held = {c.get("type"): c.get("observedGeneration") for c in upper_conditions}
    current = as_mapping(lower.get("status")).get("observedGeneration")
    for condition in conditions:
        if "observedGeneration" not in condition:
            continue
        if observed is not None and condition["observedGeneration"] == current:
            condition["observedGeneration"] = observed
        elif isinstance(held.get(condition.get("type")), int):
            condition["observedGeneration"] = held[condition.get("type")]
        else:
            del condition["observedGeneration"]


def resize_patch(upper: Mapping[str, Any], lower: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the body of a PATCH on the lower pod's `resize` subresource that gives its
    containers the upper pod's cpu and memory, or None when they have them already.

    In: the upper pod and its lower pod. Compared per container and init container (matched
    by name; a sidecar can be resized, and the lower apiserver judges the others as the upper
    one did), for cpu and memory in requests and limits, as quantities ("1" equals "1000m").
    Only what the upper pod names is sent: a figure the lower cluster added (a LimitRange's
    default) is left alone, and the resize subresource refuses a removal anyway.
    Out: an `application/strategic-merge-patch+json` body, `{"spec": {group: [{"name",
    "resources": {"requests"|"limits": {resource: quantity}}}]}}` (containers merge by name).
    The upper pod's `resize` request is forwarded as it was made (kubectl patch pod
    --subresource resize; pkg/registry/core/pod/strategy.go, podResizeStrategy).
    """
    spec: dict[str, Any] = {}
    for group in _CONTAINER_GROUPS:
        have = {
            c.get("name"): as_mapping(c.get("resources")) for c in dicts_in(_spec(lower).get(group))
        }
        changed = []
        for container in dicts_in(_spec(upper).get(group)):
            name = container.get("name")
            if not isinstance(name, str) or name not in have:
                continue
            wanted = _resizable(as_mapping(container.get("resources")))
            current = have[name]
            if any(
                not _same_quantity(amount, as_mapping(current.get(kind)).get(resource))
                for kind, amounts in wanted.items()
                for resource, amount in amounts.items()
            ):
                changed.append({"name": name, "resources": wanted})
        if changed:
            spec[group] = changed
    return {"spec": spec} if spec else None


def _resizable(resources: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The cpu and memory of `resources`' requests and limits (empty lists left out)."""
    found: dict[str, dict[str, Any]] = {}
    for kind in _RESOURCE_LISTS:
        amounts = {r: q for r, q in as_mapping(resources.get(kind)).items() if r in _RESIZABLE}
        if amounts:
            found[kind] = amounts
    return found


def _same_quantity(left: object, right: object) -> bool:
    if left == right:
        return True
    if not isinstance(left, str | int) or not isinstance(right, str | int):
        return False
    try:
        return parse_quantity(left) == parse_quantity(right)
    except ValueError:
        return False


def restored_labels(lower: Mapping[str, Any]) -> dict[str, str]:
    """Return what the upper pod's labels should be, from its lower pod `lower`.

    The lower labels without the ownership labels (`OWNERSHIP_LABELS`), with the labels
    `lower_pod` moved into the `tripped-labels` annotation put back (tensile-kube's GetPod
    recovery). An unparseable `tripped-labels` is ignored.
    """
    meta = meta_of(lower)
    labels = {
        k: v
        for k, v in as_mapping(meta.get("labels")).items()
        if k not in ownership.OWNERSHIP_LABELS
    }
    tripped = as_mapping(meta.get("annotations")).get(naming.TRIPPED_LABELS_ANNOTATION)
    try:
        moved = json.loads(tripped) if isinstance(tripped, str) else None
    except (ValueError, RecursionError):
        moved = None
    if isinstance(moved, dict):
        labels.update({k: v for k, v in moved.items() if isinstance(v, str)})
    return labels


def spec_update(
    upper: Mapping[str, Any], lower: Mapping[str, Any], *, policy: TranslationPolicy
) -> dict[str, Any] | None:
    """Return the patch that brings the lower pod `lower` in line with the upper pod `upper`.

    Only what Kubernetes lets change on an existing pod is considered: container and init
    container images (matched by name, unlike tensile-kube's by-index copy), a new or lower
    activeDeadlineSeconds, added tolerations (the only legal change to them), and labels and
    annotations computed as `lower_pod` does (ownership marks and `tripped-labels` kept).
    Keys are added or changed, never removed: a key the lower pod has and the upper lacks may
    be the lower cluster's own (a CNI's annotation, say) and is left alone.
    Out: a body for `application/strategic-merge-patch+json`, which
    merges `containers`/`initContainers` by name (so they are `[{"name", "image"}]`) and
    replaces `tolerations` wholesale (so it lists the existing ones plus the added), or None
    when nothing differs.
    """
    # What `lower_pod` would make of these fields, worked out without the rest of the pod:
    # every pod of the node is compared at each start, most of them to find nothing.
    upper_meta, upper_spec = meta_of(upper), _spec(upper)
    marks = dict(
        zip(("labels", "annotations"), _lower_marks(upper_meta, policy=policy), strict=True)
    )
    selector = clusterselector.parse(
        as_mapping(upper_meta.get("annotations")).get(clusterselector.ANNOTATION)
    )
    wanted_tolerations = lower_tolerations(
        upper_spec, cluster_selector=selector, taint_key=policy.taint_key
    )
    have_meta, have_spec = meta_of(lower), _spec(lower)
    meta_patch: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        want, have = marks[key], as_mapping(have_meta.get(key))
        diff = {k: v for k, v in want.items() if have.get(k) != v}
        if diff:
            meta_patch[key] = diff
    spec_patch: dict[str, Any] = {}
    for group in _CONTAINER_GROUPS:
        images = {c.get("name"): c.get("image") for c in dicts_in(have_spec.get(group))}
        changed = [
            {"name": c["name"], "image": c["image"]}
            for c in dicts_in(upper_spec.get(group))
            if isinstance(c.get("name"), str)
            and c["name"] in images
            and c.get("image") is not None
            and images[c["name"]] != c["image"]
        ]
        if changed:
            spec_patch[group] = changed
    deadline = upper_spec.get("activeDeadlineSeconds")
    current = have_spec.get("activeDeadlineSeconds")
    # Kubernetes lets a deadline be set or shortened, never removed or extended.
    if isinstance(deadline, int) and (not isinstance(current, int) or deadline < current):
        spec_patch["activeDeadlineSeconds"] = deadline
    existing = as_list(have_spec.get("tolerations"))
    added = [tol for tol in wanted_tolerations if tol not in existing]
    if added:
        spec_patch["tolerations"] = codec.deep_copy(existing) + added
    patch = {"metadata": meta_patch, "spec": spec_patch}
    return {k: v for k, v in patch.items() if v} or None


def _lower_marks(
    meta: Mapping[str, Any], *, policy: TranslationPolicy
) -> tuple[dict[str, Any], dict[str, Any]]:
    labels = dict(as_mapping(meta.get("labels")))
    annotations = dict(as_mapping(meta.get("annotations")))
    # Only lower_pod writes tripped-labels; one arriving from above would inject labels the
    # upper pod never had when restored_labels merges it back.
    annotations.pop(naming.TRIPPED_LABELS_ANNOTATION, None)
    # Only the node writes the trace context below (its create's span); one from above
    # would join the lower pod to whatever trace its writer chose.
    annotations.pop(naming.TRACEPARENT_ANNOTATION, None)
    moved = {key: labels.pop(key) for key in policy.ignore_labels if labels.get(key)}
    if moved:
        annotations[naming.TRIPPED_LABELS_ANNOTATION] = json.dumps(
            moved, separators=(",", ":"), sort_keys=True, ensure_ascii=False
        )
    owner_labels, owner_annotations = ownership.owner_marks(policy.owner)
    labels.update(owner_labels)
    annotations.update(owner_annotations)
    if meta.get("uid"):
        annotations[ownership.UPPER_UID_ANNOTATION] = str(meta["uid"])
    annotations[ownership.UPPER_NAMESPACE_ANNOTATION] = str(meta.get("namespace") or "default")
    return codec.deep_copy(labels), codec.deep_copy(annotations)


def _lower_container(
    container: dict[str, Any],
    *,
    upper_meta: Mapping[str, Any],
    token_volumes: set[str],
    policy: TranslationPolicy,
) -> None:
    # `container` belongs to lower_pod's own deep copy, so it is changed in place.
    mounts = [
        m for m in dicts_in(container.get("volumeMounts")) if m.get("name") not in token_volumes
    ]
    if mounts:
        container["volumeMounts"] = mounts
    else:
        container.pop("volumeMounts", None)
    # Literals for what the lower kubelet would resolve differently; everything else
    # (metadata.name, labels, status.podIP, resourceFieldRef, ...) it resolves correctly.
    literals = {"spec.nodeName": policy.node_name}
    if upper_meta.get("uid"):
        literals["metadata.uid"] = str(upper_meta["uid"])
    if policy.namespace_prefix:
        literals["metadata.namespace"] = str(upper_meta.get("namespace") or "default")
    for var in dicts_in(container.get("env")):
        path = as_mapping(as_mapping(var.get("valueFrom")).get("fieldRef")).get("fieldPath")
        if isinstance(path, str) and path in literals:
            var.pop("valueFrom")
            var["value"] = literals[path]


def _remove_references(spec: dict[str, Any], absent: frozenset[tuple[str, str]]) -> None:
    # `spec` is lower_pod's own deep copy. What a kubelet does with an optional reference
    # whose object is missing, done here so the lower kubelet never looks the name up:
    # a volume becomes an empty directory (the kubelet mounts an empty one), a projected
    # source is left out, an env var or envFrom entry is not set, a pull secret not used.
    def gone(kind: str, ref: object) -> bool:
        return (kind, str(as_mapping(ref).get("name"))) in absent

    for volume in dicts_in(spec.get("volumes")):
        config_map, secret = as_mapping(volume.get("configMap")), as_mapping(volume.get("secret"))
        emptied = (CONFIG_MAP, str(config_map.get("name"))) in absent or (
            SECRET,
            str(secret.get("secretName")),
        ) in absent
        projected = volume.get("projected")
        if isinstance(projected, dict) and isinstance(projected.get("sources"), list):
            kept = [
                source
                for source in projected["sources"]
                if not (
                    isinstance(source, dict)
                    and (
                        gone(CONFIG_MAP, source.get("configMap"))
                        or gone(SECRET, source.get("secret"))
                    )
                )
            ]
            emptied = emptied or not kept
            projected["sources"] = kept
        if emptied:
            for source in ("configMap", "secret", "projected"):
                volume.pop(source, None)
            volume["emptyDir"] = {}
    for group in ("initContainers", "containers"):
        for container in dicts_in(spec.get(group)):
            if isinstance(container.get("env"), list):
                container["env"] = [
                    var
                    for var in container["env"]
                    if not (
                        isinstance(var, dict)
                        and (
                            gone(
                                CONFIG_MAP, as_mapping(var.get("valueFrom")).get("configMapKeyRef")
                            )
                            or gone(SECRET, as_mapping(var.get("valueFrom")).get("secretKeyRef"))
                        )
                    )
                ]
            if isinstance(container.get("envFrom"), list):
                container["envFrom"] = [
                    entry
                    for entry in container["envFrom"]
                    if not (
                        isinstance(entry, dict)
                        and (
                            gone(CONFIG_MAP, entry.get("configMapRef"))
                            or gone(SECRET, entry.get("secretRef"))
                        )
                    )
                ]
    if isinstance(spec.get("imagePullSecrets"), list):
        spec["imagePullSecrets"] = [
            ref for ref in spec["imagePullSecrets"] if not gone(SECRET, ref)
        ]
        if not spec["imagePullSecrets"]:
            del spec["imagePullSecrets"]


def _lower_ephemeral_volumes(
    spec: dict[str, Any],
    *,
    pod: Mapping[str, Any],
    provisioned: frozenset[str],
    policy: TranslationPolicy,
) -> None:
    """Make the generic ephemeral volumes `provisioned` of `spec` (a copy of `pod`'s) mount
    their claims, `<pod>-<volume>` (`volumes.ephemeral_claim_name`); give the others' claim
    templates the lower StorageClass (`volumes.lower_template`)."""
    for volume in dicts_in(spec.get("volumes")):
        claim = volumes.ephemeral_claim_name(pod, volume)
        if claim is None:
            continue
        if volume.get("name") in provisioned:
            del volume["ephemeral"]
            volume["persistentVolumeClaim"] = {"claimName": claim}
            continue
        ephemeral = volume.get("ephemeral")
        if isinstance(ephemeral, dict) and isinstance(ephemeral.get("volumeClaimTemplate"), dict):
            ephemeral["volumeClaimTemplate"] = volumes.lower_template(
                ephemeral["volumeClaimTemplate"], classes=policy.storage_classes
            )


def _upper_api_env(container: dict[str, Any], *, address: str) -> None:
    # Explicit env wins over the service env the lower kubelet adds: the in-cluster client
    # of the pod then reaches the upper apiserver, whose token and CA it holds.
    wanted = boundtokens.service_env(address)
    names = {e["name"] for e in wanted}
    env = [e for e in dicts_in(container.get("env")) if e.get("name") not in names]
    container["env"] = [*env, *wanted]


def _is_injected_token_volume(volume: Mapping[str, Any]) -> bool:
    # What the ServiceAccount admission adds: a projected token volume (Kubernetes >= 1.21),
    # or the legacy token Secret volume.
    name = str(volume.get("name") or "")
    sources = dicts_in(as_mapping(volume.get("projected")).get("sources"))
    if name.startswith(_MODERN_TOKEN_PREFIX) and any("serviceAccountToken" in s for s in sources):
        return True
    return name.startswith(_LEGACY_TOKEN_PREFIX) and "secret" in volume


@dataclass(frozen=True, kw_only=True)
class Reference:
    """One reference of a pod to a ConfigMap or Secret, where it was found."""

    kind: str
    """"ConfigMap" or "Secret"."""
    name: str
    optional: bool
    key: str | None = None
    """The data key an env var reads (configMapKeyRef, secretKeyRef); None: the whole object."""
    volume: str | None = None
    """The pod volume that needs it; None for env, envFrom and imagePullSecrets."""
    pull_secret: bool = False


def references(upper: Mapping[str, Any]) -> Iterator[Reference]:
    """Yield every ConfigMap and Secret reference of the pod, in the order a kubelet meets them:
    volumes (mounted first), then env and envFrom of each container, then imagePullSecrets.

    Empty or missing names are skipped, as are the token volumes `lower_pod` removes (of a
    `kube-api-access-*` volume, the sources the admission injected) and the lower
    cluster's own `kube-root-ca.crt`.
    """
    spec = _spec(upper)
    refs = _volume_references(dicts_in(spec.get("volumes")))
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for container in dicts_in(spec.get(group)):
            for env in dicts_in(container.get("env")):
                source = as_mapping(env.get("valueFrom"))
                for field, kind in (("configMapKeyRef", CONFIG_MAP), ("secretKeyRef", SECRET)):
                    ref = as_mapping(source.get(field))
                    key = ref.get("key")
                    at = {"key": key} if isinstance(key, str) else {}
                    refs.append((kind, ref.get("name"), ref.get("optional"), at))
            for env_from in dicts_in(container.get("envFrom")):
                for field, kind in (("configMapRef", CONFIG_MAP), ("secretRef", SECRET)):
                    ref = as_mapping(env_from.get(field))
                    refs.append((kind, ref.get("name"), ref.get("optional"), {}))
    refs += [
        (SECRET, p.get("name"), True, {"pull_secret": True})
        for p in dicts_in(spec.get("imagePullSecrets"))
    ]
    for kind, name, optional, extra in refs:
        if isinstance(name, str) and name and (kind, name) != (CONFIG_MAP, _ROOT_CA):
            yield Reference(kind=kind, name=name, optional=optional is True, **extra)


def _references(upper: Mapping[str, Any]) -> Iterator[tuple[str, str, bool]]:
    # Every (kind, name, optional) reference of the pod.
    for ref in references(upper):
        yield ref.kind, ref.name, ref.optional


_Ref = tuple[str, object, object, dict[str, Any]]


def _volume_references(volumes: list[dict[str, Any]]) -> list[_Ref]:
    refs: list[_Ref] = []
    for volume in volumes:
        at = {"volume": str(volume.get("name") or "")}
        if _is_injected_token_volume(volume):
            # What the admission injected is rewritten or removed by lower_pod; any other
            # source a tenant adds to the volume is a reference like any other, or it would
            # mount whatever the lower namespace holds of that name.
            for source in dicts_in(as_mapping(volume.get("projected")).get("sources")):
                if not boundtokens.injected_source(source):
                    for field, kind in (("configMap", CONFIG_MAP), ("secret", SECRET)):
                        ref = as_mapping(source.get(field))
                        refs.append((kind, ref.get("name"), ref.get("optional"), at))
            continue
        config_map = as_mapping(volume.get("configMap"))
        refs.append((CONFIG_MAP, config_map.get("name"), config_map.get("optional"), at))
        secret = as_mapping(volume.get("secret"))
        refs.append((SECRET, secret.get("secretName"), secret.get("optional"), at))
        for source in dicts_in(as_mapping(volume.get("projected")).get("sources")):
            for field, kind in (("configMap", CONFIG_MAP), ("secret", SECRET)):
                ref = as_mapping(source.get(field))
                refs.append((kind, ref.get("name"), ref.get("optional"), at))
        # Secret-backed volume plugins have no `optional`: the volume cannot mount without it.
        csi_ref = as_mapping(as_mapping(volume.get("csi")).get("nodePublishSecretRef"))
        refs.append((SECRET, csi_ref.get("name"), False, at))
        for plugin in _SECRET_REF_SOURCES:
            ref = as_mapping(as_mapping(volume.get(plugin)).get("secretRef"))
            refs.append((SECRET, ref.get("name"), False, at))
        refs.append((SECRET, as_mapping(volume.get("azureFile")).get("secretName"), False, at))
    return refs


def _unready_gates(gates: list[Any], conditions: list[dict[str, Any]]) -> str:
    # The kubelet's wording (pkg/kubelet/status), joined the same way.
    by_type = {c.get("type"): c for c in conditions}
    messages = []
    for gate in gates:
        condition = by_type.get(gate)
        if condition is None:
            messages.append(
                f'corresponding condition of pod readiness gate "{gate}" does not exist.'
            )
        elif condition.get("status") != "True":
            messages.append(
                f'the status of pod readiness gate "{gate}" is not "True", '
                f"but {condition.get('status')}"
            )
    return ", ".join(messages)


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(pod.get("spec"))
