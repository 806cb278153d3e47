"""Bootstrapped serving certificates kept in a Secret of the real upper cluster
(`vnode.serving.certsecret`): replicas racing converge on the first write, renewals keep
the CA (so the caBundle stays), and new names get a new certificate."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging

import pytest

from vnode.kube import config
from vnode.kube.client import ApiClient
from vnode.serving import certsecret
from vnode.serving.selfsigned import SubjectNames
from vnode.testing.fleet import Fleet

NAMES = SubjectNames.of(["hook.shop.svc", "192.0.2.1"])
NOW = dt.datetime.now(dt.UTC)


async def test_replicas_racing_for_the_secret_converge_on_the_first_write(
    fleet: Fleet, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vnode.serving.certsecret")
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
