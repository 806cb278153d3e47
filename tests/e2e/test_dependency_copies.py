"""The copies of pods' dependencies (vnode.providers.k2k.dependencies) between the fleet's
real upper and lower apiservers, around pod creations held at the moment that matters.

`DependencySync` runs in the test's own event loop with its real mirrors and informers; the
test plays the provider's part (`creating`, `ensure`, then the lower pod's POST), so it can
delete the last lower pod that uses a copy while another pod's creation is between its
`ensure` and its POST: the clean-up race of the issue, which a running node shows only by
chance.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from collections.abc import AsyncIterator

import pytest

from devcluster.fleet import Fleet
from tensile.contracts import ownership
from tensile.contracts.objects import Obj
from tensile.kube import config, errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import PODS, SECRETS
from tests.e2e.helpers import until
from vnode.providers.k2k.dependencies import DependencySync
from vnode.providers.k2k.naming import NodeTenancy
from vnode.providers.k2k.translate import TranslationPolicy, lower_pod

T = TranslationPolicy(
    node_name="copies-test",
    cluster_id="copies-test-cluster",
    node_labels={},
    enable_service_account=False,
)
COLLECT_DELAY = 2.0  # seconds: the mirrors' wait before a scheduled collection (their default)


@contextlib.asynccontextmanager
async def clients(fleet: Fleet) -> AsyncIterator[tuple[ApiClient, ApiClient]]:
    async with (
        ApiClient(config.load(str(fleet.upper.kubeconfig)), name="upper") as upper,
        ApiClient(config.load(str(fleet.lower.kubeconfig)), name="lower") as lower,
    ):
        yield upper, lower


@contextlib.asynccontextmanager
async def running(
    upper: ApiClient, lower: ApiClient, namespace: str
) -> AsyncIterator[tuple[DependencySync, Informer]]:
    """A DependencySync for `namespace` with its informers and mirrors running, and the
    lower pod informer it reads."""
    factory = InformerFactory()
    lower_pods = factory.informer(lower, PODS, name="lower-pods", namespace=namespace)
    sync = DependencySync(
        upper=upper,
        lower=lower,
        tenancy=NodeTenancy(owner=T.owner, prefix=""),
        upper_namespace=namespace,
        enable_service_account=False,
        lower_pods=lower_pods,
        informers=factory,
        on_resolved=lambda _key: None,
    )
    async with asyncio.TaskGroup() as group:
        informers = factory.informers()
        tasks = [group.create_task(i.run(), name=f"test-{i.name}") for i in informers]
        for informer in informers:
            await asyncio.wait_for(informer.wait_synced(), 30)
        for mirror in sync.components():
            await mirror.start()
            tasks.append(group.create_task(mirror.run(), name=f"test-{mirror.name}"))
        try:
            yield sync, lower_pods
        finally:
            for mirror in sync.components():
                await mirror.shut_down()
            for task in tasks:
                task.cancel()


def upper_pod(name: str, namespace: str, *, secret: str) -> Obj:
    """An upper pod (as the provider gets it) mounting Secret `secret`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": secrets.token_hex(8)},
        "spec": {
            "containers": [{"name": "main", "image": "nginx:1.27"}],
            "volumes": [{"name": "s", "secret": {"secretName": secret}}],
        },
    }


async def copy_of(lower: ApiClient, namespace: str, name: str) -> Obj | None:
    try:
        return await lower.request("GET", SECRETS.path(namespace=namespace, name=name))
    except errors.NotFound:
        return None


async def make_secret(upper: ApiClient, sync: DependencySync, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {"k": base64.b64encode(b"v").decode()},
    }
    await upper.request("POST", SECRETS.path(namespace=namespace), body=body)
    source = sync.mirrors["Secret"].source
    await until(f"Secret {name} cached", lambda: source.store.get(f"{namespace}/{name}"))


async def delete_below(lower: ApiClient, pods: Informer, namespace: str, name: str) -> None:
    """Delete lower pod `name` at once and wait until the cache no longer has it."""
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    await lower.request("DELETE", PODS.path(namespace=namespace, name=name), body=body)
    key = f"{namespace}/{name}"
    await until(f"{name} gone from the lower cache", lambda: pods.store.get(key) is None)


async def test_a_copy_that_a_pod_creation_in_flight_needs_is_not_collected(
    fleet: Fleet, namespace: str
) -> None:
    async with (
        clients(fleet) as (upper, lower),
        running(upper, lower, namespace) as (
            sync,
            lower_pods,
        ),
    ):
        await make_secret(upper, sync, namespace, "s")
        pods = PODS.path(namespace=namespace)
        first = upper_pod("first", namespace, secret="s")
        with sync.creating(first):
            ensured = await sync.ensure(first)
            assert ensured.created == [("Secret", namespace, "s")]
            await lower.request("POST", pods, body=lower_pod(first, policy=T))
        await until("first in the lower cache", lambda: lower_pods.store.get(f"{namespace}/first"))
        # The copy was made before the pod's POST, and seen by the mirror before the pod was
        # seen below: only the creation in flight kept it meanwhile.
        await asyncio.sleep(COLLECT_DELAY)
        assert await copy_of(lower, namespace, "s") is not None, "first's copy was collected"

        second = upper_pod("second", namespace, secret="s")
        with sync.creating(second):
            assert (await sync.ensure(second)).created == [], "the copy was made again"
            # The only lower pod that uses the copy goes while the second pod is on its
            # way below: its deletion schedules a collection of the copy, and nothing
            # below references it now.
            await delete_below(lower, lower_pods, namespace, "first")
            await sync.mirrors["Secret"].collect(f"{namespace}/s")
            await asyncio.sleep(COLLECT_DELAY + 1.0)  # the scheduled collection ran too
            kept = await copy_of(lower, namespace, "s")
            assert kept is not None, "the copy the pod on its way needs was collected"
            await lower.request("POST", pods, body=lower_pod(second, policy=T))
        await until(
            "second in the lower cache", lambda: lower_pods.store.get(f"{namespace}/second")
        )
        await sync.mirrors["Secret"].collect(f"{namespace}/s")
        assert await copy_of(lower, namespace, "s") is not None  # used by second below

        # Once no pod uses it and none is on its way, the copy goes.
        await delete_below(lower, lower_pods, namespace, "second")
        await until("the copy collected", lambda: _absent(lower, namespace, "s"))


async def test_copies_of_a_creation_that_failed_are_collected(fleet: Fleet, namespace: str) -> None:
    async with (
        clients(fleet) as (upper, lower),
        running(upper, lower, namespace) as (
            sync,
            _pods,
        ),
    ):
        await make_secret(upper, sync, namespace, "t")
        aborted = upper_pod("aborted", namespace, secret="t")

        async def create_and_fail() -> None:
            with sync.creating(aborted):
                assert (await sync.ensure(aborted)).created == [("Secret", namespace, "t")]
                copy = await copy_of(lower, namespace, "t")
                assert copy is not None
                assert ownership.is_owned(copy, owner=T.owner)
                raise RuntimeError("the lower apiserver went away before the pod's POST")

        with pytest.raises(RuntimeError):
            await create_and_fail()
        await until("the copy collected", lambda: _absent(lower, namespace, "t"))


async def _absent(lower: ApiClient, namespace: str, name: str) -> bool:
    return await copy_of(lower, namespace, name) is None
