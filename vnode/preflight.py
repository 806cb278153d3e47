"""The virtual node's checks at start, which stop the command at once saying what to do:

- with --leader-elect, its Lease can be kept (the namespace of
  --leader-elect-resource-namespace exists or is created, RBAC allows the Lease), through
  the programs' shared preflight (`tensile.serving.preflight`, the descheduler's too).
  Without it, a missing namespace made the node retry its Lease forever after one warning
  and never become Ready;
- with --cert-secret (and a serving certificate from CSRs), the Secret can be read and
  written (`vnode.api.secretstore.check_access`). Without it, a missing rule showed only
  once a CSR was approved, maybe hours later, and the certificate was lost at the next
  restart."""

from __future__ import annotations

from tensile.kube.client import ApiClient
from tensile.serving.preflight import Need, PreflightFailed, ensure_writable
from vnode.api.certstore import StoreError
from vnode.api.secretstore import check_access
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


def certificate_secret(settings: Settings) -> tuple[str, str] | None:
    """Return the (namespace, name) of --cert-secret when the serving certificate comes from
    CSRs and is kept there; None otherwise (certificate files, rotation off, --cert-dir)."""
    api = settings.api
    if api.cert_file or not api.rotate_server_certificates:
        return None
    return api.cert_secret


async def ensure(upper: ApiClient, settings: Settings) -> None:
    """With --leader-elect, make the Lease writable in the upper cluster (`upper`: the
    node's identity there) or stop; with --cert-secret, check the Secret can be kept or
    stop. Raises tensile.serving.preflight.PreflightFailed, errors.ApiError (other
    refusals), errors.ApiUnavailable."""
    need = lease_need(settings)
    if need is not None:
        await ensure_writable(upper, [need], manager=MANAGER)
    secret = certificate_secret(settings)
    if secret is not None:
        namespace, name = secret
        try:
            await check_access(upper, namespace=namespace, name=name)
        except StoreError as exc:
            raise PreflightFailed(str(exc)) from None
