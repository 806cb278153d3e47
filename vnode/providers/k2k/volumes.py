"""Persistent volumes across the boundary (pure): the virtual node as the external
provisioner of an upper StorageClass, and tensile-kube's path for claims of other classes.

**Provisioning** (the Kubernetes way, kubernetes.io/docs "Storage Classes" and the
external-provisioner contract): an upper StorageClass names `PROVISIONER` with
`volumeBindingMode: WaitForFirstConsumer`. When the upper scheduler picks a virtual node
for a pod using such a claim it writes `volume.kubernetes.io/selected-node` on the claim
(scheduler volumebinding, AssumePodVolumes); the upper PV controller then marks the claim
for us (`volume.kubernetes.io/storage-provisioner`). The selected virtual node creates the
claim below (in the mapped namespace, of the lower StorageClass its flag maps the upper one
to) and an upper PersistentVolume pinned to itself by node affinity, annotated
`pv.kubernetes.io/provisioned-by` and pre-bound to the claim (`claimRef` with its UID).
The upper PV controller binds the two; the scheduler's `checkBindings` sees the PV's node
affinity match the virtual node and binds the pod there, and every later pod using the
claim is placed on the same virtual node by the scheduler itself. Below, the claim binds
when the lower scheduler places the pod (so each lower pod lands where its volume is).

**Migration** (tensile-kube's path): a claim of another class, copied down with the pod
that uses it; once bound below, the lower PersistentVolume is shown upstairs as one pinned
to the virtual node, and the claim gets `selected-node` = the virtual node (which the
webhook reads to pin later pods).

**Generic ephemeral volumes** of a virtual-node class: the upper ephemeral volume
controller makes the claim `<pod>-<volume>`, owned by the upper pod; it is provisioned as
any claim of the class (a lower claim of the virtual node, an upper PV), and the lower pod
mounts that lower claim as a `persistentVolumeClaim` (`translate.lower_pod`). Deleting the
pod deletes the upper claim (garbage collection), which releases the PV, whose reclaim
policy then decides as below.

**Reclaim**: the upper PV's reclaim policy decides, read from the PV when the decision is
taken (`reclaim_policy`; the copy marked on the lower claim may be stale). `Delete`: once
the upper claim is gone (the PV Released), the lower claim is deleted (the lower class's
policy then decides for the lower volume) and then the upper PV. `Retain`: the lower claim
stays, marked so. No upper PV of ours standing for it (policy unknown): it stays too.

The upper PV's volume source is a `local` path naming the lower claim: nothing upstairs
mounts it (the virtual node is not a kubelet), `local` requires the node affinity it has
anyway, and no attach/detach or CSI machinery of the upper cluster takes an interest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import labels, ownership, podpolicy
from tensile.contracts.objects import Obj, annotations_of, meta_of, owner_references_of, uid_of
from tensile.kube.mirror.spec import Change, KindSpec, Patch
from tensile.kube.quantity import parse_quantity
from tensile.kube.resources import PERSISTENT_VOLUME_CLAIMS
from vnode.providers.k2k import naming

PROVISIONER = "tensile.io/virtual-node"
"""The provisioner name of upper StorageClasses the virtual nodes provision."""
SELECTED_NODE = labels.SELECTED_NODE_ANNOTATION
STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
HOSTNAME_LABEL = labels.HOSTNAME_LABEL
LOWER_CLAIM_ANNOTATION = "tensile.io/lower-claim"
"""On an upper PV: the lower claim ("namespace/name") that holds its data."""
LOWER_PHASE_ANNOTATION = "tensile.io/lower-phase"
"""On an upper claim: the phase of its lower claim (Pending, Bound, Lost)."""
LOWER_VOLUME_ANNOTATION = "tensile.io/lower-volume"
"""On an upper claim: the lower PersistentVolume its lower claim is bound to."""
_BETA_CLASS = "volume.beta.kubernetes.io/storage-class"
RECLAIM_ANNOTATION = "tensile.io/reclaim-policy"
"""On a lower claim: the reclaim policy of the upper PV standing for it, copied for people
looking below. A record only: the decision reads the upper PV itself (`reclaim_policy`)."""


@dataclass(frozen=True, kw_only=True)
class StorageClassMap:
    """--lower-storage-class: which lower StorageClass a lower claim gets."""

    classes: tuple[tuple[str, str], ...] = ()
    """(upper class, lower class) pairs."""
    default: str | None = None
    """For upper classes not named in `classes`; None: the claim names no class, so the
    lower cluster's default StorageClass applies."""

    def lower(self, upper_class: str | None) -> str | None:
        """Return the lower class for `upper_class` (None: leave the lower default)."""
        if upper_class == "":
            return ""  # explicitly class-less: binds only to class-less volumes below
        for upper, lower in self.classes:
            if upper == upper_class:
                return lower
        return self.default


def claim_class(claim: Mapping[str, Any]) -> str | None:
    """The claim's StorageClass name (the beta annotation wins, as in the PV controller)."""
    annotations = annotations_of(claim)
    beta = annotations.get(_BETA_CLASS)
    if beta is not None:
        return str(beta)
    value = (claim.get("spec") or {}).get("storageClassName")
    return None if value is None else str(value)


def is_ours(storage_class: Mapping[str, Any] | None) -> bool:
    """Tell whether an upper StorageClass is provisioned by the virtual nodes."""
    return storage_class is not None and storage_class.get("provisioner") == PROVISIONER


def wants_provisioning(
    claim: Mapping[str, Any], *, node_name: str, storage_class: Mapping[str, Any] | None
) -> bool:
    """Tell whether `node_name` must provision `claim` now: unbound, not being deleted, of a
    class of ours, marked for us by the PV controller, and selected for this node."""
    meta = meta_of(claim)
    annotations = meta.get("annotations") or {}
    marked = annotations.get(STORAGE_PROVISIONER) or annotations.get(BETA_STORAGE_PROVISIONER)
    return bool(
        is_ours(storage_class)
        and not meta.get("deletionTimestamp")
        and not (claim.get("spec") or {}).get("volumeName")
        and marked == PROVISIONER
        and annotations.get(SELECTED_NODE) == node_name
    )


def provisioning_problem(claim: Mapping[str, Any]) -> str | None:
    """Return why a claim of our class cannot be provisioned below, or None: the pod table's
    claim rules (`podpolicy.claim_refusals`): a data source (a snapshot or a claim to
    clone) and a selector name upper objects the lower cluster has not got; an empty volume
    in their place would mislead."""
    found = podpolicy.claim_refusals(claim.get("spec") or {}, what="it", template=False)
    return f"{PROVISIONER} cannot provision the claim: {'; '.join(found)}" if found else None


def claim_problem(claim: Mapping[str, Any], *, key: str) -> str | None:
    """Return why the upper claim `key` ("namespace/name") may not be copied below, or None:
    the pod table's claim rules (`podpolicy.claim_refusals`) for a copied claim."""
    found = podpolicy.claim_refusals(
        claim.get("spec") or {}, what=f"PersistentVolumeClaim {key}", template=False
    )
    return "; ".join(found) or None


def lower_template(template: Mapping[str, Any], *, classes: StorageClassMap) -> Obj:
    """Return the claim template of a generic ephemeral volume as the lower cluster gets it
    (the lower ephemeral volume controller makes the claim from it): its StorageClass the
    lower one `classes` gives (as a copied claim's, `lower_claim`), the beta class
    annotation gone (the class is in the spec). `template` is not changed. The fields the
    pod table refuses in a template (`podpolicy.claim_refusals`) are the caller's to have
    refused before."""
    meta = dict(template.get("metadata") or {})
    spec = dict(template.get("spec") or {})
    lower = classes.lower(claim_class(template))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != _BETA_CLASS}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    spec.pop("storageClassName", None)
    if lower is not None:
        spec["storageClassName"] = lower
    out: Obj = {**template, "spec": spec}
    if meta:
        out["metadata"] = meta
    else:
        out.pop("metadata", None)
    return out


def ephemeral_claim_name(pod: Mapping[str, Any], volume: Mapping[str, Any]) -> str | None:
    """The claim of a pod's generic ephemeral volume, `<pod>-<volume>` (k8s.io/component-helpers
    storage/ephemeral VolumeClaimName), or None when `volume` is not one."""
    if "ephemeral" not in volume or volume.get("persistentVolumeClaim"):
        return None
    return f"{(pod.get('metadata') or {}).get('name')}-{volume.get('name')}"


def is_claim_of_pod(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Tell whether `claim` was made for `pod`'s ephemeral volume: its controller
    ownerReference is the pod (same UID), the kubelet's and scheduler's check
    (storage/ephemeral VolumeIsForPod)."""
    uid = uid_of(pod)
    return bool(uid) and any(
        isinstance(ref, Mapping)
        and ref.get("controller") is True
        and ref.get("kind") == "Pod"
        and ref.get("uid") == uid
        for ref in owner_references_of(claim)
    )


def volume_name(claim: Mapping[str, Any]) -> str:
    """The upper PV's name for a claim: `pvc-<claim UID>`, as external provisioners name it."""
    return f"pvc-{(claim.get('metadata') or {}).get('uid')}"


def lower_claim(
    upper: Mapping[str, Any],
    *,
    owner: ownership.NodeIdentity,
    prefix: str,
    storage_class: str | None,
    reclaim_policy: str,
) -> Obj:
    """Return the lower claim for an upper one: same name in the mapped namespace, same
    access modes, requests and volume mode, `storage_class` (None: the lower default), no
    selector, volume name or data source (they name upper objects), and no
    `selected-node` (the lower scheduler selects its own node; tensile-kube copied the
    upper one, a defect)."""
    meta = meta_of(upper)
    spec = upper.get("spec") or {}
    labels, annotations = ownership.owner_marks(owner)
    lower_spec: dict[str, Any] = {
        "accessModes": list(spec.get("accessModes") or []),
        "resources": {
            k: dict(v)
            for k, v in (spec.get("resources") or {}).items()
            if k in ("requests", "limits")
        },
    }
    if spec.get("volumeMode"):
        lower_spec["volumeMode"] = spec["volumeMode"]
    if storage_class is not None:
        lower_spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": meta.get("name"),
            "namespace": naming.lower_namespace(str(meta.get("namespace")), prefix=prefix),
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": {
                **annotations,
                ownership.UPPER_NAMESPACE_ANNOTATION: str(meta.get("namespace")),
                ownership.UPPER_UID_ANNOTATION: str(meta.get("uid")),
                RECLAIM_ANNOTATION: reclaim_policy,
            },
        },
        "spec": lower_spec,
    }


def requested_storage(claim: Mapping[str, Any]) -> str:
    """The storage a claim requests, as the quantity it names ("1Gi"; "0" if none)."""
    return str(_storage((claim.get("spec") or {}).get("resources")) or "0")


def _storage(resources: Mapping[str, Any] | None, field: str = "requests") -> Any:
    return ((resources or {}).get(field) or {}).get("storage")


def _larger(new: Any, old: Any) -> bool:
    try:
        return new is not None and (old is None or parse_quantity(new) > parse_quantity(old))
    except ValueError:
        return False


def compare_claim(lower: Mapping[str, Any], desired: Mapping[str, Any]) -> Change:
    """Return how to bring a lower claim to `desired` (pure): only a larger storage request
    (a resize upstairs) is applied; claims cannot shrink, and nothing else of a claim's
    spec may change once made."""
    wanted = _storage((desired.get("spec") or {}).get("resources"))
    current = _storage((lower.get("spec") or {}).get("resources"))
    if _larger(wanted, current):
        return Patch({"spec": {"resources": {"requests": {"storage": wanted}}}})
    return None


def stands_for(lower: Mapping[str, Any], upper: Mapping[str, Any]) -> bool:
    """Tell whether a lower claim was made for this very upper claim (same UID): a claim
    re-created upstairs under the same name must not get the data of the one before."""
    return bool(ownership.upper_uid_of(lower) == uid_of(upper))


def upper_volume_name(lower: Mapping[str, Any]) -> str | None:
    """The name of the upper PV that stands for a lower claim (`pvc-<upper claim UID>`, as
    `volume_name` names both provisioned and shown volumes), or None when the lower claim
    names no upper claim."""
    upper_uid = ownership.upper_uid_of(lower)
    return f"pvc-{upper_uid}" if upper_uid else None


def reclaim_policy(
    volume: Mapping[str, Any] | None, *, lower: Mapping[str, Any], node_name: str
) -> str | None:
    """Return the reclaim policy in force for `lower` (a lower claim of `node_name`): that of
    `volume`, the upper PV named `upper_volume_name(lower)` as read now, or None when it is
    unknown: no such PV, one that is not `node_name`'s, one bound to another claim than the
    one `lower` was made for, or one naming no policy. The upper PV is where an
    administrator sets the policy (kubectl patch pv), so it alone says; the lower claim's
    `RECLAIM_ANNOTATION` is a copy for people below and may be stale."""
    if volume is None or not is_our_volume(volume, node_name=node_name):
        return None
    spec = volume.get("spec") or {}
    if (spec.get("claimRef") or {}).get("uid") != ownership.upper_uid_of(lower):
        return None
    return str(spec.get("persistentVolumeReclaimPolicy") or "") or None


def claim_collectable(upper: Mapping[str, Any] | None, *, policy: str | None) -> bool:
    """Tell whether a lower claim is garbage: its upper claim is gone (`upper` None) and the
    reclaim policy in force (`policy`, from `reclaim_policy`) is Delete. Retain keeps it for
    an administrator; so does an unknown policy (None), since deleting the claim may delete
    its data and that is never done on a guess. The lower claim's own mark is not
    consulted: it may be older than the policy."""
    return upper is None and policy == "Delete"


def claim_spec(
    *, translate: Callable[[Obj], Obj], policy_of: Callable[[Obj], str | None]
) -> KindSpec:
    """Return the on-request mirror of upper claims into the lower cluster (pure):
    `translate` (a `lower_claim` with the class and origin the provisioner decided) makes
    the lower claim when the provisioner or a pod creation asks; resizes follow; the lower
    claim goes with its upper claim as `claim_collectable` says, given the policy in force
    that `policy_of(lower claim)` reads at that moment (only asked once the upper claim is
    gone)."""

    def collectable(lower: Obj, upper: Obj | None) -> bool:
        if upper is not None:
            return False
        return claim_collectable(None, policy=policy_of(lower))

    return KindSpec(
        name="claims_to_lower",
        kind="PersistentVolumeClaim",
        source=PERSISTENT_VOLUME_CLAIMS,
        target=PERSISTENT_VOLUME_CLAIMS,
        selects=lambda _upper: True,
        translate=translate,
        compare=compare_claim,
        collectable=collectable,
        creation="on_request",
        stands_for=stands_for,
    )


def upper_volume(
    claim: Mapping[str, Any],
    *,
    node_name: str,
    lower_claim_key: str,
    capacity: str,
    reclaim_policy: str,
    mount_options: list[str] | None = None,
    access_modes: list[str] | None = None,
) -> Obj:
    """Return the upper PersistentVolume standing for a lower claim: pre-bound to `claim`,
    pinned to the virtual node by required node affinity on `kubernetes.io/hostname`
    (which the upper scheduler checks against the Node's labels), annotated as provisioned
    by us (so the upper PV controller leaves its deletion to us), `capacity` as a quantity."""
    meta = meta_of(claim)
    spec = claim.get("spec") or {}
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": capacity},
        "accessModes": list(access_modes or spec.get("accessModes") or []),
        "persistentVolumeReclaimPolicy": reclaim_policy,
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": HOSTNAME_LABEL, "operator": "In", "values": [node_name]}
                        ]
                    }
                ]
            }
        },
        "local": {"path": f"/tensile/{lower_claim_key}"},
    }
    if spec.get("volumeMode"):
        pv_spec["volumeMode"] = spec["volumeMode"]
    storage_class = claim_class(claim)
    if storage_class:
        pv_spec["storageClassName"] = storage_class
    if mount_options:
        pv_spec["mountOptions"] = list(mount_options)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "labels": {ownership.NODE_LABEL: ownership.label_value(node_name)},
            "annotations": {
                PROVISIONED_BY: PROVISIONER,
                ownership.NODE_ANNOTATION: node_name,
                LOWER_CLAIM_ANNOTATION: lower_claim_key,
            },
        },
        "spec": pv_spec,
    }


def is_our_volume(volume: Mapping[str, Any] | None, *, node_name: str) -> bool:
    """Tell whether an upper PV stands for a lower claim of `node_name`."""
    if volume is None:
        return False
    annotations = annotations_of(volume)
    return bool(
        annotations.get(PROVISIONED_BY) == PROVISIONER
        and annotations.get(ownership.NODE_ANNOTATION) == node_name
        and annotations.get(LOWER_CLAIM_ANNOTATION)
    )


def released_for_deletion(volume: Mapping[str, Any]) -> bool:
    """Tell whether an upper PV of ours waits for us to delete it: Released (its claim is
    gone) with reclaim policy Delete (pv_controller reclaimVolume leaves it to the external
    provisioner named in `pv.kubernetes.io/provisioned-by`)."""
    return bool(
        (volume.get("status") or {}).get("phase") == "Released"
        and (volume.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete"
    )


def claim_status_patch(upper: Mapping[str, Any], lower: Mapping[str, Any]) -> Obj | None:
    """Return the merge patch for the upper claim's status that shows the lower claim's
    capacity once it is bound (a resize done below, a lower volume larger than asked), or
    None. Phase and binding upstairs stay the upper PV controller's."""
    lower_status = lower.get("status") or {}
    if lower_status.get("phase") != "Bound" or (upper.get("status") or {}).get("phase") != "Bound":
        return None
    capacity = _storage(lower_status, "capacity")
    if capacity is None or capacity == _storage(upper.get("status"), "capacity"):
        return None
    return {"status": {"capacity": {"storage": capacity}}}


def volume_capacity_patch(volume: Mapping[str, Any], lower: Mapping[str, Any]) -> Obj | None:
    """Return the merge patch giving the upper PV the lower claim's bound capacity, or None."""
    lower_status = lower.get("status") or {}
    capacity = _storage(lower_status, "capacity")
    if lower_status.get("phase") != "Bound" or capacity is None:
        return None
    if _storage(volume.get("spec"), "capacity") == capacity:
        return None
    return {"spec": {"capacity": {"storage": capacity}}}


def lower_state_patch(upper: Mapping[str, Any], lower: Mapping[str, Any]) -> Obj | None:
    """Return the merge patch recording the lower claim's phase and volume on the upper
    claim (`kubectl describe pvc` shows them), or None when it shows them already."""
    annotations = annotations_of(upper)
    phase = (lower.get("status") or {}).get("phase") or "Pending"
    volume = (lower.get("spec") or {}).get("volumeName") or None
    wanted = {LOWER_PHASE_ANNOTATION: phase, LOWER_VOLUME_ANNOTATION: volume}
    if all(annotations.get(k) == v for k, v in wanted.items()):
        return None
    return {"metadata": {"annotations": wanted}}


def migrated_volume(
    claim: Mapping[str, Any],
    *,
    lower_volume: Mapping[str, Any],
    node_name: str,
    lower_claim_key: str,
) -> Obj:
    """Return the upper PV for a migrated claim bound below to `lower_volume`: its capacity,
    access modes, reclaim policy and mount options, pinned to the virtual node."""
    spec = lower_volume.get("spec") or {}
    return upper_volume(
        claim,
        node_name=node_name,
        lower_claim_key=lower_claim_key,
        capacity=str(
            _storage(spec, "capacity") or _storage((claim.get("spec") or {}).get("resources"))
        ),
        reclaim_policy=str(spec.get("persistentVolumeReclaimPolicy") or "Retain"),
        mount_options=spec.get("mountOptions"),
        access_modes=spec.get("accessModes"),
    )
