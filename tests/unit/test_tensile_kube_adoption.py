"""--adopt-tensile-kube: which lower objects tensile-kube made are adopted, and which are
listed (`vnode.providers.k2k.tensilekube.plan`, pure), and the flag's parsing."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.events import EventRecorder
from tensile.kube.resources import CONFIG_MAPS, EVENTS, PODS
from tensile.serving import flags as serving_flags
from tensile.serving.lifecycle import StartupError
from vnode import cli
from vnode.providers.k2k import services, tensilekube
from vnode.providers.k2k.adoption import ADOPTION_OBJECTS, TensileKubeAdoption
from vnode.settings import MigrationSettings
from vnode.testing.fakeapi import FakeApi, status_error, unreachable

OWNER = ownership.NodeIdentity(node_name="tk-node", cluster_id="cluster-a")
SCOPE = tensilekube.Scope(owner=OWNER)
NS = "app"
MADE = "2026-01-01T11:00:00Z"
"""When the lower objects of the tables were made (tensile-kube ran until the cut-off)."""
CUTOFF = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
"""--adopt-tensile-kube-before of the tables."""


def _meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "uid": f"uid-{name}", "creationTimestamp": MADE, **extra}


def upper_pod(
    name: str = "web",
    *,
    containers: tuple[str, ...] = ("main",),
    image: str = "nginx",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": _meta(
            name, uid=f"upper-{name}", labels={"app": "web"} if labels is None else labels
        ),
        "spec": {
            "nodeName": "tk-node",
            "containers": [{"name": c, "image": image} for c in containers],
            "volumes": [
                {"name": "c", "configMap": {"name": "cfg"}},
                {"name": "s", "secret": {"secretName": "sec"}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
            ],
        },
    }


def lower_pod(
    name: str = "web", *, containers: tuple[str, ...] = ("main",), image: str = "nginx"
) -> dict[str, Any]:
    """As tensile-kube made it: same name, `virtual-pod=true`, no owner marks."""
    pod = upper_pod(name, containers=containers, image=image)
    pod["metadata"] = _meta(name, labels={"virtual-pod": "true"})
    pod["spec"].pop("nodeName")
    return pod


def copy_(name: str, **fields: Any) -> dict[str, Any]:
    return {"metadata": _meta(name, annotations={"global": "true"}), **fields}


def upper_obj(name: str, **fields: Any) -> dict[str, Any]:
    return {"metadata": _meta(name, uid=f"upper-{name}"), **fields}


def born(obj: dict[str, Any], when: str) -> dict[str, Any]:
    """`obj` with its creationTimestamp `when` (RFC 3339)."""
    result = copy.deepcopy(obj)
    result["metadata"]["creationTimestamp"] = when
    return result


def ours(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` carrying tensile's owner annotations (made by tensile, never a candidate)."""
    result = copy.deepcopy(obj)
    result["metadata"].setdefault("annotations", {})[ownership.NODE_ANNOTATION] = "other"
    return result


def service_copy(
    name: str = "web", *, selector: str | None = '{"app":"web"}', **spec: Any
) -> dict[str, Any]:
    """tensile-kube's copy of a Service: no selector, the upper one kept as JSON in the
    `labelSelector` annotation (none when the upper Service had none)."""
    made = copy_(name, spec={"type": "ClusterIP", "ports": [{"port": 80}], **spec})
    if selector is not None:
        made["metadata"]["annotations"]["labelSelector"] = selector
    return made


LOWER_SERVICE = service_copy()
UPPER_SERVICE = upper_obj("web", spec={"type": "ClusterIP", "selector": {"app": "web"}})
UPPER = {
    "ConfigMap": {f"{NS}/cfg": upper_obj("cfg", data={"a": "1"})},
    "Secret": {
        f"{NS}/sec": upper_obj("sec", data={"a": "MQ=="}),
        f"{NS}/tok": upper_obj("tok", type="kubernetes.io/service-account-token"),
    },
    "PersistentVolumeClaim": {f"{NS}/data": upper_obj("data")},
    "Service": {
        f"{NS}/web": UPPER_SERVICE,
        f"{NS}/bare": upper_obj("bare", spec={"type": "ClusterIP"}),
    },
}


def outcome(
    *,
    lower: dict[str, list[dict[str, Any]]],
    pods: list[dict[str, Any]] | None = None,
    scope: tensilekube.Scope = SCOPE,
) -> list[tuple[str, str, str]]:
    """(kind, key, "adopted" or the leftover's outcome) of everything `plan` decided."""
    decided = tensilekube.plan(
        scope=scope,
        upper_pods=[upper_pod()] if pods is None else pods,
        lower=lower,
        upper=UPPER,
        created_before=CUTOFF,
    )
    return [(a.kind, a.key, "adopted") for a in decided.adopt] + [
        (left.kind, left.key, left.outcome) for left in decided.leftovers
    ]


@pytest.mark.parametrize(
    ("lower", "pods", "expected"),
    [
        # The pod tensile-kube made for an upper pod of this node, and what that pod uses.
        (
            {
                "Pod": [lower_pod()],
                "ConfigMap": [copy_("cfg")],
                "Secret": [copy_("sec")],
                "PersistentVolumeClaim": [copy_("data")],
            },
            None,
            [
                ("Pod", "app/web", "adopted"),
                ("ConfigMap", "app/cfg", "adopted"),
                ("Secret", "app/sec", "adopted"),
                ("PersistentVolumeClaim", "app/data", "adopted"),
            ],
        ),
        # A pod no upper pod of this node names: another tensile-kube node's, or orphaned.
        ({"Pod": [lower_pod("stray")]}, None, [("Pod", "app/stray", "unmatched")]),
        # Same name, other containers: not made for this upper pod.
        (
            {"Pod": [lower_pod(containers=("main", "sidecar"))]},
            None,
            [("Pod", "app/web", "mismatch")],
        ),
        # Created an hour before the upper pod of its name: made for an earlier pod of that
        # name (a StatefulSet's, re-created while no virtual node ran); within the clocks'
        # skew it is this one's.
        (
            {"Pod": [born(lower_pod(), "2026-01-01T11:00:00Z")]},
            [born(upper_pod(), "2026-01-01T12:00:00Z")],
            [("Pod", "app/web", "mismatch")],
        ),
        (
            {"Pod": [born(lower_pod(), "2026-01-01T11:59:30Z")]},
            [born(upper_pod(), "2026-01-01T12:00:00Z")],
            [("Pod", "app/web", "adopted")],
        ),
        # Not tensile-kube's shape: no virtual-pod label, or tensile's own marks.
        ({"Pod": [{**lower_pod(), "metadata": _meta("web")}]}, None, []),
        ({"Pod": [ours(lower_pod())]}, None, []),
        # Copies: only those an adopted pod uses; none without `global`.
        ({"ConfigMap": [copy_("cfg")]}, [], [("ConfigMap", "app/cfg", "unused")]),
        ({"ConfigMap": [copy_("gone")]}, None, [("ConfigMap", "app/gone", "unmatched")]),
        (
            {"ConfigMap": [{"metadata": _meta("cfg")}], "Pod": [lower_pod()]},
            None,
            [("Pod", "app/web", "adopted")],
        ),
        ({"ConfigMap": [ours(copy_("cfg"))]}, None, []),
        # An immutable copy whose content differs would have to be replaced: left.
        (
            {"Pod": [lower_pod()], "ConfigMap": [copy_("cfg", data={"a": "0"}, immutable=True)]},
            None,
            [("Pod", "app/web", "adopted"), ("ConfigMap", "app/cfg", "mismatch")],
        ),
        (
            {"Pod": [lower_pod()], "ConfigMap": [copy_("cfg", data={"a": "1"}, immutable=True)]},
            None,
            [("Pod", "app/web", "adopted"), ("ConfigMap", "app/cfg", "adopted")],
        ),
        # A Service copy: no selector of its own, the upper one's in `labelSelector`, and a
        # pod it selects adopted with it.
        (
            {"Pod": [lower_pod()], "Service": [LOWER_SERVICE]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "adopted")],
        ),
        # ... but no pod it selects is adopted (none below, or the upper pod of that name
        # is not selected): a Service taken by its name alone would be anyone's.
        ({"Service": [LOWER_SERVICE]}, None, [("Service", "app/web", "unused")]),
        (
            {"Pod": [lower_pod()], "Service": [LOWER_SERVICE]},
            [upper_pod(labels={"app": "other"})],
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "unused")],
        ),
        # Another selector kept, none kept, or one that is not JSON of a map of strings.
        (
            {"Pod": [lower_pod()], "Service": [service_copy(selector='{"app":"other"}')]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "mismatch")],
        ),
        (
            {"Pod": [lower_pod()], "Service": [service_copy(selector=None)]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "mismatch")],
        ),
        (
            {"Pod": [lower_pod()], "Service": [service_copy(selector='["app"]')]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "mismatch")],
        ),
        (
            {"Pod": [lower_pod()], "Service": [service_copy(selector='{"app":1}')]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "mismatch")],
        ),
        # An upper Service without a selector (tensile-kube kept none) selects no pod.
        (
            {"Pod": [lower_pod()], "Service": [service_copy("bare", selector=None)]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/bare", "unused")],
        ),
        # A selector of its own, or a copy tensile's mirror would replace (headless).
        (
            {
                "Pod": [lower_pod()],
                "Service": [{**LOWER_SERVICE, "spec": {"selector": {"app": "web"}}}],
            },
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "mismatch")],
        ),
        (
            {"Pod": [lower_pod()], "Service": [service_copy(clusterIP="None")]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "mismatch")],
        ),
        ({"Service": [copy_("db", spec={})]}, None, [("Service", "app/db", "unmatched")]),
        # Same containers by name, another image: not made for this upper pod.
        ({"Pod": [lower_pod(image="nginx:evil")]}, None, [("Pod", "app/web", "mismatch")]),
        (
            {"Pod": [lower_pod(containers=("main", "sidecar"))]},
            [upper_pod(containers=("main", "sidecar"), image="nginx:1.27")],
            [("Pod", "app/web", "mismatch")],
        ),
        # The operator's cut-off: made at or after it (or of no known time), someone
        # else's, whatever it looks like.
        (
            {"Pod": [born(lower_pod(), "2026-01-01T12:00:00Z")]},
            [born(upper_pod(), "2026-01-01T12:00:00Z")],
            [("Pod", "app/web", "after-cutoff")],
        ),
        (
            {"Pod": [lower_pod()], "ConfigMap": [born(copy_("cfg"), "2026-01-01T12:30:00Z")]},
            None,
            [("Pod", "app/web", "adopted"), ("ConfigMap", "app/cfg", "after-cutoff")],
        ),
        (
            {"Pod": [lower_pod()], "Service": [born(LOWER_SERVICE, "2026-01-02T00:00:00Z")]},
            None,
            [("Pod", "app/web", "adopted"), ("Service", "app/web", "after-cutoff")],
        ),
        (
            {"Pod": [born(lower_pod(), "")]},
            None,
            [("Pod", "app/web", "after-cutoff")],
        ),
        # Endpoints copies: superseded by EndpointSlices, listed.
        ({"Endpoints": [copy_("web")]}, None, [("Endpoints", "app/web", "superseded")]),
        # kube-system: tensile-kube forwarded and mirrored nothing there.
        (
            {
                "Pod": [
                    {
                        **lower_pod(),
                        "metadata": {**lower_pod()["metadata"], "namespace": "kube-system"},
                    }
                ]
            },
            None,
            [],
        ),
    ],
)
def test_plan(
    lower: dict[str, list[dict[str, Any]]],
    pods: list[dict[str, Any]] | None,
    expected: list[tuple[str, str, str]],
) -> None:
    assert outcome(lower=lower, pods=pods) == expected


def test_a_service_account_token_secret_is_never_adopted() -> None:
    pod = upper_pod()
    pod["spec"]["volumes"].append({"name": "t", "secret": {"secretName": "tok"}})
    found = outcome(lower={"Pod": [lower_pod()], "Secret": [copy_("tok")]}, pods=[pod])
    assert found == [("Pod", "app/web", "adopted"), ("Secret", "app/tok", "mismatch")]


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        (
            tensilekube.Scope(owner=OWNER, mirror_services=False),
            ("Service", "app/web", "not-mirrored"),
        ),
        (
            tensilekube.Scope(
                owner=OWNER,
                service_selection=services.ServiceSelection(namespaces=frozenset({"x"})),
            ),
            ("Service", "app/web", "unmatched"),
        ),
    ],
)
def test_services_this_node_does_not_mirror_are_left(
    scope: tensilekube.Scope, expected: tuple[str, str, str]
) -> None:
    assert outcome(lower={"Service": [LOWER_SERVICE]}, scope=scope) == [expected]


def test_claims_without_pv_controllers_are_left() -> None:
    scope = tensilekube.Scope(owner=OWNER, mirror_claims=False)
    found = outcome(
        lower={"Pod": [lower_pod()], "PersistentVolumeClaim": [copy_("data")]}, scope=scope
    )
    assert ("PersistentVolumeClaim", "app/data", "not-mirrored") in found


def test_the_patch_adds_the_owner_marks_guarded_by_the_lower_uid() -> None:
    decided = tensilekube.plan(
        scope=SCOPE,
        upper_pods=[upper_pod()],
        lower={"Pod": [lower_pod()], "ConfigMap": [copy_("cfg")]},
        upper=UPPER,
        created_before=CUTOFF,
    )
    pod_patch, copy_patch = (a.patch["metadata"] for a in decided.adopt)
    labels, annotations = ownership.owner_marks(OWNER)
    assert pod_patch["uid"] == "uid-web"
    assert pod_patch["labels"] == labels
    assert pod_patch["annotations"] == {
        **annotations,
        ownership.UPPER_NAMESPACE_ANNOTATION: NS,
        ownership.UPPER_UID_ANNOTATION: "upper-web",
    }
    assert ownership.UPPER_UID_ANNOTATION not in copy_patch["annotations"]
    # Patched, the pod is this node's (what the pod controller and the mirrors check).
    patched = copy.deepcopy(lower_pod())
    for key in ("labels", "annotations"):
        patched["metadata"].setdefault(key, {}).update(pod_patch[key])
    assert ownership.is_owned(patched, owner=OWNER)


def test_adopting_twice_finds_nothing_left() -> None:
    decided = tensilekube.plan(
        scope=SCOPE,
        upper_pods=[upper_pod()],
        lower={"Pod": [lower_pod()]},
        upper=UPPER,
        created_before=CUTOFF,
    )
    patched = copy.deepcopy(lower_pod())
    for key in ("labels", "annotations"):
        patched["metadata"].setdefault(key, {}).update(decided.adopt[0].patch["metadata"][key])
    assert outcome(lower={"Pod": [patched]}) == []


BEFORE = "--adopt-tensile-kube-before=2026-01-01T12:00:00Z"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], MigrationSettings()),
        (
            ["--adopt-tensile-kube", BEFORE],
            MigrationSettings(adopt_tensile_kube=True, adopt_before=CUTOFF),
        ),
        (
            ["--adopt-tensile-kube=true", "--adopt-tensile-kube-before=2026-01-01T13:00:00+01:00"],
            MigrationSettings(adopt_tensile_kube=True, adopt_before=CUTOFF),
        ),
        (["--adopt-tensile-kube=false"], MigrationSettings()),
    ],
)
def test_the_flag(flags: list[str], expected: MigrationSettings) -> None:
    settings = cli.parse(["--client-kubeconfig=lower.kubeconfig", *flags], env={})
    assert settings.migration == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--namespace-prefix=t1-", BEFORE], "cannot be used with --namespace-prefix"),
        (["--provider=mock", BEFORE], "needs --provider=k8s"),
        (["--adopt-tensile-kube=maybe", BEFORE], "adopt-tensile-kube"),
        ([], "needs --adopt-tensile-kube-before=<RFC 3339 time>"),
        (["--adopt-tensile-kube-before=2026-01-01"], "must be an RFC 3339 time with its offset"),
        (["--adopt-tensile-kube-before=yesterday"], "must be an RFC 3339 time"),
        (["--adopt-tensile-kube-before=2999-01-01T00:00:00Z"], "is in the future"),
    ],
)
def test_bad_combinations(flags: list[str], message: str) -> None:
    argv = ["--client-kubeconfig=lower.kubeconfig", "--adopt-tensile-kube", *flags]
    with pytest.raises(serving_flags.UsageError, match=message):
        cli.parse(argv, env={})


def test_a_cutoff_without_the_adoption_is_refused() -> None:
    with pytest.raises(serving_flags.UsageError, match=r"needs --adopt-tensile-kube$"):
        cli.parse(["--client-kubeconfig=lower.kubeconfig", BEFORE], env={})


# -- the adoption's I/O, on FakeApi (its lists, patches and Events in isolation; the real
# clusters: tests/e2e/test_tensile_kube_adoption.py) ---------------------------------------


def _adoption(
    upper: FakeApi, lower: FakeApi, *, namespace: str | None = None
) -> TensileKubeAdoption:
    return TensileKubeAdoption(
        upper=upper,
        lower=lower,
        scope=SCOPE,
        recorder=EventRecorder(upper, component="tk-node/adoption", host="tk-node"),
        created_before=CUTOFF,
        namespace=namespace,
    )


def _clusters(*namespaces: str) -> tuple[FakeApi, FakeApi]:
    upper, lower = FakeApi(name="upper"), FakeApi(name="lower")
    for ns in namespaces:
        pod = upper_pod()
        pod["metadata"]["namespace"] = ns
        upper.put(PODS, pod)
        made = lower_pod()
        made["metadata"]["namespace"] = ns
        lower.put(PODS, made)
    return upper, lower


async def test_adoption_patches_the_pods_and_records_what_it_left() -> None:
    upper, lower = _clusters("app", "other")
    lower.put(CONFIG_MAPS, copy_("stray"))
    adoption = _adoption(upper, lower, namespace="app")
    await adoption.start()  # every replica starts it: nothing is read or written
    assert lower.requests == []
    assert upper.requests == []
    assert not adoption.ready()
    await adoption.take_over()
    patched = [r.target.namespace for r in lower.requests_of("PATCH", "pods")]
    assert patched == ["app"]  # the pod of another namespace is not this node's (--namespace)
    adopted = lower.get(PODS, "web", namespace="app")
    assert adopted is not None
    assert ownership.is_owned(adopted, owner=OWNER)
    left = lower.get(PODS, "web", namespace="other")
    assert left is not None
    assert not ownership.is_owned(left, owner=OWNER)
    assert adoption.ready()
    reasons = sorted(e["reason"] for e in upper.objects(EVENTS))
    assert reasons == ["TensileKubeAdopted", "TensileKubeLeftovers"]
    assert ADOPTION_OBJECTS.labels(kind="Pod", outcome="unmatched")._value.get() == 1


async def test_an_object_changed_under_the_patch_is_left_and_the_start_goes_on() -> None:
    upper, lower = _clusters("app")
    lower.fail("PATCH", "pods", error=status_error(409, reason="Conflict", message="uid differs"))
    adoption = _adoption(upper, lower)
    await adoption.take_over()
    assert adoption.ready()
    assert not ownership.is_owned(lower.get(PODS, "web", namespace="app") or {}, owner=OWNER)


async def test_a_lower_cluster_that_cannot_be_read_stops_the_start() -> None:
    upper, lower = _clusters("app")
    lower.fail("GET", "pods", error=unreachable())
    with pytest.raises(StartupError, match="--adopt-tensile-kube"):
        await _adoption(upper, lower).take_over()


class Closed:
    """A fence that never opens (a replica that does not hold the Lease)."""

    def may_write(self) -> bool:
        return False

    def refusal(self) -> str:
        return "not leading"


async def test_a_replica_that_may_not_write_adopts_nothing() -> None:
    """The adoption writes through the node's fenced lower client: a process that does
    not hold the Lease has its patch refused before it is sent, and stops (it could not
    adopt, so it must not go on as if it had)."""
    upper, lower = _clusters("app")
    adoption = TensileKubeAdoption(
        upper=upper,
        lower=lower.fenced(Closed()),
        scope=SCOPE,
        recorder=EventRecorder(upper, component="tk-node/adoption", host="tk-node"),
        created_before=CUTOFF,
    )
    with pytest.raises(StartupError, match="not sent: not leading"):
        await adoption.take_over()
    assert lower.requests_of("PATCH") == []
    assert not ownership.is_owned(lower.get(PODS, "web", namespace="app") or {}, owner=OWNER)
