"""The virtual node as external provisioner and keeper of persistent volumes (`PVControllers`).

Upper claims, upper PersistentVolumes of this node, upper StorageClasses and the lower
claims it owns feed one work queue ("volumes"; keys "claim/<ns>/<name>", "volume/<name>",
and "read/<PV name>/<ns>/<name>" for a PV the cache had not got when the reclaim policy
of a lower claim was needed); the lower claims themselves are an on-request mirror of the
upper ones (`volumes.claim_spec`). What each key's worker does is in `volumes`' module docstring:

- a claim of our class selected for this node and marked for us by the upper PV controller
  is provisioned: the lower claim, then the upper PV pre-bound to it (a lower refusal is a
  `ProvisioningFailed` event and takes `selected-node` away, so the scheduler tries again,
  maybe elsewhere, as the external-provisioner library does);
- a bound claim of ours shows its lower claim: capacity (status), phase and volume
  (annotations), resizes down (the mirror), lower Events (`kubectl describe pvc`);
- a claim of another class copied down with its pod gets, once bound below, an upper PV
  standing for the lower one, and `selected-node` = this node;
- a Released PV of ours with policy Delete loses its lower claim, then itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    deletion_timestamp_of,
    meta_of,
    name_of,
    namespace_of,
    uid_of,
)
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.mirror.engine import Mirror, NameTakenError, Refused
from tensile.kube.resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    object_key,
)
from tensile.kube.workqueue import Requeue, WorkQueue
from vnode import provider_errors
from vnode.providers.k2k import naming, volumes
from vnode.providers.k2k.events import EventMirror
from vnode.providers.k2k.namespaces import LowerNamespaces

logger = logging.getLogger(__name__)

_REFUSALS = (errors.Invalid, errors.Forbidden, errors.BadRequest)
_CLAIM = {"kind": "PersistentVolumeClaim", "api_version": "v1"}
"""The involved object of Events about claims (cached claims carry no kind)."""
_GONE_RETRY = 1.0
"""Seconds between looks at a lower claim being deleted before its upper PV goes."""


class VolumeProvisioner:
    """Provisions and keeps the persistent volumes of one virtual node (a component)."""

    name = "volume-provisioner"

    def __init__(
        self,
        *,
        upper: ApiClient,
        upper_events: ApiClient,
        lower: ApiClient,
        informers: InformerFactory,
        tenancy: naming.NodeTenancy,
        namespaces: LowerNamespaces,
        classes: volumes.StorageClassMap,
        on_resolved: Callable[[str], None],
        upper_namespace: str | None = None,
        workers: int = 4,
    ) -> None:
        """`classes` maps upper StorageClasses to lower ones (--lower-storage-class);
        `on_resolved(upper pod key)` is called when a claim a waiting pod needs changes;
        `upper_namespace` (--namespace) limits it to the claims of the pods it forwards."""
        self._upper = upper
        self._lower = lower
        owner, prefix = tenancy.owner, tenancy.prefix
        self._node = owner.node_name
        self._owner = owner
        self._prefix = prefix
        self._classes = classes
        self._on_resolved = on_resolved
        self._workers = workers
        self._waiting: dict[str, set[str]] = {}
        """Upper claim key -> upper pods whose creation waits for it."""
        self._read: dict[str, Obj | None] = {}
        """Upper PV name -> that PV as a GET found it (None: not found) for the next
        reclaim decision on its lower claim, which takes it (`_policy_in_force`)."""
        self.claims = informers.informer(
            upper,
            PERSISTENT_VOLUME_CLAIMS,
            name="upper-persistentvolumeclaims",
            namespace=upper_namespace,
        )
        self.volumes = informers.informer(
            upper,
            PERSISTENT_VOLUMES,
            name="upper-owned-persistentvolumes",
            label_selector=f"{ownership.NODE_LABEL}={ownership.label_value(owner.node_name)}",
        )
        self.storage_classes = informers.informer(
            upper, STORAGE_CLASSES, name="upper-storageclasses"
        )
        lower_claims = informers.informer(
            lower,
            PERSISTENT_VOLUME_CLAIMS,
            name="lower-owned-persistentvolumeclaims",
            label_selector=ownership.owner_selector(owner),
            namespaces=tenancy.watched,
        )
        self.recorder = EventRecorder(
            upper_events, component=f"{owner.node_name}/volume-provisioner", host=owner.node_name
        )
        self.mirror = Mirror(
            spec=volumes.claim_spec(translate=self._lower_claim, policy_of=self._policy_in_force),
            tenancy=tenancy,
            source=self.claims,
            target=lower_claims,
            source_client=upper,
            target_client=lower,
            workers=workers,
            namespaces=namespaces,
            on_problem=self._mirror_problem,
        )
        self.events = EventMirror(
            upper=upper_events,
            lower=lower,
            # Claims are told by their marks: nothing records the lower claim's UID yet.
            made=lambda claim: ownership.is_owned(claim, owner=owner),
            lower_objects=lower_claims,
            informers=informers,
            kind="PersistentVolumeClaim",
            name="lower-claim-events",
        )
        self.queue = WorkQueue(name="volumes")
        self.claims.add_handlers(
            Handlers(on_add=self._claim_changed, on_modify=self._claim_changed)
        )
        self.volumes.add_handlers(
            Handlers(
                on_add=self._volume_changed,
                on_modify=self._volume_changed,
                on_delete=self._volume_changed,
            )
        )
        lower_claims.add_handlers(
            Handlers(
                on_add=self._lower_claim_changed,
                on_modify=self._lower_claim_changed,
                on_delete=self._lower_claim_gone,
            )
        )

    def _lower_claim(self, upper: Obj) -> Obj:
        return volumes.lower_claim(
            upper,
            owner=self._owner,
            prefix=self._prefix,
            storage_class=self._classes.lower(volumes.claim_class(upper)),
            reclaim_policy="Delete",  # a record, until an upper PV says otherwise (_sync_volume)
        )

    def _policy_in_force(self, lower: Obj) -> str | None:
        """The reclaim policy of the upper PV standing for `lower` as cached now, or as a GET
        found it when the cache had not got it; None when it is unknown (the lower claim is
        kept, and this says why). A cache miss answers None at once (kept for now) and
        has the PV read on the volumes queue ("read/..."), which then looks at the claim
        again with what the read found."""
        name = volumes.upper_volume_name(lower)
        volume = self.volumes.store.get(name) if name else None
        if name is not None and volume is None:
            if name not in self._read:
                key = naming.upper_key_of(lower, prefix=self._prefix)
                if key is not None:
                    self.queue.add(f"read/{name}/{key}")
                    return None  # kept until the read says more
            volume = self._read.pop(name, None)
        policy = volumes.reclaim_policy(volume, lower=lower, node_name=self._node)
        if policy is None:
            logger.warning(
                "keeping lower claim %s although its upper claim is gone: the reclaim policy "
                "is unknown (no upper PersistentVolume %s of node %s stands for it)",
                object_key(lower),
                name,
                self._node,
            )
        return policy

    async def _read_volume(self, name: str, key: str) -> None:
        """Read upper PV `name`, which the cache had not got when the lower claim of upper
        claim `key` was looked at, and have the claims mirror look at it again. Raises kube
        errors but NotFound (the queue retries; the claim is kept meanwhile)."""
        try:
            volume = await self._upper.request("GET", PERSISTENT_VOLUMES.path(name=name))
        except errors.NotFound:
            volume = None
        self._read[name] = volume
        self.mirror.queue.add(key)

    def _lower_claim_gone(self, lower: Obj) -> None:
        name = volumes.upper_volume_name(lower)
        if name is not None:
            self._read.pop(name, None)  # a read no decision will take any more

    # -- the Component contract ------------------------------------------------------------

    def informers(self) -> Sequence[Informer]:
        """Upper claims, this node's upper PVs, upper StorageClasses, lower claim Events."""
        return [self.claims, self.volumes, self.storage_classes, self.events.informer]

    def components(self) -> list[Mirror]:
        """The claims mirror, run beside this component."""
        return [self.mirror]

    async def start(self) -> None:
        """Nothing to prepare."""

    def ready(self) -> bool:
        """Whether its informers have synced."""
        return all(i.has_synced() for i in self.informers())

    async def run(self) -> None:
        """Work the volumes queue and the Events queue until `shut_down`."""
        for volume in list(self.volumes.store):
            self._volume_changed(volume)
        async with asyncio.TaskGroup() as group:
            group.create_task(
                self.queue.run(workers=self._workers, handler=self._sync), name="volumes"
            )
            group.create_task(
                self.events.queue.run(workers=2, handler=self.events.sync),
                name="claim-events-from-lower",
            )

    async def shut_down(self) -> None:
        """Stop both queues."""
        await self.queue.shut_down()
        await self.events.queue.shut_down()

    # -- events ----------------------------------------------------------------------------

    def _claim_changed(self, claim: Obj) -> None:
        key = object_key(claim)
        for pod_key in self._waiting.pop(key, ()):
            self._on_resolved(pod_key)
        meta = meta_of(claim)
        annotations = meta.get("annotations") or {}
        bound_to = (claim.get("spec") or {}).get("volumeName")
        if (
            annotations.get(volumes.SELECTED_NODE) == self._node
            or (bound_to and self.volumes.store.get(bound_to) is not None)
            or self.mirror.current(key) is not None
        ):
            self.queue.add(f"claim/{key}")

    def _volume_changed(self, volume: Obj) -> None:
        self.queue.add(f"volume/{name_of(volume)}")
        ref = (volume.get("spec") or {}).get("claimRef") or {}
        if ref.get("namespace") and ref.get("name"):
            self.queue.add(f"claim/{ref['namespace']}/{ref['name']}")

    def _lower_claim_changed(self, lower: Obj) -> None:
        key = naming.upper_key_of(lower, prefix=self._prefix)
        if key is not None and ownership.is_owned(lower, owner=self._owner):
            self.queue.add(f"claim/{key}")

    async def _sync(self, key: str) -> None:
        what, _, rest = key.partition("/")
        if what == "claim":
            await self._sync_claim(rest)
        elif what == "read":
            name, _, claim_key = rest.partition("/")
            await self._read_volume(name, claim_key)
        else:
            await self._sync_volume(rest)

    # -- claims ----------------------------------------------------------------------------

    def _class_of(self, claim: Mapping[str, Any]) -> Obj | None:
        name = volumes.claim_class(claim)
        return self.storage_classes.store.get(name) if name else None

    def _lower_of(self, key: str, claim: Mapping[str, Any]) -> Obj | None:
        lower = self.mirror.current(key)
        if lower is None or not ownership.is_owned(lower, owner=self._owner):
            return None
        return lower if volumes.stands_for(lower, claim) else None

    async def _sync_claim(self, key: str) -> None:
        claim = self.claims.store.get(key)
        if claim is None:
            return
        storage_class = self._class_of(claim)
        if volumes.wants_provisioning(claim, node_name=self._node, storage_class=storage_class):
            if self.volumes.store.get(volumes.volume_name(claim)) is None:
                await self._provision(key, claim, storage_class or {})
            return  # else provisioned: the upper PV controller is binding the two
        lower = self._lower_of(key, claim)
        if lower is None:
            return
        bound_to = (claim.get("spec") or {}).get("volumeName")
        volume = self.volumes.store.get(bound_to) if bound_to else None
        if bound_to and not volumes.is_our_volume(volume, node_name=self._node):
            return  # bound upstairs to a volume that is not ours: nothing of ours to show
        await self._patch_claim(claim, volumes.lower_state_patch(claim, lower))
        if volume is not None:
            await self._patch_claim(
                claim, volumes.claim_status_patch(claim, lower), subresource="status"
            )
            await self._patch(
                PERSISTENT_VOLUMES.path(name=name_of(volume)),
                volumes.volume_capacity_patch(volume, lower),
            )
            if annotations_of(claim).get(volumes.SELECTED_NODE) != self._node:
                # A migrated claim: the webhook pins later pods by this annotation.
                await self._patch_claim(
                    claim, {"metadata": {"annotations": {volumes.SELECTED_NODE: self._node}}}
                )
            return
        if not volumes.is_ours(storage_class):
            await self._show_migrated(key, claim, lower)

    async def _provision(self, key: str, claim: Obj, storage_class: Obj) -> None:
        problem = volumes.provisioning_problem(claim)
        if problem is not None:
            await self._failed(claim, problem, reschedule=False)
            return
        try:
            await self.mirror.ensure(key)
        except NameTakenError as exc:
            await self._failed(
                claim,
                f"claim {object_key(exc.target)} exists in the lower cluster and is "
                f"{_owner_of_claim(exc.target, self._owner)}; refusing to use or overwrite it",
                reschedule=True,
            )
            return
        except Refused as exc:
            await self._failed(claim, str(exc), reschedule=True)
            return
        except _REFUSALS as exc:
            await self._failed(
                claim, f"the lower cluster refused the claim: {exc.message}", reschedule=True
            )
            return
        lower_key = naming.lower_key(key, prefix=self._prefix)
        request = volumes.requested_storage(claim)
        body = volumes.upper_volume(
            claim,
            node_name=self._node,
            lower_claim_key=lower_key,
            capacity=request,
            reclaim_policy=str(storage_class.get("reclaimPolicy") or "Delete"),
            mount_options=storage_class.get("mountOptions"),
        )
        try:
            await self._upper.request("POST", PERSISTENT_VOLUMES.path(), body=body)
        except errors.AlreadyExists:
            return  # an earlier attempt made it; the PV controller binds it
        lower_class = self._classes.lower(volumes.claim_class(claim))
        logger.info("provisioned %s for claim %s (lower claim %s)", name_of(body), key, lower_key)
        await self.recorder.record(
            claim,
            type="Normal",
            reason="ProvisioningSucceeded",
            message=(
                f"Successfully provisioned volume {name_of(body)}: claim {lower_key} "
                f"in the lower cluster of virtual node {self._node}, StorageClass "
                f"{lower_class or '(the lower default)'}"
            ),
            **_CLAIM,
        )

    async def _failed(self, claim: Obj, message: str, *, reschedule: bool) -> None:
        logger.warning("cannot provision claim %s: %s", object_key(claim), message)
        await self.recorder.record(
            claim, type="Warning", reason="ProvisioningFailed", message=message, **_CLAIM
        )
        if reschedule:
            # The scheduler's checkBindings sees the annotation gone and schedules the pod
            # again, maybe onto another virtual node (pv_controller rescheduleProvisioning).
            await self._patch_claim(
                claim, {"metadata": {"annotations": {volumes.SELECTED_NODE: None}}}
            )

    async def _show_migrated(self, key: str, claim: Obj, lower: Obj) -> None:
        """A claim of another class copied down with its pod: once bound below, show the
        lower PV upstairs, pinned to this node and pre-bound to the upper claim. Made once,
        not by a lower -> upper mirror (README, "What crosses without a mirror"): the PV is
        named after the upper claim, made from three objects of two clusters, and then
        bound and released by the upper cluster, not kept equal to a source."""
        lower_volume_name = (lower.get("spec") or {}).get("volumeName")
        if (lower.get("status") or {}).get("phase") != "Bound" or not lower_volume_name:
            return
        try:
            lower_volume = await self._lower.request(
                "GET", PERSISTENT_VOLUMES.path(name=lower_volume_name)
            )
        except errors.NotFound:
            return
        body = volumes.migrated_volume(
            claim,
            lower_volume=lower_volume,
            node_name=self._node,
            lower_claim_key=naming.lower_key(key, prefix=self._prefix),
        )
        try:
            await self._upper.request("POST", PERSISTENT_VOLUMES.path(), body=body)
        except errors.AlreadyExists:
            return
        logger.info("showing lower volume %s of claim %s upstairs", lower_volume_name, key)

    # -- volumes ---------------------------------------------------------------------------

    async def _sync_volume(self, name: str) -> None:
        volume = self.volumes.store.get(name)
        if volume is None or not volumes.is_our_volume(volume, node_name=self._node):
            return
        ref = (volume.get("spec") or {}).get("claimRef") or {}
        key = f"{ref.get('namespace')}/{ref.get('name')}"
        lower = self.mirror.current(key)
        if lower is not None and not (
            ownership.is_owned(lower, owner=self._owner)
            and ownership.upper_uid_of(lower) == ref.get("uid")
        ):
            lower = None
        policy = str((volume.get("spec") or {}).get("persistentVolumeReclaimPolicy") or "")
        if (
            lower is not None
            and policy
            and (annotations_of(lower).get(volumes.RECLAIM_ANNOTATION) != policy)
        ):
            meta = meta_of(lower)
            await self._patch(
                PERSISTENT_VOLUME_CLAIMS.path(namespace=meta["namespace"], name=meta["name"]),
                {"metadata": {"annotations": {volumes.RECLAIM_ANNOTATION: policy}}},
                lower_cluster=True,
            )
        if not volumes.released_for_deletion(volume):
            return
        if lower is not None:
            await self.mirror.collect(key)
            raise Requeue(_GONE_RETRY, f"waiting for lower claim of {name} to go")
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid_of(volume)},
        }
        try:
            await self._upper.request("DELETE", PERSISTENT_VOLUMES.path(name=name), body=body)
            logger.info("deleted released volume %s (reclaim policy Delete)", name)
        except (errors.NotFound, errors.Conflict):
            pass

    # -- for pods --------------------------------------------------------------------------

    async def ensure_for_pod(self, pod: Mapping[str, Any]) -> frozenset[str]:
        """Make the lower claims `pod` mounts exist (see the module docstring): those of its
        `persistentVolumeClaim` volumes, and those of its generic ephemeral volumes whose
        claims (`<pod>-<volume>`, made upstairs by the ephemeral volume controller) are of
        a class of ours. Returns the names of those ephemeral volumes (`translate.lower_pod`
        mounts their lower claims); the others are left to the lower cluster.

        Raises MissingDependency while a claim is missing or not yet bound (the pod waits,
        as on a kubelet, and is announced to `on_resolved` when the claim changes),
        InvalidPod for a claim the lower cluster cannot serve (bound upstairs to a volume
        that is not this node's, its lower claim gone, a lower claim of someone else in
        the way), one the pod table refuses (`volumes.claim_problem`: a selector or data
        source) or an ephemeral volume's claim that is not the pod's, kube errors for API
        failures.
        """
        namespace = namespace_of(pod)
        pod_key = f"{namespace}/{name_of(pod)}"
        provisioned: set[str] = set()
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            source = volume.get("persistentVolumeClaim")
            ephemeral = volumes.ephemeral_claim_name(pod, volume)
            if not source and ephemeral is None:
                continue
            name = ephemeral or str(source.get("claimName"))
            key = f"{namespace}/{name}"
            volume_name = str(volume.get("name"))
            try:
                if ephemeral is None:
                    await self._ensure_claim(key, volume=volume_name)
                elif await self._ensure_ephemeral(key, pod=pod, volume=volume_name):
                    provisioned.add(volume_name)
            except provider_errors.MissingDependency:
                self._waiting.setdefault(key, set()).add(pod_key)
                raise
        return frozenset(provisioned)

    async def _ensure_ephemeral(self, key: str, *, pod: Mapping[str, Any], volume: str) -> bool:
        """Ensure the claim of generic ephemeral volume `volume` of `pod` when its class is
        ours (True); False when it is another class's (the lower cluster makes the claim
        from the template, as before). Raises as `ensure_for_pod`."""
        claim = self.claims.store.get(key)
        if claim is None or deletion_timestamp_of(claim):
            raise _missing(key, volume=volume, message="not found")
        if not volumes.is_claim_of_pod(claim, pod):
            raise provider_errors.InvalidPod(
                f"PersistentVolumeClaim {key} of ephemeral volume {volume} was not created "
                f"for pod {object_key(pod)} (pod is not owner)"
            )
        if not volumes.is_ours(self._class_of(claim)):
            return False
        await self._ensure_claim(key, volume=volume)
        return True

    async def _ensure_claim(self, key: str, *, volume: str) -> None:
        claim = self.claims.store.get(key)

        def missing(message: str) -> provider_errors.MissingDependency:
            return _missing(key, volume=volume, message=message)

        if claim is None or deletion_timestamp_of(claim):
            raise missing("not found")
        bound_to = (claim.get("spec") or {}).get("volumeName")
        lower_key = naming.lower_key(key, prefix=self._prefix)
        if bound_to:
            upper_volume = self.volumes.store.get(bound_to)
            if not volumes.is_our_volume(upper_volume, node_name=self._node):
                raise provider_errors.InvalidPod(
                    f"PersistentVolumeClaim {key} is bound to PersistentVolume {bound_to}, "
                    f"which is not one of virtual node {self._node}'s: pods below cannot reach it"
                )
            if self._lower_of(key, claim) is None:
                raise provider_errors.InvalidPod(
                    f"the lower claim {lower_key} standing for PersistentVolume {bound_to} is "
                    "gone from the lower cluster; its data cannot be recovered there"
                )
            return
        if (problem := volumes.claim_problem(claim, key=key)) is not None:
            # Whether the node would provision it or copy it: the pod table refuses it.
            raise provider_errors.InvalidPod(problem)
        storage_class = self._class_of(claim)
        if volumes.is_ours(storage_class):
            annotations = annotations_of(claim)
            if annotations.get(volumes.SELECTED_NODE) != self._node:
                # The pod was placed here without the scheduler (spec.nodeName): do what
                # the scheduler would have done, so the claim is provisioned here.
                await self._patch_claim(
                    claim, {"metadata": {"annotations": {volumes.SELECTED_NODE: self._node}}}
                )
            raise missing("is being provisioned")
        try:
            await self.mirror.ensure(key)
        except NameTakenError as exc:
            raise provider_errors.InvalidPod(
                f"PersistentVolumeClaim {lower_key} exists in the lower cluster and is "
                f"{_owner_of_claim(exc.target, self._owner)}; refusing to use or overwrite it"
            ) from exc
        except Refused as exc:
            raise provider_errors.InvalidPod(str(exc)) from exc
        except KeyError:
            raise missing("not found") from None
        except _REFUSALS as exc:
            raise provider_errors.InvalidPod(
                f"the lower cluster refused claim {lower_key}: {exc.message}"
            ) from exc

    def forget_waiting(self, pod_key: str) -> None:
        """Stop announcing upper pod `pod_key` when a claim changes."""
        for key in [k for k, pods in self._waiting.items() if pod_key in pods]:
            self._waiting[key].discard(pod_key)
            if not self._waiting[key]:
                del self._waiting[key]

    # -- writes ----------------------------------------------------------------------------

    async def _mirror_problem(self, claim: Obj, message: str) -> None:
        await self.recorder.record(
            claim, type="Warning", reason="LowerClaimFailed", message=message
        )

    async def _patch_claim(
        self, claim: Obj, patch: Obj | None, *, subresource: str | None = None
    ) -> None:
        meta = meta_of(claim)
        path = PERSISTENT_VOLUME_CLAIMS.path(
            namespace=meta["namespace"], name=meta["name"], subresource=subresource
        )
        await self._patch(path, patch)

    async def _patch(self, path: str, patch: Obj | None, *, lower_cluster: bool = False) -> None:
        if patch is None:
            return
        client = self._lower if lower_cluster else self._upper
        try:
            await client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        except errors.NotFound:
            pass  # gone meanwhile; its deletion is handled by its own event


def _missing(key: str, *, volume: str, message: str) -> provider_errors.MissingDependency:
    """The kubelet's wait for claim `key` ("namespace/name") of pod volume `volume`:
    `message` says what is wrong with it ("not found", ...)."""
    namespace, _, name = key.partition("/")
    return provider_errors.MissingDependency(
        f'MountVolume.SetUp failed for volume "{volume}" : persistentvolumeclaim "{name}" '
        f"{message}",
        kind="PersistentVolumeClaim",
        namespace=namespace,
        name=name,
        volume=volume,
    )


def _owner_of_claim(lower: Obj, owner: ownership.NodeIdentity) -> str:
    if ownership.is_owned(lower, owner=owner):
        return "the retained claim of an earlier claim of the same name (reclaim policy Retain)"
    return ownership.owner_of(lower)
