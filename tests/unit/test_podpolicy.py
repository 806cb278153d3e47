"""The pod table (tensile.contracts.podpolicy), row by row: what crosses, what is mapped,
dropped or refused, and that the translation applies exactly what the table says."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tensile.contracts import podpolicy
from tensile.contracts.podpolicy import (
    PRIORITY_CLASSES,
    RUNTIME_CLASSES,
    SCHEDULER_NAMES,
    ClassMap,
    PodPolicy,
)
from vnode import cli
from vnode.providers.k2k import translate, volumes

MAPPED = PodPolicy(
    scheduler_names=(("batch", "volcano"), ("default-scheduler", "tenants")),
    runtime_classes=(("sandboxed", "gvisor"),),
    priority_classes=(("high", "gold"), ("system-cluster-critical", "tenant-top")),
)

# Every field of a Kubernetes 1.37 VolumeSource (k8s.io/api core/v1 types.go).
VOLUME_SOURCES = {
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret",
    "nfs", "iscsi", "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder",
    "cephfs", "flocker", "downwardAPI", "fc", "azureFile", "configMap", "vsphereVolume",
    "quobyte", "azureDisk", "photonPersistentDisk", "projected", "portworxVolume", "scaleIO",
    "storageos", "csi", "ephemeral", "image",
}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value", "lower", "note"),
    [
        # Mapped: the lower administrator's value, nothing to say.
        (SCHEDULER_NAMES, "batch", "volcano", None),
        (SCHEDULER_NAMES, "default-scheduler", "tenants", None),
        (RUNTIME_CLASSES, "sandboxed", "gvisor", None),
        (PRIORITY_CLASSES, "high", "gold", None),
        (PRIORITY_CLASSES, "system-cluster-critical", "tenant-top", None),
        # Not mapped: dropped, and the Warning says what the pod gets instead.
        (SCHEDULER_NAMES, "my-upper-profile", None, "not mapped below (--scheduler-name-map)"),
        (RUNTIME_CLASSES, "kata", None, "default runtime handler"),
        (PRIORITY_CLASSES, "low", None, "not mapped below (--priority-class-map)"),
        (PRIORITY_CLASSES, "system-node-critical", None, "reserves for its own critical pods"),
        # Nothing asked, or the apiserver's own default: dropped without a word.
        (SCHEDULER_NAMES, None, None, None),
        (RUNTIME_CLASSES, "", None, None),
        (PRIORITY_CLASSES, 7, None, None),
    ],
)
def test_class_fields_cross_only_mapped(
    field: ClassMap, value: object, lower: str | None, note: str | None
) -> None:
    got_lower, got = podpolicy.lower_class(field, value, policy=MAPPED)
    assert got_lower == lower
    if note is None:
        assert got is None
    else:
        assert got is not None
        assert note in got
        assert field.dropped in got


def test_the_default_scheduler_is_dropped_silently_when_not_mapped() -> None:
    assert podpolicy.lower_class(SCHEDULER_NAMES, "default-scheduler", policy=PodPolicy()) == (
        None,
        None,
    )


def pod_with(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "app"}, "spec": {"containers": [], **spec}}


def ephemeral(name: str, **claim: Any) -> dict[str, Any]:
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}


@pytest.mark.parametrize(
    ("spec", "policy", "expected"),
    [
        # Inside the pod: crosses.
        (
            {
                "volumes": [
                    {"name": "c", "configMap": {"name": "c"}},
                    {"name": "s", "secret": {"secretName": "s"}},
                    {"name": "e", "emptyDir": {}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "d"}},
                    ephemeral("scratch", storageClassName="fast"),
                ]
            },
            PodPolicy(),
            [],
        ),
        # hostPath is Pod Security's: not refused here, whatever the level.
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, PodPolicy(), []),
        # Outside the pod: refused unless named.
        (
            {"volumes": [{"name": "share", "nfs": {"server": "10.0.0.1", "path": "/"}}]},
            PodPolicy(),
            [r'nfs: volume "share"\): --allowed-volume-types allows none'],
        ),
        (
            {"volumes": [{"name": "share", "nfs": {"server": "10.0.0.1", "path": "/"}}]},
            PodPolicy(volume_types=frozenset({"nfs"})),
            [],
        ),
        (
            {
                "volumes": [
                    {"name": "a", "nfs": {}},
                    {"name": "b", "csi": {"driver": "x"}},
                    {"name": "c", "csi": {"driver": "y"}},
                ]
            },
            PodPolicy(volume_types=frozenset({"nfs"})),
            [r'\(csi: volume "b", volume "c"\): --allowed-volume-types allows nfs'],
        ),
        # A type of a newer API is never passed unread.
        (
            {"volumes": [{"name": "n", "newStorage": {}}]},
            PodPolicy(),
            [r'does not know \(newStorage: volume "n"\)'],
        ),
        # An ephemeral volume's claim template that picks a volume.
        (
            {"volumes": [ephemeral("data", volumeName="someone-elses")]},
            PodPolicy(),
            [r'ephemeral volume "data" sets spec.volumeName, which names a PersistentVolume'],
        ),
        (
            {
                "volumes": [
                    ephemeral(
                        "data",
                        selector={"matchLabels": {"a": "b"}},
                        dataSource={"kind": "VolumeSnapshot", "name": "s"},
                        dataSourceRef={"kind": "PersistentVolumeClaim", "name": "c"},
                    )
                ]
            },
            PodPolicy(),
            ["sets spec.selector", "sets spec.dataSource,", "sets spec.dataSourceRef"],
        ),
        # Dynamic resource allocation: privileged only.
        (
            {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-0"}]},
            PodPolicy(),
            [r"resourceClaims \(gpu\): .* --pod-security-level=privileged \(this node enforces "],
        ),
        (
            {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-0"}]},
            PodPolicy(pod_security_level="privileged"),
            [],
        ),
    ],
)
def test_what_the_table_refuses(
    spec: dict[str, Any], policy: PodPolicy, expected: list[str]
) -> None:
    pod = pod_with(**spec)
    before = copy.deepcopy(pod)
    found = podpolicy.refusals(pod, policy=policy)
    assert pod == before
    assert len(found) == len(expected), found
    text = "; ".join(found)
    for pattern in expected:
        assert re.search(pattern, text), (pattern, text)


@pytest.mark.parametrize(
    ("spec", "template", "fields"),
    [
        ({"volumeName": "pv-1"}, True, ["volumeName"]),
        # On a copied claim volumeName is the upper binding (checked apart).
        ({"volumeName": "pv-1"}, False, []),
        ({"selector": {"matchLabels": {"a": "b"}}}, False, ["selector"]),
        (
            {"dataSource": {"name": "s"}, "dataSourceRef": {"name": "s"}},
            False,
            ["dataSource", "dataSourceRef"],
        ),
        ({"storageClassName": "x", "resources": {}}, True, []),
    ],
)  # fmt: skip
def test_claims_that_pick_a_volume_are_refused(
    spec: dict[str, Any], template: bool, fields: list[str]
) -> None:
    found = podpolicy.claim_refusals(spec, what="the claim", template=template)
    assert [re.search(r"sets spec\.(\w+)", r).group(1) for r in found] == fields  # type: ignore[union-attr]


def test_every_volume_type_has_one_verdict() -> None:
    sets = (
        podpolicy.POD_VOLUMES,
        podpolicy.CLAIM_VOLUMES,
        podpolicy.POD_SECURITY_VOLUMES,
        podpolicy.OUTSIDE_VOLUMES,
    )
    assert set().union(*sets) == VOLUME_SOURCES
    assert sum(len(s) for s in sets) == len(VOLUME_SOURCES)


@pytest.mark.parametrize(
    ("key", "allowed", "copied"),
    [
        ("example.com/internal", (), False),
        ("example.com/internal", ("example.com/internal",), True),
        ("example.com/internal-x", ("example.com/internal",), False),
        ("example.com/internal-x", ("example.com/internal*",), True),
        ("example.com/lb", ("example.com/*",), True),
        ("example.org/lb", ("example.com/*",), False),
        ("anything/at-all", ("*",), True),
    ],
)
def test_service_annotations_cross_as_named(
    key: str, allowed: tuple[str, ...], copied: bool
) -> None:
    assert podpolicy.annotation_allowed(key, allowed) is copied


def test_a_policy_digest_depends_on_the_settings_not_their_order() -> None:
    one = podpolicy.digest({"types": frozenset({"NodePort", "ClusterIP"}), "annotations": ("a",)})
    same = podpolicy.digest({"annotations": ["a"], "types": ("ClusterIP", "NodePort")})
    other = podpolicy.digest({"types": ("ClusterIP",), "annotations": ("a",)})
    assert one == same
    assert one != other
    assert re.fullmatch(r"[0-9a-f]{16}", one)


# -- the translation applies the table ---------------------------------------------------

POLICY = translate.TranslationPolicy(
    node_name="vn-a",
    cluster_id="c-1",
    node_labels={},
    scheduler_names=MAPPED.scheduler_names,
    runtime_classes=MAPPED.runtime_classes,
    priority_classes=MAPPED.priority_classes,
    storage_classes=volumes.StorageClassMap(classes=(("fast", "lower-fast"),)),
)


def test_the_lower_pod_drops_what_the_table_drops() -> None:
    upper = pod_with(**dict.fromkeys(podpolicy.DROPPED_SPEC, "x"))
    spec = translate.lower_pod(upper, policy=POLICY)["spec"]
    assert not podpolicy.DROPPED_SPEC.keys() & spec.keys()


def classes(scheduler: str, runtime: str, priority: str) -> dict[str, str]:
    """The three mapped fields of a PodSpec ("": left out)."""
    given = {"schedulerName": scheduler, "runtimeClassName": runtime, "priorityClassName": priority}
    return {k: v for k, v in given.items() if v}


@pytest.mark.parametrize(
    ("upper", "lower"),
    [
        (classes("batch", "sandboxed", "high"), classes("volcano", "gvisor", "gold")),
        (classes("my-upper-profile", "kata", "low"), {}),
        (classes("default-scheduler", "", ""), classes("tenants", "", "")),
    ],
)
def test_the_lower_pod_carries_what_the_table_maps(
    upper: dict[str, str], lower: dict[str, str]
) -> None:
    spec = translate.lower_pod(pod_with(**upper), policy=POLICY)["spec"]
    keys = [m.key for m in podpolicy.CLASS_MAPS]
    assert {k: spec[k] for k in keys if k in spec} == lower
    dropped = translate.dropped_classes(pod_with(**upper), policy=POLICY)
    assert {reason for reason, _ in dropped} == {
        m.reason for m in podpolicy.CLASS_MAPS if m.key in upper and m.key not in lower
    }


def test_an_ephemeral_template_gets_the_lower_storage_class_and_nothing_else_changes() -> None:
    template = {
        "metadata": {
            "labels": {"app": "x"},
            "annotations": {"volume.beta.kubernetes.io/storage-class": "fast", "note": "kept"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    upper = pod_with(volumes=[{"name": "v", "ephemeral": {"volumeClaimTemplate": template}}])
    before = copy.deepcopy(upper)
    [volume] = translate.lower_pod(upper, policy=POLICY)["spec"]["volumes"]
    assert upper == before
    assert volume["ephemeral"]["volumeClaimTemplate"] == {
        "metadata": {"labels": {"app": "x"}, "annotations": {"note": "kept"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "lower-fast",
        },
    }


# -- the table as the documentation shows it -------------------------------------------------


def test_every_rule_of_the_table_has_its_row() -> None:
    fields = " ".join(row.field for row in podpolicy.ROWS)
    for key in podpolicy.DROPPED_SPEC:
        assert f"spec.{key}" in fields
    for mapped in podpolicy.CLASS_MAPS:
        assert f"spec.{mapped.key}" in fields
    for kind in VOLUME_SOURCES:
        assert re.search(rf"\b{kind}\b", fields), kind
    for field in (*podpolicy.CLAIM_SOURCES, podpolicy.TEMPLATE_VOLUME_NAME, "resourceClaims"):
        assert field in fields
    assert {row.verdict for row in podpolicy.ROWS} == {
        "crosses", "mapped", "dropped", "refused", "Pod Security",
    }  # fmt: skip


def test_the_flags_the_table_names_are_the_virtual_nodes() -> None:
    known = {option for action in cli._parser({})._actions for option in action.option_strings}
    named = {
        flag
        for row in podpolicy.ROWS
        for flag in re.findall(r"--[a-z][a-z-]*", f"{row.flag} {row.why} {row.with_flag}")
    }
    assert named
    assert named <= known, named - known
