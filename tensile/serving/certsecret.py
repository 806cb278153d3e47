"""A bootstrapped serving certificate kept in a Secret, so every replica of a server serves
the same one and the apiserver trusts one CA.

`ensure` reads the Secret and returns its material when it still serves the names asked
for; otherwise it makes what is missing and writes it, create-if-absent (POST) or
replace-if-unchanged (PUT with the resourceVersion read). Replicas that race converge on
the first write: a loser's 409 (AlreadyExists or Conflict) makes it read the winner's back.
The CA is kept as long as it is valid past the serving certificate's next renewal, so a
renewed serving certificate needs no new `caBundle`. Parts that do not fit together (a
serving key that is not its certificate's, a CA key that is not the CA's, as a hand edit or
a half restore may leave) count as missing: they are made again, never served.

The Secret is `kubernetes.io/tls`: `tls.crt`/`tls.key` the serving certificate, `ca.crt`
the CA (what a `caBundle` holds) and `ca.key` its key, which signs renewals.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts.objects import meta_of
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.resources import SECRETS
from tensile.serving import selfsigned
from tensile.serving.selfsigned import KeyPair, SubjectNames

logger = logging.getLogger(__name__)

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
MANAGED_BY = "app.kubernetes.io/managed-by"
_WRITE_ATTEMPTS = 5


class SecretError(Exception):
    """The Secret could not be brought to a usable state; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Bundle:
    """A CA and the serving certificate it signed."""

    authority: KeyPair
    serving: KeyPair

    @property
    def serving_pem(self) -> bytes:
        """Certificate then key, one PEM block (what `tls.load_pem_chain` reads)."""
        return self.serving.cert_pem + self.serving.key_pem


@dataclass(frozen=True, kw_only=True)
class Lifetimes:
    """How long bootstrapped certificates live, and when they are renewed."""

    authority: dt.timedelta = dt.timedelta(days=3650)
    serving: dt.timedelta = dt.timedelta(days=365)
    renew_before: dt.timedelta = dt.timedelta(days=30)
    """A serving certificate this close to its end is renewed (by whichever replica sees
    it first)."""


async def ensure(
    client: ApiClient,
    *,
    namespace: str,
    name: str,
    names: SubjectNames,
    manager: str,
    lifetimes: Lifetimes = Lifetimes(),
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
) -> Bundle:
    """Return the material of Secret `namespace`/`name`, made or renewed first when it does
    not serve `names` for at least `lifetimes.renew_before` more (see the module docstring);
    `manager` labels a Secret this makes (app.kubernetes.io/managed-by).

    Raises errors.ApiError / errors.ApiUnavailable when the Secret cannot be read or written
    (RBAC: get, create and update on it), SecretError when writes kept racing."""
    path = SECRETS.path(namespace=namespace)
    for _ in range(_WRITE_ATTEMPTS):
        try:
            secret: dict[str, Any] | None = await client.request(
                "GET", SECRETS.path(namespace=namespace, name=name)
            )
        except errors.NotFound:
            secret = None
        now = clock()
        current = bundle_of(secret) if secret is not None else None
        if current is not None:
            reason = selfsigned.problem(
                current.serving,
                current.authority.cert_pem,
                names=names,
                now=now,
                renew_before=lifetimes.renew_before,
            )
            if reason is None:
                return current
            logger.info("certificate in Secret %s/%s: %s; renewing", namespace, name, reason)
        fresh = _renewed(current, names=names, now=now, lifetimes=lifetimes)
        body = _secret(fresh, namespace=namespace, name=name, manager=manager, previous=secret)
        try:
            if secret is None:
                await client.request("POST", path, body=body)
            else:
                await client.request("PUT", SECRETS.path(namespace=namespace, name=name), body=body)
        except (errors.AlreadyExists, errors.Conflict):
            logger.info("Secret %s/%s was written by another replica; reading it", namespace, name)
            continue
        logger.info("certificate for %s written to Secret %s/%s", _names(names), namespace, name)
        return fresh
    raise SecretError(
        f"Secret {namespace}/{name} changed under every one of {_WRITE_ATTEMPTS} writes"
    )


def bundle_of(secret: Mapping[str, Any]) -> Bundle | None:
    """Return the material in a Secret, or None when a part is missing or not base64 (the
    CA key may be missing: the Secret then serves until it must be renewed)."""
    data = secret.get("data") or {}
    try:
        parts = {
            key: base64.b64decode(str(data[key]), validate=True)
            for key in (CA_CERT, TLS_CERT, TLS_KEY)
        }
        ca_key = base64.b64decode(str(data.get(CA_KEY, "")), validate=True)
    except (KeyError, binascii.Error):
        return None
    return Bundle(
        authority=KeyPair(cert_pem=parts[CA_CERT], key_pem=ca_key),
        serving=KeyPair(cert_pem=parts[TLS_CERT], key_pem=parts[TLS_KEY]),
    )


def _renewed(
    current: Bundle | None, *, names: SubjectNames, now: dt.datetime, lifetimes: Lifetimes
) -> Bundle:
    """Return a new serving certificate, signed by the current CA while it can still sign
    one that lives a full renewal period, else by a new CA."""
    authority = current.authority if current is not None else None
    if authority is not None and not _can_sign(authority, now=now, lifetimes=lifetimes):
        authority = None
    if authority is None:
        authority = selfsigned.new_authority(
            common_name=f"tensile serving CA {now:%Y-%m-%d}", now=now, lifetime=lifetimes.authority
        )
    serving = selfsigned.issue(authority, names=names, now=now, lifetime=lifetimes.serving)
    return Bundle(authority=authority, serving=serving)


def _can_sign(authority: KeyPair, *, now: dt.datetime, lifetimes: Lifetimes) -> bool:
    reason = selfsigned.issuing_problem(authority)
    if reason is not None:
        logger.info("the CA in the Secret cannot sign (%s); a new CA is made", reason)
        return False
    return now + lifetimes.renew_before * 2 < authority.certificate.not_valid_after_utc


def _secret(
    bundle: Bundle,
    *,
    namespace: str,
    name: str,
    manager: str,
    previous: Mapping[str, Any] | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if previous is not None:
        metadata = {**meta_of(previous), **metadata}
    else:
        metadata["labels"] = {MANAGED_BY: manager}
    encoded = {
        CA_CERT: bundle.authority.cert_pem,
        CA_KEY: bundle.authority.key_pem,
        TLS_CERT: bundle.serving.cert_pem,
        TLS_KEY: bundle.serving.key_pem,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "kubernetes.io/tls",
        "data": {key: base64.b64encode(value).decode() for key, value in encoded.items()},
    }


def _names(names: SubjectNames) -> str:
    return ", ".join([*names.dns_names, *names.ip_addresses])
