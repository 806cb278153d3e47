"""Translation of Services, EndpointSlices, claims and volumes across the boundary (pure),
and the flags that choose and configure their controllers."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tensile.contracts import ownership
from tensile.kube.mirror.siblings import SiblingPolicy
from tensile.kube.mirror.spec import Patch, Replace
from vnode import cli
from vnode.providers.k2k import naming, services, volumes
from vnode.settings import ControllerSettings

OWNER = ownership.NodeIdentity(node_name="vn-a", cluster_id="aaaaaaaa-0000-4000-8000-000000000001")
SIBLING = ownership.NodeIdentity(node_name="vn-b", cluster_id=OWNER.cluster_id)
TENANCY = naming.NodeTenancy(owner=OWNER, prefix="")
ALL = services.ServiceSelection()
BASE = ["--client-kubeconfig=lower.kubeconfig"]


def upper_service(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web",
            "namespace": "app",
            "uid": "u-1",
            "labels": {"tier": "front"},
            "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        },
        "spec": {
            "type": "NodePort",
            "selector": {"app": "web"},
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"],
            "ports": [
                {
                    "name": "http",
                    "protocol": "TCP",
                    "port": 80,
                    "targetPort": 8080,
                    "nodePort": 30080,
                }
            ],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            "externalTrafficPolicy": "Local",
            **spec,
        },
    }


def test_a_lower_service_has_no_selector_no_node_ports_and_a_clusterip_of_its_own() -> None:
    upper = upper_service()
    before = copy.deepcopy(upper)
    lower = services.lower_service(upper, owner=OWNER, prefix="t1-")
    assert upper == before
    spec = lower["spec"]
    assert "selector" not in spec
    assert "clusterIP" not in spec
    assert "externalTrafficPolicy" not in spec
    assert "ipFamilies" not in spec
    assert spec["type"] == "ClusterIP"  # by default nothing is exposed below (issue 22)
    assert spec["ports"] == [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]
    assert spec["sessionAffinity"] == "ClientIP"
    assert lower["metadata"]["namespace"] == "t1-app"
    assert lower["metadata"]["labels"]["tier"] == "front"
    annotations = lower["metadata"]["annotations"]
    assert "service.beta.kubernetes.io/aws-load-balancer-type" not in annotations
    assert annotations[ownership.UPPER_UID_ANNOTATION] == "u-1"
    assert ownership.is_owned(lower, owner=OWNER)


def test_headless_stays_headless_and_external_name_is_copied() -> None:
    headless = services.lower_service(upper_service(clusterIP="None"), owner=OWNER, prefix="")
    assert headless["spec"]["clusterIP"] == "None"
    external = services.lower_service(
        upper_service(type="ExternalName", externalName="db.example.com", ports=[]),
        owner=OWNER,
        prefix="",
    )
    assert external["spec"]["type"] == "ExternalName"
    assert external["spec"]["externalName"] == "db.example.com"


def test_a_lower_service_defaulted_by_its_apiserver_is_equal_to_its_translation() -> None:
    desired = services.lower_service(upper_service(), owner=OWNER, prefix="")
    served = copy.deepcopy(desired)
    served["spec"]["clusterIP"] = "10.97.3.4"
    served["spec"]["ports"][0]["nodePort"] = 31000
    served["spec"]["internalTrafficPolicy"] = "Cluster"
    assert services.compare_service(served, desired) is None


def test_a_port_change_keeps_the_lower_node_port_and_headlessness_replaces() -> None:
    wide = services.ServiceExposure(types=frozenset({"ClusterIP", "NodePort"}))
    served = services.lower_service(upper_service(), owner=OWNER, prefix="", exposure=wide)
    served["spec"]["ports"][0]["nodePort"] = 31000
    more = upper_service(
        ports=[
            {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
            {"name": "admin", "protocol": "TCP", "port": 9000},
        ]
    )
    change = services.compare_service(
        served, services.lower_service(more, owner=OWNER, prefix="", exposure=wide)
    )
    assert isinstance(change, Patch)
    assert change.body["spec"]["ports"][0]["nodePort"] == 31000
    assert "nodePort" not in change.body["spec"]["ports"][1]
    # Type changes between ClusterIP, NodePort and LoadBalancer are patched in place (see
    # tests/unit/test_tenant_boundary.py); headlessness cannot change in place.
    assert isinstance(
        services.compare_service(
            served, services.lower_service(upper_service(clusterIP="None"), owner=OWNER, prefix="")
        ),
        Replace,
    )


def test_removed_labels_are_removed_below() -> None:
    served = services.lower_service(upper_service(), owner=OWNER, prefix="")
    upper = upper_service()
    upper["metadata"]["labels"] = {}
    change = services.compare_service(served, services.lower_service(upper, owner=OWNER, prefix=""))
    assert isinstance(change, Patch)
    assert change.body["metadata"]["labels"]["tier"] is None


def test_which_services_are_mirrored() -> None:
    assert ALL.covers("app", "web")
    assert not ALL.covers("kube-system", "metrics-server")
    assert not ALL.covers("default", "kubernetes")
    assert ALL.covers("other", "kubernetes")
    only = services.ServiceSelection(namespaces=frozenset({"app"}))
    assert only.covers("app", "web")
    assert not only.covers("other", "web")


def _slice_by(manager: str | None, *, namespace: str = "app") -> dict[str, Any]:
    labels = {services.SERVICE_NAME_LABEL: "web"}
    if manager is not None:
        labels[services.MANAGED_BY_LABEL] = manager
    return {"metadata": {"namespace": namespace, "labels": labels}}


CONTROLLER = "endpointslice-controller.k8s.io"


@pytest.mark.parametrize(
    ("managers", "slice_", "considered"),
    [
        # The default (`*`, empty): every slice of a mirrored Service; what of it crosses is
        # verified (tests/unit/test_endpointslices.py), whatever its label says.
        ((), _slice_by("someone.example"), True),
        ((), _slice_by(None), True),
        # --endpointslice-managers narrows to the managers it names.
        ((CONTROLLER,), _slice_by(CONTROLLER), True),
        ((CONTROLLER,), _slice_by("endpointslicemirroring-controller.k8s.io"), False),
        ((CONTROLLER,), _slice_by(None), False),
        ((CONTROLLER, "someone.example"), _slice_by("someone.example"), True),
        # The Service selection still applies first.
        ((), _slice_by(CONTROLLER, namespace="kube-system"), False),
        ((CONTROLLER,), {"metadata": {"namespace": "app", "labels": {}}}, False),
    ],
)
def test_which_endpoint_slices_are_considered(
    managers: tuple[str, ...], slice_: dict[str, Any], considered: bool
) -> None:
    selection = services.ServiceSelection(slice_managers=frozenset(managers))
    assert selection.takes_slice(slice_) is considered


def test_a_service_being_deleted_is_not_mirrored() -> None:
    spec = services.service_spec(tenancy=TENANCY, selection=ALL)
    going = upper_service()
    assert spec.selects(going)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not spec.selects(going)


def test_the_cluster_ip_is_recorded_per_virtual_node() -> None:
    report = services.report_cluster_ip("vn-a")
    upper = upper_service()
    lower = {"spec": {"clusterIP": "10.97.3.4"}}
    patch = report(upper, lower)
    assert patch == {"metadata": {"annotations": {"cluster-ip.tensile.io/vn-a": "10.97.3.4"}}}
    upper["metadata"]["annotations"]["cluster-ip.tensile.io/vn-a"] = "10.97.3.4"
    assert report(upper, lower) is None
    assert report(upper, {"spec": {"type": "ExternalName"}}) is None
    long_name = "n" * 70
    assert services.cluster_ip_annotation(long_name).split("/")[1].startswith("h-")


def upper_slice(**extra: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-abcde",
            "namespace": "app",
            "uid": "s-1",
            "labels": {
                services.SERVICE_NAME_LABEL: "web",
                services.MANAGED_BY_LABEL: "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": [
            {
                "addresses": ["10.244.1.5"],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": "vn-a",
                "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "app", "uid": "p-1"},
                "hostname": "web-1",
            }
        ],
        **extra,
    }


def test_a_lower_slice_is_managed_by_us_and_names_no_upper_node_or_pod() -> None:
    lower = services.lower_slice(upper_slice(), owner=OWNER, prefix="")
    labels = lower["metadata"]["labels"]
    assert labels[services.MANAGED_BY_LABEL] == services.MANAGED_BY
    assert labels[services.SERVICE_NAME_LABEL] == "web"
    assert ownership.is_owned(lower, owner=OWNER)
    [endpoint] = lower["endpoints"]
    assert endpoint == {
        "addresses": ["10.244.1.5"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "hostname": "web-1",
    }
    assert services.compare_slice(lower, lower) is None
    gone = services.lower_slice(upper_slice(endpoints=None), owner=OWNER, prefix="")
    change = services.compare_slice(lower, gone)
    assert change == Patch({"endpoints": []})
    v6 = services.lower_slice(upper_slice(addressType="IPv6"), owner=OWNER, prefix="")
    assert isinstance(services.compare_slice(lower, v6), Replace)


def test_a_sibling_nodes_copy_is_kept_like_our_own_in_its_name() -> None:
    """Two virtual nodes of one upper cluster over one lower cluster make one copy between
    them, whichever comes first. Each keeps it (compare and patch, in its maker's name),
    so the copy stays up to date after its maker is gone; what the mirror does with a
    sibling's copy is in tests/unit/test_mirror_decide.py, and against real apiservers in
    tests/e2e/test_mirror.py (and of slices in tests/unit/test_endpointslices.py).
    Outside a node's --service-namespaces the siblings' copies are not its to keep."""
    spec = services.service_spec(tenancy=TENANCY, selection=ALL)
    shared = SiblingPolicy.of(spec, tenancy=TENANCY)
    theirs = services.lower_service(upper_service(), owner=SIBLING, prefix="")
    assert not TENANCY.owned(theirs)
    assert shared.keeps("app/web", theirs)
    stranger = {"metadata": {"name": "web", "namespace": "app", "labels": {}, "annotations": {}}}
    assert not shared.keeps("app/web", stranger)
    other_cluster = ownership.NodeIdentity(node_name="vn-a", cluster_id="another-cluster")
    assert not shared.keeps(
        "app/web", services.lower_service(upper_service(), owner=other_cluster, prefix="")
    )
    narrower = services.service_spec(
        tenancy=TENANCY, selection=services.ServiceSelection(namespaces=frozenset({"x"}))
    )
    assert not SiblingPolicy.of(narrower, tenancy=TENANCY).keeps("app/web", theirs)

    changed = upper_service(ports=[{"name": "http", "protocol": "TCP", "port": 81}])
    desired = shared.in_makers_name(spec.translate(changed), theirs)
    assert ownership.is_owned(desired, owner=SIBLING)
    assert not ownership.is_owned(desired, owner=OWNER)
    change = spec.compare(theirs, desired)
    assert isinstance(change, Patch)
    assert "metadata" not in change.body  # the copy stays its maker's
    assert [p["port"] for p in change.body["spec"]["ports"]] == [81]


# -- volumes ------------------------------------------------------------------------------


def upper_claim(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "data-db-0",
            "namespace": "app",
            "uid": "c-1",
            "labels": {"app": "db"},
            "annotations": annotations,
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "tensile",
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


OUR_CLASS = {"metadata": {"name": "tensile"}, "provisioner": volumes.PROVISIONER}


def test_a_claim_is_provisioned_only_when_selected_for_this_node_and_marked_for_us() -> None:
    ready = upper_claim(
        **{volumes.SELECTED_NODE: "vn-a", volumes.STORAGE_PROVISIONER: volumes.PROVISIONER}
    )
    assert volumes.wants_provisioning(ready, node_name="vn-a", storage_class=OUR_CLASS)
    assert not volumes.wants_provisioning(ready, node_name="vn-b", storage_class=OUR_CLASS)
    other = {"provisioner": "ebs.csi.aws.com"}
    assert not volumes.wants_provisioning(ready, node_name="vn-a", storage_class=other)
    unmarked = upper_claim(**{volumes.SELECTED_NODE: "vn-a"})
    assert not volumes.wants_provisioning(unmarked, node_name="vn-a", storage_class=OUR_CLASS)
    beta = upper_claim(
        **{volumes.SELECTED_NODE: "vn-a", volumes.BETA_STORAGE_PROVISIONER: volumes.PROVISIONER}
    )
    assert volumes.wants_provisioning(beta, node_name="vn-a", storage_class=OUR_CLASS)
    bound = copy.deepcopy(ready)
    bound["spec"]["volumeName"] = "pvc-c-1"
    assert not volumes.wants_provisioning(bound, node_name="vn-a", storage_class=OUR_CLASS)


def test_claims_naming_upper_objects_are_not_provisioned() -> None:
    clone = upper_claim()
    clone["spec"]["dataSource"] = {"kind": "PersistentVolumeClaim", "name": "other"}
    assert "spec.dataSource" in (volumes.provisioning_problem(clone) or "")
    picky = upper_claim()
    picky["spec"]["selector"] = {"matchLabels": {"disk": "ssd"}}
    assert "selector" in (volumes.provisioning_problem(picky) or "")
    assert volumes.provisioning_problem(upper_claim()) is None


def test_the_lower_claim_keeps_size_and_modes_and_never_the_upper_selected_node() -> None:
    upper = upper_claim(**{volumes.SELECTED_NODE: "vn-a"})
    upper["spec"]["volumeName"] = "pvc-c-1"
    lower = volumes.lower_claim(
        upper, owner=OWNER, prefix="t1-", storage_class="local", reclaim_policy="Delete"
    )
    assert lower["metadata"]["namespace"] == "t1-app"
    assert volumes.SELECTED_NODE not in lower["metadata"]["annotations"]
    assert lower["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "volumeMode": "Filesystem",
        "storageClassName": "local",
    }
    assert volumes.stands_for(lower, upper)
    assert not volumes.stands_for(lower, {"metadata": {"uid": "c-2"}})
    default = volumes.lower_claim(
        upper, owner=OWNER, prefix="", storage_class=None, reclaim_policy="Delete"
    )
    assert "storageClassName" not in default["spec"]


def test_claims_grow_below_but_never_shrink() -> None:
    lower = volumes.lower_claim(
        upper_claim(), owner=OWNER, prefix="", storage_class=None, reclaim_policy="Delete"
    )
    bigger = copy.deepcopy(lower)
    bigger["spec"]["resources"]["requests"]["storage"] = "2Gi"
    assert volumes.compare_claim(lower, bigger) == Patch(
        {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}
    )
    assert volumes.compare_claim(bigger, lower) is None
    assert volumes.compare_claim(lower, lower) is None


def volume_for(claim: dict[str, Any], *, policy: str | None, node: str = "vn-a") -> Any:
    """The upper PV of `node` standing for `claim`, with reclaim policy `policy`."""
    pv = volumes.upper_volume(
        claim, node_name=node, lower_claim_key="app/data-db-0", capacity="1Gi", reclaim_policy=""
    )
    if policy is not None:
        pv["spec"]["persistentVolumeReclaimPolicy"] = policy
    else:
        del pv["spec"]["persistentVolumeReclaimPolicy"]
    return pv


def _reclaim_cases() -> dict[str, tuple[str, Any, bool, bool]]:
    """id -> (the lower claim's mark, the upper PV as read, upper claim present, collectable)."""
    claim = upper_claim()
    other = volume_for(claim, policy="Delete")  # the right name, another claim's UID
    other["spec"]["claimRef"]["uid"] = "c-2"
    return {
        "PV Delete, claim gone": ("Delete", volume_for(claim, policy="Delete"), False, True),
        "PV Delete, claim there": ("Delete", volume_for(claim, policy="Delete"), True, False),
        # The race of issue 21: the PV was patched to Retain, the mark not yet.
        "PV Retain, marked Delete": ("Delete", volume_for(claim, policy="Retain"), False, False),
        "PV Retain, marked Retain": ("Retain", volume_for(claim, policy="Retain"), False, False),
        # Retain turned back into Delete: the PV is in force, not the old mark.
        "PV Delete, marked Retain": ("Retain", volume_for(claim, policy="Delete"), False, True),
        "no PV": ("Delete", None, False, False),
        "PV of another node": (
            "Delete",
            volume_for(claim, policy="Delete", node="vn-b"),
            False,
            False,
        ),
        "PV bound to another claim": ("Delete", other, False, False),
        "PV naming no policy": ("Delete", volume_for(claim, policy=None), False, False),
        "PV Recycle": ("Delete", volume_for(claim, policy="Recycle"), False, False),
    }


@pytest.mark.parametrize(
    ("mark", "volume", "upper_present", "collectable"),
    list(_reclaim_cases().values()),
    ids=list(_reclaim_cases()),
)
def test_a_lower_claim_goes_only_when_the_upper_pv_in_force_says_delete(
    mark: str, volume: Any, upper_present: bool, collectable: bool
) -> None:
    lower = volumes.lower_claim(
        upper_claim(), owner=OWNER, prefix="", storage_class=None, reclaim_policy=mark
    )
    asked: list[str | None] = []

    def policy_of(claim: Any) -> str | None:
        name = volumes.upper_volume_name(claim)
        asked.append(name)
        found = volume if volume is not None and volume["metadata"]["name"] == name else None
        return volumes.reclaim_policy(found, lower=claim, node_name="vn-a")

    spec = volumes.claim_spec(translate=lambda c: c, policy_of=policy_of)
    upper = upper_claim() if upper_present else None
    assert spec.collectable(lower, upper) is collectable
    # The PV is read only when the upper claim is gone, and it is the one named for it.
    assert asked == ([] if upper_present else ["pvc-c-1"])


def test_the_reclaim_decision_is_the_upper_pvs_alone() -> None:
    assert volumes.claim_collectable(None, policy="Delete")
    assert not volumes.claim_collectable(upper_claim(), policy="Delete")
    assert not volumes.claim_collectable(None, policy="Retain")
    assert not volumes.claim_collectable(None, policy=None)
    assert volumes.upper_volume_name({"metadata": {}}) is None


def test_the_upper_volume_is_pinned_to_the_node_and_pre_bound_to_its_claim() -> None:
    pv = volumes.upper_volume(
        upper_claim(),
        node_name="vn-a",
        lower_claim_key="app/data-db-0",
        capacity="1Gi",
        reclaim_policy="Delete",
        mount_options=["noatime"],
    )
    assert pv["metadata"]["name"] == "pvc-c-1"
    assert pv["metadata"]["annotations"][volumes.PROVISIONED_BY] == volumes.PROVISIONER
    assert volumes.is_our_volume(pv, node_name="vn-a")
    assert not volumes.is_our_volume(pv, node_name="vn-b")
    spec = pv["spec"]
    assert spec["claimRef"]["uid"] == "c-1"
    assert spec["storageClassName"] == "tensile"
    assert spec["mountOptions"] == ["noatime"]
    [term] = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["vn-a"]}
    ]
    released = {**pv, "status": {"phase": "Released"}}
    assert volumes.released_for_deletion(released)
    retained = copy.deepcopy(released)
    retained["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    assert not volumes.released_for_deletion(retained)


def test_a_migrated_volume_takes_the_lower_volumes_size_and_policy() -> None:
    lower_pv = {
        "spec": {
            "capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
        }
    }
    pv = volumes.migrated_volume(
        upper_claim(), lower_volume=lower_pv, node_name="vn-a", lower_claim_key="app/data-db-0"
    )
    assert pv["spec"]["capacity"] == {"storage": "5Gi"}
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


def test_what_the_lower_claim_shows_upstairs() -> None:
    upper = upper_claim()
    upper["status"] = {"phase": "Bound", "capacity": {"storage": "1Gi"}}
    lower = {
        "spec": {"volumeName": "local-1"},
        "status": {"phase": "Bound", "capacity": {"storage": "5Gi"}},
    }
    assert volumes.claim_status_patch(upper, lower) == {"status": {"capacity": {"storage": "5Gi"}}}
    assert volumes.lower_state_patch(upper, lower) == {
        "metadata": {
            "annotations": {
                volumes.LOWER_PHASE_ANNOTATION: "Bound",
                volumes.LOWER_VOLUME_ANNOTATION: "local-1",
            }
        }
    }
    pending = {"status": {"phase": "Pending"}}
    assert volumes.claim_status_patch(upper, pending) is None
    pv = {"spec": {"capacity": {"storage": "1Gi"}}}
    assert volumes.volume_capacity_patch(pv, lower) == {"spec": {"capacity": {"storage": "5Gi"}}}
    assert volumes.volume_capacity_patch(pv, pending) is None


def test_storage_class_map() -> None:
    classes = volumes.StorageClassMap(classes=(("fast", "ssd"),), default="hdd")
    assert classes.lower("fast") == "ssd"
    assert classes.lower("other") == "hdd"
    assert classes.lower("") == ""
    assert volumes.StorageClassMap().lower("fast") is None
    legacy = upper_claim()
    legacy["metadata"]["annotations"] = {"volume.beta.kubernetes.io/storage-class": "old"}
    assert volumes.claim_class(legacy) == "old"


# -- flags --------------------------------------------------------------------------------


def test_controller_flags() -> None:
    assert cli.parse(BASE, env={}).controllers == ControllerSettings()
    parsed = cli.parse(
        [
            *BASE,
            "--enable-controllers=ServiceControllers",
            "--service-namespaces=app, web",
            "--lower-storage-class=tensile=local,fast=ssd,standard",
        ],
        env={},
    ).controllers
    assert parsed.enabled == ("ServiceControllers",)
    assert parsed.service_namespaces == ("app", "web")
    assert parsed.lower_storage_classes == (("tensile", "local"), ("fast", "ssd"))
    assert parsed.lower_storage_class_default == "standard"
    assert cli.parse([*BASE, "--enable-controllers="], env={}).controllers.enabled == ()
    managers = cli.parse([*BASE, "--endpointslice-managers=a.example, b,a.example"], env={})
    assert managers.controllers.endpointslice_managers == ("a.example", "b")
    every = cli.parse([*BASE, "--endpointslice-managers=*"], env={})
    assert every.controllers.endpointslice_managers == ()
    named = cli.parse([*BASE, "--selectorless-services=app/db, ops/*,app/db"], env={})
    assert named.controllers.selectorless_services == (("app", "db"), ("ops", "*"))


def test_endpointslice_managers_given_narrow_and_say_they_grant_no_trust() -> None:
    """The flag's meaning narrowed (it no longer lets a label decide what crosses): a start
    note says so whenever it names managers."""
    assert not [n for n in cli.parse(BASE, env={}).notes if "endpointslice" in n]
    assert not [
        n
        for n in cli.parse([*BASE, "--endpointslice-managers=*"], env={}).notes
        if "endpointslice" in n
    ]
    [note] = cli.parse([*BASE, f"--endpointslice-managers={CONTROLLER}"], env={}).notes
    assert note.startswith(f"--endpointslice-managers={CONTROLLER} only narrows")
    assert "grants no trust" in note


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--enable-controllers=PVControllers,Nope", "unknown Nope"),
        ("--service-namespaces=App", "'App' is not a namespace name"),
        ("--endpointslice-managers=", "name at least one managed-by value, or \\*"),
        ("--endpointslice-managers=a b", "'a b' is not a label value"),
        ("--endpointslice-managers=*,x", "'\\*' is not a label value"),
        ("--selectorless-services=db", "expected NAMESPACE/NAME or NAMESPACE/\\*, got 'db'"),
        ("--selectorless-services=App/db", "'App' is not a namespace name"),
        ("--selectorless-services=app/1db", "'1db' is not a Service name"),
        ("--selectorless-services=app/", "'' is not a Service name"),
        ("--lower-storage-class=a=B", "'B' in 'a=B' is not a StorageClass name"),
        ("--lower-storage-class=a=b,a=c", "a is mapped twice"),
        ("--lower-storage-class=x,y", "two classes for all others"),
        ("--lower-storage-class==b", "'' in '=b' is not a StorageClass name"),
    ],
)
def test_bad_controller_flags(flag: str, message: str) -> None:
    with pytest.raises(cli.UsageError, match=message):
        cli.parse([*BASE, flag], env={})
