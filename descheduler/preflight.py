"""The descheduler's preflight check: before it competes for its Lease, make sure it CAN hold
the Lease and write the avoidance record, or stop at once saying what to do.

tensile-kube's descheduler had neither: started the way it was (a kubeconfig or its
ServiceAccount, a policy file), ours would otherwise retry the Lease forever after one
warning, in a namespace (tensile-system) that does not exist or with an identity that may
not create Leases. So, for the Lease's namespace and the avoidance record's, a dry-run
create (`dryRun=All`: the apiserver authorizes and admits it, stores nothing) says which:

- accepted, or AlreadyExists: it can be written;
- NotFound: the namespace is missing; it is created (it is ours, named by our defaults:
  creating it is what an administrator would do, and is harmless if someone else just did);
  if this identity may not create namespaces, stop with what to do;
- Forbidden: RBAC lacks the rule; stop, naming the rule and the flags that avoid it.

First of all, one SelfSubjectAccessReview per cluster-wide permission its caches and
moves need (`PERMISSIONS`; tensile-kube's ClusterRole granted fewer): a missing one would
otherwise make a reflector retry forever; all missing ones are named in one message.

A stop is `PreflightFailed` (the command exits 1 with its message). Other answers (a 5xx, an
unreachable apiserver) are raised as they are: they are not configuration.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from descheduler.settings import Settings
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.resources import CONFIG_MAPS, LEASES, NAMESPACES

logger = logging.getLogger(__name__)

MANAGED_BY = {"app.kubernetes.io/managed-by": "tensile-descheduler"}


@dataclass(frozen=True)
class Permission:
    """One verb on a resource (`group` "" for the core API) across the cluster."""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""

    def text(self) -> str:
        """kubectl's spelling, e.g. "list poddisruptionbudgets.policy", "create pods/eviction"."""
        name = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {name}" + (f"/{self.subresource}" if self.subresource else "")


PERMISSIONS = (
    *(
        Permission(verb, resource, group)
        for resource, group in (
            ("pods", ""),
            ("nodes", ""),
            ("poddisruptionbudgets", "policy"),
            ("persistentvolumeclaims", ""),
            ("persistentvolumes", ""),
        )
        for verb in ("list", "watch")
    ),
    Permission("create", "pods", subresource="eviction"),
    Permission("create", "pods"),
    Permission("delete", "pods"),
    Permission("patch", "pods"),
)
"""What the caches (descheduler.loop) and moves (descheduler.mover) do across the cluster:
manifests/descheduler/rbac.yaml's ClusterRole."""
Verdict = Literal["writable", "create-namespace", "forbidden"]


class PreflightFailed(Exception):
    """The descheduler cannot keep its Lease or its record; the message says what to do."""


@dataclass(frozen=True)
class Need:
    """One object the descheduler must be able to create: its kind, namespace and name,
    and the flags that choose them (for messages)."""

    kind: Literal["Lease", "ConfigMap"]
    namespace: str
    name: str
    flags: str
    """e.g. "--leader-elect-resource-namespace, or --leader-elect=false with one replica"."""


def needs(settings: Settings) -> list[Need]:
    """Return what `settings` need: the Lease (with leader election) and the avoidance
    record's ConfigMap."""
    found = []
    election = settings.leader_election
    if election is not None:
        found.append(
            Need(
                kind="Lease",
                namespace=election.namespace,
                name=election.name,
                flags="--leader-elect-resource-namespace/-name, or --leader-elect=false when "
                "only one replica runs",
            )
        )
    found.append(
        Need(
            kind="ConfigMap",
            namespace=settings.avoid_namespace,
            name=settings.avoid_name,
            flags="--avoid-configmap NAMESPACE/NAME (the webhook's flag of that name must "
            "name the same)",
        )
    )
    return found


def verdict(code: int) -> Verdict | None:
    """Return what the HTTP status of a dry-run create means (None: not configuration; the
    caller raises the error)."""
    if code in (200, 201, 409):
        return "writable"
    if code == 404:
        return "create-namespace"
    if code == 403:
        return "forbidden"
    return None


def forbidden_message(need: Need, answer: str) -> str:
    """Return what to do when the apiserver refuses `need` with 403 (`answer`: its message,
    which also tells a namespace being deleted from missing RBAC)."""
    plural = "leases" if need.kind == "Lease" else "configmaps"
    return (
        f"{answer}; this identity must be able to create {need.kind}s in namespace "
        f"{need.namespace} (the "
        f"{need.kind} {need.name}): grant create on {plural} there and get/update on "
        f"{plural}/{need.name} (manifests/descheduler/rbac.yaml does), or choose with "
        f"{need.flags}"
    )


def no_namespace_message(need: Need) -> str:
    """Return what to do when `need`'s namespace is missing and may not be created."""
    return (
        f"namespace {need.namespace} (of the {need.kind} {need.name}) does not exist and this "
        f"identity may not create it: kubectl create namespace {need.namespace} (or apply "
        f"manifests/descheduler/rbac.yaml), or choose with {need.flags}"
    )


def missing_message(missing: list[Permission]) -> str:
    """Return what to do about `missing` cluster-wide permissions."""
    return (
        "this identity lacks " + ", ".join(p.text() for p in missing) + " across the cluster: "
        "grant them (the ClusterRole of manifests/descheduler/rbac.yaml does; tensile-kube's "
        "granted fewer)"
    )


async def ensure(client: ApiClient, settings: Settings) -> None:
    """Check `PERMISSIONS`, then make every `needs(settings)` writable (see the module
    docstring). Raises PreflightFailed, errors.ApiError (other refusals), errors.ApiUnavailable."""
    missing = [p for p in PERMISSIONS if not await _allowed(client, p)]
    if missing:
        raise PreflightFailed(missing_message(missing))
    for need in needs(settings):
        code, answer = await _dry_run(client, need)
        if verdict(code) == "create-namespace":
            await _create_namespace(client, need)
            code, answer = await _dry_run(client, need)
        if verdict(code) == "forbidden":
            raise PreflightFailed(forbidden_message(need, answer))


async def _allowed(client: ApiClient, permission: Permission) -> bool:
    review = await client.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": permission.verb,
                    "group": permission.group,
                    "resource": permission.resource,
                    "subresource": permission.subresource,
                }
            },
        },
    )
    return bool((review.get("status") or {}).get("allowed"))


async def _dry_run(client: ApiClient, need: Need) -> tuple[int, str]:
    """Return the HTTP status of a dry-run create of `need` and the apiserver's message."""
    resource = LEASES if need.kind == "Lease" else CONFIG_MAPS
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1" if need.kind == "Lease" else "v1",
        "kind": need.kind,
        "metadata": {"name": need.name, "namespace": need.namespace},
    }
    try:
        await client.request(
            "POST",
            resource.path(namespace=need.namespace),
            params={"dryRun": "All"},
            body=body,
        )
    except errors.ApiError as exc:
        if verdict(exc.code) is None:
            raise
        return exc.code, exc.message
    return 201, ""


async def _create_namespace(client: ApiClient, need: Need) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": need.namespace, "labels": MANAGED_BY},
    }
    try:
        await client.request("POST", NAMESPACES.path(), body=body)
    except errors.AlreadyExists:
        return
    except errors.Forbidden:
        raise PreflightFailed(no_namespace_message(need)) from None
    logger.warning(
        "created namespace %s for the %s %s: it did not exist", need.namespace, need.kind, need.name
    )
