"""The descheduler's preflight check: before it competes for its Lease, make sure it CAN hold
the Lease and write the avoidance record, or stop at once saying what to do.

tensile-kube's descheduler had neither: started the way it was (a kubeconfig or its
ServiceAccount, a policy file), ours would otherwise retry the Lease forever after one
warning, in a namespace (tensile-system) that does not exist or with an identity that may
not create Leases. So, for the Lease's namespace and the avoidance record's, the program
preflight of `tensile.serving.preflight` (shared with the virtual node): a dry-run create of
each, the namespace created when missing and allowed, a stop naming what to do otherwise.

First of all, one SelfSubjectAccessReview per cluster-wide permission its caches and
moves need (`PERMISSIONS`; tensile-kube's ClusterRole granted fewer): a missing one would
otherwise make a reflector retry forever; all missing ones are named in one message.

A stop is `PreflightFailed` (the command exits 1 with its message). Other answers (a 5xx, an
unreachable apiserver) are raised as they are: they are not configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from descheduler.settings import Settings
from tensile.kube.client import ApiClient
from tensile.serving.preflight import Need, PreflightFailed, ensure_writable

MANAGER = "tensile-descheduler"
"""The managed-by label of a namespace the descheduler creates."""
MANIFEST = "manifests/descheduler/rbac.yaml"
"""The shipped RBAC that grants what it needs."""


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
                manifest=MANIFEST,
            )
        )
    found.append(
        Need(
            kind="ConfigMap",
            namespace=settings.avoid_namespace,
            name=settings.avoid_name,
            flags="--avoid-configmap NAMESPACE/NAME (the webhook's flag of that name must "
            "name the same)",
            manifest=MANIFEST,
        )
    )
    return found


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
    await ensure_writable(client, needs(settings), manager=MANAGER)


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
