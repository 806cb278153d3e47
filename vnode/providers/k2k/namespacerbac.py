"""The node's rights in the lower namespaces it makes (--lower-namespace-role).

With lower credentials whose rights are namespaced (manifests/vnode/lower-rbac-namespaced.yaml),
the node may create namespaces and, in them, a RoleBinding of one ClusterRole (RBAC's
escalation check: it holds `bind` on that ClusterRole only) to its own identity; a
ValidatingAdmissionPolicy there lets each upper cluster's identity do either only for
names of its own --namespace-prefix. `NamespaceGrant` makes that RoleBinding when the
namespace is made (or first used) and waits until the apiserver's authorizer applies it,
so the first object written there is not refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.workqueue import Requeue

logger = logging.getLogger(__name__)

ROLE_BINDINGS = "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SELF_SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
BINDING_NAME = "tensile-virtual-node"
"""The name of the RoleBinding the node makes in each of its lower namespaces."""
_SERVICE_ACCOUNT = "system:serviceaccount:"
_IN_FORCE_LOOKS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0)
"""Seconds between looks at whether a new RoleBinding is in force (RBAC's authorizer reads
bindings from its own cache, usually within a second); then the key is requeued."""


def subject_of(username: str) -> dict[str, str]:
    """The RBAC subject for the authenticated `username` (pure): a ServiceAccount for
    `system:serviceaccount:<namespace>:<name>`, else a User (a client certificate's CN,
    an OIDC user)."""
    if username.startswith(_SERVICE_ACCOUNT):
        namespace, _, name = username[len(_SERVICE_ACCOUNT) :].partition(":")
        if namespace and name:
            return {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    return {"kind": "User", "name": username, "apiGroup": "rbac.authorization.k8s.io"}


def role_binding(*, namespace: str, role: str, username: str) -> dict[str, Any]:
    """The RoleBinding of ClusterRole `role` to `username` in `namespace` (pure)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": BINDING_NAME, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject_of(username)],
    }


class NamespaceGrant:
    """Binds `role` to the lower client's own identity in each namespace it is given."""

    def __init__(
        self,
        *,
        lower: ApiClient,
        role: str,
        on_granted: Callable[[str], None],
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        """`on_granted(namespace)` is called once the rights are in force there (the node
        starts watching it); `sleep` waits between looks (seconds)."""
        self._lower = lower
        self._role = role
        self._on_granted = on_granted
        self._sleep = sleep
        self._username: str | None = None

    async def username(self) -> str:
        """Who the lower client is (a SelfSubjectReview, asked once). Raises kube errors."""
        if self._username is None:
            review = await self._lower.request(
                "POST",
                SELF_SUBJECT_REVIEWS,
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            )
            self._username = str(((review.get("status") or {}).get("userInfo") or {})["username"])
        return self._username

    async def grant(self, namespace: str) -> None:
        """Make the RoleBinding in `namespace` (one there is kept: nobody else may write
        RoleBindings in this node's namespaces) and return once it is in force. Raises
        Requeue while it is not yet, kube errors (Forbidden: the lower RBAC lacks the
        grant; the message says which)."""
        body = role_binding(namespace=namespace, role=self._role, username=await self.username())
        try:
            await self._lower.request("POST", ROLE_BINDINGS.format(namespace=namespace), body=body)
        except errors.AlreadyExists:
            pass
        else:
            logger.info("lower namespace %s: bound ClusterRole %s", namespace, self._role)
        for delay in _IN_FORCE_LOOKS:
            if await self._in_force(namespace):
                self._on_granted(namespace)
                return
            await self._sleep(delay)
        raise Requeue(1.0, f"the RoleBinding in lower namespace {namespace} is not in force yet")

    async def _in_force(self, namespace: str) -> bool:
        review = await self._lower.request(
            "POST",
            SELF_SUBJECT_ACCESS_REVIEWS,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": "create",
                        "resource": "pods",
                    }
                },
            },
        )
        status: Mapping[str, Any] = review.get("status") or {}
        return bool(status.get("allowed"))
