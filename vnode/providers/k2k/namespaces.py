"""Lower namespaces: made when the first object of an upper namespace goes below, checked
when they exist (`naming.namespace_conflict`), remembered once usable.

Pods, mirrored Services, EndpointSlices and claims all go through one `LowerNamespaces`,
so every object follows the same tenancy rules (see the README, "Tenants below").
"""

from __future__ import annotations

from vnode.kube import errors
from vnode.kube.client import ApiClient
from vnode.kube.mirror import Refused
from vnode.kube.resources import NAMESPACES
from vnode.kube.workqueue import Requeue
from vnode.providers.k2k import naming, podsecurity
from vnode.settings import PodSecurityLevel

_GOING_RETRY = 5.0
"""Seconds before an object of an upper namespace being deleted is looked at again."""


class LowerNamespaces:
    """Makes and checks lower namespaces (implements `vnode.kube.mirror.Namespaces`)."""

    def __init__(
        self,
        *,
        lower: ApiClient,
        upper: ApiClient | None = None,
        owner: naming.Owner,
        prefix: str,
        pod_security_level: PodSecurityLevel,
    ) -> None:
        """Namespaces it creates are labelled with `owner`'s marks and the upper namespace
        they were made for, and `pod-security.kubernetes.io/enforce=<pod_security_level>`.
        With `upper`, a namespace is made only while its upper namespace lives: objects of
        an upper namespace being deleted must not bring its lower one back."""
        self._lower = lower
        self._upper = upper
        self._owner = owner
        self._prefix = prefix
        self._level = pod_security_level
        self._known: set[str] = set()
        """Lower namespaces known to exist and to be usable."""

    async def ensure(self, namespace: str, *, source_namespace: str) -> None:
        """Create the lower `namespace` for upper `source_namespace`, or check that the
        existing one may take its objects. Raises Refused naming the conflict (another
        tenant's namespace, an invalid mapped name), kube errors for API failures."""
        if namespace in self._known:
            return
        problem = naming.namespace_problem(source_namespace, prefix=self._prefix)
        if problem is not None:
            raise Refused(problem)
        await self._check_upper(source_namespace)
        labels, annotations = naming.namespace_marks(
            owner=self._owner, upper_namespace=source_namespace
        )
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
            conflict = naming.namespace_conflict(
                existing,
                owner=self._owner,
                upper_namespace=source_namespace,
                prefix=self._prefix,
            )
            if conflict is not None:
                raise Refused(conflict) from None
        self._known.add(namespace)

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
