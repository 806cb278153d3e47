"""One CertificateSigningRequest's life in the upper cluster: create it, approve it
ourselves when RBAC allows, and watch it until it is issued, denied or failed.

Self-approval mirrors the checks kube-apiserver makes on `PUT .../approval`: `update` on
`certificatesigningrequests/approval` and `approve` on the synthetic `signers` resource
named `kubernetes.io/kubelet-serving` (or the whole `kubernetes.io/*` domain), asked with
SelfSubjectAccessReviews before the CSR exists. Without them the request waits for an
administrator (`kubectl certificate approve <name>`), as a kubelet's serving CSR does: no
controller approves kubelet-serving requests.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass

from tensile.contracts.objects import Obj, meta_of, uid_of
from tensile.kube import errors
from tensile.kube.backoff import ExponentialBackoff, jittered
from tensile.kube.client import ApiClient
from tensile.kube.reflector import Reflector, ReflectorSettings
from tensile.kube.resources import CERTIFICATE_SIGNING_REQUESTS as CSRS
from tensile.kube.store import Store
from vnode.api.certificates import (
    APPROVED_REASON,
    SIGNER,
    CertificateRejected,
    approved,
    csr_status,
    differences,
)

logger = logging.getLogger(__name__)

_APPROVE_RETRY = ExponentialBackoff(base=1.0, cap=30.0)


@dataclass(frozen=True, kw_only=True)
class Issued:
    """A CSR the signer answered: its name and the PEM certificate chain."""

    name: str
    certificate: bytes


async def may_approve(upper: ApiClient) -> bool:
    """Tell whether our credentials may approve kubelet-serving CSRs (two or three
    SelfSubjectAccessReviews).

    A review we may not create (403: a hardened cluster that takes
    `selfsubjectaccessreviews` away from everyone but a few) or an API without them (404)
    means False, with a log: the CSR is then created and waits for an administrator, as a
    kubelet's does. Raises errors.ApiError / ApiUnavailable for other failures (the caller
    tries again later)."""
    try:
        return await _may_approve(upper)
    except (errors.Forbidden, errors.NotFound) as exc:
        logger.info(
            "kubelet API: cannot ask whether this node may approve its own CSRs "
            "(SelfSubjectAccessReview: %s); an administrator will have to approve them",
            exc,
        )
        return False


async def _may_approve(upper: ApiClient) -> bool:
    approval = {
        "group": "certificates.k8s.io",
        "resource": "certificatesigningrequests",
        "subresource": "approval",
        "verb": "update",
    }
    if not await _allowed(upper, approval):
        return False
    domain = SIGNER.split("/", 1)[0] + "/*"
    for name in (SIGNER, domain):
        signer = {"group": "certificates.k8s.io", "resource": "signers", "verb": "approve"}
        if await _allowed(upper, {**signer, "name": name}):
            return True
    return False


async def _allowed(upper: ApiClient, attributes: Obj) -> bool:
    review = await upper.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        },
    )
    return bool((review.get("status") or {}).get("allowed"))


async def request_certificate(
    upper: ApiClient,
    *,
    manifest: Obj,
    node_name: str,
    self_approve: bool,
    now: Callable[[], dt.datetime],
    watch: ReflectorSettings | None = None,
) -> Issued:
    """Create the CSR `manifest`, approve it when `self_approve` (after checking it holds
    exactly what we asked for), and return it once the signer issued a certificate.
    Waits as long as it takes: approval may need a human. `now` stamps the approval.

    Raises CertificateRejected when the CSR is denied, fails, disappears or does not hold
    what we asked for; errors.ApiError / ApiUnavailable when it cannot be created.
    """
    created = await upper.request("POST", CSRS.path(), body=manifest)
    meta = meta_of(created)
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    logger.info("kubelet API: requested a serving certificate: CSR %s (signer %s)", name, SIGNER)
    store = Store()
    changed = asyncio.Event()
    synced = False

    def on_synced() -> None:
        nonlocal synced
        synced = True
        changed.set()

    reflector = Reflector(
        upper,
        CSRS,
        name=f"csr-{name}",
        store=store,
        on_event=lambda _event: changed.set(),
        on_synced=on_synced,
        field_selector=f"metadata.name={name}",
        settings=watch,
    )
    waiting = _Waiting(
        upper=upper,
        manifest=manifest,
        name=name,
        uid=uid,
        node_name=node_name,
        self_approve=self_approve,
        now=now,
    )
    outcome: Issued | CertificateRejected
    async with asyncio.TaskGroup() as group:
        watcher = group.create_task(reflector.run(), name=f"csr-watch-{name}")
        try:
            while True:
                await changed.wait()
                changed.clear()
                if not synced:
                    continue
                issued = await waiting.step(store.get(name))
                if issued is not None:
                    outcome = issued
                    break
                if waiting.retry_in is not None:
                    await asyncio.sleep(waiting.retry_in)
                    changed.set()  # look at the latest state again
        except CertificateRejected as exc:
            # Raised outside the group below: inside, it would arrive in an ExceptionGroup.
            outcome = exc
        finally:
            watcher.cancel()
    if isinstance(outcome, CertificateRejected):
        raise outcome
    return outcome


class _Waiting:
    """What to do with each new state of our CSR (one instance per CSR)."""

    def __init__(
        self,
        *,
        upper: ApiClient,
        manifest: Obj,
        name: str,
        uid: str,
        node_name: str,
        self_approve: bool,
        now: Callable[[], dt.datetime],
    ) -> None:
        self._upper = upper
        self._manifest = manifest
        self._name = name
        self._uid = uid
        self._node = node_name
        self._approve = self_approve
        self._now = now
        self._failures = 0
        self._told: set[str] = set()
        self.retry_in: float | None = None
        """Seconds after which to look again without a new event (a failed approval)."""

    async def step(self, csr: Obj | None) -> Issued | None:
        """Act on the CSR's current state; return it once issued. Raises
        CertificateRejected when it can never be issued to us."""
        self.retry_in = None
        name = self._name
        if csr is None or uid_of(csr) != self._uid:
            raise CertificateRejected(f"CSR {name} was deleted before a certificate was issued")
        state = csr_status(csr)
        if state.phase in ("Denied", "Failed"):
            raise CertificateRejected(
                f"CSR {name} {state.phase.lower()}: {state.reason or 'no reason'}"
                + (f": {state.message}" if state.message else "")
            )
        if state.phase == "Issued":
            return Issued(name=name, certificate=state.certificate)
        if state.phase == "Approved":
            self._once(
                "approved",
                logging.INFO,
                "kubelet API: CSR %s approved (%s); waiting for the signer to issue it",
                name,
                state.reason or "no reason given",
            )
            return None
        if self._approve:
            await self._approve_pending(csr)
        else:
            self._once(
                "waiting",
                logging.WARNING,
                "kubelet API: CSR %s waits for an administrator to approve it "
                "(`kubectl certificate approve %s`): this node may not approve its own "
                "serving certificates; the kubelet API starts serving once it is issued",
                name,
                name,
            )
        return None

    async def _approve_pending(self, csr: Obj) -> None:
        name = self._name
        problems = differences(csr, wanted=self._manifest)
        if problems:
            raise CertificateRejected(
                f"CSR {name} does not hold what we asked for ({'; '.join(problems)}); "
                "not approving it"
            )
        body = approved(csr, node_name=self._node, now=self._now())
        try:
            await self._upper.request(
                "PUT", CSRS.path(name=name, subresource="approval"), body=body
            )
        except errors.Conflict:
            return  # changed meanwhile: the watch brings the new version
        except errors.Forbidden as exc:
            logger.warning("kubelet API: may not approve CSR %s after all: %s", name, exc)
            self._approve = False
            self.retry_in = 0.0  # now wait like a node that may not approve
            return
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            self.retry_in = jittered(_APPROVE_RETRY.delay(self._failures))
            self._failures += 1
            logger.warning(
                "kubelet API: approving CSR %s failed (%s); trying again in %.1fs",
                name,
                exc,
                self.retry_in,
            )
            return
        # Approve once: the next states come through the watch (Approved, then Issued).
        self._approve = False
        self._told.add("waiting")
        logger.info("kubelet API: approved our own CSR %s (reason %s)", name, APPROVED_REASON)

    def _once(self, key: str, level: int, message: str, *args: object) -> None:
        if key not in self._told:
            self._told.add(key)
            logger.log(level, message, *args)
