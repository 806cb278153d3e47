"""Upper ServiceAccount tokens for lower pods: the pure decisions (`boundtokens`), the lower
pod's translation with --upper-api-address, and the flags; then the worker (`tokens`) on
FakeApi."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import CONFIG_MAPS, PODS, SECRETS
from tensile.serving import flags as serving_flags
from tensile.serving.lifecycle import StartupError
from vnode import cli, provider_errors
from vnode.providers.k2k import boundtokens, dependencies, slim, translate
from vnode.providers.k2k.tokens import CONCURRENCY, RETRY, UpperTokens, check_identity
from vnode.settings import ServiceAccountSettings
from vnode.testing.fakeapi import FakeApi, status_error, unreachable

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
OWNER = ownership.NodeIdentity(node_name="vn", cluster_id="c")
UPPER_POLICY = translate.TranslationPolicy(
    node_name="vn", cluster_id="c", node_labels={}, upper_api_address="h:6443"
)


def upper_pod(
    *volumes: dict[str, Any], account: str | None = "runner", name: str = "web", uid: str = "u-1"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "vn",
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
    return {"metadata": {"name": name, "namespace": "app", "uid": uid}, "spec": spec}


def vault_volume(**token: Any) -> dict[str, Any]:
    return {
        "name": "kube-api-access-vault",
        "projected": {"sources": [{"serviceAccountToken": {"path": "vault", **token}}]},
    }


def with_extra(*extra: dict[str, Any]) -> dict[str, Any]:
    """The injected volume with sources a tenant added."""
    sources = [*INJECTED["projected"]["sources"], *extra]  # type: ignore[index]
    return {**INJECTED, "projected": {**INJECTED["projected"], "sources": sources}}


@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        # 3607 s, the admission's, would be a year: an hour is asked for.
        ((INJECTED,), [("kube-api-access-abcde.token", "token", "", 3600)]),
        # An audience is asked for as it is; a life under the API's minimum is raised to it.
        (
            (vault_volume(audience="vault", expirationSeconds=60),),
            [("kube-api-access-vault.vault", "vault", "vault", 600)],
        ),
        ((vault_volume(),), [("kube-api-access-vault.vault", "vault", "", 3600)]),
        (
            (vault_volume(expirationSeconds=7200),),
            [("kube-api-access-vault.vault", "vault", "", 7200)],
        ),
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
        "expirationSeconds": 3600,
        "audiences": ["vault"],
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"},
    }
    assert boundtokens.service_account(upper_pod(account=None)) == "default"


@pytest.mark.parametrize(
    ("life", "fraction", "after"),
    [
        (3600.0, 0.8, 2880.0),
        # Never sooner than the floor, whatever the fraction or the life.
        (3600.0, 0.001, boundtokens.RENEWAL_FLOOR),
        (0.0, 0.8, boundtokens.RENEWAL_FLOOR),
        (-50.0, 0.8, boundtokens.RENEWAL_FLOOR),
        # A year-long token is renewed after a day at the latest (as the kubelet).
        (365 * 86400.0, 0.8, 86400.0),
    ],
)
def test_refresh_after(life: float, fraction: float, after: float) -> None:
    assert boundtokens.refresh_after(life=life, fraction=fraction) == pytest.approx(after)


def jwt(claims: Any) -> str:
    def part(value: Any) -> str:
        raw = json.dumps(value).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


@pytest.mark.parametrize(
    ("token", "times"),
    [
        (jwt({"iat": 1000, "exp": 4600}), (1000.0, 4600.0)),
        (jwt({"iat": 1000.5, "exp": 4600}), (1000.5, 4600.0)),
        (jwt({"iat": 1000}), None),
        (jwt({"iat": True, "exp": 4600}), None),
        (jwt({"iat": "1000", "exp": 4600}), None),
        (jwt([1, 2]), None),
        ("not-a-jwt", None),
        ("a.!!!.c", None),
        ("a.bm90IGpzb24.c", None),  # "not json"
    ],
)
def test_token_times(token: str, times: tuple[float, float] | None) -> None:
    assert boundtokens.token_times(token) == times


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize("name", ["web", "p" * 253, "a" * 221 + ".b" * 16, "x-" * 120 + "y"])
def test_secret_name_is_a_valid_name_of_the_pod_and_its_upper_uid(name: str) -> None:
    made = boundtokens.secret_name(name, "u-1")
    assert len(made) <= 253
    assert _SUBDOMAIN.fullmatch(made), made
    assert made.startswith(boundtokens.SECRET_PREFIX)
    assert made != boundtokens.secret_name(name, "u-2")  # a later pod of that name
    assert made == boundtokens.secret_name(name, "u-1")
    assert boundtokens.secret_name("p" * 253, "u") != boundtokens.secret_name("p" * 252 + "q", "u")


def test_secret_names_of_the_node_are_reserved() -> None:
    assert boundtokens.reserved_secret(["app-config", "tls"]) is None
    refusal = boundtokens.reserved_secret(["tls", "tensile-token-web-0123456789abcdef"])
    assert refusal is not None
    assert "tensile-token-web-0123456789abcdef" in refusal
    # ... and never copied from upstairs, should a lower pod "use" one.
    named = {"metadata": {"name": "tensile-token-web-0123456789abcdef"}, "type": "Opaque"}
    assert not dependencies.copyable(named, kind="Secret")
    assert dependencies.copyable({"metadata": {"name": "tls"}}, kind="Secret")


@pytest.mark.parametrize(
    ("source", "injected"),
    [
        (INJECTED["projected"]["sources"][0], True),  # type: ignore[index]
        (INJECTED["projected"]["sources"][1], True),  # type: ignore[index]
        (INJECTED["projected"]["sources"][2], True),  # type: ignore[index]
        ({"secret": {"name": "other"}}, False),
        ({"configMap": {"name": "app"}}, False),
        ({"configMap": {"name": "kube-root-ca.crt"}}, False),  # not the admission's items
        ({"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "x", "path": "x"}]}}, False),
        (
            {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
            False,
        ),
        ({"clusterTrustBundle": {"name": "b", "path": "b"}}, False),
    ],
)
def test_only_the_sources_the_admission_injects_are_rewritten(
    source: dict[str, Any], injected: bool
) -> None:
    assert boundtokens.injected_source(source) is injected


def test_without_an_upper_address_the_lower_pod_gets_the_lower_token() -> None:
    policy = translate.TranslationPolicy(node_name="vn", cluster_id="c", node_labels={})
    lower = translate.lower_pod(upper_pod(INJECTED), policy=policy)
    assert "volumes" not in lower["spec"]
    assert "volumeMounts" not in lower["spec"]["containers"][0]


def test_with_an_upper_address_the_lower_pod_mounts_the_upper_token_and_reaches_upstairs() -> None:
    policy = translate.TranslationPolicy(
        node_name="vn", cluster_id="c", node_labels={}, upper_api_address="[2001:db8::1]:6443"
    )
    lower = translate.lower_pod(upper_pod(INJECTED), policy=policy)
    (volume,) = lower["spec"]["volumes"]
    secret = boundtokens.secret_name("web", "u-1")
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
                # The upper namespace (the downward API would say the lower one).
                {"secret": {"name": secret, "items": [{"key": "namespace", "path": "namespace"}]}},
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


def test_a_source_a_tenant_adds_to_the_token_volume_is_a_reference_like_any_other() -> None:
    extra = [
        {"secret": {"name": "app-secret", "optional": True}},
        {"configMap": {"name": "app-config"}},
        {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
    ]
    pod = upper_pod(with_extra(*extra))
    refs = {(r.kind, r.name, r.optional) for r in translate.references(pod)}
    assert refs == {("Secret", "app-secret", True), ("ConfigMap", "app-config", False)}
    assert translate.optional_references(pod) == frozenset({("Secret", "app-secret")})
    # Absent upstairs (optional): left out below, never resolved to a lower Secret of the name.
    absent = frozenset({("Secret", "app-secret")})
    lower = translate.lower_pod(pod, policy=UPPER_POLICY, absent=absent)
    (volume,) = lower["spec"]["volumes"]
    assert volume["projected"]["sources"][3:] == extra[1:]
    # Copied: kept as the pod wrote it, the copy below resolving it.
    lower = translate.lower_pod(pod, policy=UPPER_POLICY)
    assert lower["spec"]["volumes"][0]["projected"]["sources"][3:] == extra


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ServiceAccountSettings()),
        (
            [
                "--upper-api-address=upper.example:6443",
                "--serviceaccount-token-refresh-fraction=0.5",
                "--upper-token-kubeconfig=node.kubeconfig",
            ],
            ServiceAccountSettings(
                upper_api_address="upper.example:6443",
                token_refresh_fraction=0.5,
                token_kubeconfig="node.kubeconfig",
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
        ("--upper-token-kubeconfig=node.kubeconfig", "needs --upper-api-address"),
    ],
)
def test_bad_flags(flag: str, message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=message):
        cli.parse(["--client-kubeconfig=lower.kubeconfig", flag], env={})


def test_the_upper_token_kubeconfig_without_service_accounts_is_refused() -> None:
    with pytest.raises(serving_flags.UsageError, match="enable-serviceaccount"):
        cli.parse(
            [
                "--client-kubeconfig=lower.kubeconfig",
                "--upper-api-address=u:6443",
                "--enable-serviceaccount=false",
                "--upper-token-kubeconfig=node.kubeconfig",
            ],
            env={},
        )


def _marked(**changes: Any) -> dict[str, Any]:
    _, marks = ownership.owner_marks(OWNER)
    secret: dict[str, Any] = {
        "type": boundtokens.SECRET_TYPE,
        "metadata": {
            "name": "s",
            "annotations": {**marks, ownership.UPPER_UID_ANNOTATION: "u-1"},
        },
    }
    meta = changes.pop("metadata", {})
    secret["metadata"].update(meta)
    secret.update(changes)
    return secret


POD_OWNER = {"kind": "Pod", "name": "web", "uid": "l-1"}


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        (_marked(), None),  # the placeholder
        (_marked(metadata={"ownerReferences": [POD_OWNER]}), None),
        # An earlier lower pod of the node's for the same upper pod.
        (_marked(metadata={"ownerReferences": [{**POD_OWNER, "uid": "l-0"}]}), None),
        (_marked(type="Opaque"), "of type Opaque"),
        ({**_marked(), "type": None}, "of type Opaque"),
        (
            _marked(metadata={"annotations": {ownership.CLUSTER_ANNOTATION: "other"}}),
            "not managed by tensile",
        ),
        (
            _marked(
                metadata={
                    "annotations": {
                        **ownership.owner_marks(
                            ownership.NodeIdentity(node_name="vn", cluster_id="d")
                        )[1],
                        ownership.UPPER_UID_ANNOTATION: "u-1",
                    }
                }
            ),
            "of upper cluster d",
        ),
        (_marked(metadata={"labels": ownership.owner_marks(OWNER)[0]}), "a copy"),
        (
            _marked(
                metadata={
                    "annotations": {
                        **_marked()["metadata"]["annotations"],
                        ownership.UPPER_UID_ANNOTATION: "u-0",
                    }
                }
            ),
            "another upper pod",
        ),
        (_marked(metadata={"ownerReferences": [{**POD_OWNER, "name": "other"}]}), "owned by"),
        (_marked(metadata={"ownerReferences": [{**POD_OWNER, "kind": "Node"}]}), "owned by"),
    ],
)
def test_token_secret_problem(secret: dict[str, Any], problem: str | None) -> None:
    found = boundtokens.token_secret_problem(secret, owner=OWNER, upper_uid="u-1", pod_name="web")
    assert found == problem if problem is None else problem in (found or "")


def _pod_now(**changes: Any) -> dict[str, Any]:
    pod = upper_pod(INJECTED)
    pod["metadata"].update(changes.pop("metadata", {}))
    pod["spec"].update(changes.pop("spec", {}))
    pod.update(changes)
    return pod


@pytest.mark.parametrize(
    ("pod", "lower_problem", "ends"),
    [
        (_pod_now(status={"phase": "Running"}), None, None),
        (_pod_now(), None, None),
        (_pod_now(metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}), None, "going"),
        (_pod_now(metadata={"uid": "u-2"}), None, "another one"),
        (_pod_now(spec={"nodeName": "vn-2"}), None, "bound to vn-2, not to vn"),
        (_pod_now(spec={"nodeName": None}), None, "bound to no node"),
        (_pod_now(status={"phase": "Succeeded"}), None, "finished (Succeeded)"),
        (_pod_now(status={"phase": "Failed"}), None, "finished (Failed)"),
        (_pod_now(status={"phase": "Running"}), "the lower pod is gone", "lower pod is gone"),
    ],
)
def test_renewal_ends(pod: dict[str, Any], lower_problem: str | None, ends: str | None) -> None:
    found = boundtokens.renewal_ends(
        pod, upper_uid="u-1", node_name="vn", lower_pod_problem=lower_problem
    )
    assert found == ends if ends is None else ends in (found or "")


def _lower(**changes: Any) -> dict[str, Any]:
    labels, marks = ownership.owner_marks(OWNER)
    pod = {
        "metadata": {
            "name": "web",
            "namespace": "app",
            "uid": "l-1",
            "labels": labels,
            "annotations": {**marks, ownership.UPPER_UID_ANNOTATION: "u-1"},
        }
    }
    pod["metadata"].update(changes)
    return pod


@pytest.mark.parametrize(
    ("found", "lower_uid", "issued", "problem"),
    [
        (_lower(), "l-1", True, None),
        (_lower(), None, True, None),  # not known yet: read
        (None, "l-1", False, None),  # just created, not cached yet
        (None, "l-1", True, "gone"),
        (_lower(labels={}), "l-1", True, "not this node's"),
        (
            _lower(
                annotations={
                    **_lower()["metadata"]["annotations"],
                    ownership.UPPER_UID_ANNOTATION: "u-0",
                }
            ),
            "l-1",
            True,
            "another upper pod",
        ),
        (_lower(uid="l-2"), "l-1", True, "not the one this node made"),
    ],
)
def test_lower_pod_problem(
    found: dict[str, Any] | None, lower_uid: str | None, issued: bool, problem: str | None
) -> None:
    got = boundtokens.lower_pod_problem(
        found, owner=OWNER, upper_uid="u-1", lower_uid=lower_uid, issued=issued
    )
    assert got == problem if problem is None else problem in (got or "")


def _review(name: object, groups: object) -> dict[str, Any]:
    return {"status": {"userInfo": {"username": name, "groups": groups}}}


@pytest.mark.parametrize(
    ("review", "fine"),
    [
        (_review("system:node:vn", ["system:nodes", "system:authenticated"]), True),
        (_review("system:node:vn-2", ["system:nodes"]), False),
        (_review("system:node:vn", ["system:authenticated"]), False),
        (_review("kubernetes-admin", ["system:masters"]), False),
        ({}, False),
    ],
)
def test_node_identity_problem(review: dict[str, Any], fine: bool) -> None:
    problem = boundtokens.node_identity_problem(review, node_name="vn")
    assert (problem is None) is fine
    if problem is not None:
        assert "system:node:vn" in problem


def test_a_legacy_token_secret_volume_is_dropped_with_an_upper_address_too() -> None:
    # A pre-1.21 upper cluster's injected token: a Secret volume, for which no upper token
    # is asked (`boundtokens.asks`); mounting it below would mount an empty volume.
    legacy = {"name": "default-token-x1y2z", "secret": {"secretName": "default-token-x1y2z"}}
    pod = upper_pod(legacy)
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "default-token-x1y2z", "mountPath": MOUNT["mountPath"]}
    ]
    assert boundtokens.asks(pod) == []
    lower = translate.lower_pod(pod, policy=UPPER_POLICY)
    assert "volumes" not in lower["spec"]
    assert "volumeMounts" not in lower["spec"]["containers"][0]


# -- UpperTokens on FakeApi: the requests and Secret writes in isolation (a fake clock, the
# lower pod informer's store filled by hand: no reflector runs against the fake); the real
# TokenRequest, TokenReview, NodeRestriction and garbage collection are in
# tests/e2e/test_upper_serviceaccount_tokens.py


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


TOKEN_PATH = "/api/v1/namespaces/app/serviceaccounts/runner/token"
ISSUED_AT = 1_800_000_000
"""The tokens' `iat` (seconds since the epoch)."""
STATED = "2027-01-15T08:30:00Z"
"""The answers' expirationTimestamp, which the tokens' claims contradict (as kube-apiserver's
does for a token it extended)."""


def answer(upper: FakeApi, token: str, *, life: int = 3600) -> None:
    """Have the TokenRequest answered with a JWT of `life` seconds named `token`."""
    signed = jwt({"iat": ISSUED_AT, "exp": ISSUED_AT + life, "jti": token})
    upper.answer("POST", TOKEN_PATH, {"status": {"token": signed, "expirationTimestamp": STATED}})


def jti(secret: dict[str, Any] | None, key: str = "kube-api-access-abcde.token") -> str:
    token = ((secret or {}).get("stringData") or {}).get(key) or ""
    if token.count(".") != 2:
        return ""
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"])


SECRET_NAME = boundtokens.secret_name("web", "u-1")


def _clusters(token: str = "t-1") -> tuple[FakeApi, FakeApi]:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    upper.put(PODS, upper_pod(INJECTED))
    upper.put(CONFIG_MAPS, {"metadata": {"name": "kube-root-ca.crt", "namespace": "app"},
                            "data": {"ca.crt": "UPPER CA"}})  # fmt: skip
    answer(upper, token)
    return upper, lower


LOWER_WEB = {"metadata": {"name": "web", "namespace": "app", "uid": "lower-uid"}}


def _tokens(
    upper: FakeApi,
    lower: FakeApi,
    clock: Clock,
    *,
    prefix: str = "",
    minter: FakeApi | None = None,
) -> UpperTokens:
    pods = InformerFactory().informer(lower, PODS, name="lower-pods")
    return UpperTokens(
        upper=upper,
        minter=minter,
        lower=lower,
        owner=OWNER,
        prefix=prefix,
        lower_pods=pods,
        refresh_fraction=0.5,
        clock=clock,
    )


def _cached(tokens: UpperTokens, lower_pod: dict[str, Any]) -> None:
    """What the provider's informer keeps of a lower pod (slim)."""
    tokens._pods.store.upsert(slim.SlimLowerPods(OWNER)(lower_pod))


def _made_below(pod: dict[str, Any], *, uid: str = "lower-uid") -> dict[str, Any]:
    below = translate.lower_pod(pod, policy=UPPER_POLICY)
    below["metadata"]["uid"] = uid
    return below


async def _settle(until: Any) -> None:
    for _ in range(300):
        if until():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached")


class Running:
    """`tokens.run()` as a task, shut down and awaited on exit."""

    def __init__(self, tokens: UpperTokens) -> None:
        self.tokens = tokens

    async def __aenter__(self) -> UpperTokens:
        self.task = asyncio.create_task(self.tokens.run(), name="tokens-under-test")
        return self.tokens

    async def __aexit__(self, *_: object) -> None:
        await self.tokens.shut_down()
        await self.task


async def test_a_created_pod_gets_an_hour_s_token_renewed_at_the_fraction_of_its_stated_life() -> (
    None
):
    upper, lower = _clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    await tokens.prepare(upper_pod(INJECTED))
    placeholder = lower.get(SECRETS, SECRET_NAME, namespace="app") or {}
    assert "ownerReferences" not in placeholder["metadata"]  # no lower pod yet
    assert placeholder["stringData"] == {"namespace": "app"}  # no token yet
    made = _made_below(upper_pod(INJECTED))
    _cached(tokens, made)
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), made)
        await _settle(lambda: jti(lower.get(SECRETS, SECRET_NAME, namespace="app")) == "t-1")
        secret = lower.get(SECRETS, SECRET_NAME, namespace="app") or {}
        assert secret["stringData"]["ca.crt"] == "UPPER CA"
        assert secret["stringData"]["namespace"] == "app"
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "lower-uid"
        # The expiry the token states, not the answer's timestamp.
        expires = secret["metadata"]["annotations"][boundtokens.EXPIRES_ANNOTATION]
        assert expires == "2027-01-15T09:00:00Z"  # ISSUED_AT + 3600
        request = upper.requests_of("POST")[0].body
        assert request["spec"]["boundObjectRef"]["uid"] == "u-1"
        assert request["spec"]["expirationSeconds"] == 3600
        entry = tokens._entries["app/web"]
        assert entry.due == clock.now + 1800  # half (fraction 0.5) of the hour
        # A year-long answer (an apiserver that extends anyway) is renewed after a day.
        answer(upper, "t-2", life=365 * 86400)
        clock.now = entry.due
        tokens._wake.set()
        await _settle(lambda: jti(lower.get(SECRETS, SECRET_NAME, namespace="app")) == "t-2")
        await _settle(lambda: tokens._entries["app/web"].due == clock.now + 86400)
        # The upper pod goes: no more requests for it.
        upper.remove(PODS, "web", namespace="app")
        clock.now += 86400
        tokens._wake.set()
        await _settle(lambda: not tokens._entries)
        assert len(upper.requests_of("POST")) == 2


async def test_tokens_are_asked_for_with_the_minter_and_the_rest_read_as_the_node() -> None:
    upper, lower = _clusters()
    minter = FakeApi(name="node-identity")
    answer(minter, "t-node")
    upper.fail("POST", "serviceaccounts", error=status_error(403, reason="Forbidden", message="no"))
    tokens = _tokens(upper, lower, Clock(), minter=minter)
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        await _settle(lambda: jti(lower.get(SECRETS, SECRET_NAME, namespace="app")) == "t-node")
    assert upper.requests_of("POST") == []
    assert upper.requests_of("GET", "pods")
    assert upper.requests_of("GET", "configmaps")


async def test_the_minter_must_be_this_node() -> None:
    path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    minter = FakeApi(name="node-identity")
    minter.answer("POST", path, _review("system:node:vn", ["system:nodes"]))
    await check_identity(minter, node_name="vn")
    minter.answer("POST", path, _review("kubernetes-admin", ["system:masters"]))
    with pytest.raises(StartupError, match="must be this node's identity system:node:vn"):
        await check_identity(minter, node_name="vn")


async def test_a_failed_request_is_asked_again() -> None:
    upper, lower = _clusters()
    upper.fail("GET", "configmaps", error=unreachable(), times=1)
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        await _settle(lambda: upper.requests_of("GET", "configmaps"))
        await _settle(lambda: tokens._entries["app/web"].due == clock.now + RETRY)
        assert lower.get(SECRETS, SECRET_NAME, namespace="app") is None
        clock.now += RETRY
        tokens._wake.set()
        await _settle(lambda: lower.get(SECRETS, SECRET_NAME, namespace="app"))


@pytest.mark.parametrize(
    "planted",
    [
        # A user's Secret, or another upper cluster's token Secret, in the name.
        {"type": "Opaque", "data": {"k": "dg=="}},
        {"type": boundtokens.SECRET_TYPE, "metadata": {"annotations": {
            **ownership.owner_marks(ownership.NodeIdentity(node_name="vn", cluster_id="d"))[1],
            ownership.UPPER_UID_ANNOTATION: "u-1"}}},
        # A copy this node made of an upper Secret written to look like one.
        {"type": boundtokens.SECRET_TYPE, "metadata": {
            "labels": ownership.owner_marks(OWNER)[0],
            "annotations": {**ownership.owner_marks(OWNER)[1],
                            ownership.UPPER_UID_ANNOTATION: "u-1"}}},
    ],
)  # fmt: skip
async def test_a_secret_of_that_name_not_the_node_s_refuses_the_pod_and_is_left_as_it_is(
    planted: dict[str, Any],
) -> None:
    # FakeApi: a real cluster is in tests/e2e (another cluster's); the copy case needs an
    # upper Secret copied by this very node in the name before the pod exists.
    upper, lower = _clusters()
    body = {**planted, "metadata": {**planted.get("metadata", {}), "name": SECRET_NAME,
                                    "namespace": "app"}}  # fmt: skip
    stored = lower.put(SECRETS, body)
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    with pytest.raises(provider_errors.InvalidPod, match=SECRET_NAME):
        await tokens.prepare(upper_pod(INJECTED))
    # A worker that meets it (after a restart, say) does not write it either.
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        await _settle(lambda: tokens._entries["app/web"].due == clock.now + RETRY)
    assert lower.requests_of("PATCH") == []
    assert lower.requests_of("DELETE") == []
    await tokens.discard(upper_pod(INJECTED))
    assert lower.get(SECRETS, SECRET_NAME, namespace="app") == stored


async def test_the_empty_secret_of_a_pod_that_never_got_below_is_deleted() -> None:
    upper, lower = _clusters()
    tokens = _tokens(upper, lower, Clock())
    await tokens.prepare(upper_pod(INJECTED))
    await tokens.prepare(upper_pod(INJECTED))  # again (a create retried): it is the node's
    await tokens.discard(upper_pod(INJECTED))
    assert lower.get(SECRETS, SECRET_NAME, namespace="app") is None
    # Owned by a lower pod: the lower garbage collector's.
    await tokens.prepare(upper_pod(INJECTED))
    await lower.request(
        "PATCH",
        f"/api/v1/namespaces/app/secrets/{SECRET_NAME}",
        body={"metadata": {"ownerReferences": [boundtokens.pod_owner(LOWER_WEB)]}},
    )
    await tokens.discard(upper_pod(INJECTED))
    assert lower.get(SECRETS, SECRET_NAME, namespace="app") is not None


async def test_no_token_for_another_upper_pod_of_the_same_name() -> None:
    # FakeApi: the upper pod is replaced (a StatefulSet's next pod) before the renewal.
    upper, lower = _clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        await _settle(lambda: lower.get(SECRETS, SECRET_NAME, namespace="app"))
        upper.put(PODS, upper_pod(INJECTED, uid="u-2"))
        tokens._entries["app/web"].due = clock.now
        tokens._wake.set()
        await _settle(lambda: not tokens._entries)
        assert len(upper.requests_of("POST")) == 1


@pytest.mark.parametrize(
    "gone",
    ["lower pod", "lower pod replaced", "upper pod finished", "upper pod bound elsewhere"],
)
async def test_no_renewal_once_the_pod_is_not_one_the_node_gives_tokens_to(gone: str) -> None:
    upper, lower = _clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    made = _made_below(upper_pod(INJECTED))
    _cached(tokens, made)
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), made)
        await _settle(lambda: "app/web" in tokens._entries and tokens._entries["app/web"].issued)
        match gone:
            case "lower pod":
                tokens._pods.store.delete("app/web")
            case "lower pod replaced":  # someone else's pod of that name, with the marks
                _cached(tokens, _made_below(upper_pod(INJECTED), uid="forged-uid"))
            case "upper pod finished":
                upper.put(PODS, _pod_now(status={"phase": "Succeeded"}))
            case _:
                upper.put(PODS, _pod_now(spec={"nodeName": "vn-2"}))
        tokens._entries["app/web"].due = clock.now
        tokens._wake.set()
        await _settle(lambda: not tokens._entries)
        assert len(upper.requests_of("POST")) == 1


async def test_a_renewal_while_both_pods_run() -> None:
    # The control case of test_no_renewal_once_the_pod_is_not_one_the_node_gives_tokens_to.
    upper, lower = _clusters()
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    made = _made_below(upper_pod(INJECTED))
    _cached(tokens, made)
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), made)
        await _settle(lambda: tokens._entries["app/web"].issued)
        tokens._entries["app/web"].due = clock.now
        tokens._wake.set()
        await _settle(lambda: len(upper.requests_of("POST")) == 2)
        assert "app/web" in tokens._entries


@pytest.mark.parametrize("whose", ["this pod's", "another's"])
async def test_a_lower_pod_issued_without_its_uid_is_read(whose: str) -> None:
    # The provider's create found the lower pod made already (AlreadyExists) and issues
    # with the body it sent, which has no UID; the Secret's owner is read below.
    upper, lower = _clusters()
    labels, annotations = ownership.owner_marks(OWNER)
    upper_uid = "u-1" if whose == "this pod's" else "u-0"
    annotations = {**annotations, ownership.UPPER_UID_ANNOTATION: upper_uid}
    existing = lower.put(
        PODS,
        {"metadata": {"name": "web", "namespace": "app", "labels": labels,
                      "annotations": annotations}},
    )  # fmt: skip
    tokens = _tokens(upper, lower, Clock())
    async with Running(tokens):
        tokens.issue(upper_pod(INJECTED), {"metadata": {"name": "web", "namespace": "app"}})
        if whose == "this pod's":
            await _settle(lambda: lower.get(SECRETS, SECRET_NAME, namespace="app"))
            secret = lower.get(SECRETS, SECRET_NAME, namespace="app") or {}
            owner = secret["metadata"]["ownerReferences"][0]
            assert owner["uid"] == existing["metadata"]["uid"]
        else:
            await _settle(lambda: not tokens._entries)
            assert lower.get(SECRETS, SECRET_NAME, namespace="app") is None
            assert upper.requests_of("POST") == []


@pytest.mark.parametrize("prefix", ["", "up-"])
async def test_at_start_the_lower_pods_at_their_upper_pod_s_key_are_taken_over(
    prefix: str,
) -> None:
    # After a restart: the store is filled as the provider's informer fills it (slim lower
    # pods, no volumes kept). A pod with the same marks in a namespace the upper pod's does
    # not map to is not this node's: no token goes there.
    upper, lower = _clusters()
    policy = translate.TranslationPolicy(
        node_name="vn",
        cluster_id="c",
        node_labels={},
        upper_api_address="h:6443",
        namespace_prefix=prefix,
    )
    below = translate.lower_pod(upper_pod(INJECTED), policy=policy)
    below["metadata"]["uid"] = "lower-uid"
    forged = translate.lower_pod(upper_pod(INJECTED), policy=policy)
    forged["metadata"].update(uid="forged-uid", namespace="elsewhere")
    tokens = _tokens(upper, lower, Clock(), prefix=prefix)
    for pod in (forged, below):
        _cached(tokens, pod)
    async with Running(tokens):
        await _settle(lambda: lower.get(SECRETS, SECRET_NAME, namespace=f"{prefix}app"))
        await _settle(lambda: tokens._entries["app/web"].issued)
        secret = lower.get(SECRETS, SECRET_NAME, namespace=f"{prefix}app") or {}
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "lower-uid"
        assert lower.objects(SECRETS, namespace="elsewhere") == []
        assert len(upper.requests_of("POST")) == 1


async def test_at_start_a_forged_pod_of_an_upper_pod_bound_elsewhere_gets_no_token() -> None:
    upper, lower = _clusters()
    upper.put(PODS, _pod_now(spec={"nodeName": "vn-2"}))
    tokens = _tokens(upper, lower, Clock())
    _cached(tokens, _made_below(upper_pod(INJECTED)))
    async with Running(tokens):
        await _settle(lambda: upper.requests_of("GET", "pods"))
        await _settle(lambda: not tokens._entries)
    assert upper.requests_of("POST") == []
    assert lower.objects(SECRETS) == []


async def test_renewals_run_at_once_up_to_the_bound() -> None:
    upper, lower = _clusters()
    count = CONCURRENCY + 3
    pods = [upper_pod(INJECTED, name=f"p{i}", uid=f"u-{i}") for i in range(count)]
    for pod in pods:
        upper.put(PODS, pod)
    gate = asyncio.Event()
    upper.delay("POST", "serviceaccounts", until=gate)
    clock = Clock()
    tokens = _tokens(upper, lower, clock)
    async with Running(tokens):
        for i, pod in enumerate(pods):
            tokens.issue(pod, {"metadata": {"name": f"p{i}", "namespace": "app", "uid": f"l{i}"}})
        await _settle(lambda: len(upper.requests_of("POST")) == CONCURRENCY)
        reads = clock.reads
        await asyncio.sleep(0.05)
        assert len(upper.requests_of("POST")) == CONCURRENCY  # the rest wait their turn...
        assert clock.reads - reads < 5  # ... asleep, not looking again and again
        gate.set()
        await _settle(lambda: all(e.issued for e in tokens._entries.values()))
    assert len(upper.requests_of("POST")) == count
    assert len(lower.objects(SECRETS, namespace="app")) == count


async def test_a_pod_issued_while_the_last_one_of_its_name_ends_keeps_its_entry() -> None:
    # The upper GET of the old pod is held while the new pod of that name (a StatefulSet's
    # next one) is issued; the old entry's end must not drop the new one.
    upper, lower = _clusters()
    tokens = _tokens(upper, lower, Clock())
    gate = asyncio.Event()
    async with Running(tokens):
        old = upper_pod(INJECTED, uid="u-0")  # the upper pod of that name now is u-1
        upper.delay("GET", "pods", until=gate, times=1)
        tokens.issue(old, LOWER_WEB)
        await _settle(lambda: upper.requests_of("GET", "pods"))
        tokens.issue(upper_pod(INJECTED), LOWER_WEB)
        new_entry = tokens._entries["app/web"]
        gate.set()
        await _settle(lambda: lower.get(SECRETS, SECRET_NAME, namespace="app"))
        assert tokens._entries.get("app/web") is new_entry
