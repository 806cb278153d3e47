"""The k2k provider's pod paths (create, delete, the dependencies and claims a pod needs)
against a fake lower and upper API (`vnode.testing.fakeapi.FakeApi`): what is written
below, in which order, and what a failing lower cluster makes of it. The informers do not
run: their stores are filled here as the informers would fill them."""

from __future__ import annotations

from typing import Any

import pytest

from tensile.contracts.objects import Obj
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import (
    CONFIG_MAPS,
    NAMESPACES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    SECRETS,
)
from vnode import provider_errors
from vnode.providers.k2k import assembly, boundtokens, naming, slim, translate
from vnode.providers.k2k.provider import K2KProvider
from vnode.settings import SERVICE_CONTROLLERS, ControllerSettings
from vnode.testing.fakeapi import FakeApi, server_error, status_error, unreachable

POLICY = translate.TranslationPolicy(node_name="vn-1", cluster_id="c-1", node_labels={})


class Setup:
    """A provider built as the node builds it, on fake upper and lower clusters."""

    def __init__(self, *, controllers: ControllerSettings | None = None) -> None:
        self.upper = FakeApi(name="upper")
        self.lower = FakeApi(name="lower")
        self.upper.put(NAMESPACES, {"metadata": {"name": "team"}, "status": {"phase": "Active"}})
        self.provider: K2KProvider = assembly.build(
            upper=self.upper,
            lower=self.lower,
            informers=InformerFactory(),
            policy=POLICY,
            node_ip="10.0.0.9",
            controllers=controllers,
        )

    def upper_object(self, store_of: Any, obj: Obj) -> None:
        """Put an upper object where the informer `store_of` would have it."""
        store_of.store.update(obj)

    def lower_pod_seen(self, lower: Obj) -> None:
        """What the lower pods informer does with a lower pod it sees."""
        stored = self.lower.put(PODS, lower)
        self.provider.pods.store.update(slim.SlimLowerPods(POLICY.owner)(stored))
        self.provider.lower_pod_changed(stored)


def upper_pod(name: str = "web", *, uid: str = "uid-web", **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "team", "name": name, "uid": uid},
        "spec": {"nodeName": "vn-1", "containers": [{"name": "c", "image": "nginx"}], **spec},
        "status": {},
    }


async def test_a_create_posts_the_translated_pod() -> None:
    setup = Setup()
    pod = upper_pod()
    assert await setup.provider.create_pod(pod) == []
    posts = setup.lower.requests_of("POST", "pods")
    assert [p.path for p in posts] == ["/api/v1/namespaces/team/pods"]
    assert posts[0].body == translate.lower_pod(pod, policy=POLICY)
    assert setup.lower.get(PODS, "web", namespace="team") is not None
    namespace = setup.lower.get(NAMESPACES, "team")
    assert namespace is not None
    conflict = naming.namespace_conflict(
        namespace, owner=POLICY.owner, upper_namespace="team", prefix=""
    )
    assert conflict is None, "made for this cluster's namespace team"
    write = setup.provider.book.in_flight(upper_uid="uid-web")
    assert write is not None
    assert (write.verb, write.lower_key) == ("create", "team/web")


async def _created_and_seen(setup: Setup) -> Obj:
    """Create the lower pod of `upper_pod()` and have the informer show it; return it."""
    await setup.provider.create_pod(upper_pod())
    created = setup.lower.get(PODS, "web", namespace="team")
    assert created is not None
    setup.lower_pod_seen(created)
    return created


async def test_a_create_is_in_flight_until_the_informer_shows_the_pod() -> None:
    setup = Setup()
    await _created_and_seen(setup)
    assert not setup.provider.book.writing(upper_uid="uid-web")
    assert setup.provider.backend_pod(upper_pod()) is not None


@pytest.mark.parametrize("fault", [server_error(503), unreachable()])
async def test_a_create_whose_post_fails_transiently_waits(fault: Exception) -> None:
    setup = Setup()
    setup.lower.fail("POST", "pods", error=fault)
    with pytest.raises(provider_errors.BackendUnavailable, match="lower cluster"):
        await setup.provider.create_pod(upper_pod())
    assert setup.lower.get(PODS, "web", namespace="team") is None
    assert setup.provider.book.writing(upper_uid="uid-web"), "it may have got through"


async def test_a_create_in_doubt_is_forgotten_once_its_upper_pod_is_deleted() -> None:
    setup = Setup()
    setup.lower.fail("POST", "pods", error=server_error(503))
    with pytest.raises(provider_errors.BackendUnavailable):
        await setup.provider.create_pod(upper_pod())
    assert await setup.provider.delete_pod(upper_pod(), grace_period=None) is True
    assert setup.provider.book.writes() == []


async def test_a_create_the_lower_cluster_refuses_is_refused_and_not_in_flight() -> None:
    setup = Setup()
    setup.lower.fail("POST", "pods", error=status_error(422, reason="Invalid", message="spec: bad"))
    with pytest.raises(provider_errors.InvalidPod, match="refused the pod: spec: bad"):
        await setup.provider.create_pod(upper_pod())
    assert not setup.provider.book.writing(upper_uid="uid-web")


async def test_a_create_of_a_pod_already_made_is_fine() -> None:
    setup = Setup()
    await setup.provider.create_pod(upper_pod())
    assert await setup.provider.create_pod(upper_pod()) == []  # 409 AlreadyExists
    assert len(setup.lower.requests_of("POST", "pods")) == 2


async def test_a_delete_deletes_the_lower_pod_of_that_uid() -> None:
    setup = Setup()
    await setup.provider.create_pod(upper_pod())
    created = setup.lower.get(PODS, "web", namespace="team")
    assert created is not None
    setup.lower_pod_seen(created)
    assert await setup.provider.delete_pod(upper_pod(), grace_period=30) is False
    [delete] = setup.lower.requests_of("DELETE", "pods")
    assert delete.path == "/api/v1/namespaces/team/pods/web"
    assert delete.body["preconditions"] == {"uid": created["metadata"]["uid"]}
    assert delete.body["gracePeriodSeconds"] == 30
    assert setup.lower.get(PODS, "web", namespace="team") is None
    write = setup.provider.book.in_flight(lower_key="team/web")
    assert write is not None
    assert write.verb == "delete"
    setup.provider.lower_pod_deleted(created)
    assert not setup.provider.vanished(upper_pod()), "deleted by us"
    assert setup.provider.book.writes() == []


async def test_a_lower_pod_deleted_by_someone_else_vanished() -> None:
    setup = Setup()
    await setup.provider.create_pod(upper_pod())
    created = setup.lower.get(PODS, "web", namespace="team")
    assert created is not None
    setup.lower_pod_seen(created)
    setup.provider.lower_pod_deleted(created)
    assert setup.provider.vanished(upper_pod())


async def test_a_delete_of_a_pod_never_created_is_fine() -> None:
    setup = Setup()
    assert await setup.provider.delete_pod(upper_pod(), grace_period=None) is True
    assert setup.lower.requests == []


async def test_a_delete_that_finds_the_pod_gone_already_is_done() -> None:
    setup = Setup()
    await setup.provider.create_pod(upper_pod())
    created = setup.lower.get(PODS, "web", namespace="team")
    assert created is not None
    setup.lower_pod_seen(created)
    await setup.lower.request("DELETE", "/api/v1/namespaces/team/pods/web")  # by someone
    assert await setup.provider.delete_pod(upper_pod(), grace_period=None) is True
    assert setup.provider.book.writes() == [], "a DELETE answered 404 is not in flight"


async def test_a_delete_against_an_unreachable_lower_cluster_raises_backend_unavailable() -> None:
    setup = Setup()
    await setup.provider.create_pod(upper_pod())
    created = setup.lower.get(PODS, "web", namespace="team")
    assert created is not None
    setup.lower_pod_seen(created)
    setup.lower.fail("DELETE", "pods", error=unreachable())
    with pytest.raises(provider_errors.BackendUnavailable):
        await setup.provider.delete_pod(upper_pod(), grace_period=None)


async def test_dependencies_are_copied_before_the_pod() -> None:
    setup = Setup()
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": "team", "name": "settings", "uid": "uid-cm"},
        "data": {"a": "1"},
    }
    setup.upper_object(setup.provider.dependencies.mirrors["ConfigMap"].source, config)
    pod = upper_pod(volumes=[{"name": "v", "configMap": {"name": "settings"}}])
    await setup.provider.create_pod(pod)
    writes = [(r.method, r.target.plural) for r in setup.lower.requests if r.method == "POST"]
    assert writes == [("POST", "namespaces"), ("POST", "configmaps"), ("POST", "pods")]
    copy = setup.lower.get(CONFIG_MAPS, "settings", namespace="team")
    assert copy is not None
    assert copy["data"] == {"a": "1"}


async def test_a_missing_mandatory_dependency_waits_and_nothing_is_posted() -> None:
    setup = Setup()
    pod = upper_pod(volumes=[{"name": "v", "configMap": {"name": "settings"}}])
    with pytest.raises(provider_errors.MissingDependency, match="settings"):
        await setup.provider.create_pod(pod)
    assert setup.lower.requests_of("POST", "pods") == []
    assert not setup.provider.book.writing(upper_uid="uid-web")


def claim(name: str = "data", **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            **spec,
        },
    }


async def test_a_claim_is_made_below_before_the_pod() -> None:
    setup = Setup()
    volumes = setup.provider.volumes
    assert volumes is not None
    setup.upper_object(volumes.claims, claim(storageClassName="standard"))
    pod = upper_pod(volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}])
    await setup.provider.create_pod(pod)
    writes = [r.target.plural for r in setup.lower.requests if r.method == "POST"]
    assert writes == ["namespaces", "persistentvolumeclaims", "pods"]
    assert setup.lower.get(PERSISTENT_VOLUME_CLAIMS, "data", namespace="team") is not None


async def test_a_missing_claim_waits() -> None:
    setup = Setup()
    pod = upper_pod(volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}])
    with pytest.raises(provider_errors.MissingDependency, match='"data" not found'):
        await setup.provider.create_pod(pod)
    assert setup.lower.requests_of("POST", "pods") == []


async def test_a_claim_without_pv_controllers_is_refused() -> None:
    setup = Setup(controllers=ControllerSettings(enabled=(SERVICE_CONTROLLERS,)))
    assert setup.provider.volumes is None
    pod = upper_pod(volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}])
    with pytest.raises(
        provider_errors.InvalidPod, match=r"PersistentVolumeClaim data, .* without PVControllers"
    ):
        await setup.provider.create_pod(pod)
    assert setup.lower.requests == []


async def test_a_delete_answered_503_raises_backend_unavailable_and_is_sent_again() -> None:
    setup = Setup()
    await setup.provider.create_pod(upper_pod())
    created = setup.lower.get(PODS, "web", namespace="team")
    assert created is not None
    setup.lower_pod_seen(created)
    setup.lower.fail("DELETE", "pods", error=server_error(503), times=1)
    with pytest.raises(provider_errors.BackendUnavailable, match="lower cluster"):
        await setup.provider.delete_pod(upper_pod(), grace_period=None)
    assert setup.lower.get(PODS, "web", namespace="team") is not None
    assert await setup.provider.delete_pod(upper_pod(), grace_period=None) is False
    assert setup.lower.get(PODS, "web", namespace="team") is None
    assert len(setup.lower.requests_of("DELETE", "pods")) == 2


def _post_in_doubt_that_landed(setup: Setup) -> Obj:
    """A lower pod as the POST answered 503 made it: stored below, not in the cache."""
    return setup.lower.put(PODS, translate.lower_pod(upper_pod(), policy=POLICY))


async def test_a_delete_while_a_create_that_landed_is_in_doubt_deletes_the_lower_pod() -> None:
    setup = Setup()
    setup.lower.fail("POST", "pods", error=server_error(503), times=1)
    with pytest.raises(provider_errors.BackendUnavailable):
        await setup.provider.create_pod(upper_pod())
    _post_in_doubt_that_landed(setup)
    assert setup.provider.backend_pod(upper_pod()) is None, "the informer has not shown it"
    assert await setup.provider.delete_pod(upper_pod(), grace_period=0) is False
    assert setup.lower.get(PODS, "web", namespace="team") is None
    [get] = setup.lower.requests_of("GET", "pods")
    assert get.path == "/api/v1/namespaces/team/pods/web"
    assert len(setup.lower.requests_of("DELETE", "pods")) == 1


async def test_a_delete_while_a_create_is_in_doubt_waits_for_a_lower_cluster_that_cannot_tell() -> (
    None
):
    setup = Setup()
    setup.lower.fail("POST", "pods", error=unreachable(), times=1)
    with pytest.raises(provider_errors.BackendUnavailable):
        await setup.provider.create_pod(upper_pod())
    setup.lower.fail("GET", "pods", error=unreachable())
    with pytest.raises(provider_errors.BackendUnavailable):
        await setup.provider.delete_pod(upper_pod(), grace_period=None)
    assert setup.provider.book.creating("uid-web") is not None, "still in doubt"


async def test_a_create_in_doubt_for_a_pod_of_another_uid_is_not_deleted() -> None:
    setup = Setup()
    setup.lower.fail("POST", "pods", error=server_error(503), times=1)
    with pytest.raises(provider_errors.BackendUnavailable):
        await setup.provider.create_pod(upper_pod())
    setup.lower.put(PODS, translate.lower_pod(upper_pod(uid="uid-new"), policy=POLICY))
    assert await setup.provider.delete_pod(upper_pod(), grace_period=None) is True
    assert setup.lower.get(PODS, "web", namespace="team") is not None
    assert setup.lower.requests_of("DELETE", "pods") == []


async def test_the_backend_stamp_moves_with_whatever_the_pods_status_is_read_from() -> None:
    setup = Setup()
    created = await _created_and_seen(setup)
    stamp = setup.provider.backend_stamp("team/web", upper_uid="uid-web")
    assert setup.provider.backend_stamp("team/web", upper_uid="uid-web") == stamp

    # The lower pod changes (a new resourceVersion): so may the status told upstairs.
    setup.lower_pod_seen({**created, "status": {"phase": "Running"}})
    moved = setup.provider.backend_stamp("team/web", upper_uid="uid-web")
    assert moved != stamp

    # Gone, then made again by someone else with our marks (another lower UID): a stamp
    # of neither earlier state, and not the node's pod.
    setup.provider.pods.store.delete("team/web")
    setup.provider.lower_pod_deleted(created)
    gone = setup.provider.backend_stamp("team/web", upper_uid="uid-web")
    assert gone not in (stamp, moved)
    copied = {**created, "metadata": {**created["metadata"], "uid": "someone-elses"}}
    setup.lower_pod_seen(copied)
    assert setup.provider.backend_stamp("team/web", upper_uid="uid-web") not in (stamp, moved, gone)
    assert setup.provider.backend_pod(upper_pod()) is None


async def test_a_dangling_lower_pod_of_ours_is_deleted_and_no_other() -> None:
    setup = Setup()
    setup.lower_pod_seen(translate.lower_pod(upper_pod(), policy=POLICY))
    setup.lower_pod_seen(
        {"metadata": {"namespace": "team", "name": "theirs"}, "spec": {"containers": []}}
    )
    await setup.provider.delete_dangling("team/theirs")
    await setup.provider.delete_dangling("other/web")
    assert setup.lower.requests_of("DELETE", "pods") == []
    await setup.provider.delete_dangling("team/web")
    assert setup.lower.get(PODS, "web", namespace="team") is None
    assert setup.lower.get(PODS, "theirs", namespace="team") is not None


async def test_the_start_up_clean_up_deletes_our_lower_pods_of_upper_pods_gone() -> None:
    setup = Setup()
    setup.lower_pod_seen(translate.lower_pod(upper_pod(), policy=POLICY))
    setup.lower_pod_seen(translate.lower_pod(upper_pod("db", uid="uid-db"), policy=POLICY))
    setup.lower_pod_seen(
        {"metadata": {"namespace": "team", "name": "theirs"}, "spec": {"containers": []}}
    )
    await setup.provider.cleanup_dangling([upper_pod("db", uid="uid-db")])
    names = [o["metadata"]["name"] for o in setup.lower.objects(PODS, namespace="team")]
    assert sorted(names) == ["db", "theirs"]


async def test_a_long_run_of_pods_leaves_nothing_in_the_book() -> None:
    """Issue 21 (memory that only grows): pods created, deleted by us, vanished below and
    then deleted upstairs, or deleted below just as we delete them, in the orders the
    informers and the pod controller call the provider in; afterwards the book remembers
    nothing of any of them."""
    setup = Setup()
    provider, lower_api = setup.provider, setup.lower

    def informer_deletes(lower: Obj) -> None:
        provider.pods.store.delete(f"{lower['metadata']['namespace']}/{lower['metadata']['name']}")
        provider.lower_pod_deleted(lower)

    uids: list[str] = []
    for i in range(200):
        pod = upper_pod(f"p{i}", uid=f"uid-{i}")
        uids.append(f"uid-{i}")
        await provider.create_pod(pod)
        made = lower_api.get(PODS, f"p{i}", namespace="team")
        assert made is not None
        setup.lower_pod_seen(made)
        match i % 4:
            case 0:  # deleted upstairs: we delete below, the informer shows it, done
                assert await provider.delete_pod(pod, grace_period=None) is False
                informer_deletes(made)
                assert await provider.delete_pod(pod, grace_period=None) is True
            case 1:  # deleted below by someone: vanished, then the upper pod is deleted
                await lower_api.request("DELETE", f"/api/v1/namespaces/team/pods/p{i}")
                informer_deletes(made)
                assert provider.vanished(pod)
                assert await provider.delete_pod(pod, grace_period=None) is True
            case 2:  # deleted below just before our DELETE (404), the informer shows it
                # before the upper pod's final deletion comes back (`_gone`)
                await lower_api.request("DELETE", f"/api/v1/namespaces/team/pods/p{i}")
                assert await provider.delete_pod(pod, grace_period=None) is True
                informer_deletes(made)
                assert await provider.delete_pod(pod, grace_period=None) is True
            case _:  # the same, the lower informer showing it only after all that
                await lower_api.request("DELETE", f"/api/v1/namespaces/team/pods/p{i}")
                assert await provider.delete_pod(pod, grace_period=None) is True
                assert await provider.delete_pod(pod, grace_period=None) is True
                informer_deletes(made)
    assert provider.book.writes() == []
    assert [u for u in uids if provider.book.vanished(u)] == []
    assert provider.book.remembered() == 0


async def test_a_create_that_finds_its_pod_made_has_its_upper_tokens_asked_for() -> None:
    # An earlier create got through but raised (a dropped connection) before the tokens
    # were asked for: the next one's AlreadyExists asks for them (FakeApi, no worker runs).
    policy = translate.TranslationPolicy(
        node_name="vn-1", cluster_id="c-1", node_labels={}, upper_api_address="h:6443"
    )
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    upper.put(NAMESPACES, {"metadata": {"name": "team"}, "status": {"phase": "Active"}})
    provider = assembly.build(
        upper=upper, lower=lower, informers=InformerFactory(), policy=policy, node_ip="10.0.0.9"
    )
    token_volume = {
        "name": "kube-api-access-x",
        "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
    }
    pod = upper_pod(volumes=[token_volume])
    lower.put(PODS, translate.lower_pod(pod, policy=policy))
    assert await provider.create_pod(pod) == []  # 409 AlreadyExists
    assert provider.tokens is not None
    assert list(provider.tokens._entries) == ["team/web"]


TOKEN_VOLUME = {
    "name": "kube-api-access-x",
    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
}


def _token_setup() -> tuple[K2KProvider, FakeApi]:
    policy = translate.TranslationPolicy(
        node_name="vn-1", cluster_id="c-1", node_labels={}, upper_api_address="h:6443"
    )
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    upper.put(NAMESPACES, {"metadata": {"name": "team"}, "status": {"phase": "Active"}})
    provider = assembly.build(
        upper=upper, lower=lower, informers=InformerFactory(), policy=policy, node_ip="10.0.0.9"
    )
    return provider, lower


async def test_the_token_secret_is_the_node_s_before_the_lower_pod_exists() -> None:
    provider, lower = _token_setup()
    pod = upper_pod(volumes=[TOKEN_VOLUME])
    await provider.create_pod(pod)
    posts = [r.target.plural for r in lower.requests if r.method == "POST"]
    assert posts.index("secrets") < posts.index("pods")
    assert lower.get(SECRETS, boundtokens.secret_name("web", "uid-web"), namespace="team")


async def test_a_pod_refused_below_leaves_no_token_secret() -> None:
    provider, lower = _token_setup()
    lower.fail("POST", "pods", error=status_error(422, reason="Invalid", message="spec: bad"))
    with pytest.raises(provider_errors.InvalidPod, match="refused the pod"):
        await provider.create_pod(upper_pod(volumes=[TOKEN_VOLUME]))
    assert lower.objects(SECRETS) == []


async def test_a_pod_deleted_before_it_got_below_leaves_no_token_secret() -> None:
    provider, lower = _token_setup()
    lower.fail("POST", "pods", error=server_error(503))
    pod = upper_pod(volumes=[TOKEN_VOLUME])
    with pytest.raises(provider_errors.BackendUnavailable):
        await provider.create_pod(pod)
    assert lower.objects(SECRETS) != []
    lower.heal()
    assert await provider.delete_pod(pod, grace_period=None) is True
    assert lower.objects(SECRETS) == []


async def test_a_pod_naming_a_token_secret_of_the_node_is_refused() -> None:
    provider, lower = _token_setup()
    stolen = boundtokens.secret_name("other", "uid-other")
    pod = upper_pod(volumes=[{"name": "s", "secret": {"secretName": stolen}}])
    with pytest.raises(provider_errors.InvalidPod, match=f"references Secret {stolen}"):
        await provider.create_pod(pod)
    assert lower.requests_of("POST") == []
