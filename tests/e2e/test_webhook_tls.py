"""Bootstrapped serving certificates kept in a Secret of the real upper cluster
(`tensile.serving.certsecret`): replicas racing converge on the first write, renewals keep
the CA (so the caBundle stays), new names get a new certificate, and a Secret whose parts
do not fit together is made whole."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import ssl
import tempfile

import pytest

from devcluster.fleet import Fleet
from tensile.kube import config
from tensile.kube.client import ApiClient
from tensile.serving import certsecret, selfsigned
from tensile.serving.selfsigned import SubjectNames

NAMES = SubjectNames.of(["hook.shop.svc", "192.0.2.1"])
NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


async def test_replicas_racing_for_the_secret_converge_on_the_first_write(
    fleet: Fleet, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tensile.serving.certsecret")
    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as client:
        bundles = await asyncio.gather(
            *(
                certsecret.ensure(
                    client, namespace=namespace, name="tls", names=NAMES, manager="test"
                )
                for _ in range(4)
            )
        )
        secret = await client.request("GET", f"/api/v1/namespaces/{namespace}/secrets/tls")
    assert len({b.serving_pem for b in bundles}) == 1
    assert len({b.authority.cert_pem for b in bundles}) == 1
    assert base64.b64decode(secret["data"]["tls.crt"]) == bundles[0].serving.cert_pem
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "test"}
    # The losers were refused by the apiserver (AlreadyExists) and read the winner's back.
    assert "written by another replica" in caplog.text


async def test_renewal_keeps_the_ca_and_new_names_get_a_new_certificate(
    fleet: Fleet, namespace: str
) -> None:
    lifetimes = certsecret.Lifetimes(
        authority=dt.timedelta(days=3650),
        serving=dt.timedelta(days=10),
        renew_before=dt.timedelta(days=2),
    )
    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as client:

        async def ensure(names: SubjectNames, now: dt.datetime) -> certsecret.Bundle:
            return await certsecret.ensure(
                client,
                namespace=namespace,
                name="tls",
                names=names,
                manager="test",
                lifetimes=lifetimes,
                clock=lambda: now,
            )

        first = await ensure(NAMES, NOW)
        assert await ensure(NAMES, NOW + dt.timedelta(days=7)) == first  # not due yet
        renewed = await ensure(NAMES, NOW + dt.timedelta(days=9))  # due: 1 day left
        assert renewed.serving != first.serving
        assert renewed.authority == first.authority  # the caBundle stays valid
        wider = SubjectNames.of(["hook.shop.svc", "192.0.2.1", "192.0.2.2"])
        more = await ensure(wider, NOW + dt.timedelta(days=9))
        assert more.serving != renewed.serving
        assert more.authority == first.authority
        # What another replica reads now is that one.
        assert await ensure(NAMES, NOW + dt.timedelta(days=9)) == more


async def test_a_secret_whose_parts_do_not_fit_together_is_made_whole(
    fleet: Fleet, namespace: str
) -> None:
    """What a hand edit or a half restore may leave: a serving certificate with another key
    (ssl would refuse to load it, and the webhook would stop at every start), then a CA key
    that is not the CA's (the certificates it signed would not verify against the caBundle)."""
    authority = selfsigned.new_authority(common_name="restored CA", now=NOW, lifetime=3650 * DAY)
    serving = selfsigned.issue(authority, names=NAMES, now=NOW, lifetime=365 * DAY)
    stranger = selfsigned.new_authority(common_name="someone else", now=NOW, lifetime=DAY)
    path = f"/api/v1/namespaces/{namespace}/secrets"

    def secret(ca_key: bytes, tls_key: bytes) -> dict[str, object]:
        data = {
            "ca.crt": authority.cert_pem,
            "ca.key": ca_key,
            "tls.crt": serving.cert_pem,
            "tls.key": tls_key,
        }
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tls"},
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }

    async with ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as client:

        async def ensure(names: SubjectNames) -> certsecret.Bundle:
            return await certsecret.ensure(
                client, namespace=namespace, name="tls", names=names, manager="test"
            )

        await client.request("POST", path, body=secret(authority.key_pem, stranger.key_pem))
        bundle = await ensure(NAMES)
        assert bundle.serving.cert_pem != serving.cert_pem  # renewed ...
        assert bundle.authority == authority  # ... by the CA, whose key is its own
        assert _fits(bundle.serving)
        await client.request("DELETE", f"{path}/tls")
        await client.request("POST", path, body=secret(stranger.key_pem, serving.key_pem))
        wider = SubjectNames.of([*NAMES.dns_names, *NAMES.ip_addresses, "hook.shop"])
        bundle = await ensure(wider)  # due (a new name), and the CA cannot sign it
        assert bundle.authority.cert_pem != authority.cert_pem
        assert _fits(bundle.serving)
        bundle.serving.certificate.verify_directly_issued_by(bundle.authority.certificate)
        assert await ensure(wider) == bundle  # and it stays


def _fits(pair: selfsigned.KeyPair) -> bool:
    """Whether ssl loads the pair (it checks the key against the certificate)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.NamedTemporaryFile(suffix=".pem") as file:
        file.write(pair.cert_pem + pair.key_pem)
        file.flush()
        try:
            context.load_cert_chain(file.name)
        except ssl.SSLError:
            return False
    return True
