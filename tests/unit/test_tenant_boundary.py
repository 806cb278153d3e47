"""What a tenant may do below (issue 22, sections 1 to 3): the pure decisions, as tables.
Service exposure (`services`), priority classes (`translate`), the lower administrator's
namespace marks (`namespaces.marks_patch`) and the flags that set them (`cli`)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tensile.contracts import names, ownership, podpolicy
from tensile.kube.mirror.spec import Patch, Replace
from tensile.serving.flags import UsageError
from vnode import cli
from vnode.providers.k2k import namespaces, naming, services, translate

OWNER = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
OTHER_NODE = ownership.NodeIdentity(node_name="vn-sibling", cluster_id=OWNER.cluster_id)
OTHER = ownership.NodeIdentity(node_name="vn-a", cluster_id="bbbbbbbb-0000-4000-8000-000000000002")
BASE = ["--client-kubeconfig=lower.kubeconfig"]
ONLY_CLUSTER_IP = services.ServiceExposure()
NO_BALANCERS = services.ServiceExposure(types=frozenset({"ClusterIP", "NodePort"}))
INTERNAL = "networking.example.com/load-balancer-internal"
EVERY_TYPE = services.ServiceExposure(
    types=frozenset({"ClusterIP", "NodePort", "LoadBalancer"}), annotations=(INTERNAL,)
)
PINNING = {
    "metallb.universe.tf/loadBalancerIPs": "203.0.113.9",
    "metallb.universe.tf/address-pool": "production",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
}
"""Annotations a tenant may write to pin an address or a pool of the lower network."""


def upper_service(service_type: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web",
            "namespace": "app",
            "uid": "u-1",
            "annotations": {
                INTERNAL: "true",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                services.cluster_ip_annotation("vn-b"): "10.0.0.9",
            },
        },
        "spec": {
            "type": service_type,
            "selector": {"app": "web"},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "nodePort": 30080}],
            "loadBalancerSourceRanges": ["10.0.0.0/8"],
            "loadBalancerClass": "example.com/internal",
            "externalTrafficPolicy": "Local",
            "allocateLoadBalancerNodePorts": False,
            "externalIPs": ["203.0.113.7"],
            "loadBalancerIP": "203.0.113.8",
            "healthCheckNodePort": 32000,
            **spec,
        },
    }


def lower(upper: dict[str, Any], exposure: services.ServiceExposure) -> dict[str, Any]:
    return services.lower_service(upper, owner=OWNER, prefix="", exposure=exposure)


# -- Service exposure ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("upper_type", "exposure", "lower_type", "fields"),
    [
        # Default: every exposure type is ClusterIP below, with nothing of its exposure.
        ("LoadBalancer", ONLY_CLUSTER_IP, "ClusterIP", set()),
        ("NodePort", ONLY_CLUSTER_IP, "ClusterIP", set()),
        ("ClusterIP", ONLY_CLUSTER_IP, "ClusterIP", set()),
        # Allowed: the type and what restricts or places its exposure.
        (
            "LoadBalancer",
            EVERY_TYPE,
            "LoadBalancer",
            {
                "externalTrafficPolicy",
                "loadBalancerSourceRanges",
                "loadBalancerClass",
                "allocateLoadBalancerNodePorts",
            },
        ),
        ("NodePort", EVERY_TYPE, "NodePort", {"externalTrafficPolicy"}),
        ("ClusterIP", EVERY_TYPE, "ClusterIP", set()),
        # NodePort allowed, LoadBalancer not: the load balancer is ClusterIP below.
        (
            "LoadBalancer",
            services.ServiceExposure(types=frozenset({"ClusterIP", "NodePort"})),
            "ClusterIP",
            set(),
        ),
    ],
)
def test_the_lower_type_and_the_exposure_fields_that_travel(
    upper_type: str, exposure: services.ServiceExposure, lower_type: str, fields: set[str]
) -> None:
    upper = upper_service(upper_type)
    before = copy.deepcopy(upper)
    spec = lower(upper, exposure)["spec"]
    assert upper == before
    assert spec["type"] == lower_type
    exposure_fields = {
        "externalTrafficPolicy",
        "loadBalancerSourceRanges",
        "loadBalancerClass",
        "allocateLoadBalancerNodePorts",
    }
    assert exposure_fields & spec.keys() == fields
    # Never: the upper cluster's node ports and addresses.
    assert not any("nodePort" in p for p in spec["ports"])
    assert not {"externalIPs", "loadBalancerIP", "healthCheckNodePort"} & spec.keys()


@pytest.mark.parametrize(
    ("upper_type", "exposure", "copied"),
    [
        ("LoadBalancer", EVERY_TYPE, True),
        ("NodePort", EVERY_TYPE, True),
        ("LoadBalancer", ONLY_CLUSTER_IP, False),
        ("ClusterIP", EVERY_TYPE, False),
    ],
)
def test_annotations_travel_only_with_an_allowed_exposure_type(
    upper_type: str, exposure: services.ServiceExposure, copied: bool
) -> None:
    annotations = lower(upper_service(upper_type), exposure)["metadata"]["annotations"]
    assert (INTERNAL in annotations) is copied
    assert (services.COPIED_ANNOTATIONS in annotations) is copied
    if copied:
        assert annotations[services.COPIED_ANNOTATIONS] == INTERNAL
    # kubectl's record and what virtual nodes write upstairs never go below.
    assert "kubectl.kubernetes.io/last-applied-configuration" not in annotations
    assert services.cluster_ip_annotation("vn-b") not in annotations
    assert annotations[ownership.UPPER_UID_ANNOTATION] == "u-1"


@pytest.mark.parametrize(
    ("allowed", "copied"),
    [
        # Default: none, whatever the type allows.
        ((), set()),
        ((INTERNAL,), {INTERNAL}),
        (
            ("service.beta.kubernetes.io/aws-load-balancer-*", "metallb.universe.tf/address-pool"),
            {
                "service.beta.kubernetes.io/aws-load-balancer-internal",
                "metallb.universe.tf/address-pool",
            },
        ),
        (
            ("metallb.universe.tf/*",),
            {"metallb.universe.tf/loadBalancerIPs", "metallb.universe.tf/address-pool"},
        ),
        (("*",), {INTERNAL, *PINNING}),
        # A key is a whole key, not a prefix.
        (("metallb.universe.tf/address",), set()),
    ],
)
def test_annotations_travel_only_as_the_lower_administrator_names_them(
    allowed: tuple[str, ...], copied: set[str]
) -> None:
    """Issue 31: annotations that pin addresses or pools of the lower network are filtered
    like loadBalancerIP; --lower-service-annotations names those that cross."""
    upper = upper_service("LoadBalancer")
    upper["metadata"]["annotations"].update(PINNING)
    exposure = services.ServiceExposure(types=EVERY_TYPE.types, annotations=allowed)
    annotations = lower(upper, exposure)["metadata"]["annotations"]
    assert {*PINNING, INTERNAL} & annotations.keys() == copied
    assert annotations.get(services.COPIED_ANNOTATIONS, "") == ",".join(sorted(copied))
    # kubectl's record and what virtual nodes write upstairs never go, even with *.
    assert "kubectl.kubernetes.io/last-applied-configuration" not in annotations
    assert services.cluster_ip_annotation("vn-b") not in annotations
    # A narrower list later: what it no longer names goes from the copy.
    narrower = services.ServiceExposure(types=EVERY_TYPE.types, annotations=())
    change = services.compare_service(served(lower(upper, exposure)), lower(upper, narrower))
    if copied:
        assert isinstance(change, Patch)
        assert {k for k, v in change.body["metadata"]["annotations"].items() if v is None} == {
            *copied,
            services.COPIED_ANNOTATIONS,
        }


def test_headless_and_external_name_are_copied_whatever_the_flag() -> None:
    headless = lower(upper_service("ClusterIP", clusterIP="None"), ONLY_CLUSTER_IP)
    assert headless["spec"] == {**headless["spec"], "type": "ClusterIP", "clusterIP": "None"}
    external = lower(
        upper_service("ExternalName", externalName="db.example.com", ports=[]), ONLY_CLUSTER_IP
    )
    assert external["spec"]["type"] == "ExternalName"
    assert external["spec"]["externalName"] == "db.example.com"


@pytest.mark.parametrize(
    ("upper_type", "exposure", "told"),
    [
        ("LoadBalancer", ONLY_CLUSTER_IP, True),
        ("NodePort", ONLY_CLUSTER_IP, True),
        ("LoadBalancer", NO_BALANCERS, True),
        ("LoadBalancer", EVERY_TYPE, False),
        ("ClusterIP", ONLY_CLUSTER_IP, False),
        ("ExternalName", ONLY_CLUSTER_IP, False),
    ],
)
def test_a_narrowed_type_is_told(
    upper_type: str, exposure: services.ServiceExposure, told: bool
) -> None:
    message = exposure.narrowed(upper_service(upper_type), node_name="vn-a")
    assert (message is not None) is told
    if message is not None:
        assert f"type {upper_type} as ClusterIP" in message
        assert "--lower-service-types=" in message
        assert "vn-a" in message


def served(desired: dict[str, Any]) -> dict[str, Any]:
    """`desired` as the lower apiserver shows it: defaults filled in, node ports allocated."""
    shown = copy.deepcopy(desired)
    spec = shown["spec"]
    spec["clusterIP"] = "10.97.0.4"
    spec["internalTrafficPolicy"] = "Cluster"
    if spec["type"] in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")
        for port in spec["ports"]:
            port["nodePort"] = 31555
    if spec["type"] == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)
    return shown


@pytest.mark.parametrize(
    ("before", "after", "kind", "spec_patch"),
    [
        # Narrowed when the flag narrows: in place, exposure fields nulled, node ports freed.
        (
            ("LoadBalancer", EVERY_TYPE),
            ("LoadBalancer", ONLY_CLUSTER_IP),
            Patch,
            {
                "type": "ClusterIP",
                "externalTrafficPolicy": None,
                "loadBalancerSourceRanges": None,
                "loadBalancerClass": None,
                "allocateLoadBalancerNodePorts": None,
                "healthCheckNodePort": None,
                "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
            },
        ),
        # Widened when the flag widens: in place; the lower cluster allocates node ports.
        (
            ("NodePort", ONLY_CLUSTER_IP),
            ("NodePort", EVERY_TYPE),
            Patch,
            {
                "type": "NodePort",
                "externalTrafficPolicy": "Local",
                "loadBalancerSourceRanges": None,
                "loadBalancerClass": None,
                "allocateLoadBalancerNodePorts": None,
                "healthCheckNodePort": None,
            },
        ),
        # The same flag: nothing to do once the apiserver defaulted the copy.
        (("LoadBalancer", EVERY_TYPE), ("LoadBalancer", EVERY_TYPE), type(None), None),
        (("LoadBalancer", ONLY_CLUSTER_IP), ("LoadBalancer", ONLY_CLUSTER_IP), type(None), None),
    ],
)
def test_a_flag_change_patches_existing_copies_in_place(
    before: tuple[str, services.ServiceExposure],
    after: tuple[str, services.ServiceExposure],
    kind: type,
    spec_patch: dict[str, Any] | None,
) -> None:
    current = served(lower(upper_service(before[0]), before[1]))
    change = services.compare_service(current, lower(upper_service(after[0]), after[1]))
    assert isinstance(change, kind)
    if isinstance(change, Patch):
        assert change.body["spec"] == spec_patch


def test_annotations_copied_before_are_removed_once_they_no_longer_travel() -> None:
    current = served(lower(upper_service("LoadBalancer"), EVERY_TYPE))
    current["metadata"]["annotations"]["lower.example.com/own"] = "kept"
    narrowed = lower(upper_service("LoadBalancer"), ONLY_CLUSTER_IP)
    change = services.compare_service(current, narrowed)
    assert isinstance(change, Patch)
    annotations = change.body["metadata"]["annotations"]
    assert annotations[INTERNAL] is None
    assert annotations[services.COPIED_ANNOTATIONS] is None
    assert "lower.example.com/own" not in annotations  # the lower cluster's own: left alone
    # An upper annotation removed while the type travels goes too.
    gone = upper_service("LoadBalancer")
    del gone["metadata"]["annotations"][INTERNAL]
    change = services.compare_service(current, lower(gone, EVERY_TYPE))
    assert isinstance(change, Patch)
    assert change.body["metadata"]["annotations"][INTERNAL] is None


@pytest.mark.parametrize(
    ("current_spec", "desired_spec", "reason"),
    [
        ({"loadBalancerClass": "a.example/x"}, {"loadBalancerClass": "b.example/y"}, "Class"),
        ({}, {"type": "ExternalName", "externalName": "x.example.com", "ports": []}, "type"),
    ],
)
def test_what_kubernetes_does_not_change_in_place_is_replaced(
    current_spec: dict[str, Any], desired_spec: dict[str, Any], reason: str
) -> None:
    current = served(lower(upper_service("LoadBalancer", **current_spec), EVERY_TYPE))
    change = services.compare_service(
        current, lower(upper_service("LoadBalancer", **desired_spec), EVERY_TYPE)
    )
    assert isinstance(change, Replace)
    assert reason in change.reason


def test_source_ranges_and_traffic_policy_are_patched_on_an_allowed_load_balancer() -> None:
    current = served(lower(upper_service("LoadBalancer"), EVERY_TYPE))
    desired = lower(
        upper_service(
            "LoadBalancer", loadBalancerSourceRanges=["192.0.2.0/24"], externalTrafficPolicy=None
        ),
        EVERY_TYPE,
    )
    change = services.compare_service(current, desired)
    assert isinstance(change, Patch)
    assert change.body["spec"] == {
        "loadBalancerSourceRanges": ["192.0.2.0/24"],
        "externalTrafficPolicy": None,
    }


# -- siblings of other settings (issue 31, section 3) --------------------------------------


@pytest.mark.parametrize(
    ("upper_type", "stamped"),
    [("LoadBalancer", True), ("NodePort", True), ("ClusterIP", False), ("ExternalName", False)],
)
def test_copies_the_exposure_flags_decide_record_them(upper_type: str, stamped: bool) -> None:
    for exposure in (ONLY_CLUSTER_IP, EVERY_TYPE):
        annotations = lower(upper_service(upper_type), exposure)["metadata"]["annotations"]
        assert annotations.get(services.POLICY_ANNOTATION) == (exposure.policy if stamped else None)
    assert ONLY_CLUSTER_IP.policy != EVERY_TYPE.policy
    assert EVERY_TYPE.policy != services.ServiceExposure(types=EVERY_TYPE.types).policy


def sibling_conflict(exposure: services.ServiceExposure) -> Any:
    kind = services.service_spec(
        tenancy=naming.NodeTenancy(owner=OWNER, prefix=""),
        selection=services.ServiceSelection(),
        exposure=exposure,
    )
    assert kind.sibling_conflict is not None
    return kind.sibling_conflict


@pytest.mark.parametrize(
    ("upper_type", "theirs", "ours", "left"),
    [
        # The sibling would write a NodePort copy as ClusterIP, or the other way round.
        ("NodePort", ONLY_CLUSTER_IP, NO_BALANCERS, True),
        ("LoadBalancer", EVERY_TYPE, ONLY_CLUSTER_IP, True),
        # The same settings: the copy is kept like our own, as before.
        ("LoadBalancer", EVERY_TYPE, EVERY_TYPE, False),
        # Settings that do not decide the copy: no quarrel.
        ("ClusterIP", ONLY_CLUSTER_IP, EVERY_TYPE, False),
    ],
)
def test_a_siblings_copy_of_other_settings_is_left_to_its_maker(
    upper_type: str,
    theirs: services.ServiceExposure,
    ours: services.ServiceExposure,
    left: bool,
) -> None:
    upper = upper_service(upper_type)
    made = services.lower_service(upper, owner=OTHER_NODE, prefix="", exposure=theirs)
    why = sibling_conflict(ours)(served(made), upper)
    assert (why is not None) is left
    if why is not None:
        assert theirs.policy in why
        assert ours.policy in why
        assert "--lower-service-types" in why


def test_a_copy_from_before_the_record_counts_as_another_policys() -> None:
    upper = upper_service("LoadBalancer")
    made = served(services.lower_service(upper, owner=OTHER_NODE, prefix="", exposure=EVERY_TYPE))
    del made["metadata"]["annotations"][services.POLICY_ANNOTATION]
    why = sibling_conflict(EVERY_TYPE)(made, upper)
    assert why is not None
    assert "(none)" in why


def test_the_record_goes_when_the_settings_no_longer_decide_the_copy() -> None:
    current = served(lower(upper_service("LoadBalancer"), EVERY_TYPE))
    change = services.compare_service(current, lower(upper_service("ClusterIP"), EVERY_TYPE))
    assert isinstance(change, Patch)
    assert change.body["metadata"]["annotations"][services.POLICY_ANNOTATION] is None


# -- priority classes ------------------------------------------------------------------

MAPPED = translate.TranslationPolicy(
    node_name="vn-a",
    cluster_id=OWNER.cluster_id,
    node_labels={},
    priority_classes=(("tenant-high", "lower-gold"), ("system-cluster-critical", "tenant-top")),
)


@pytest.mark.parametrize(
    ("upper_class", "lower_class", "note"),
    [
        ("tenant-high", "lower-gold", None),
        # The administrator may map a tenant's system class onto a class of theirs.
        ("system-cluster-critical", "tenant-top", None),
        ("system-node-critical", None, "reserves for its own critical pods"),
        ("tenant-low", None, "not mapped below (--priority-class-map)"),
        (None, None, None),
        ("", None, None),
        (7, None, None),
    ],
)
def test_priority_classes_go_below_only_mapped(
    upper_class: object, lower_class: str | None, note: str | None
) -> None:
    got_class, got_note = podpolicy.lower_class(
        podpolicy.PRIORITY_CLASSES, upper_class, policy=MAPPED.pods
    )
    assert got_class == lower_class
    if note is None:
        assert got_note is None
    else:
        assert got_note is not None
        assert note in got_note
        assert "default priority" in got_note


@pytest.mark.parametrize(
    ("upper_class", "expected"),
    [("tenant-high", "lower-gold"), ("system-node-critical", None), ("tenant-low", None)],
)
def test_the_lower_pod_carries_the_mapped_class_and_never_priority_or_preemption(
    upper_class: str, expected: str | None
) -> None:
    upper = {
        "metadata": {"name": "p", "namespace": "app", "uid": "u"},
        "spec": {
            "priorityClassName": upper_class,
            "priority": 2000001000,
            "preemptionPolicy": "PreemptLowerPriority",
            "containers": [{"name": "c", "image": "nginx"}],
        },
    }
    spec = translate.lower_pod(upper, policy=MAPPED)["spec"]
    assert spec.get("priorityClassName") == expected
    assert "priority" not in spec  # the lower Priority admission recomputes both
    assert "preemptionPolicy" not in spec


# -- the lower administrator's namespace marks ----------------------------------------


def namespace(*, owner: ownership.NodeIdentity | None, **extra: dict[str, str]) -> dict[str, Any]:
    labels, annotations = (
        ownership.namespace_marks(owner=owner, upper_namespace="app") if owner else ({}, {})
    )
    labels.update(extra.get("labels", {}))
    annotations.update(extra.get("annotations", {}))
    return {"metadata": {"name": "app", "labels": labels, "annotations": annotations}}


WHITELIST = "scheduler.alpha.kubernetes.io/tolerationsWhitelist"


@pytest.mark.parametrize(
    ("existing", "patch"),
    [
        # Made by tensile for this upper cluster, before the flags: given what it lacks.
        (
            namespace(owner=OWNER),
            {"metadata": {"labels": {"tier": "tenants"}, "annotations": {WHITELIST: "[]"}}},
        ),
        # A value the flag changed is set again; keys not named are never removed.
        (
            namespace(
                owner=OWNER, labels={"tier": "old", "mine": "x"}, annotations={WHITELIST: "[]"}
            ),
            {"metadata": {"labels": {"tier": "tenants"}}},
        ),
        (namespace(owner=OWNER, labels={"tier": "tenants"}, annotations={WHITELIST: "[]"}), None),
        # Someone else's (the administrator's own, another upper cluster's): theirs to label.
        (namespace(owner=None), None),
        (namespace(owner=OTHER), None),
    ],
)
def test_namespaces_tensile_made_get_the_marks_they_lack(
    existing: dict[str, Any], patch: dict[str, Any] | None
) -> None:
    got = namespaces.marks_patch(
        existing, owner=OWNER, labels={"tier": "tenants"}, annotations={WHITELIST: "[]"}
    )
    assert got == patch


# -- flags -----------------------------------------------------------------------------


def test_the_defaults_expose_nothing_map_no_class_and_mark_no_namespace() -> None:
    settings = cli.parse(BASE, env={})
    assert settings.controllers.lower_service_types == ("ClusterIP",)
    assert settings.pods.priority_class_map == ()
    assert settings.pods.scheduler_name_map == ()
    assert settings.pods.runtime_class_map == ()
    assert settings.pods.allowed_volume_types == frozenset()
    assert settings.controllers.lower_service_annotations == ()
    assert settings.pods.lower_namespace_labels == ()
    assert settings.pods.lower_namespace_annotations == ()


def test_good_boundary_flags() -> None:
    whitelist = '[{"operator":"Exists","effect":"NoExecute"},{"key":"a","operator":"Exists"}]'
    settings = cli.parse(
        [
            *BASE,
            "--lower-service-types=LoadBalancer, NodePort",
            "--priority-class-map=tenant-high=lower-gold,system-cluster-critical=tenant-top",
            "--scheduler-name-map=batch-profile=volcano, default-scheduler=tenant-scheduler",
            "--runtime-class-map=sandboxed=gvisor",
            "--allowed-volume-types=nfs, csi,nfs",
            "--lower-service-annotations=example.com/internal,"
            "service.beta.kubernetes.io/aws-load-balancer-*,example.org/*",
            "--lower-namespace-labels=team=tenants,example.com/tier=b",
            "--lower-namespace-labels=empty=",
            f"--lower-namespace-annotations={WHITELIST}={whitelist},"
            r"scheduler.alpha.kubernetes.io/node-selector=pool=tenants\,zone=a",
        ],
        env={},
    )
    assert settings.controllers.lower_service_types == ("ClusterIP", "LoadBalancer", "NodePort")
    assert settings.pods.priority_class_map == (
        ("tenant-high", "lower-gold"),
        ("system-cluster-critical", "tenant-top"),
    )
    assert settings.pods.scheduler_name_map == (
        ("batch-profile", "volcano"),
        ("default-scheduler", "tenant-scheduler"),
    )
    assert settings.pods.runtime_class_map == (("sandboxed", "gvisor"),)
    assert settings.pods.allowed_volume_types == frozenset({"nfs", "csi"})
    assert settings.controllers.lower_service_annotations == (
        "example.com/internal",
        "service.beta.kubernetes.io/aws-load-balancer-*",
        "example.org/*",
    )
    assert cli.parse(
        [*BASE, "--lower-service-annotations=*"], env={}
    ).controllers.lower_service_annotations == ("*",)
    assert settings.pods.lower_namespace_labels == (
        ("team", "tenants"),
        ("example.com/tier", "b"),
        ("empty", ""),
    )
    assert settings.pods.lower_namespace_annotations == (
        (WHITELIST, whitelist),
        ("scheduler.alpha.kubernetes.io/node-selector", "pool=tenants,zone=a"),
    )


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--lower-service-types=Ingress", "unknown type 'Ingress'"),
        ("--lower-service-types=ExternalName", "ExternalName is always copied"),
        ("--priority-class-map=high", "expected UPPER=LOWER, got 'high'"),
        ("--priority-class-map=High=x", "'High' in 'High=x' is not a PriorityClass name"),
        ("--priority-class-map=a=system-node-critical", "maps onto system-node-critical"),
        ("--priority-class-map=a=b,a=c", "a is mapped twice"),
        ("--scheduler-name-map=profile", "--scheduler-name-map: expected UPPER=LOWER"),
        ("--scheduler-name-map=a=My_Scheduler", "'My_Scheduler' in 'a=My_Scheduler' is not a"),
        ("--scheduler-name-map=a=b,a=c", "--scheduler-name-map: a is mapped twice"),
        ("--runtime-class-map=kata=", "'' in 'kata=' is not a RuntimeClass name"),
        ("--allowed-volume-types=hostPath", "--pod-security-level=privileged allows it"),
        ("--allowed-volume-types=secret", "secret volumes always go below"),
        ("--allowed-volume-types=NFS", "unknown volume type 'NFS' \\(known: awsElasticBlockStore"),
        ("--lower-service-annotations=a b", "'a b' is not an annotation key"),
        ("--lower-service-annotations=example.com/*/x", "is not an annotation key or a prefix"),
        ("--lower-service-annotations=example.com/", "'example.com/' is not an annotation key"),
        ("--lower-service-annotations=*.example.com/x", "not an annotation key"),
        ("--lower-namespace-labels=team", "expected key=value, got 'team'"),
        ("--lower-namespace-labels=team=a b", "the value of team is not a label value"),
        ("--lower-namespace-labels=team=" + "x" * 64, "longer than 63 characters"),
        ("--lower-namespace-labels=-team=a", "name part '-team' may hold only"),
        ("--lower-namespace-labels=Example.com/team=a", "prefix 'Example.com' is not a DNS"),
        ("--lower-namespace-labels=/team=a", "the prefix before '/' is empty"),
        ("--lower-namespace-labels=a=1,a=2", "a is given twice"),
        ("--lower-namespace-labels=tensile.io/managed=x", "written by the virtual node itself"),
        (
            "--lower-namespace-labels=pod-security.kubernetes.io/enforce=privileged",
            "--pod-security-level",
        ),
        ("--lower-namespace-annotations=a b=c", "key 'a b' is not a valid key"),
    ],
)
def test_bad_boundary_flags_are_refused_precisely(flag: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        cli.parse([*BASE, flag], env={})


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("team", None),
        ("example.com/team", None),
        ("a.b-c/x_y.z", None),
        ("x" * 63, None),
        ("x" * 64, "longer than 63"),
        ("team/", "name part is empty"),
        ("a/b/c", "prefix 'a/b'"),
        ("te am", "may hold only"),
    ],
)
def test_qualified_names(key: str, problem: str | None) -> None:
    got = names.qualified_name_problem(key)
    assert (got is None) if problem is None else (got is not None and problem in got)
