"""--adopt-tensile-kube: take over, once, what tensile-kube made below (the I/O of
`tensilekube.plan`).

`TensileKubeAdoption` writes in its `take_over()` (`tensile.serving.lifecycle.TakesOver`),
which runs only when this process may write and before any other component works: without
leader election, after every component's start and before any informer lists; with
--leader-elect, in the replica that acquired the Lease, before the leading components are
told of anything or run (a standby adopts nothing). So the pod controller, the mirrors and
the patrol treat the adopted objects as their own from their first look (a lower pod with
this node's marks and its upper pod's UID is that pod's: no create, no delete). It reads the
upper pods bound to the node and the lower objects shaped like tensile-kube's, patches the
owner marks onto those `plan` adopts (UID precondition; through the node's fenced lower
client) and lists the rest: a WARNING log line each, one Warning Event
`TensileKubeLeftovers` on the upper Node, and the gauge
`tensile_adoption_objects{kind,outcome}`. It deletes nothing. Caches that had listed
before (a standby's, warm) list again the kinds it patched, so they hold the marks before
anyone reads them. Adopting twice finds nothing left to adopt.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import Counter
from collections.abc import Sequence

from prometheus_client import Gauge

from tensile.contracts.labels import VIRTUAL_POD_LABEL
from tensile.contracts.objects import Obj, meta_of
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import (
    CONFIG_MAPS,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    SECRETS,
    SERVICES,
    Resource,
)
from tensile.serving.lifecycle import StartupError
from vnode.providers.k2k import tensilekube

logger = logging.getLogger(__name__)

ENDPOINTS = Resource(group="", version="v1", plural="endpoints", kind="Endpoints", namespaced=True)
"""tensile-kube's Endpoints copies (read only, to list them)."""
_LOWER = {
    "Pod": PODS,
    "ConfigMap": CONFIG_MAPS,
    "Secret": SECRETS,
    "PersistentVolumeClaim": PERSISTENT_VOLUME_CLAIMS,
    "Service": SERVICES,
    "Endpoints": ENDPOINTS,
}
_UPPER_COPIED = ("ConfigMap", "Secret", "PersistentVolumeClaim", "Service")
ADOPTED = "adopted"
LEFTOVERS_REASON = "TensileKubeLeftovers"
"""Reason of the Warning Event on the upper Node listing what was not adopted."""
ADOPTED_REASON = "TensileKubeAdopted"
"""Reason of the Normal Event on the upper Node counting what was adopted."""
_LISTED_IN_EVENT = 20
"""Objects named in the Event at most (the log names every one)."""
REFRESH_TIMEOUT = 60.0
"""Seconds a cache has to list again after the adoption patched its objects."""

ADOPTION_OBJECTS = Gauge(
    "tensile_adoption_objects",
    "Lower objects made by tensile-kube found by the last adoption (--adopt-tensile-kube, "
    "in the leader), by kind and outcome (adopted, or why one was left: unmatched, "
    "after-cutoff, mismatch, unused, superseded, not-mirrored).",
    ["kind", "outcome"],
)


class TensileKubeAdoption:
    """Adopts tensile-kube's lower objects at start (see the module docstring)."""

    name = "tensile-kube-adoption"

    def __init__(
        self,
        *,
        upper: ApiClient,
        lower: ApiClient,
        scope: tensilekube.Scope,
        recorder: EventRecorder,
        created_before: dt.datetime,
        namespace: str | None = None,
        informers: InformerFactory | None = None,
    ) -> None:
        """`upper`/`lower` read and patch; `scope` is this node's identity and what it
        mirrors; `recorder` writes the Events on the upper Node; `created_before` is the
        operator's cut-off (--adopt-tensile-kube-before, aware): lower objects created at
        or after it are not adopted; `namespace` (--namespace) the only upper namespace
        whose pods the node forwards (None: all): a lower pod of another namespace is not
        this node's to keep (it would be collected as dangling); `informers` the node's,
        whose running caches of `lower` list again the kinds adopted."""
        self._upper = upper
        self._lower = lower
        self._scope = scope
        self._recorder = recorder
        self._created_before = created_before
        self._namespace = namespace
        self._informers = informers
        self._done = False
        self.plan: tensilekube.Plan | None = None
        """What the last start decided (for tests and /readyz)."""

    def informers(self) -> Sequence[Informer]:
        """None: one list of each kind at start is all it reads."""
        return ()

    async def start(self) -> None:
        """Nothing: every replica starts it, and only the one that may write adopts
        (`take_over`)."""

    async def take_over(self) -> None:
        """Adopt (see the module docstring). Raises StartupError when a cluster cannot be
        read or a patch is refused for another reason than the object having changed or
        gone (409/404: that object is left, and said so)."""
        try:
            self.plan = await self._decide()
            adopted = await self._apply(self.plan)
            await self._refresh({item.kind for item in adopted})
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            raise StartupError(f"--adopt-tensile-kube: {exc}") from exc
        await self._report(self.plan, adopted)
        self._done = True

    def ready(self) -> bool:
        """Whether the adoption pass ran (in a standby: not yet)."""
        return self._done

    async def run(self) -> None:
        """Nothing after the start."""

    async def shut_down(self) -> None:
        """Nothing to stop."""

    async def _decide(self) -> tensilekube.Plan:
        node = self._scope.owner.node_name
        upper_pods = await self._list(
            self._upper,
            PODS,
            params={"fieldSelector": f"spec.nodeName={node}"},
            namespace=self._namespace,
        )
        lower: dict[str, list[Obj]] = {
            "Pod": await self._list(
                self._lower,
                PODS,
                params={"labelSelector": f"{VIRTUAL_POD_LABEL}=true"},
            )
        }
        upper: dict[str, dict[str, Obj]] = {}
        for kind in _UPPER_COPIED:
            lower[kind] = await self._list(self._lower, _LOWER[kind])
            if lower[kind] and any(map(tensilekube.is_tensile_kube_copy, lower[kind])):
                found = await self._list(self._upper, _LOWER[kind])
                upper[kind] = {_key(o): o for o in found}
        lower["Endpoints"] = await self._list(self._lower, ENDPOINTS)
        return tensilekube.plan(
            scope=self._scope,
            upper_pods=upper_pods,
            lower=lower,
            upper=upper,
            created_before=self._created_before,
        )

    async def _apply(self, plan: tensilekube.Plan) -> list[tensilekube.Adopt]:
        adopted = []
        for item in plan.adopt:
            namespace, _, name = item.key.partition("/")
            path = _LOWER[item.kind].path(namespace=namespace, name=name)
            try:
                await self._lower.request("PATCH", path, body=item.patch, content_type=MERGE_PATCH)
            except (errors.NotFound, errors.Conflict, errors.Invalid) as exc:
                # Gone, or another object of that name now (the UID precondition): left.
                logger.warning("not adopting %s %s: %s", item.kind, item.key, exc.message)
                continue
            logger.info("adopted tensile-kube's %s %s", item.kind, item.key)
            adopted.append(item)
        return adopted

    async def _refresh(self, kinds: set[str]) -> None:
        """List again the running caches of the lower cluster of `kinds` (a standby's, warm
        before the adoption patched their objects), so no component reads an adopted
        object without its marks. Caches not running yet (no leader election: they list
        after this) are left alone."""
        if self._informers is None:
            return
        lower = self._lower.unfenced
        for informer in self._informers.informers():
            selection = informer.selection
            if (
                selection.client is lower
                and selection.resource.kind in kinds
                and informer.has_synced()
            ):
                try:
                    async with asyncio.timeout(REFRESH_TIMEOUT):
                        await informer.relist()
                except TimeoutError:
                    raise StartupError(
                        f"--adopt-tensile-kube: the cache {informer.name} did not list again "
                        f"within {REFRESH_TIMEOUT:g}s after the adoption"
                    ) from None

    async def _report(self, plan: tensilekube.Plan, adopted: list[tensilekube.Adopt]) -> None:
        counts = Counter((a.kind, ADOPTED) for a in adopted)
        counts.update((left.kind, left.outcome) for left in plan.leftovers)
        ADOPTION_OBJECTS.clear()
        for (kind, outcome), n in counts.items():
            ADOPTION_OBJECTS.labels(kind=kind, outcome=outcome).set(n)
        for left in plan.leftovers:
            logger.warning(
                "tensile-kube's %s %s is left as it is (%s): %s",
                left.kind,
                left.key,
                left.outcome,
                left.reason,
            )
        node = {"metadata": {"name": self._scope.owner.node_name, "namespace": "default"}}
        summary = ", ".join(
            f"{n} {kind}" for (kind, _), n in sorted(counts.items()) if _ == ADOPTED
        )
        logger.info(
            "--adopt-tensile-kube: adopted %s; %d left as they are",
            summary or "nothing",
            len(plan.leftovers),
        )
        try:
            if adopted:
                await self._recorder.record(
                    node,
                    type="Normal",
                    reason=ADOPTED_REASON,
                    message=f"adopted tensile-kube's lower objects: {summary}",
                    kind="Node",
                    api_version="v1",
                )
            if plan.leftovers:
                named = "; ".join(
                    f"{left.kind} {left.key} ({left.outcome})"
                    for left in plan.leftovers[:_LISTED_IN_EVENT]
                )
                more = len(plan.leftovers) - _LISTED_IN_EVENT
                await self._recorder.record(
                    node,
                    type="Warning",
                    reason=LEFTOVERS_REASON,
                    message=f"{len(plan.leftovers)} lower objects of tensile-kube left as they "
                    f"are, none deleted: {named}"
                    + (f"; and {more} more (see the log)" if more > 0 else ""),
                    kind="Node",
                    api_version="v1",
                )
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            # Events are best effort; the log and the gauge have it all.
            logger.warning("could not record the adoption's Events: %s", exc)

    @staticmethod
    async def _list(
        client: ApiClient,
        resource: Resource,
        *,
        params: dict[str, str] | None = None,
        namespace: str | None = None,
    ) -> list[Obj]:
        items: list[Obj] = []
        path = resource.path(namespace=namespace)
        async for page in client.pages(path, limit=500, params=params):
            if page.restarted:
                items.clear()  # an expired continue token: the list began again
            items += (item for item in page.items if isinstance(item, dict))
        return items


def _key(obj: Obj) -> str:
    meta = meta_of(obj)
    return f"{meta.get('namespace')}/{meta.get('name')}"
