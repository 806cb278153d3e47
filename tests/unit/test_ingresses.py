"""Which upper Ingresses are copied below with --enable-ingress, and how (pure, as tables):
only those whose every backend is this upper cluster's copy of that very Service, of a
class --ingress-class-map maps, once their TLS Secrets' copies are below; annotations by
the allow-list; the lower status recorded and brought up as the union of the nodes'. The
same on the real clusters: tests/e2e/test_services.py (the tests after "Ingresses")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.contracts.objects import Obj
from tensile.kube.informer import Informer
from tensile.kube.mirror.decide import Create, Delete, Nothing, decide
from tensile.kube.mirror.engine import Mirror
from tensile.kube.mirror.siblings import SiblingPolicy
from tensile.kube.mirror.spec import Patch
from tensile.kube.resources import INGRESSES
from vnode.providers.k2k import dependencies, endpointslices, ingresses, naming, services
from vnode.providers.k2k.ingresses import Caches, IngressPolicy

OWNER = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
SIBLING = ownership.NodeIdentity(node_name="vn-b", cluster_id=OWNER.cluster_id)
OTHER_CLUSTER = ownership.NodeIdentity(node_name="vn-a", cluster_id="another-cluster")
TENANCY = naming.NodeTenancy(owner=OWNER, prefix="")
POLICY = IngressPolicy(classes=(("public", "nginx-tenants"),))


def upper_service(name: str = "web", *, uid: str = "svc-1") -> Obj:
    return {
        "metadata": {"name": name, "namespace": "app", "uid": uid},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
    }


def upper_secret(name: str = "tls", **extra: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": "app", "uid": f"s-{name}"}, **extra}


def ingress(
    *,
    klass: str | None = "public",
    backends: tuple[str, ...] = ("web",),
    default: dict[str, Any] | None = None,
    tls: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
) -> Obj:
    spec: dict[str, Any] = {
        "rules": [
            {
                "host": "web.example",
                "http": {
                    "paths": [
                        {
                            "path": f"/{b}",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": b, "port": {"number": 80}}},
                        }
                        for b in backends
                    ]
                },
            }
        ]
    }
    if klass is not None:
        spec["ingressClassName"] = klass
    if default is not None:
        spec["defaultBackend"] = default
    if tls:
        spec["tls"] = [{"hosts": ["web.example"], "secretName": t} for t in tls]
    return {
        "metadata": {
            "name": "site",
            "namespace": "app",
            "uid": "ing-1",
            "annotations": annotations or {},
        },
        "spec": spec,
    }


def service_copy(owner: ownership.NodeIdentity = OWNER, *, of: Obj | None = None) -> Obj:
    return services.lower_service(of or upper_service(), owner=owner, prefix="")


def secret_copy(owner: ownership.NodeIdentity = OWNER, name: str = "tls") -> Obj:
    return dependencies.copy_of(upper_secret(name), kind="Secret", namespace="app", owner=owner)


THEIRS = {"metadata": {"name": "web", "namespace": "app", "uid": "lower-1", "labels": {}}}
"""The lower cluster's own Service (or Secret) of the same name."""


def caches(
    *,
    upper: dict[str, Obj] | None = None,
    copies: dict[str, Obj] | None = None,
    secrets: dict[str, Obj] | None = None,
    secret_copies: dict[str, Obj] | None = None,
) -> Caches:
    return Caches(
        upper_services={"app/web": upper_service()} if upper is None else upper,
        service_copies={"app/web": service_copy()} if copies is None else copies,
        upper_secrets={"app/tls": upper_secret()} if secrets is None else secrets,
        secret_copies={"app/tls": secret_copy()} if secret_copies is None else secret_copies,
    )


TOKEN = upper_secret(type="kubernetes.io/service-account-token")


@pytest.mark.parametrize(
    ("upper_ingress", "cache", "wants", "crosses", "reason"),
    [
        pytest.param(ingress(), caches(), True, True, None, id="mapped-class-own-copy"),
        pytest.param(
            ingress(tls=("tls",)), caches(), True, True, None, id="tls-secret-copied-below"
        ),
        pytest.param(
            ingress(klass=None), caches(), False, False, "names no ingressClassName", id="no-class"
        ),
        pytest.param(
            ingress(klass="internal"),
            caches(),
            False,
            False,
            "its class internal is not mapped",
            id="unmapped-class",
        ),
        pytest.param(
            ingress(),
            caches(copies={"app/web": THEIRS}),
            False,
            False,
            "backend Service web is not this tenant's copy below",
            id="lower-clusters-own-service",
        ),
        pytest.param(
            ingress(),
            caches(copies={}),
            False,
            False,
            "backend Service web is not this tenant's copy below (that name holds no Service)",
            id="service-not-copied-yet",
        ),
        pytest.param(
            ingress(),
            caches(copies={"app/web": service_copy(OTHER_CLUSTER)}),
            False,
            False,
            "not this tenant's copy",
            id="another-upper-clusters-copy",
        ),
        pytest.param(
            ingress(),
            caches(copies={"app/web": service_copy(of=upper_service(uid="svc-old"))}),
            False,
            False,
            "not this tenant's copy",
            id="copy-of-an-earlier-service",
        ),
        pytest.param(
            ingress(),
            caches(copies={"app/web": service_copy(SIBLING)}),
            True,
            True,
            None,
            id="siblings-copy-serves",
        ),
        pytest.param(
            ingress(backends=("web", "api")),
            caches(),
            False,
            False,
            "backend Service api does not exist upstairs",
            id="one-backend-of-two-missing",
        ),
        pytest.param(
            ingress(default={"service": {"name": "other", "port": {"number": 80}}}),
            caches(),
            False,
            False,
            "backend Service other",
            id="default-backend-checked",
        ),
        pytest.param(
            ingress(default={"resource": {"apiGroup": "x.io", "kind": "Bucket", "name": "b"}}),
            caches(),
            False,
            False,
            "its backend Bucket b is not a Service",
            id="resource-backend",
        ),
        pytest.param(
            ingress(tls=("tls",)),
            caches(secrets={}),
            False,
            False,
            "its TLS Secret tls does not exist",
            id="tls-secret-missing-upstairs",
        ),
        pytest.param(
            ingress(tls=("tls",)),
            caches(secrets={"app/tls": TOKEN}),
            False,
            False,
            "a token Secret",
            id="tls-secret-is-a-token",
        ),
        pytest.param(
            ingress(tls=("tls",)),
            caches(secret_copies={}),
            True,
            False,
            "its TLS Secret tls has no copy of this tenant below",
            id="tls-copy-on-its-way",
        ),
        pytest.param(
            ingress(tls=("tls",)),
            caches(secret_copies={"app/tls": THEIRS}),
            True,
            False,
            "has no copy of this tenant below",
            id="tls-secret-name-taken-below",
        ),
    ],
)
def test_judge(
    upper_ingress: Obj, cache: Caches, wants: bool, crosses: bool, reason: str | None
) -> None:
    verdict = ingresses.judge(upper_ingress, caches=cache, tenancy=TENANCY, policy=POLICY)
    assert (verdict.wants, verdict.crosses) == (wants, crosses)
    if reason is None:
        assert verdict.reason is None
    else:
        assert verdict.reason is not None
        assert reason in verdict.reason


def test_a_deleting_ingress_is_not_copied_and_tells_nothing() -> None:
    deleting = ingress()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    verdict = ingresses.judge(deleting, caches=caches(), tenancy=TENANCY, policy=POLICY)
    assert verdict == ingresses.Verdict(wants=False, crosses=False)


@pytest.mark.parametrize(
    ("allowed", "upper_annotations", "copied"),
    [
        pytest.param((), {"nginx.ingress.kubernetes.io/rewrite-target": "/"}, {}, id="none"),
        pytest.param(
            ("nginx.ingress.kubernetes.io/rewrite-target",),
            {
                "nginx.ingress.kubernetes.io/rewrite-target": "/",
                "nginx.ingress.kubernetes.io/configuration-snippet": "evil",
            },
            {"nginx.ingress.kubernetes.io/rewrite-target": "/"},
            id="a-key",
        ),
        pytest.param(
            ("example.com/*",),
            {"example.com/a": "1", "other.io/b": "2"},
            {"example.com/a": "1"},
            id="a-prefix",
        ),
        pytest.param(
            ("*",),
            {"kubectl.kubernetes.io/last-applied-configuration": "{}", "a": "1"},
            {"a": "1"},
            id="all-but-kubectls-record",
        ),
    ],
)
def test_lower_ingress_annotations(
    allowed: tuple[str, ...], upper_annotations: dict[str, str], copied: dict[str, str]
) -> None:
    policy = IngressPolicy(classes=POLICY.classes, annotations=allowed)
    lower = ingresses.lower_ingress(
        ingress(annotations=upper_annotations), owner=OWNER, prefix="p-", policy=policy
    )
    annotations = lower["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k in upper_annotations} == copied
    assert annotations.get(services.COPIED_ANNOTATIONS, "") == ",".join(sorted(copied))
    assert annotations[ownership.UPPER_UID_ANNOTATION] == "ing-1"
    assert annotations[services.POLICY_ANNOTATION] == policy.digest
    assert lower["metadata"]["namespace"] == "p-app"
    assert lower["spec"]["ingressClassName"] == "nginx-tenants"
    assert lower["spec"]["rules"] == ingress()["spec"]["rules"]


def test_compare_replaces_the_spec_and_removes_annotations_no_longer_allowed() -> None:
    allowed = IngressPolicy(classes=POLICY.classes, annotations=("a/*",))
    before = ingresses.lower_ingress(
        ingress(annotations={"a/x": "1"}), owner=OWNER, prefix="", policy=allowed
    )
    before["metadata"]["annotations"]["lower.io/own"] = "kept"
    before["status"] = {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}
    assert ingresses.compare_ingress(before, {**before, "status": {}}) is None
    desired = ingresses.lower_ingress(
        ingress(backends=("web", "api")), owner=OWNER, prefix="", policy=POLICY
    )
    change = ingresses.compare_ingress(before, desired)
    assert isinstance(change, Patch)
    assert change.content_type == ingresses.JSON_PATCH
    ops = {(op["op"], op["path"]) for op in change.body}  # type: ignore[index]
    assert ("add", "/spec") in ops
    assert ("remove", "/metadata/annotations/a~1x") in ops
    assert (
        "remove",
        f"/metadata/annotations/{services.COPIED_ANNOTATIONS.replace('/', '~1')}",
    ) in ops
    assert not any("lower.io" in path for _op, path in ops)


@pytest.mark.parametrize(
    ("recorded", "current", "status"),
    [
        pytest.param({"vn-a": [{"ip": "10.0.0.1"}]}, [], [{"ip": "10.0.0.1"}], id="one-node"),
        pytest.param({"vn-a": [{"ip": "10.0.0.1"}]}, [{"ip": "10.0.0.1"}], None, id="up-to-date"),
        pytest.param(
            {"vn-a": [{"ip": "10.0.0.1"}], "vn-b": [{"hostname": "lb.b"}, {"ip": "10.0.0.1"}]},
            [],
            [{"ip": "10.0.0.1"}, {"hostname": "lb.b"}],
            id="union-of-nodes",
        ),
        pytest.param({"vn-a": []}, [{"ip": "10.0.0.9"}], [], id="address-gone-below"),
        pytest.param({}, [], None, id="nothing-recorded"),
    ],
)
def test_upper_status_is_the_union_of_what_nodes_recorded(
    recorded: dict[str, list[Any]], current: list[Any], status: list[Any] | None
) -> None:
    upper = ingress()
    upper["metadata"]["annotations"] = {
        ingresses.status_annotation(node): json.dumps(entries) for node, entries in recorded.items()
    }
    upper["metadata"]["annotations"][ingresses.STATUS_ANNOTATION_PREFIX + "junk"] = "not json"
    upper["status"] = {"loadBalancer": {"ingress": current}}
    patch = ingresses.upper_status(upper, {})
    if status is None:
        assert patch is None
    else:
        assert patch == {"status": {"loadBalancer": {"ingress": status}}}


def test_report_records_the_lower_addresses_once() -> None:
    report = ingresses.report_addresses("vn-a")
    lower = {"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}}
    patch = report(ingress(), lower)
    assert patch is not None
    upper = ingress(annotations=patch["metadata"]["annotations"])
    assert report(upper, lower) is None
    assert ingresses.upper_status(upper, lower) == {
        "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}
    }


SPEC = ingresses.ingress_spec(
    tenancy=TENANCY,
    selection=services.ServiceSelection(),
    policy=POLICY,
    caches=caches(),
)
REFUSING = ingresses.ingress_spec(
    tenancy=TENANCY,
    selection=services.ServiceSelection(),
    policy=POLICY,
    caches=caches(copies={"app/web": THEIRS}),
)


@pytest.mark.parametrize(
    ("spec", "current", "action"),
    [
        pytest.param(SPEC, None, Create, id="crosses-created"),
        pytest.param(REFUSING, None, Nothing, id="refused-never-created"),
        pytest.param(REFUSING, "own", Delete, id="refused-copy-below-deleted"),
        pytest.param(REFUSING, "theirs", Nothing, id="refused-someone-elses-left-alone"),
    ],
)
def test_decisions(spec: Any, current: str | None, action: type) -> None:
    lower = {
        None: None,
        "own": ingresses.lower_ingress(ingress(), owner=OWNER, prefix="", policy=POLICY),
        "theirs": {"metadata": {"name": "site", "namespace": "app", "uid": "x"}},
    }[current]
    got = decide(
        "app/site",
        source=ingress(),
        current=lower,
        spec=spec,
        siblings=SiblingPolicy.of(spec, tenancy=TENANCY),
        now=0.0,
    )
    assert isinstance(got, action)


def test_refusal_names_the_backend_and_the_node() -> None:
    assert REFUSING.refusal is not None
    assert SPEC.refusal is not None
    message = REFUSING.refusal(ingress())
    assert message is not None
    assert "virtual node vn-a" in message
    assert "backend Service web" in message
    assert SPEC.refusal(ingress()) is None


# -- the engine: a refusal told once it lasts; the status reported on the subresource --------


class _Api:
    """Records writes; a POST shows in `lower` (the target informer's store, as its watch
    would), a PATCH answers the patched upper Ingress. A fake for both clusters, so the test
    steps a clock between two looks (what a real server cannot do on demand)."""

    def __init__(self, lower: Informer, upper: Informer) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.lower, self.upper = lower, upper

    async def request(
        self, method: str, path: str, *, body: Any = None, content_type: str | None = None
    ) -> Obj:
        self.writes.append((method, path, body))
        if method == "POST":
            made = {**body, "metadata": {**body["metadata"], "uid": "made", "resourceVersion": "1"}}
            self.lower.store.upsert(made)
            return made
        current = self.upper.store.get("app/site")
        assert current is not None
        meta = current["metadata"]
        patched = {
            **current,
            "metadata": {
                **meta,
                "annotations": {
                    **meta.get("annotations", {}),
                    **body.get("metadata", {}).get("annotations", {}),
                },
            },
        }
        self.upper.store.upsert(patched)
        return patched


async def test_a_refusal_is_told_once_it_lasts_and_a_copy_reports_its_status() -> None:
    now = [1000.0]
    told: list[str] = []
    service_copies: dict[str, Obj] = {}
    view = caches(copies=service_copies)
    upper = Informer(None, INGRESSES, name="test-upper")  # type: ignore[arg-type]
    lower = Informer(None, INGRESSES, name="test-lower")  # type: ignore[arg-type]
    api = _Api(lower, upper)

    async def refusal(_source: Obj, message: str) -> None:
        told.append(message)

    spec = ingresses.ingress_spec(
        tenancy=TENANCY, selection=services.ServiceSelection(), policy=POLICY, caches=view
    )
    mirror = Mirror(
        spec=spec,
        tenancy=TENANCY,
        source=upper,
        target=lower,
        source_client=api,  # type: ignore[arg-type]
        target_client=api,  # type: ignore[arg-type]
        on_refusal=refusal,
        clock=lambda: now[0],
    )
    upper.store.upsert(ingress())
    # The Service's copy is not below yet: nothing is written, nothing told yet ...
    await mirror.sync("app/site")
    assert (api.writes, told) == ([], [])
    # ... and when it stays so past the settle, the refusal is told, once.
    now[0] += endpointslices.NOTICE_SETTLE
    await mirror.sync("app/site")
    await mirror.sync("app/site")
    assert len(told) == 1
    assert "backend Service web is not this tenant's copy below" in told[0]
    assert api.writes == []

    # The copy arrives: the Ingress is made below; the lower address, once written there,
    # is recorded on the Ingress and written to its status subresource.
    service_copies["app/web"] = service_copy()
    await mirror.sync("app/site")
    # (No address below yet: nothing to record upstairs.)
    assert [(m, p) for m, p, _ in api.writes] == [
        ("POST", "/apis/networking.k8s.io/v1/namespaces/app/ingresses")
    ]
    made = lower.store.get("app/site")
    assert made is not None
    lower.store.upsert({**made, "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})
    api.writes.clear()
    await mirror.sync("app/site")
    assert [(m, p) for m, p, _ in api.writes] == [
        ("PATCH", "/apis/networking.k8s.io/v1/namespaces/app/ingresses/site"),
        ("PATCH", "/apis/networking.k8s.io/v1/namespaces/app/ingresses/site/status"),
    ]
    assert api.writes[1][2] == {"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}
    await mirror.queue.shut_down()
