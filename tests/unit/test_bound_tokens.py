"""Upper ServiceAccount tokens for lower pods: the pure decisions (`boundtokens`), the lower
pod's translation with --upper-api-address, and the flags."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import CONFIG_MAPS, PODS, SECRETS
from tensile.serving import flags as serving_flags
from vnode import cli
from vnode.providers.k2k import boundtokens, slim, translate
from vnode.providers.k2k.tokens import RETRY, UpperTokens
from vnode.settings import ServiceAccountSettings
from vnode.testing.fakeapi import FakeApi, unreachable

INJECTED = {
    "name": "kube-api-access-abcde",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                    ]
                }
            },
        ],
    },
}
MOUNT = {
    "name": "kube-api-access-abcde",
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
}


def upper_pod(*volumes: dict[str, Any], account: str | None = "runner") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "x",
                "volumeMounts": [MOUNT],
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}],
            }
        ],
        "volumes": list(volumes),
    }
    if account:
        spec["serviceAccountName"] = account
    return {"metadata": {"name": "web", "namespace": "app", "uid": "u-1"}, "spec": spec}


def vault_volume(**token: Any) -> dict[str, Any]:
    return {
        "name": "kube-api-access-vault",
        "projected": {"sources": [{"serviceAccountToken": {"path": "vault", **token}}]},
    }


@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        ((INJECTED,), [("kube-api-access-abcde.token", "token", "", 3607)]),
        # An audience is asked for as it is; a life under the API's minimum is raised to it.
        (
            (vault_volume(audience="vault", expirationSeconds=60),),
            [("kube-api-access-vault.vault", "vault", "vault", 600)],
        ),
        ((vault_volume(),), [("kube-api-access-vault.vault", "vault", "", 3607)]),
        # Volumes the admission did not inject (a user's own projected token) are not ours.
        (({**vault_volume(), "name": "mine"},), []),
        ((), []),
    ],
)
def test_asks(
    volumes: tuple[dict[str, Any], ...], expected: list[tuple[str, str, str, int]]
) -> None:
    found = boundtokens.asks(upper_pod(*volumes))
    assert [(a.key, a.path, a.audience, a.expiration) for a in found] == expected


def test_the_token_request_is_bound_to_the_upper_pod() -> None:
    ask = boundtokens.asks(upper_pod(vault_volume(audience="vault")))[0]
    body = boundtokens.token_request(ask, pod=upper_pod())
    assert body["spec"] == {
        "expirationSeconds": 3607,
        "audiences": ["vault"],
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"},
    }
    assert boundtokens.service_account(upper_pod(account=None)) == "default"


@pytest.mark.parametrize(
    ("issued", "expires", "fraction", "at"),
    [
        (0.0, 3600.0, 0.8, 2880.0),
        (100.0, 700.0, 0.001, 100.6),
        # A year-long token is renewed after a day at the latest (as the kubelet).
        (0.0, 365 * 86400.0, 0.8, 86400.0),
        (50.0, 40.0, 0.8, 50.0),  # already expired: at once
    ],
)
def test_refresh_at(issued: float, expires: float, fraction: float, at: float) -> None:
    assert boundtokens.refresh_at(
        issued=issued, expires=expires, fraction=fraction
    ) == pytest.approx(at)


@pytest.mark.parametrize(
    ("name", "length"),
    [("web", len("tensile-token-web")), ("p" * 253, 253)],
)
def test_secret_name_is_a_valid_name(name: str, length: int) -> None:
    made = boundtokens.secret_name(name)
    assert len(made) == length
    assert made.startswith(boundtokens.SECRET_PREFIX)
    assert boundtokens.secret_name("p" * 253) != boundtokens.secret_name("p" * 252 + "q")


POLICY = translate.TranslationPolicy(node_name="vn", cluster_id="c", node_labels={})


def test_without_an_upper_address_the_lower_pod_gets_the_lower_token() -> None:
    lower = translate.lower_pod(upper_pod(INJECTED), policy=POLICY)
    assert "volumes" not in lower["spec"]
    assert "volumeMounts" not in lower["spec"]["containers"][0]


def test_with_an_upper_address_the_lower_pod_mounts_the_upper_token_and_reaches_upstairs() -> None:
    policy = translate.TranslationPolicy(
        node_name="vn", cluster_id="c", node_labels={}, upper_api_address="[2001:db8::1]:6443"
    )
    lower = translate.lower_pod(upper_pod(INJECTED), policy=policy)
    (volume,) = lower["spec"]["volumes"]
    secret = boundtokens.secret_name("web")
    assert volume == {
        "name": "kube-api-access-abcde",
        "projected": {
            "defaultMode": 420,
            "sources": [
                {
                    "secret": {
                        "name": secret,
                        "items": [{"key": "kube-api-access-abcde.token", "path": "token"}],
                    }
                },
                {"secret": {"name": secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                INJECTED["projected"]["sources"][2],
            ],
        },
    }
    container = lower["spec"]["containers"][0]
    assert container["volumeMounts"] == [MOUNT]
    assert container["env"] == [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "2001:db8::1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
    ]
    # Without --enable-serviceaccount the address changes nothing.
    off = translate.TranslationPolicy(
        node_name="vn",
        cluster_id="c",
        node_labels={},
        upper_api_address="h:1",
        enable_service_account=False,
    )
    assert "volumes" not in translate.lower_pod(upper_pod(INJECTED), policy=off)["spec"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ServiceAccountSettings()),
        (
            [
                "--upper-api-address=upper.example:6443",
                "--serviceaccount-token-refresh-fraction=0.5",
            ],
            ServiceAccountSettings(
                upper_api_address="upper.example:6443", token_refresh_fraction=0.5
            ),
        ),
    ],
)
def test_flags(flags: list[str], expected: ServiceAccountSettings) -> None:
    settings = cli.parse(["--client-kubeconfig=lower.kubeconfig", *flags], env={})
    assert settings.serviceaccount == expected


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--upper-api-address=:6443", "must be HOST:PORT"),
        ("--upper-api-address=upper", "must be HOST:PORT"),
        ("--upper-api-address=upper:0", "must be HOST:PORT"),
        ("--serviceaccount-token-refresh-fraction=1", "between 0 and 1"),
        ("--serviceaccount-token-refresh-fraction=0", "between 0 and 1"),
    ],
)
def test_bad_flags(flag: str, message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=message):
        cli.parse(["--client-kubeconfig=lower.kubeconfig", flag], env={})


# -- UpperTokens on FakeApi: the requests and Secret writes in isolation (a fake clock);
# the real TokenRequest, TokenReview and garbage collection are in
# tests/e2e/test_upper_serviceaccount_tokens.py


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


TOKEN_PATH = "/api/v1/namespaces/app/serviceaccounts/runner/token"
EXPIRES = "1970-01-12T14:46:40Z"  # 1,000,000 s + 1 h after the epoch: the fake clock's + 3600


def _token_clusters(token: str = "t-1") -> tuple[FakeApi, FakeApi]:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    upper.put(PODS, upper_pod(INJECTED))
    upper.put(CONFIG_MAPS, {"metadata": {"name": "kube-root-ca.crt", "namespace": "app"},
                            "data": {"ca.crt": "UPPER CA"}})  # fmt: skip
    upper.answer("POST", TOKEN_PATH, {"status": {"token": token, "expirationTimestamp": EXPIRES}})
    return upper, lower


LOWER_WEB = {"metadata": {"name": "web", "namespace": "app", "uid": "lower-uid"}}


def _tokens(upper: FakeApi, lower: FakeApi, clock: Clock) -> UpperTokens:
    pods = InformerFactory().informer(lower, PODS, name="lower-pods")
    owner = ownership.NodeIdentity(node_name="vn", cluster_id="c")
    return UpperTokens(
        upper=upper, lower=lower, owner=owner, lower_pods=pods, refresh_fraction=0.5, clock=clock
    )


async def _settle(until: Any) -> None:
    for _ in range(200):
        if until():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached")


async def test_a_created_pod_gets_its_secret_then_a_renewal_then_nothing_once_its_pod_is_gone() -> (
    None
):
    upper, lower = _token_clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    lower_pod = {"metadata": {"name": "web", "namespace": "app", "uid": "lower-uid"}}
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(upper_pod(INJECTED), lower_pod)
        secret_name = boundtokens.secret_name("web")
        await _settle(lambda: lower.get(SECRETS, secret_name, namespace="app"))
        secret = lower.get(SECRETS, secret_name, namespace="app") or {}
        assert secret["stringData"] == {
            "kube-api-access-abcde.token": "t-1", "ca.crt": "UPPER CA", "namespace": "app",
        }  # fmt: skip
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "lower-uid"
        request = upper.requests_of("POST")[0].body
        assert request["spec"]["boundObjectRef"]["uid"] == "u-1"
        # Half of the hour later (fraction 0.5), the token is asked for again and replaced.
        upper.answer(
            "POST", TOKEN_PATH, {"status": {"token": "t-2", "expirationTimestamp": EXPIRES}}
        )
        clock.now += 1800
        tokens.issue(upper_pod(INJECTED), lower_pod)  # wakes the worker
        await _settle(lambda: len(lower.requests_of("PATCH", "secrets")) == 1)
        patched = lower.get(SECRETS, secret_name, namespace="app") or {}
        assert patched["stringData"]["kube-api-access-abcde.token"] == "t-2"
        # The upper pod goes: no more requests for it.
        upper.remove(PODS, "web", namespace="app")
        clock.now += 3600
        tokens.issue(upper_pod(INJECTED), lower_pod)
        await _settle(lambda: not tokens._entries)
        assert len(upper.requests_of("POST")) == 2
    finally:
        await tokens.shut_down()
        await task


async def test_a_failed_request_is_asked_again() -> None:
    upper, lower = _token_clusters()
    upper.fail("GET", "configmaps", error=unreachable(), times=1)
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(
            upper_pod(INJECTED), {"metadata": {"name": "web", "namespace": "app", "uid": "l"}}
        )
        await _settle(lambda: upper.requests_of("GET", "configmaps"))
        assert lower.get(SECRETS, boundtokens.secret_name("web"), namespace="app") is None
        clock.now += RETRY
        tokens._wake.set()
        await _settle(lambda: lower.get(SECRETS, boundtokens.secret_name("web"), namespace="app"))
    finally:
        await tokens.shut_down()
        await task


async def test_a_secret_of_that_name_not_written_for_this_cluster_is_left_as_it_is() -> None:
    # FakeApi: a user's Secret (or another upper cluster's) already holds the name below.
    upper, lower = _token_clusters()
    name = boundtokens.secret_name("web")
    lower.put(SECRETS, {"metadata": {"name": name, "namespace": "app"}, "data": {"k": "dg=="}})
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        await _settle(lambda: lower.requests_of("POST", "secrets"))
        await _settle(lambda: tokens._entries["app/web"].due > clock.now)  # failed, retried
        assert lower.requests_of("PATCH") == []
        assert "stringData" not in (lower.get(SECRETS, name, namespace="app") or {})
    finally:
        await tokens.shut_down()
        await task


async def test_no_token_for_another_upper_pod_of_the_same_name() -> None:
    # FakeApi: the upper pod is replaced (a StatefulSet's next pod) before the renewal.
    upper, lower = _token_clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        await _settle(lambda: lower.get(SECRETS, boundtokens.secret_name("web"), namespace="app"))
        upper.remove(PODS, "web", namespace="app")
        replaced = upper_pod(INJECTED)
        replaced["metadata"]["uid"] = "u-2"
        upper.put(PODS, replaced)
        tokens._entries["app/web"].due = clock.now
        tokens._wake.set()
        await _settle(lambda: not tokens._entries)
        assert len(upper.requests_of("POST")) == 1
    finally:
        await tokens.shut_down()
        await task


def _pod_now(**changes: Any) -> dict[str, Any]:
    pod = upper_pod(INJECTED)
    pod["metadata"].update(changes.pop("metadata", {}))
    pod.update(changes)
    return pod


@pytest.mark.parametrize(
    ("pod", "lower_there", "ends"),
    [
        (_pod_now(status={"phase": "Running"}), True, None),
        (_pod_now(), True, None),
        (_pod_now(metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}), True, "going"),
        (_pod_now(metadata={"uid": "u-2"}), True, "another one"),
        (_pod_now(status={"phase": "Succeeded"}), True, "finished (Succeeded)"),
        (_pod_now(status={"phase": "Failed"}), True, "finished (Failed)"),
        (_pod_now(status={"phase": "Running"}), False, "lower pod is gone"),
    ],
)
def test_renewal_ends(pod: dict[str, Any], lower_there: bool, ends: str | None) -> None:
    found = boundtokens.renewal_ends(pod, upper_uid="u-1", lower_pod_there=lower_there)
    assert found == ends if ends is None else ends in (found or "")


@pytest.mark.parametrize("gone", ["lower pod", "upper pod finished"])
async def test_no_renewal_once_the_pod_is_over(gone: str) -> None:
    # FakeApi: the renewal's request in isolation; the lower pod informer's store is filled
    # by hand (no reflector runs against the fake).
    upper, lower = _token_clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    lower_pod = {"metadata": {"name": "web", "namespace": "app", "uid": "lower-uid"}}
    tokens._pods.store.upsert(lower_pod)
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(upper_pod(INJECTED), lower_pod)
        await _settle(lambda: tokens._entries["app/web"].issued)
        if gone == "lower pod":
            tokens._pods.store.delete("app/web")
        else:
            upper.put(PODS, _pod_now(status={"phase": "Succeeded"}))
        tokens._entries["app/web"].due = clock.now
        tokens._wake.set()
        await _settle(lambda: not tokens._entries)
        assert len(upper.requests_of("POST")) == 1
    finally:
        await tokens.shut_down()
        await task


async def test_a_renewal_while_both_pods_run() -> None:
    # FakeApi, as above: the control case of test_no_renewal_once_the_pod_is_over.
    upper, lower = _token_clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    lower_pod = {"metadata": {"name": "web", "namespace": "app", "uid": "lower-uid"}}
    tokens._pods.store.upsert(lower_pod)
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(upper_pod(INJECTED), lower_pod)
        await _settle(lambda: tokens._entries["app/web"].issued)
        tokens._entries["app/web"].due = clock.now
        tokens._wake.set()
        await _settle(lambda: len(upper.requests_of("POST")) == 2)
        assert "app/web" in tokens._entries
    finally:
        await tokens.shut_down()
        await task


def test_a_legacy_token_secret_volume_is_dropped_with_an_upper_address_too() -> None:
    # A pre-1.21 upper cluster's injected token: a Secret volume, for which no upper token
    # is asked (`boundtokens.asks`); mounting it below would mount an empty volume.
    legacy = {"name": "default-token-x1y2z", "secret": {"secretName": "default-token-x1y2z"}}
    pod = upper_pod(legacy)
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "default-token-x1y2z", "mountPath": MOUNT["mountPath"]}
    ]
    policy = translate.TranslationPolicy(
        node_name="vn", cluster_id="c", node_labels={}, upper_api_address="h:1"
    )
    assert boundtokens.asks(pod) == []
    lower = translate.lower_pod(pod, policy=policy)
    assert "volumes" not in lower["spec"]
    assert "volumeMounts" not in lower["spec"]["containers"][0]


@pytest.mark.parametrize("whose", ["this pod's", "another's"])
async def test_a_lower_pod_issued_without_its_uid_is_read(whose: str) -> None:
    # FakeApi: the provider's create found the lower pod made already (AlreadyExists) and
    # issues with the body it sent, which has no UID; the Secret's owner is read below.
    upper, lower = _token_clusters()
    labels, annotations = ownership.owner_marks(
        ownership.NodeIdentity(node_name="vn", cluster_id="c")
    )
    upper_uid = "u-1" if whose == "this pod's" else "u-0"
    annotations = {**annotations, ownership.UPPER_UID_ANNOTATION: upper_uid}
    existing = lower.put(
        PODS,
        {"metadata": {"name": "web", "namespace": "app", "labels": labels,
                      "annotations": annotations}},
    )  # fmt: skip
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    task = asyncio.create_task(tokens.run())
    try:
        tokens.issue(upper_pod(INJECTED), {"metadata": {"name": "web", "namespace": "app"}})
        secret_name = boundtokens.secret_name("web")
        if whose == "this pod's":
            await _settle(lambda: lower.get(SECRETS, secret_name, namespace="app"))
            secret = lower.get(SECRETS, secret_name, namespace="app") or {}
            owner = secret["metadata"]["ownerReferences"][0]
            assert owner["uid"] == existing["metadata"]["uid"]
        else:
            await _settle(lambda: not tokens._entries)
            assert lower.get(SECRETS, secret_name, namespace="app") is None
            assert upper.requests_of("POST") == []
    finally:
        await tokens.shut_down()
        await task


async def test_at_start_the_cached_lower_pods_mounting_a_token_are_taken_over() -> None:
    # FakeApi; the store is filled by hand as the provider's informer fills it: slim lower
    # pods (`slim.SlimLowerPods`, no volumes kept), after a restart of the node.
    upper, lower = _token_clusters()
    owner = ownership.NodeIdentity(node_name="vn", cluster_id="c")
    policy = translate.TranslationPolicy(
        node_name="vn", cluster_id="c", node_labels={}, upper_api_address="h:6443"
    )
    below = translate.lower_pod(upper_pod(INJECTED), policy=policy)
    below["metadata"]["uid"] = "lower-uid"
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    tokens._pods.store.upsert(slim.SlimLowerPods(owner)(below))
    task = asyncio.create_task(tokens.run())
    try:
        await _settle(lambda: lower.get(SECRETS, boundtokens.secret_name("web"), namespace="app"))
    finally:
        await tokens.shut_down()
        await task


async def test_a_pod_issued_while_the_last_one_of_its_name_ends_keeps_its_entry() -> None:
    # FakeApi: the upper GET of the old pod is held while the new pod of that name (a
    # StatefulSet's next one) is issued; the old entry's end must not drop the new one.
    upper, lower = _token_clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    gate = asyncio.Event()
    task = asyncio.create_task(tokens.run())
    try:
        old = upper_pod(INJECTED)
        old["metadata"]["uid"] = "u-0"  # the upper pod of that name now is u-1
        upper.delay("GET", "pods", until=gate, times=1)
        tokens.issue(old, LOWER_WEB)
        await _settle(lambda: upper.requests_of("GET", "pods"))
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        new_entry = tokens._entries["app/web"]
        gate.set()
        await _settle(lambda: lower.get(SECRETS, boundtokens.secret_name("web"), namespace="app"))
        assert tokens._entries.get("app/web") is new_entry
    finally:
        await tokens.shut_down()
        await task
