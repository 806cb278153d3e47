"""What the webhook knows of the upper cluster, from informers (tensile.kube): the virtual
nodes (by --virtual-node-selector), each PVC's `volume.kubernetes.io/selected-node` and
whether it is bound, and
the descheduler's avoidance record (the one ConfigMap of --avoid-configmap, watched by
name: no API call per admission).

Objects are cached slimmed to what the lookups read (name, namespace, resourceVersion,
that one annotation, and a claim's `spec.volumeName` and `status.phase`), so a cluster with
many PVCs costs little memory.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from tensile.contracts import avoidance
from tensile.contracts.objects import meta_of
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.kube.resources import CONFIG_MAPS, NODES, Resource
from webhook.mutation import SELECTED_NODE_ANNOTATION, Lookups

PERSISTENT_VOLUME_CLAIMS = Resource(
    group="", version="v1", plural="persistentvolumeclaims", kind="PersistentVolumeClaim",
    namespaced=True,
)  # fmt: skip


class Caches:
    """The informers behind `Lookups`; `run` them (owned tasks) before asking."""

    def __init__(
        self,
        client: ApiClient,
        *,
        virtual_node_selector: str,
        avoid_configmap: tuple[str, str] = avoidance.DEFAULT_LOCATION,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        """`virtual_node_selector` is the label selector of virtual nodes (sent to the
        apiserver as the watch's labelSelector); `avoid_configmap` the (namespace, name)
        of the avoidance record."""
        self.nodes = Informer(
            client,
            NODES,
            name="virtual-nodes",
            label_selector=virtual_node_selector or None,
            transform=_slim,
        )
        self.claims = Informer(
            client, PERSISTENT_VOLUME_CLAIMS, name="persistent-volume-claims", transform=_slim_claim
        )
        namespace, name = avoid_configmap
        self._record_key = f"{namespace}/{name}"
        self._now = now
        self.record = Informer(
            client,
            CONFIG_MAPS,
            name="avoidance-record",
            namespace=namespace,
            field_selector=f"metadata.name={name}",
        )
        self.lookups = Lookups(
            is_virtual_node=lambda name: self.nodes.store.get(name) is not None,
            claim=lambda namespace, name: self.claims.store.get(f"{namespace}/{name}"),
            avoided_nodes=self._avoided_nodes,
        )

    @property
    def informers(self) -> Sequence[Informer]:
        """The informers to run."""
        return (self.nodes, self.claims, self.record)

    def not_synced(self) -> str | None:
        """A readiness check: None once every informer has listed, else which have not."""
        missing = [
            f"{i.name} ({i.last_sync_error or 'listing'})"
            for i in self.informers
            if not i.has_synced()
        ]
        return f"caches not synced: {', '.join(missing)}" if missing else None

    async def wait_synced(self) -> None:
        """Return once every informer has listed (cancel or bound it from outside)."""
        for informer in self.informers:
            await informer.wait_synced()

    def _avoided_nodes(self, owner_uid: str) -> frozenset[str]:
        record = self.record.store.get(self._record_key)
        data = None if record is None else record.get("data")
        return avoidance.avoided_nodes(data, owner_uid=owner_uid, now=self._now())


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    meta = meta_of(obj)
    slim = {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta}
    node = (meta.get("annotations") or {}).get(SELECTED_NODE_ANNOTATION)
    if node:
        slim["annotations"] = {SELECTED_NODE_ANNOTATION: node}
    return {"metadata": slim}


def _slim_claim(obj: dict[str, Any]) -> dict[str, Any]:
    """`_slim`, and what `mutation.claim_node` reads besides: whether the claim is bound."""
    found = _slim(obj)
    volume = (obj.get("spec") or {}).get("volumeName")
    if volume:
        found["spec"] = {"volumeName": volume}
    phase = (obj.get("status") or {}).get("phase")
    if phase:
        found["status"] = {"phase": phase}
    return found
