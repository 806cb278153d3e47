"""The virtual node's check at start with --leader-elect: its Lease can be kept (the
namespace of --leader-elect-resource-namespace exists or is created, RBAC allows the Lease),
or the command stops at once saying what to do, through the programs' shared preflight
(`tensile.serving.preflight`, the descheduler's too). Without it, a missing namespace made
the node retry its Lease forever after one warning and never become Ready."""

from __future__ import annotations

from tensile.kube.client import ApiClient
from tensile.serving.preflight import Need, ensure_writable
from vnode.settings import Settings

MANAGER = "tensile-virtual-node"
"""The managed-by label of a namespace the virtual node creates."""
MANIFEST = "manifests/vnode/upper-rbac.yaml"
"""The shipped RBAC that grants the Lease."""


def lease_need(settings: Settings) -> Need | None:
    """Return the election's Lease as a `Need` (None without --leader-elect)."""
    election = settings.leader_election
    if election is None:
        return None
    return Need(
        kind="Lease",
        namespace=election.namespace,
        name=election.name,
        flags="--leader-elect-resource-namespace/-name",
        manifest=MANIFEST,
    )


async def ensure(upper: ApiClient, settings: Settings) -> None:
    """With --leader-elect, make the Lease writable in the upper cluster (`upper`: the
    node's identity there) or stop. Raises tensile.serving.preflight.PreflightFailed,
    errors.ApiError (other refusals), errors.ApiUnavailable."""
    need = lease_need(settings)
    if need is not None:
        await ensure_writable(upper, [need], manager=MANAGER)
