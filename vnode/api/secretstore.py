"""The kubelet serving certificate kept in a Secret of the upper cluster
(`--cert-secret NAMESPACE/NAME`): a restarted or rescheduled process (whose pod's volumes
went with it) serves the certificate it had instead of making a new CSR, which may wait
for an administrator's approval again. A `vnode.api.certstore.ServingCertificateStore`.

One Secret per node, one data key per serving identity (`entry_key`: the addresses the
certificate names). The replicas of one node each serve on their own host's address and so
each hold a certificate of their own: each reads and writes its own key and keeps the
others'; a node that comes back to a host it served from before finds that host's
certificate again. A key holds what a `--cert-dir` file holds (the chain, then the private
key). Entries of expired certificates are dropped whenever one is written.

A write reads the Secret and replaces it with the resourceVersion it read (PUT), so
replicas that write at once never lose each other's entries: the loser's 409 Conflict
reads it again after a random pause (client-go's `retry.RetryOnConflict`, with the pause
drawn from zero so replicas that started together stop colliding). A Secret that does not
exist is created (POST), which needs `create` on Secrets; the chart and
`manifests/vnode/upper-rbac.yaml` make it empty beforehand instead, so the node needs only
`get` and `update` on it by name (`check_access` says at start what is missing). The
Secret is read by anyone who may read Secrets in its namespace: the private key is as safe
as that namespace's Secrets are.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import hashlib
import logging
import random
import re
from collections.abc import Mapping
from typing import Any

from cryptography import x509

from tensile.kube import errors
from tensile.kube.backoff import ExponentialBackoff
from tensile.kube.client import ApiClient
from tensile.kube.resources import SECRETS
from vnode.api.certificates import ServingIdentity
from vnode.api.certstore import StoredCertificate, StoreError

logger = logging.getLogger(__name__)

ENTRY_PREFIX = "kubelet-server-"
"""Every entry's key starts so; other keys of the Secret are left alone."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "tensile-virtual-node"
NODE_LABEL = "tensile.io/virtual-node"
RBAC_SOURCE = "the chart and manifests/vnode/upper-rbac.yaml grant it"
_WRITE_ATTEMPTS = 10
_CONFLICT_PAUSE = ExponentialBackoff(base=0.05, cap=1.0)
"""The longest pause (seconds) after the n-th conflict in a row; each is drawn from 0 up."""
_KEY_MAX = 253
_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def entry_key(identity: ServingIdentity) -> str:
    """Return the Secret data key of `identity`'s certificate: `kubelet-server-` and its
    addresses (IPs, then DNS names) joined by `_`, IPv6 colons written as `-` (a key holds
    only alphanumerics, `-`, `_` and `.`), then `.pem`; `kubelet-server-<sha256 prefix>.pem`
    of the addresses when that is no valid key (over 253 characters, a zone index). Two
    identities could share a key only by a spelling no real node uses, and a certificate
    read is checked against the node's addresses before it serves anyway."""
    names = [*identity.ip_addresses, *identity.dns_names]
    key = f"{ENTRY_PREFIX}{'_'.join(n.replace(':', '-') for n in names)}.pem"
    if len(key) <= _KEY_MAX and _KEY.fullmatch(key):
        return key
    digest = hashlib.sha256(",".join(names).encode()).hexdigest()[:32]
    return f"{ENTRY_PREFIX}{digest}.pem"


def entry_of(secret: Mapping[str, Any], key: str) -> bytes | None:
    """Return the decoded entry `key` of a Secret object, or None when it has none.
    Raises ValueError when it is not base64."""
    encoded = (secret.get("data") or {}).get(key)
    if encoded is None:
        return None
    try:
        return base64.b64decode(str(encoded), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"key {key} is not base64: {exc}") from exc


def with_entry(
    data: Mapping[str, str], *, key: str, pem: bytes, now: dt.datetime
) -> dict[str, str]:
    """Return a Secret's `data` (base64 values) with entry `key` set to `pem`, the other
    entries kept unless their certificate has expired at `now` or cannot be read (neither
    can serve again), and keys that are no entries (not `kubelet-server-*`) kept as they
    are."""
    kept = {k: v for k, v in data.items() if k == key or not _dead(k, v, now=now)}
    kept[key] = base64.b64encode(pem).decode()
    return kept


def _dead(key: str, value: str, *, now: dt.datetime) -> bool:
    if not key.startswith(ENTRY_PREFIX):
        return False
    try:
        leaf = x509.load_pem_x509_certificates(base64.b64decode(value, validate=True))[0]
    except (ValueError, IndexError):
        return True
    return leaf.not_valid_after_utc <= now


class SecretStore:
    """One node's serving certificates in Secret `namespace`/`name`, read and written
    through `client` (the node's upper identity); this process's entry is `identity`'s."""

    def __init__(
        self, *, client: ApiClient, namespace: str, name: str, identity: ServingIdentity
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._identity = identity
        self._key = entry_key(identity)

    @property
    def location(self) -> str:
        """`Secret NAMESPACE/NAME`."""
        return f"Secret {self._namespace}/{self._name}"

    async def read(self) -> StoredCertificate | None:
        """Return this identity's entry, or None when the Secret or the entry is missing.
        Raises StoreError when the Secret cannot be read or the entry is not base64."""
        secret = await self._get()
        if secret is None:
            return None
        try:
            pem = entry_of(secret, self._key)
        except ValueError as exc:
            raise StoreError(f"{self.location}: {exc}") from exc
        return None if pem is None else StoredCertificate(pem=pem, where=self._where())

    async def write(self, pem: bytes, *, now: dt.datetime) -> str:
        """Set this identity's entry to `pem`, keeping the other entries (see the module
        docstring); return `Secret NAMESPACE/NAME key KEY`. Raises StoreError when the
        Secret cannot be read, created or replaced, or changed under every attempt."""
        for attempt in range(_WRITE_ATTEMPTS):
            if attempt:
                pause = _CONFLICT_PAUSE.delay(attempt - 1)
                await asyncio.sleep(random.uniform(0, pause))  # noqa: S311 - not a secret
            secret = await self._get()
            data = with_entry((secret or {}).get("data") or {}, key=self._key, pem=pem, now=now)
            try:
                if secret is None:
                    await self._client.request(
                        "POST", SECRETS.path(namespace=self._namespace), body=self._new(data)
                    )
                else:
                    await self._client.request(
                        "PUT",
                        SECRETS.path(namespace=self._namespace, name=self._name),
                        body={**secret, "data": data},
                    )
            except (errors.Conflict, errors.AlreadyExists):
                logger.info("%s changed while it was written; reading it again", self.location)
                continue
            except errors.Forbidden as exc:
                raise StoreError(
                    _forbidden(self.location, exists=secret is not None, exc=exc)
                ) from None
            except (errors.ApiError, errors.ApiUnavailable) as exc:
                raise StoreError(f"cannot write {self.location}: {exc}") from exc
            return self._where()
        raise StoreError(f"{self.location} changed under every one of {_WRITE_ATTEMPTS} writes")

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self._client.request(
                "GET", SECRETS.path(namespace=self._namespace, name=self._name)
            )
        except errors.NotFound:
            return None
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            raise StoreError(f"cannot read {self.location}: {exc}") from exc

    def _new(self, data: Mapping[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self._name,
                "namespace": self._namespace,
                "labels": {MANAGED_BY: MANAGER, NODE_LABEL: self._identity.node_name},
            },
            "type": "Opaque",
            "data": dict(data),
        }

    def _where(self) -> str:
        return f"{self.location} key {self._key}"


async def check_access(client: ApiClient, *, namespace: str, name: str) -> None:
    """Check, at start, that `client`'s identity can keep certificates in Secret
    `namespace`/`name`: read it, and replace it (a dry-run PUT of what was read), or, when
    it does not exist, create it (a dry-run POST): the apiserver authorizes and admits a
    dry run and stores nothing. Raises StoreError saying what to grant or create;
    errors.ApiError (other refusals) and errors.ApiUnavailable as they come."""
    location = f"Secret {namespace}/{name}"
    path = SECRETS.path(namespace=namespace, name=name)
    dry_run = {"dryRun": "All"}
    try:
        secret = await client.request("GET", path)
    except errors.NotFound:
        secret = None
    except errors.Forbidden as exc:
        raise StoreError(_forbidden(location, exists=True, exc=exc)) from None
    try:
        if secret is None:
            body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}
            await client.request(
                "POST", SECRETS.path(namespace=namespace), params=dry_run, body=body
            )
        else:
            await client.request("PUT", path, params=dry_run, body=secret)
    except errors.Forbidden as exc:
        raise StoreError(_forbidden(location, exists=secret is not None, exc=exc)) from None
    except errors.NotFound as exc:
        # The namespace itself is missing: the dry-run create says so.
        raise StoreError(f"cannot create {location}: {exc}") from None
    logger.debug("%s can be kept by this identity", location)


def _forbidden(location: str, *, exists: bool, exc: errors.ApiError) -> str:
    namespace, _, name = location.removeprefix("Secret ").partition("/")
    if exists:
        return (
            f"{exc}; the serving certificate is kept in {location}: this identity needs get "
            f"and update on secrets/{name} in namespace {namespace} ({RBAC_SOURCE}, by name)"
        )
    return (
        f"{exc}; the serving certificate is kept in {location}, which does not exist and "
        f"this identity may not create: create it empty (kubectl -n {namespace} create "
        f"secret generic {name}; the chart and manifests/vnode/upper-rbac.yaml do) and grant "
        f"get and update on it"
    )
