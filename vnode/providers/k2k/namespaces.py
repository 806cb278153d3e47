"""Lower namespaces: made when the first object of an upper namespace goes below, checked
when they exist (`naming.namespace_conflict`), remembered once usable.

Pods, mirrored Services, EndpointSlices and claims all go through one `LowerNamespaces`,
so every object follows the same tenancy rules (see the README, "Tenants below").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import meta_of, name_of
from tensile.kube import errors
from tensile.kube.backoff import ExponentialBackoff
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.mirror.engine import Refused
from tensile.kube.resources import NAMESPACES
from tensile.kube.workqueue import Requeue
from vnode.providers.k2k import naming, podsecurity
from vnode.providers.k2k.namespacerbac import NamespaceGrant
from vnode.settings import PodSecurityLevel

logger = logging.getLogger(__name__)

_GOING_RETRY = 5.0
"""Seconds before an object of an upper namespace being deleted is looked at again."""
GOING_BELOW = ExponentialBackoff(base=1.0, cap=10.0)
"""Seconds between looks at a lower namespace being deleted, doubling per look that finds
it still there: deletions usually take seconds, but a finalizer can hold one for hours (one
look, a POST and a GET, every 10 s then; a pod waits at most that long once it is gone)."""
_GOING_FORGOTTEN = 2 * GOING_BELOW.cap
"""Seconds after a look was due with nobody looking (no object waits for that namespace
any more) before what the looks found is forgotten: the next object starts from 1 s."""


@dataclass(frozen=True, kw_only=True)
class _Going:
    """A lower namespace last seen being deleted."""

    looks: int
    """Looks that found it still being deleted, minus one."""
    next_look: float
    """Time (the clock's seconds) before which nobody looks again."""


def marks_patch(
    namespace: Mapping[str, Any],
    *,
    owner: ownership.NodeIdentity,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
) -> dict[str, Any] | None:
    """Return the merge patch that gives an existing lower namespace the administrator's
    `labels` and `annotations` (--lower-namespace-labels/-annotations), or None (pure).

    Only a namespace tensile made for `owner`'s upper cluster (`ownership.namespace_marks`) is
    patched, with the keys it lacks or holds another value of: the flags are the lower
    administrator's word on the namespaces tensile makes, even those made before the flags
    changed. A namespace someone else made (the administrator's own, another upper
    cluster's) is theirs to label: None. Keys not named in the flags are never removed."""
    meta = meta_of(namespace)
    have_labels = meta.get("labels") or {}
    if have_labels.get(ownership.MANAGED_NAMESPACE_LABEL) != "true" or not ownership.same_cluster(
        namespace, owner=owner
    ):
        return None
    have_annotations = meta.get("annotations") or {}
    patch: dict[str, Any] = {}
    for field, want, have in (
        ("labels", labels, have_labels),
        ("annotations", annotations, have_annotations),
    ):
        diff = {k: v for k, v in want.items() if have.get(k) != v}
        if diff:
            patch[field] = diff
    return {"metadata": patch} if patch else None


def terminating(namespace: Mapping[str, Any]) -> bool:
    """Tell whether a Namespace object is being deleted (pure)."""
    meta = meta_of(namespace)
    status = namespace.get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"


class LowerNamespaces:
    """Makes and checks lower namespaces (implements `tensile.kube.mirror.engine.Namespaces`)."""

    def __init__(
        self,
        *,
        lower: ApiClient,
        upper: ApiClient | None = None,
        owner: ownership.NodeIdentity,
        prefix: str,
        pod_security_level: PodSecurityLevel,
        extra_labels: Mapping[str, str] | None = None,
        extra_annotations: Mapping[str, str] | None = None,
        grant: NamespaceGrant | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Namespaces it creates are labelled with `owner`'s marks and the upper namespace
        they were made for, and `pod-security.kubernetes.io/enforce=<pod_security_level>`,
        and carry `extra_labels` and `extra_annotations` (the lower administrator's, for the
        lower cluster's admission); a namespace it made earlier gets those it lacks when
        first looked at (`marks_patch`).
        With `upper`, a namespace is made only while its upper namespace lives: objects of
        an upper namespace being deleted must not bring its lower one back. With `grant`
        (--lower-namespace-role) a namespace is usable once the node's RoleBinding there is
        in force. `clock` (in seconds) times the looks at lower namespaces being deleted."""
        self._lower = lower
        self._upper = upper
        self._owner = owner
        self._prefix = prefix
        self._level = pod_security_level
        self._extra_labels = dict(extra_labels or {})
        self._extra_annotations = dict(extra_annotations or {})
        self._grant = grant
        self._clock = clock
        self._known: set[str] = set()
        """Lower namespaces known to exist and to be usable."""
        self._going: dict[str, _Going] = {}
        """Lower namespaces seen being deleted, until one is made again or nobody comes back
        for it (see `going`)."""
        self._looks: dict[str, asyncio.Future[None]] = {}
        """Lower namespace -> the look at it under way; callers meanwhile share its outcome."""

    async def ensure(self, namespace: str, *, source_namespace: str) -> None:
        """Create the lower `namespace` for upper `source_namespace`, or check that the
        existing one may take its objects. Raises Refused naming the conflict (another
        tenant's namespace, an invalid mapped name), Requeue while the upper namespace or
        the lower one is being deleted (see `going`), kube errors for API failures.

        One look (its requests) per namespace at a time: callers that come while one is
        under way wait for it and get its outcome (its error too), so a burst of pods of
        one namespace costs one look, not one per pod."""
        if namespace in self._known:
            return
        problem = naming.namespace_problem(source_namespace, prefix=self._prefix)
        if problem is not None:
            raise Refused(problem)
        while True:
            if namespace in self._known:
                return  # made by the look waited for
            going = self._going.get(namespace)
            if going is not None and (wait := going.next_look - self._clock()) > 0:
                raise Requeue(wait, f"lower namespace {namespace} is being deleted")
            look = self._looks.get(namespace)
            if look is None:
                break
            # Its error is raised here too; a look cut short (its caller cancelled) ends
            # without one, and the loop looks again. Shielded: this caller's cancellation
            # must not cancel the look others wait for.
            await asyncio.shield(look)
        look = self._looks[namespace] = asyncio.get_running_loop().create_future()
        try:
            await self._look(namespace, source_namespace=source_namespace)
        except Exception as exc:
            look.set_exception(exc)
            look.exception()  # retrieved: nobody need have waited for it
            raise
        finally:
            del self._looks[namespace]
            if not look.done():
                look.set_result(None)  # made, or cancelled: the waiters look at the state

    async def _look(self, namespace: str, *, source_namespace: str) -> None:
        """Make the lower `namespace` or check the existing one (see `ensure`)."""
        await self._check_upper(source_namespace)
        labels, annotations = ownership.namespace_marks(
            owner=self._owner, upper_namespace=source_namespace
        )
        labels.update(self._extra_labels)
        annotations.update(self._extra_annotations)
        labels[podsecurity.ENFORCE_LABEL] = self._level
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": labels, "annotations": annotations},
        }
        try:
            await self._lower.request("POST", NAMESPACES.path(), body=body)
        except errors.AlreadyExists:
            existing = await self._lower.request("GET", NAMESPACES.path(name=namespace))
            if terminating(existing):
                raise self.going(namespace) from None
            conflict = naming.namespace_conflict(
                existing,
                owner=self._owner,
                upper_namespace=source_namespace,
                prefix=self._prefix,
            )
            if conflict is not None:
                raise Refused(conflict) from None
            await self._add_marks(existing)
        if self._grant is not None:
            await self._grant.grant(namespace)
        self._going.pop(namespace, None)
        self._known.add(namespace)

    async def _add_marks(self, existing: Mapping[str, Any]) -> None:
        """Give a namespace made before the administrator's marks what it lacks of them.
        A refusal (RBAC without `patch` on namespaces) is logged: the objects still go in,
        as before the flags existed."""
        patch = marks_patch(
            existing,
            owner=self._owner,
            labels=self._extra_labels,
            annotations=self._extra_annotations,
        )
        if patch is None:
            return
        name = name_of(existing)
        try:
            await self._lower.request(
                "PATCH", NAMESPACES.path(name=name), body=patch, content_type=MERGE_PATCH
            )
        except (errors.Forbidden, errors.Invalid) as exc:
            logger.warning("lower namespace %s keeps its old labels: %s", name, exc.message)
        else:
            logger.info("lower namespace %s: set %s", name, patch["metadata"])

    def going(self, namespace: str) -> Requeue:
        """Note that the lower `namespace` is being deleted (seen so, or it refused an object
        with NamespaceTerminating) and return the Requeue its object's key should raise.

        Objects for it wait instead of being refused: `ensure` answers Requeue without a
        request until the next look is due, then looks once (keys due together share that
        one look: its two requests); the delay doubles per look that finds the namespace
        still there (`GOING_BELOW`, 1 s to 30 s), and once it is gone `ensure` makes it
        again. What the looks found is forgotten once a look has been due for
        `_GOING_FORGOTTEN` seconds with nobody looking, so namespaces nothing waits for any
        more are not remembered for ever."""
        self._known.discard(namespace)
        now = self._clock()
        self._going = {
            name: going
            for name, going in self._going.items()
            if now <= going.next_look + _GOING_FORGOTTEN
        }
        going = self._going.get(namespace)
        if going is not None and going.next_look > now:
            return Requeue(going.next_look - now, f"lower namespace {namespace} is being deleted")
        looks = 0 if going is None else going.looks + 1
        delay = GOING_BELOW.delay(looks)
        self._going[namespace] = _Going(looks=looks, next_look=now + delay)
        return Requeue(
            delay, f"lower namespace {namespace} is being deleted; looking again in {delay:g}s"
        )

    async def _check_upper(self, namespace: str) -> None:
        """Raise Requeue while the upper `namespace` is being deleted (or gone)."""
        if self._upper is None:
            return
        try:
            found = await self._upper.request("GET", NAMESPACES.path(name=namespace))
        except errors.NotFound:
            raise Requeue(_GOING_RETRY, f"upper namespace {namespace} is gone") from None
        except errors.Forbidden:
            return  # RBAC older than this check (get namespaces): make it, as before
        if (found.get("status") or {}).get("phase") == "Terminating":
            raise Requeue(_GOING_RETRY, f"upper namespace {namespace} is being deleted")

    def forget(self, namespace: str) -> None:
        """Forget that `namespace` exists (it was deleted under us: make it again)."""
        self._known.discard(namespace)
