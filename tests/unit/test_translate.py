"""Pods translate between the upper and lower cluster as tensile-kube's, minus its defects."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensile.contracts import clusterselector, ownership
from tensile.contracts.clusterselector import parse as parse_cluster_selector
from tensile.contracts.labels import VIRTUAL_POD_LABEL
from tensile.contracts.scheduling import selector_matches, term_matches
from tensile.placement.lower import lower_placement, lower_tolerations
from tests.unit.bounds import within
from vnode.providers.k2k import naming, volumes
from vnode.providers.k2k.translate import (
    Dependencies,
    RefusedResize,
    TranslationPolicy,
    dependencies,
    lower_pod,
    observed_generation,
    optional_references,
    resize_patch,
    restored_labels,
    spec_update,
    upper_status,
)

P = ParamSpec("P")
R = TypeVar("R")
NODE = "vk-lower-1"
NODE_LABELS = {
    "type": "virtual-kubelet",
    "clusterID": "lower-1",
    "kubernetes.io/os": "linux",
    "kubernetes.io/hostname": NODE,
    "cores": "64",
}
CLUSTER_ID = "0f3c2a9e-7b1d-4c55-8e2f-5a6b7c8d9e01"
OWNER = ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)
T = TranslationPolicy(cluster_id=CLUSTER_ID, node_name=NODE, node_labels=NODE_LABELS)
UID = "5b0e9c1a-3f7d-4e2b-9a61-0c8d2f4b7e11"
NOW = "2025-01-02T03:04:05Z"
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
NOT_READY_300 = {
    "key": "node.kubernetes.io/not-ready",
    "operator": "Exists",
    "effect": "NoExecute",
    "tolerationSeconds": 300,
}
UNREACHABLE_300 = {**NOT_READY_300, "key": "node.kubernetes.io/unreachable"}
NOT_READY_FOREVER = {
    "key": "node.kubernetes.io/not-ready",
    "operator": "Exists",
    "effect": "NoExecute",
}
UNREACHABLE_FOREVER = {**NOT_READY_FOREVER, "key": "node.kubernetes.io/unreachable"}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


def deployment_pod() -> dict[str, Any]:
    """A pod as the upper API server holds it after scheduling: admission defaults included."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-7d9f8b6c5-x2x9q",
            "generateName": "web-7d9f8b6c5-",
            "namespace": "shop",
            "uid": UID,
            "resourceVersion": "4711",
            "selfLink": "/api/v1/namespaces/shop/pods/web-7d9f8b6c5-x2x9q",
            "creationTimestamp": "2025-01-02T03:00:00Z",
            "generation": 1,
            "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5", "virtual-pod": "true"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d9f8b6c5",
                    "uid": "0d3c",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
            "finalizers": ["example.com/keep"],
        },
        "spec": {
            "nodeName": NODE,
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "priorityClassName": "normal",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "web",
            "serviceAccount": "web",
            "restartPolicy": "Always",
            "enableServiceLinks": True,
            "containers": [
                {
                    "name": "web",
                    "image": "nginx:1.27",
                    "env": [
                        {"name": "MODE", "value": "prod"},
                        {
                            "name": "NS",
                            "valueFrom": {
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
                            },
                        },
                        {
                            "name": "POD_UID",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                        },
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        },
                        {
                            "name": "MEM",
                            "valueFrom": {
                                "resourceFieldRef": {
                                    "containerName": "web",
                                    "resource": "limits.memory",
                                }
                            },
                        },
                    ],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/web"},
                        {
                            "name": "kube-api-access-5xk2p",
                            "mountPath": TOKEN_MOUNT,
                            "readOnly": True,
                        },
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access-5xk2p",
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
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
            ],
            "tolerations": [NOT_READY_300, UNREACHABLE_300],
        },
        "status": {
            "phase": "Pending",
            "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        },
    }


def unchanged(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Call `function` and assert it mutated none of its arguments."""
    before = copy.deepcopy((args, kwargs))
    result = function(*args, **kwargs)
    assert (args, kwargs) == before
    return result


def annotated(pod: dict[str, Any], selector: object) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    value = selector if isinstance(selector, str) else json.dumps(selector)
    pod["metadata"]["annotations"][clusterselector.ANNOTATION] = value
    return pod


def test_translation_settings_are_keyword_only_frozen_with_defaults() -> None:
    assert (T.namespace_prefix, T.ignore_labels, T.enable_service_account) == ("", (), True)
    with pytest.raises(TypeError):
        TranslationPolicy(NODE, NODE_LABELS)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        T.node_name = "other"  # type: ignore[misc]


# -- lower_pod: metadata ----------------------------------------------------------------------


def test_lower_pod_keeps_identity_and_drops_server_set_metadata() -> None:
    lower = unchanged(lower_pod, deployment_pod(), policy=T)
    meta = lower["metadata"]
    assert lower["apiVersion"] == "v1"
    assert lower["kind"] == "Pod"
    assert meta["name"] == "web-7d9f8b6c5-x2x9q"
    assert meta["namespace"] == "shop"
    for key in (
        "uid",
        "resourceVersion",
        "selfLink",
        "creationTimestamp",
        "generation",
        "ownerReferences",
        "managedFields",
        "finalizers",
        "generateName",
    ):
        assert key not in meta
    assert meta["labels"] == {
        "app": "web",
        "pod-template-hash": "7d9f8b6c5",
        VIRTUAL_POD_LABEL: "true",
        ownership.NODE_LABEL: NODE,
        ownership.CLUSTER_LABEL: CLUSTER_ID,
    }
    assert meta["annotations"] == {
        "kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z",
        ownership.NODE_ANNOTATION: NODE,
        ownership.CLUSTER_ANNOTATION: CLUSTER_ID,
        ownership.GLOBAL_ANNOTATION: "true",
        ownership.UPPER_UID_ANNOTATION: UID,
        ownership.UPPER_NAMESPACE_ANNOTATION: "shop",
    }
    assert "status" not in lower
    assert ownership.is_owned(
        lower, owner=ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)
    )


def test_lower_pod_drops_a_terminating_pods_deletion_fields() -> None:
    pod = deployment_pod()
    pod["metadata"]["deletionTimestamp"] = NOW
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    meta = lower_pod(pod, policy=T)["metadata"]
    assert "deletionTimestamp" not in meta
    assert "deletionGracePeriodSeconds" not in meta


def test_prefixed_namespace_and_long_node_name() -> None:
    long_name = "virtual-node-for-the-lower-cluster-in-region-eu-west-with-a-long-name-01"
    assert len(long_name) > 63
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID, node_name=long_name, node_labels={}, namespace_prefix="up1-"
    )
    lower = unchanged(lower_pod, deployment_pod(), policy=policy)
    meta = lower["metadata"]
    assert meta["namespace"] == "up1-shop"
    assert meta["annotations"][ownership.UPPER_NAMESPACE_ANNOTATION] == "shop"
    assert meta["annotations"][ownership.NODE_ANNOTATION] == long_name
    assert meta["labels"][ownership.NODE_LABEL] == ownership.label_value(long_name)
    assert len(meta["labels"][ownership.NODE_LABEL]) <= 63
    assert ownership.is_owned(
        lower, owner=ownership.NodeIdentity(node_name=long_name, cluster_id=CLUSTER_ID)
    )
    assert not ownership.is_owned(
        lower, owner=ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)
    )
    env = {e["name"]: e for e in lower["spec"]["containers"][0]["env"]}
    assert env["NODE"] == {"name": "NODE", "value": long_name}


def test_upper_marks_cannot_claim_another_node() -> None:
    pod = deployment_pod()
    pod["metadata"]["labels"][ownership.NODE_LABEL] = "someone-else"
    pod["metadata"]["annotations"][ownership.NODE_ANNOTATION] = "someone-else"
    pod["metadata"]["labels"][ownership.CLUSTER_LABEL] = "another-cluster"
    pod["metadata"]["annotations"][ownership.CLUSTER_ANNOTATION] = "another-cluster"
    lower = lower_pod(pod, policy=T)
    assert ownership.is_owned(lower, owner=OWNER)
    assert lower["metadata"]["labels"][ownership.CLUSTER_LABEL] == CLUSTER_ID


def test_the_same_node_name_of_another_upper_cluster_owns_nothing_of_ours() -> None:
    # Two upper clusters, both with the default node name, sharing one lower cluster.
    lower = lower_pod(deployment_pod(), policy=T)
    twin = ownership.NodeIdentity(node_name=NODE, cluster_id="6d1e0b7a-0000-4000-8000-000000000002")
    assert not ownership.is_owned(lower, owner=twin)
    assert ownership.owner_selector(twin) != ownership.owner_selector(OWNER)
    # A half-marked object (label without annotation, or the reverse) is nobody's.
    for marks in ("labels", "annotations"):
        broken = copy.deepcopy(lower)
        del broken["metadata"][marks][ownership.CLUSTER_LABEL]
        assert not ownership.is_owned(broken, owner=OWNER)


def test_references_that_are_not_copied_are_removed_below() -> None:
    pod = deployment_pod()
    spec = pod["spec"]
    spec["volumes"] = [
        {"name": "opt-cm", "configMap": {"name": "gone-cm", "optional": True}},
        {"name": "opt-secret", "secret": {"secretName": "gone-s", "optional": True}},
        {"name": "kept", "configMap": {"name": "here"}},
        {
            "name": "mixed",
            "projected": {
                "sources": [
                    {"configMap": {"name": "gone-cm", "optional": True}},
                    {"secret": {"name": "here-s"}},
                ]
            },
        },
        {"name": "all-gone", "projected": {"sources": [{"secret": {"name": "gone-s"}}]}},
    ]
    container = spec["containers"][0]
    container["env"] = [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "gone-cm", "key": "a"}}},
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "here-s", "key": "b"}}},
        {"name": "C", "value": "c"},
    ]
    container["envFrom"] = [{"secretRef": {"name": "gone-s"}}, {"configMapRef": {"name": "here"}}]
    spec["imagePullSecrets"] = [{"name": "gone-s"}]
    absent = frozenset({("ConfigMap", "gone-cm"), ("Secret", "gone-s")})
    lower = unchanged(lower_pod, pod, policy=T, absent=absent)["spec"]
    volumes = {v["name"]: v for v in lower["volumes"]}
    assert volumes["opt-cm"] == {"name": "opt-cm", "emptyDir": {}}
    assert volumes["opt-secret"] == {"name": "opt-secret", "emptyDir": {}}
    assert volumes["kept"] == {"name": "kept", "configMap": {"name": "here"}}
    assert volumes["mixed"]["projected"]["sources"] == [{"secret": {"name": "here-s"}}]
    assert volumes["all-gone"] == {"name": "all-gone", "emptyDir": {}}
    lower_container = lower["containers"][0]
    assert [e["name"] for e in lower_container["env"]] == ["B", "C"]
    assert lower_container["envFrom"] == [{"configMapRef": {"name": "here"}}]
    assert "imagePullSecrets" not in lower
    # Nothing absent: the references stay as they are.
    assert lower_pod(pod, policy=T)["spec"]["imagePullSecrets"] == [{"name": "gone-s"}]


def test_ignore_labels_move_into_tripped_labels() -> None:
    pod = deployment_pod()
    pod["metadata"]["labels"].update({"pod-group.scheduling.sigs.k8s.io": "g1", "team": ""})
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID,
        node_name=NODE,
        node_labels=NODE_LABELS,
        ignore_labels=("pod-group.scheduling.sigs.k8s.io", "team", "absent", "app"),
    )
    meta = unchanged(lower_pod, pod, policy=policy)["metadata"]
    assert "pod-group.scheduling.sigs.k8s.io" not in meta["labels"]
    assert "app" not in meta["labels"]
    assert meta["labels"]["team"] == ""  # an empty value is not moved
    tripped = meta["annotations"][naming.TRIPPED_LABELS_ANNOTATION]
    assert tripped == '{"app":"web","pod-group.scheduling.sigs.k8s.io":"g1"}'  # compact JSON


def test_tripped_labels_only_written_when_something_moved() -> None:
    pod = deployment_pod()
    # One arriving from above is not ours and would forge labels on the way back.
    pod["metadata"]["annotations"][naming.TRIPPED_LABELS_ANNOTATION] = '{"forged":"1"}'
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID, node_name=NODE, node_labels=NODE_LABELS, ignore_labels=("absent",)
    )
    lower = lower_pod(pod, policy=policy)
    assert naming.TRIPPED_LABELS_ANNOTATION not in lower["metadata"]["annotations"]
    assert "forged" not in restored_labels(lower)


def test_missing_uid_writes_no_uid_annotation() -> None:
    pod = deployment_pod()
    del pod["metadata"]["uid"]
    lower = lower_pod(pod, policy=T)
    assert ownership.UPPER_UID_ANNOTATION not in lower["metadata"]["annotations"]
    env = {e["name"]: e for e in lower["spec"]["containers"][0]["env"]}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


# -- lower_pod: spec -----------------------------------------------------------------------


def test_lower_pod_drops_fields_the_lower_cluster_computes_or_refuses() -> None:
    pod = deployment_pod()
    pod["spec"].update(
        overhead={"cpu": "250m"},
        runtimeClassName="kata",
        ephemeralContainers=[{"name": "debugger", "image": "busybox"}],
        schedulingGates=[{"name": "example.com/gate"}],
        readinessGates=[{"conditionType": "example.com/ready"}],
        activeDeadlineSeconds=600,
        hostname="web-0",
    )
    spec = unchanged(lower_pod, pod, policy=T)["spec"]
    for key in (
        "nodeName",
        "priority",
        "preemptionPolicy",
        "overhead",
        "ephemeralContainers",
        "schedulingGates",
        "readinessGates",
    ):
        assert key not in spec
    # Not mapped by --priority-class-map, --runtime-class-map, --scheduler-name-map: dropped,
    # so the lower defaults apply (tests/unit/test_podpolicy.py).
    for key in ("priorityClassName", "runtimeClassName", "schedulerName"):
        assert key not in spec
    assert spec["activeDeadlineSeconds"] == 600
    assert spec["hostname"] == "web-0"


def test_modern_service_account_volume_is_removed() -> None:
    spec = lower_pod(deployment_pod(), policy=T)["spec"]
    assert spec["volumes"] == [
        {"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}}
    ]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "config", "mountPath": "/etc/web"}]
    assert spec["serviceAccountName"] == "web"
    assert spec["serviceAccount"] == "web"


def test_legacy_token_volume_and_mounts_are_removed_everywhere() -> None:
    pod = deployment_pod()
    token = {"name": "default-token-abcde", "mountPath": TOKEN_MOUNT, "readOnly": True}
    pod["spec"]["volumes"] = [
        {"name": "default-token-abcde", "secret": {"secretName": "default-token-abcde"}}
    ]
    pod["spec"]["containers"][0]["volumeMounts"] = [token]
    pod["spec"]["initContainers"] = [
        {
            "name": "init",
            "image": "busybox",
            "volumeMounts": [token, {"name": "x", "mountPath": "/x"}],
        }
    ]
    spec = unchanged(lower_pod, pod, policy=T)["spec"]
    assert "volumes" not in spec
    assert "volumeMounts" not in spec["containers"][0]
    assert spec["initContainers"][0]["volumeMounts"] == [{"name": "x", "mountPath": "/x"}]


def test_provisioned_ephemeral_volumes_mount_the_lower_claims_the_node_made() -> None:
    """Issue 22: the lower ephemeral volume controller refuses a claim `<pod>-<volume>` it
    did not make for the lower pod; one the node provisioned is mounted as a claim. The
    others' templates get their lower StorageClass (issue 31), as copied claims do."""
    pod = deployment_pod()
    template = {"volumeClaimTemplate": {"spec": {"storageClassName": "tensile"}}}
    other = {"volumeClaimTemplate": {"spec": {"storageClassName": "local"}}}
    pod["spec"]["volumes"] = [
        {"name": "cache", "ephemeral": template},
        {"name": "scratch", "ephemeral": other},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    mapped = dataclasses.replace(
        T, storage_classes=volumes.StorageClassMap(classes=(("local", "lower-local"),))
    )
    spec = unchanged(lower_pod, pod, policy=mapped, provisioned=frozenset({"cache", "data"}))[
        "spec"
    ]
    assert spec["volumes"] == [
        {"name": "cache", "persistentVolumeClaim": {"claimName": "web-7d9f8b6c5-x2x9q-cache"}},
        # The lower cluster makes this one's claim, of the class --lower-storage-class says.
        {
            "name": "scratch",
            "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "lower-local"}}},
        },
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    # Without the flag the template names no class: the lower default StorageClass applies.
    assert lower_pod(pod, policy=T)["spec"]["volumes"][:2] == [
        {"name": "cache", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
    ]


def test_only_admission_injected_token_volumes_are_removed() -> None:
    pod = deployment_pod()
    own_token = {  # a user's own projected token (e.g. for Vault), not the admission's
        "name": "vault-token",
        "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "t"}}]},
    }
    look_alike = {"name": "kube-api-access-mine", "configMap": {"name": "mine"}}
    pod["spec"]["volumes"] = [own_token, look_alike]
    assert lower_pod(pod, policy=T)["spec"]["volumes"] == [own_token, look_alike]


def test_disabled_service_accounts_run_as_default() -> None:
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID, node_name=NODE, node_labels=NODE_LABELS, enable_service_account=False
    )
    spec = lower_pod(deployment_pod(), policy=policy)["spec"]
    assert spec["serviceAccountName"] == "default"
    assert spec["serviceAccount"] == "default"


def env_of(lower: dict[str, Any], group: str = "containers") -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in lower["spec"][group][0]["env"]}


def test_env_field_refs_without_prefix() -> None:
    pod = deployment_pod()
    pod["spec"]["initContainers"] = [copy.deepcopy(pod["spec"]["containers"][0])]
    lower = unchanged(lower_pod, pod, policy=T)
    for group in ("containers", "initContainers"):
        env = env_of(lower, group)
        original = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["NS"] == original["NS"]  # same namespace below: the kubelet resolves it
        assert env["POD_UID"] == {"name": "POD_UID", "value": UID}
        assert env["NODE"] == {"name": "NODE", "value": NODE}
        for kept in ("MODE", "POD_IP", "POD_NAME", "MEM"):
            assert env[kept] == original[kept]


def test_env_namespace_becomes_the_upper_one_with_a_prefix() -> None:
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID, node_name=NODE, node_labels=NODE_LABELS, namespace_prefix="up1-"
    )
    env = env_of(lower_pod(deployment_pod(), policy=policy))
    assert env["NS"] == {"name": "NS", "value": "shop"}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


# -- placement ---------------------------------------------------------------------------


def placed(
    spec: dict[str, Any],
    selector: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return unchanged(
        lower_placement,
        spec,
        cluster_selector=selector,
        node_name=NODE,
        node_labels=NODE_LABELS if labels is None else labels,
    )


def test_satisfied_node_selector_entries_are_spent() -> None:
    spec = {"nodeSelector": {"clusterID": "lower-1", "disk": "ssd", "kubernetes.io/os": "windows"}}
    assert placed(spec)["nodeSelector"] == {"disk": "ssd", "kubernetes.io/os": "windows"}
    assert "nodeSelector" not in placed({"nodeSelector": {"clusterID": "lower-1"}})


def test_cluster_selector_node_selector_is_merged_not_replacing() -> None:
    spec = {"nodeSelector": {"clusterID": "lower-1", "disk": "ssd", "gpu": "a100"}}
    result = placed(spec, {"nodeSelector": {"zone": "a", "gpu": "h100"}})
    assert result["nodeSelector"] == {"disk": "ssd", "gpu": "h100", "zone": "a"}


def test_satisfied_required_affinity_is_dropped_but_preferred_and_pod_affinity_kept() -> None:
    preferred = [{"weight": 1, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}}]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(
                    {"matchExpressions": [expr("clusterID", "In", "lower-1", "lower-2")]}
                ),
                "preferredDuringSchedulingIgnoredDuringExecution": preferred,
            },
            "podAntiAffinity": anti,
        }
    }
    assert placed(spec)["affinity"] == {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAntiAffinity": anti,
    }


def test_spent_affinity_leaves_no_empty_containers() -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(
                    {"matchFields": [expr("metadata.name", "In", NODE)]}
                )
            },
            "podAffinity": {},
        },
        "nodeSelector": {},
        "tolerations": [],
    }
    assert placed(spec) == {}


def test_unsatisfied_required_affinity_is_kept() -> None:
    kept = required({"matchExpressions": [expr("disk", "In", "ssd")]})
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": kept}}}
    assert placed(spec) == spec


def test_cluster_selector_affinity_alone_is_applied() -> None:
    extra = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": required(
                {"matchExpressions": [expr("zone", "In", "a")]}
            )
        }
    }
    assert placed({}, {"affinity": extra})["affinity"] == extra


def test_kept_and_cluster_selector_affinity_are_anded_as_a_cross_product() -> None:
    ssd, nvme = expr("disk", "In", "ssd"), expr("disk", "In", "nvme")
    zone_a, zone_b = expr("zone", "In", "a"), expr("zone", "In", "b")
    host = expr("metadata.name", "NotIn", "bad-node")
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(
                    {"matchExpressions": [ssd]}, {"matchExpressions": [nvme], "matchFields": [host]}
                )
            }
        }
    }
    extra = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(
                    {"matchExpressions": [zone_a]}, {"matchExpressions": [zone_b]}
                )
            }
        }
    }
    terms = placed(spec, extra)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [ssd, zone_a]},
        {"matchExpressions": [ssd, zone_b]},
        {"matchExpressions": [nvme, zone_a], "matchFields": [host]},
        {"matchExpressions": [nvme, zone_b], "matchFields": [host]},
    ]


def test_cross_product_over_the_cap_keeps_the_cluster_selector_terms() -> None:
    kept = [{"matchExpressions": [expr("k", "In", str(i))]} for i in range(9)]
    extra = [{"matchExpressions": [expr("zone", "In", str(i))]} for i in range(8)]
    assert len(kept) * len(extra) > clusterselector.MAX_TERMS
    spec = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required(*kept)}
        }
    }
    selector = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required(*extra)}
        }
    }
    node = placed(spec, selector)["affinity"]["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"] == required(*extra)
    # At the cap exactly, the product is still built.
    spec_8 = copy.deepcopy(spec)
    spec_8["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = required(
        *kept[:8]
    )
    node = placed(spec_8, selector)["affinity"]["nodeAffinity"]
    assert len(node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]) == 64


def test_cluster_selector_adds_to_preferred_and_pod_affinity() -> None:
    mine = {"weight": 1, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}}
    theirs = {"weight": 5, "preference": {"matchExpressions": [expr("zone", "In", "a")]}}
    pod_term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
    spec = {
        "affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [mine]},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [pod_term]},
        }
    }
    selector = {
        "affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [theirs, mine]},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [pod_term]},
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": pod_term}
                ]
            },
        }
    }
    affinity = placed(spec, selector)["affinity"]
    assert affinity["nodeAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [mine, theirs]
    }
    assert affinity["podAffinity"] == spec["affinity"]["podAffinity"]
    assert affinity["podAntiAffinity"] == selector["affinity"]["podAntiAffinity"]


def test_tolerations_are_merged_and_deduplicated() -> None:
    gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    spec = {"tolerations": [NOT_READY_FOREVER, UNREACHABLE_FOREVER, gpu]}
    selector = {"tolerations": [NOT_READY_300, UNREACHABLE_300, gpu, dict(gpu)]}
    # The webhook's unlimited node-problem tolerations stay upstairs: below, the pod's
    # original 300 s ones apply, so a dead lower node's pods are evicted and replaced.
    assert placed(spec, selector)["tolerations"] == [gpu, NOT_READY_300, UNREACHABLE_300]


def test_a_pod_with_very_many_tolerations_is_placed_in_linear_time() -> None:
    """A pod may carry as many tolerations as 3 MiB holds (the apiserver validates no count):
    merging them with the annotation's must not compare every pair (100,000 of them took
    minutes, the node's event loop standing still all along)."""
    own = [{"key": f"t{i}"} for i in range(100_000)]
    with within(30, "placing a pod with 100,000 tolerations"):
        below = placed({"tolerations": own}, {"tolerations": [*own[::-1], NOT_READY_300]})
    assert below["tolerations"] == [*own, NOT_READY_300]


def test_without_a_cluster_selector_the_pods_own_tolerations_are_kept() -> None:
    # No annotation: the pod did not go through a webhook, every toleration is the user's.
    vnode = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
    spec = {"tolerations": [NOT_READY_FOREVER, UNREACHABLE_FOREVER, vnode]}
    assert placed(spec, None)["tolerations"] == [NOT_READY_FOREVER, UNREACHABLE_FOREVER, vnode]


def test_the_webhooks_added_tolerations_stay_upstairs_even_when_it_copied_none() -> None:
    # A pod that had no tolerations of its own: the annotation carries none, and what the
    # webhook added (the virtual node's taint, bounded node-problem ones) is not for below.
    gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    vnode = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}
    added = [vnode, {**NOT_READY_FOREVER, "tolerationSeconds": 60}, UNREACHABLE_FOREVER]
    spec = {"tolerations": [*added, gpu]}
    assert placed(spec, {"nodeSelector": {"zone": "a"}})["tolerations"] == [gpu]
    # A node with a taint of its own recognises the toleration of that key instead.
    custom = {"key": "example.com/virtual", "operator": "Exists"}
    lowered = unchanged(
        lower_placement,
        {"tolerations": [custom, vnode]},
        cluster_selector={},
        node_name=NODE,
        node_labels=NODE_LABELS,
        taint_key="example.com/virtual",
    )
    assert lowered["tolerations"] == [vnode]


@pytest.mark.parametrize(
    ("labels", "requirement", "matches"),
    [
        ({"a": "1"}, expr("a", "In", "1", "2"), True),
        ({"a": "3"}, expr("a", "In", "1", "2"), False),
        ({}, expr("a", "In", "1"), False),
        ({"a": "1"}, expr("a", "In"), False),  # In needs values
        ({"a": "3"}, expr("a", "NotIn", "1"), True),
        ({}, expr("a", "NotIn", "1"), True),
        ({"a": "1"}, expr("a", "NotIn", "1"), False),
        ({"a": ""}, expr("a", "Exists"), True),
        ({}, expr("a", "Exists"), False),
        ({"a": "1"}, expr("a", "Exists", "1"), False),  # Exists takes no values
        ({}, expr("a", "DoesNotExist"), True),
        ({"a": "1"}, expr("a", "DoesNotExist"), False),
        ({"a": "10"}, expr("a", "Gt", "9"), True),
        ({"a": "9"}, expr("a", "Gt", "9"), False),
        ({"a": "-3"}, expr("a", "Lt", "+2"), True),
        ({"a": "2"}, expr("a", "Lt", "2"), False),
        ({"a": "x"}, expr("a", "Gt", "1"), False),
        ({"a": "1 "}, expr("a", "Lt", "5"), False),
        ({"a": "99999999999999999999"}, expr("a", "Gt", "1"), False),  # beyond int64
        ({"a": "5"}, expr("a", "Gt", "1", "2"), False),  # exactly one value
        ({}, expr("a", "Gt", "1"), False),
        ({"a": "1"}, expr("a", "Near", "1"), False),
        ({"a": "1"}, {"operator": "Exists"}, False),
    ],
)
def test_label_requirements_follow_kubernetes(
    labels: dict[str, str], requirement: dict[str, Any], matches: bool
) -> None:
    term = {"matchExpressions": [requirement]}
    assert term_matches(term, node_name=NODE, node_labels=labels) is matches


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        (expr("metadata.name", "In", NODE), True),
        (expr("metadata.name", "In", "other"), False),
        (expr("metadata.name", "NotIn", "other"), True),
        (expr("metadata.name", "NotIn", NODE), False),
        (expr("metadata.name", "In", NODE, "other"), False),  # exactly one value
        (expr("metadata.name", "Exists"), False),
        (expr("metadata.uid", "In", NODE), False),
    ],
)
def test_field_requirements_follow_kubernetes(requirement: dict[str, Any], matches: bool) -> None:
    term = {"matchFields": [requirement]}
    assert term_matches(term, node_name=NODE, node_labels={}) is matches


def test_terms_are_ored_and_requirements_anded() -> None:
    both = {"matchExpressions": [expr("clusterID", "In", "lower-1"), expr("cores", "Gt", "100")]}
    one = {
        "matchExpressions": [expr("clusterID", "Exists")],
        "matchFields": [expr("metadata.name", "In", NODE)],
    }
    assert not selector_matches(required(both), node_name=NODE, node_labels=NODE_LABELS)
    assert selector_matches(required(both, one), node_name=NODE, node_labels=NODE_LABELS)
    assert not selector_matches(required({}), node_name=NODE, node_labels=NODE_LABELS)
    assert not selector_matches(required(), node_name=NODE, node_labels=NODE_LABELS)


# -- clusterSelector annotation ------------------------------------------------------------


def webhook_selector() -> dict[str, Any]:
    """What tensile-kube's webhook writes: Go field order, compact JSON."""
    return {
        "nodeSelector": {"disk": "ssd"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(
                    {"matchExpressions": [expr("zone", "In", "a", "b")]}
                )
            }
        },
        "tolerations": [NOT_READY_300, UNREACHABLE_300],
    }


def test_pod_with_cluster_selector() -> None:
    pod = deployment_pod()
    pod["spec"]["nodeSelector"] = {"clusterID": "lower-1"}  # the key the webhook leaves above
    pod["spec"]["tolerations"] = [NOT_READY_FOREVER, UNREACHABLE_FOREVER]
    value = json.dumps(webhook_selector(), separators=(",", ":"))
    pod = annotated(pod, value)
    lower = unchanged(lower_pod, pod, policy=T)
    spec = lower["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["affinity"] == webhook_selector()["affinity"]
    # The webhook's unlimited tolerations stay upstairs; the originals apply below.
    assert spec["tolerations"] == [NOT_READY_300, UNREACHABLE_300]
    assert lower["metadata"]["annotations"][clusterselector.ANNOTATION] == value


@pytest.mark.parametrize(
    "value",
    [
        "{not json",
        "",
        "null",
        "[]",
        '"text"',
        "42",
        '{"nodeSelector": ["disk"]}',
        '{"nodeSelector": {"disk": 1}}',
        '{"tolerations": {"key": "x"}}',
        '{"tolerations": ["x"]}',
        '{"affinity": []}',
        '{"affinity": {"nodeAffinity": []}}',
        '{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}}',
        '{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":'
        ' {"nodeSelectorTerms": []}}}}',
        '{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":'
        ' {"nodeSelectorTerms": [{"matchExpressions": {"key": "a"}}]}}}}',
        '{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":'
        ' {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In",'
        ' "values": [1]}]}]}}}}',
        '{"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {}}}}',
        '{"affinity": {"podAffinity": []}}',
        '{"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}',
        "[" * 100_000,
    ],
)
def test_unusable_cluster_selector_counts_as_absent(value: str) -> None:
    assert parse_cluster_selector(value) is None
    pod = deployment_pod()
    pod["spec"]["nodeSelector"] = {"clusterID": "lower-1", "disk": "ssd"}
    plain = lower_pod(pod, policy=T)
    lower = lower_pod(annotated(pod, value), policy=T)
    assert lower["spec"] == plain["spec"]
    assert lower["metadata"]["annotations"][clusterselector.ANNOTATION] == value


def test_cluster_selector_parsing_keeps_only_known_non_null_keys() -> None:
    assert parse_cluster_selector('{"nodeSelector": null, "extra": 1, "tolerations": []}') == {
        "tolerations": []
    }
    assert parse_cluster_selector(None) is None
    assert parse_cluster_selector(json.dumps(webhook_selector())) == webhook_selector()


# -- dependencies ------------------------------------------------------------------------


def referencing_pod() -> dict[str, Any]:
    pod = deployment_pod()
    spec = pod["spec"]
    spec["volumes"] += [
        {"name": "s", "secret": {"secretName": "tls", "optional": True}},
        {"name": "legacy", "secret": {"secretName": "default-token-abcde"}},
        {"name": "default-token-abcde", "secret": {"secretName": "default-token-abcde"}},
        {
            "name": "p",
            "projected": {
                "sources": [
                    {"configMap": {"name": "proj-cm"}},
                    {"secret": {"name": "proj-secret"}},
                    {"serviceAccountToken": {"path": "vault", "audience": "vault"}},
                ]
            },
        },
        {"name": "csi", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi-creds"}}},
        {"name": "csi-plain", "csi": {"driver": "x"}},
        {"name": "ceph", "cephfs": {"monitors": ["m"], "secretRef": {"name": "ceph-key"}}},
        {"name": "ceph-nokey", "cephfs": {"monitors": ["m"]}},
        {"name": "cinder", "cinder": {"volumeID": "v", "secretRef": {"name": "cinder-key"}}},
        {"name": "rbd", "rbd": {"image": "i", "monitors": ["m"], "secretRef": {"name": "rbd-key"}}},
        {"name": "flex", "flexVolume": {"driver": "d", "secretRef": {"name": "flex-key"}}},
        {
            "name": "iscsi",
            "iscsi": {
                "iqn": "q",
                "lun": 0,
                "targetPortal": "t",
                "secretRef": {"name": "iscsi-chap"},
            },
        },
        {
            "name": "scale",
            "scaleIO": {"gateway": "g", "system": "s", "secretRef": {"name": "scaleio-key"}},
        },
        {"name": "sos", "storageos": {"volumeName": "v", "secretRef": {"name": "storageos-key"}}},
        {"name": "az", "azureFile": {"secretName": "azure-key", "shareName": "s"}},
        {"name": "pvc", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "down", "downwardAPI": {"items": []}},
    ]
    spec["containers"][0]["env"] += [
        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "a"}}},
        {
            "name": "B",
            "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "b", "optional": True}},
        },
    ]
    spec["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": "from-cm", "optional": True}},
        {"secretRef": {"name": "from-secret"}, "prefix": "S_"},
    ]
    spec["initContainers"] = [
        {"name": "init", "image": "busybox", "envFrom": [{"configMapRef": {"name": "init-cm"}}]}
    ]
    spec["ephemeralContainers"] = [
        {
            "name": "debug",
            "image": "busybox",
            "env": [
                {"name": "D", "valueFrom": {"secretKeyRef": {"name": "debug-secret", "key": "d"}}}
            ],
        }
    ]
    spec["imagePullSecrets"] = [{"name": "registry"}, {}]
    return pod


def test_dependencies_cover_every_reference() -> None:
    deps = unchanged(dependencies, referencing_pod())
    assert deps == Dependencies(
        config_maps=frozenset({"web-config", "proj-cm", "env-cm", "from-cm", "init-cm"}),
        secrets=frozenset(
            {
                "tls",
                "default-token-abcde",
                "proj-secret",
                "csi-creds",
                "ceph-key",
                "cinder-key",
                "rbd-key",
                "flex-key",
                "iscsi-chap",
                "scaleio-key",
                "storageos-key",
                "azure-key",
                "env-secret",
                "from-secret",
                "debug-secret",
                "registry",
            }
        ),
        service_account="web",
    )


def test_dependencies_skip_admission_token_volumes_and_root_ca() -> None:
    pod = deployment_pod()
    pod["spec"]["volumes"] = [
        {"name": "default-token-abcde", "secret": {"secretName": "default-token-abcde"}},
        pod["spec"]["volumes"][1],  # kube-api-access-*, with kube-root-ca.crt inside
        {"name": "ca", "configMap": {"name": "kube-root-ca.crt"}},
    ]
    del pod["spec"]["serviceAccountName"], pod["spec"]["serviceAccount"]
    pod["spec"]["containers"][0].pop("env")
    assert dependencies(pod) == Dependencies(
        config_maps=frozenset(), secrets=frozenset(), service_account="default"
    )
    pod["spec"]["serviceAccount"] = "legacy-field"  # the deprecated alias still names it
    assert dependencies(pod).service_account == "legacy-field"


def test_optional_references_are_those_never_required() -> None:
    pod = referencing_pod()
    pod["spec"]["volumes"].append(
        {"name": "cm2", "configMap": {"name": "env-cm", "optional": True}}
    )
    assert unchanged(optional_references, pod) == frozenset(
        {
            ("Secret", "tls"),
            ("Secret", "env-secret"),
            ("ConfigMap", "from-cm"),
            ("Secret", "registry"),
        }
    )
    # Required once is required: env-cm is optional in a volume but required in env.
    assert ("ConfigMap", "env-cm") not in optional_references(pod)


# -- status ------------------------------------------------------------------------------


def lower_running() -> dict[str, Any]:
    return {
        "metadata": {"name": "web-7d9f8b6c5-x2x9q", "namespace": "shop"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-02T03:01:00Z"},
            ],
            "hostIP": "10.1.0.7",
            "hostIPs": [{"ip": "10.1.0.7"}],
            "podIP": "10.244.3.9",
            "podIPs": [{"ip": "10.244.3.9"}],
            "startTime": "2025-01-02T03:00:30Z",
            "qosClass": "BestEffort",
            "nominatedNodeName": "lower-node-3",
            "containerStatuses": [
                {
                    "name": "web",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "nginx:1.27",
                    "imageID": "docker.io/library/nginx@sha256:1",
                    "containerID": "containerd://abc",
                    "state": {"running": {"startedAt": "2025-01-02T03:00:40Z"}},
                }
            ],
            "resize": "InProgress",
        },
    }


def test_upper_status_mirrors_the_lower_one_with_the_virtual_node_ip() -> None:
    lower, upper = lower_running(), deployment_pod()
    status = unchanged(upper_status, lower, upper=upper, node_ip="192.0.2.10")
    source = lower["status"]
    assert status["hostIP"] == "192.0.2.10"
    assert status["hostIPs"] == [{"ip": "192.0.2.10"}]
    assert "nominatedNodeName" not in status
    for key in ("phase", "podIP", "podIPs", "startTime", "qosClass", "containerStatuses", "resize"):
        assert status[key] == source[key]
    assert status["conditions"] == source["conditions"]  # upper PodScheduled replaced, not kept


def test_upper_only_conditions_are_kept_stale_ones_are_not() -> None:
    upper = deployment_pod()
    upper["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "reason": "upper"},
        {"type": "Ready", "status": "False", "reason": "stale"},
        {"type": "example.com/canary", "status": "True"},
    ]
    conditions = upper_status(lower_running(), upper=upper, node_ip="192.0.2.10")["conditions"]
    by_type = {c["type"]: c for c in conditions}
    assert len(conditions) == len(by_type) == 4
    assert by_type["Ready"]["status"] == "True"
    assert "reason" not in by_type["PodScheduled"]
    assert by_type["example.com/canary"] == {"type": "example.com/canary", "status": "True"}


def test_readiness_gates_gate_ready_like_a_kubelet() -> None:
    upper = deployment_pod()
    upper["spec"]["readinessGates"] = [
        {"conditionType": "example.com/lb"},
        {"conditionType": "example.com/canary"},
    ]
    upper["status"]["conditions"] = [{"type": "example.com/canary", "status": "False"}]
    ready = next(
        c
        for c in upper_status(lower_running(), upper=upper, node_ip="1.2.3.4")["conditions"]
        if c["type"] == "Ready"
    )
    assert ready["status"] == "False"
    assert ready["reason"] == "ReadinessGatesNotReady"
    assert ready["message"] == (
        'corresponding condition of pod readiness gate "example.com/lb" does not exist., '
        'the status of pod readiness gate "example.com/canary" is not "True", but False'
    )
    upper["status"]["conditions"] = [
        {"type": "example.com/canary", "status": "True"},
        {"type": "example.com/lb", "status": "True"},
    ]
    conditions = upper_status(lower_running(), upper=upper, node_ip="1.2.3.4")["conditions"]
    assert {"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-02T03:01:00Z"} in (
        conditions
    )


def test_upper_status_of_a_status_less_lower_pod() -> None:
    upper = deployment_pod()
    status = upper_status({"metadata": {}}, upper=upper, node_ip="192.0.2.10")
    assert status == {
        "hostIP": "192.0.2.10",
        "hostIPs": [{"ip": "192.0.2.10"}],
        "conditions": upper["status"]["conditions"],
    }


def test_restored_labels_round_trip() -> None:
    pod = deployment_pod()
    pod["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"] = "g1"
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID,
        node_name=NODE,
        node_labels=NODE_LABELS,
        ignore_labels=("pod-group.scheduling.sigs.k8s.io",),
    )
    lower = lower_pod(pod, policy=policy)
    expected = {k: v for k, v in pod["metadata"]["labels"].items() if k != "virtual-pod"}
    assert unchanged(restored_labels, lower) == expected


def test_restored_labels_ignore_a_broken_tripped_annotation() -> None:
    lower = {
        "metadata": {
            "labels": {"app": "web", ownership.NODE_LABEL: NODE, "virtual-pod": "true"},
            "annotations": {naming.TRIPPED_LABELS_ANNOTATION: "{broken"},
        }
    }
    assert restored_labels(lower) == {"app": "web"}
    lower["metadata"]["annotations"][naming.TRIPPED_LABELS_ANNOTATION] = '["a"]'
    assert restored_labels(lower) == {"app": "web"}
    assert restored_labels({}) == {}


# -- spec_update -------------------------------------------------------------------------


def test_no_update_when_nothing_changed() -> None:
    pod = annotated(deployment_pod(), webhook_selector())
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID, node_name=NODE, node_labels=NODE_LABELS, ignore_labels=("app",)
    )
    assert unchanged(spec_update, pod, lower_pod(pod, policy=policy), policy=policy) is None


def test_images_are_matched_by_name() -> None:
    pod = deployment_pod()
    pod["spec"]["containers"].append({"name": "sidecar", "image": "envoy:1"})
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox:1"}]
    lower = lower_pod(pod, policy=T)
    # The lower cluster injected a container in front: by-index copying would break it.
    lower["spec"]["containers"].insert(0, {"name": "injected", "image": "mesh:9"})
    pod["spec"]["containers"][1]["image"] = "envoy:2"
    pod["spec"]["containers"].append({"name": "new", "image": "cannot-be-added"})
    pod["spec"]["initContainers"][0]["image"] = "busybox:2"
    assert unchanged(spec_update, pod, lower, policy=T) == {
        "spec": {
            "containers": [{"name": "sidecar", "image": "envoy:2"}],
            "initContainers": [{"name": "init", "image": "busybox:2"}],
        }
    }


def test_active_deadline_may_be_set_or_shortened_only() -> None:
    pod = deployment_pod()
    lower = lower_pod(pod, policy=T)
    pod["spec"]["activeDeadlineSeconds"] = 300
    assert spec_update(pod, lower, policy=T) == {"spec": {"activeDeadlineSeconds": 300}}
    lower["spec"]["activeDeadlineSeconds"] = 600
    assert spec_update(pod, lower, policy=T) == {"spec": {"activeDeadlineSeconds": 300}}
    lower["spec"]["activeDeadlineSeconds"] = 100
    assert spec_update(pod, lower, policy=T) is None  # extending is illegal
    del pod["spec"]["activeDeadlineSeconds"]
    assert spec_update(pod, lower, policy=T) is None  # so is removing


def test_added_tolerations_are_appended_to_the_existing_list() -> None:
    pod = annotated(deployment_pod(), webhook_selector())
    lower = lower_pod(pod, policy=T)
    lower["spec"]["tolerations"].append({"key": "lower-admission", "operator": "Exists"})
    selector = webhook_selector()
    gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    selector["tolerations"].append(gpu)
    patch = unchanged(spec_update, annotated(pod, selector), lower, policy=T)
    assert patch is not None
    assert patch["spec"] == {"tolerations": [*lower["spec"]["tolerations"], gpu]}
    assert patch["metadata"] == {"annotations": {clusterselector.ANNOTATION: json.dumps(selector)}}


def test_label_and_annotation_changes_keep_ownership_and_tripped_labels() -> None:
    pod = deployment_pod()
    pod["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"] = "g1"
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID,
        node_name=NODE,
        node_labels=NODE_LABELS,
        ignore_labels=("pod-group.scheduling.sigs.k8s.io",),
    )
    lower = lower_pod(pod, policy=policy)
    pod["metadata"]["labels"]["tier"] = "front"
    del pod["metadata"]["labels"]["pod-template-hash"]
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = NOW
    pod["metadata"]["annotations"]["note"] = "x"
    patch = spec_update(pod, lower, policy=policy)
    assert patch == {
        "metadata": {
            # Keys are never removed below: they may be the lower cluster's own.
            "labels": {"tier": "front"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": NOW, "note": "x"},
        }
    }
    # Applied as a merge, the result still carries every mark lower_pod writes.
    merged = copy.deepcopy(lower["metadata"])
    for key, changes in patch["metadata"].items():
        for k, v in changes.items():
            if v is None:
                merged[key].pop(k)
            else:
                merged[key][k] = v
    wanted = lower_pod(pod, policy=policy)["metadata"]
    assert merged["labels"] == {**wanted["labels"], "pod-template-hash": "7d9f8b6c5"}
    assert merged["annotations"] == wanted["annotations"]
    assert ownership.is_owned(
        {"metadata": merged}, owner=ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)
    )


def test_marks_removed_below_are_restored() -> None:
    pod = deployment_pod()
    lower = lower_pod(pod, policy=T)
    del lower["metadata"]["labels"][ownership.NODE_LABEL]
    lower["metadata"]["annotations"][ownership.NODE_ANNOTATION] = "other"
    assert spec_update(pod, lower, policy=T) == {
        "metadata": {
            "labels": {ownership.NODE_LABEL: NODE},
            "annotations": {ownership.NODE_ANNOTATION: NODE},
        }
    }


# -- failure statuses --------------------------------------------------------------------


def running_upper() -> dict[str, Any]:
    pod = deployment_pod()
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    pod["status"] = copy.deepcopy(lower_running()["status"])
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "init",
            "ready": True,
            "restartCount": 0,
            "image": "busybox",
            "imageID": "",
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": "t0"}},
        }
    ]
    pod["status"]["containerStatuses"].append(
        {
            "name": "sidecar",
            "ready": False,
            "restartCount": 2,
            "image": "envoy",
            "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        }
    )
    return pod


# -- properties ------------------------------------------------------------------------


texts = st.text(max_size=20)
string_maps = st.dictionaries(texts, texts, max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)
selector_keys = st.sampled_from(
    [
        "nodeSelector",
        "affinity",
        "tolerations",
        "nodeAffinity",
        "nodeSelectorTerms",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "matchExpressions",
        "podAffinity",
    ]
)
selector_like = st.recursive(
    st.none() | texts | st.integers(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(selector_keys, inner, max_size=3),
    max_leaves=15,
)


@settings(max_examples=200, deadline=None)
@given(
    labels=string_maps,
    annotations=string_maps,
    ignored=st.lists(texts, max_size=4),
    selector=st.one_of(texts, json_values.map(json.dumps), selector_like.map(json.dumps)),
    prefix=st.sampled_from(["", "up-"]),
)
def test_lower_pod_never_raises_nor_leaks_upper_identity(
    labels: dict[str, str],
    annotations: dict[str, str],
    ignored: list[str],
    selector: str,
    prefix: str,
) -> None:
    pod = deployment_pod()
    marks = (VIRTUAL_POD_LABEL, ownership.NODE_LABEL)
    labels = {k: v for k, v in labels.items() if k not in marks}
    pod["metadata"]["labels"] = labels
    pod["metadata"]["annotations"] = {**annotations, clusterselector.ANNOTATION: selector}
    policy = TranslationPolicy(
        cluster_id=CLUSTER_ID,
        node_name=NODE,
        node_labels=NODE_LABELS,
        namespace_prefix=prefix,
        ignore_labels=(*ignored, *list(labels)[:2]),
    )
    lower = unchanged(lower_pod, pod, policy=policy)
    assert "nodeName" not in lower["spec"]
    assert "uid" not in lower["metadata"]
    assert "resourceVersion" not in lower["metadata"]
    assert ownership.is_owned(
        lower, owner=ownership.NodeIdentity(node_name=NODE, cluster_id=CLUSTER_ID)
    )
    assert restored_labels(lower) == labels
    assert spec_update(pod, lower, policy=policy) is None


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(json_values, selector_like), node_labels=string_maps)
def test_placement_never_raises_on_arbitrary_shapes(
    value: object, node_labels: dict[str, str]
) -> None:
    spec: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": value}},
        "nodeSelector": value,
        "tolerations": value,
    }
    cluster_selector = parse_cluster_selector(json.dumps(value))
    placed_spec = unchanged(
        lower_placement,
        spec,
        cluster_selector=cluster_selector,
        node_name=NODE,
        node_labels=node_labels,
    )
    assert isinstance(placed_spec, dict)
    assert not _containers(placed_spec) & (_containers(spec) | _containers(cluster_selector))


def _containers(value: object) -> set[int]:
    """The ids of every dict and list in `value` (itself included)."""
    found: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.add(id(item))
            stack.extend(item.values())
        elif isinstance(item, list):
            found.add(id(item))
            stack.extend(item)
    return found


def test_placement_copies_once_and_shares_nothing_with_its_inputs() -> None:
    # Every part of the placement is rewritten at once: kept and spent node selector
    # entries, required terms ANDed with the annotation's, preferred and pod affinities
    # merged, tolerations the webhook added left upstairs.
    term = {"matchExpressions": [expr("disk", "In", "ssd")], "matchFields": []}
    spec = {
        "containers": [{"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]}],
        "nodeSelector": {"clusterID": "lower-1", "disk": "ssd"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(term, term),
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": term}
                ],
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]
            },
        },
        "tolerations": [
            clusterselector.virtual_node_toleration(),
            {"key": "gpu", "operator": "Exists"},
        ],
    }
    selector = {
        "nodeSelector": {"zone": "a"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required(
                    {"matchExpressions": [expr("zone", "In", "a")]},
                    {"matchExpressions": [expr("zone", "In", "b")]},
                ),
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 2, "preference": {"matchExpressions": [expr("ssd", "Exists")]}}
                ],
            },
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "zone"}}
                ]
            },
        },
        "tolerations": [{"key": "spot", "operator": "Exists"}],
    }
    lowered = placed(spec, selector)
    node = lowered["affinity"]["nodeAffinity"]
    assert len(node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]) == 4
    assert lowered["nodeSelector"] == {"disk": "ssd", "zone": "a"}
    assert lowered["tolerations"] == [
        {"key": "gpu", "operator": "Exists"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert not _containers(lowered) & (_containers(spec) | _containers(selector))
    wanted = lower_tolerations(spec, cluster_selector=selector)
    assert wanted == lowered["tolerations"]
    assert not _containers(wanted) & (_containers(spec) | _containers(selector))


def test_spec_update_wants_what_lower_pod_would_make() -> None:
    # spec_update works the compared fields out on their own (every pod is compared at each
    # start); the lower pod it compares against must be what lower_pod makes of them.
    pod = deployment_pod()
    selector = webhook_selector()
    selector["tolerations"].append({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"})
    pod = annotated(pod, selector)
    pod["spec"]["activeDeadlineSeconds"] = 600
    pod["spec"]["initContainers"] = [{"name": "setup", "image": "busybox:1"}]
    for policy in (T, TranslationPolicy(cluster_id=CLUSTER_ID, node_name=NODE,
                                        node_labels=NODE_LABELS, ignore_labels=("app",),
                                        namespace_prefix="p-")):  # fmt: skip
        assert spec_update(pod, lower_pod(pod, policy=policy), policy=policy) is None
        older = lower_pod(pod, policy=policy)
        older["spec"]["tolerations"] = []
        older["spec"]["activeDeadlineSeconds"] = 900
        for group in ("containers", "initContainers"):
            for container in older["spec"][group]:
                container["image"] = "old"
        older["metadata"]["labels"] = {}
        older["metadata"]["annotations"] = {}
        wanted = lower_pod(pod, policy=policy)
        patch = spec_update(pod, older, policy=policy)
        assert patch == {
            "metadata": {
                "labels": wanted["metadata"]["labels"],
                "annotations": wanted["metadata"]["annotations"],
            },
            "spec": {
                "containers": [{"name": c["name"], "image": c["image"]}
                               for c in wanted["spec"]["containers"]],
                "initContainers": [{"name": "setup", "image": "busybox:1"}],
                "activeDeadlineSeconds": 600,
                "tolerations": wanted["spec"]["tolerations"],
            },
        }  # fmt: skip


def _sized(
    requests: dict[str, str] | None = None,
    *,
    limits: dict[str, str] | None = None,
    generation: int = 1,
    observed: int | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    pod: dict[str, Any] = {
        "metadata": {"generation": generation},
        "spec": {"containers": [{"name": "main", "resources": resources}]},
        "status": {},
    }
    if observed is not None:
        pod["status"]["observedGeneration"] = observed
    return pod


@pytest.mark.parametrize(
    ("upper", "lower", "expected"),
    [
        # the same figures, however written: nothing to send
        ({"cpu": "1", "memory": "1Gi"}, {"cpu": "1000m", "memory": "1024Mi"}, None),
        # a resize up: the upper cpu and memory, all of them
        (
            {"cpu": "500m", "memory": "128Mi"},
            {"cpu": "100m", "memory": "128Mi"},
            {"requests": {"cpu": "500m", "memory": "128Mi"}},
        ),
        # what the lower cluster added (a LimitRange default) is left alone
        ({"cpu": "100m"}, {"cpu": "100m", "memory": "64Mi"}, None),
        # other resources are not the resize's
        ({"cpu": "1", "example.com/gpu": "1"}, {"cpu": "1"}, None),
    ],
)
def test_resize_patch_sends_the_upper_cpu_and_memory_the_lower_pod_lacks(
    upper: dict[str, str], lower: dict[str, str], expected: dict[str, Any] | None
) -> None:
    patch = unchanged(resize_patch, _sized(upper), _sized(lower))
    if expected is None:
        assert patch is None
    else:
        assert patch == {"spec": {"containers": [{"name": "main", "resources": expected}]}}


def test_resize_patch_covers_limits_and_sidecars_by_name() -> None:
    upper = _sized({"cpu": "1"}, limits={"cpu": "2"})
    upper["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}
    ]
    upper["spec"]["containers"].append({"name": "only-upstairs", "resources": {}})
    lower = _sized({"cpu": "1"}, limits={"cpu": "1"})
    lower["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}
    ]
    assert resize_patch(upper, lower) == {
        "spec": {
            "initContainers": [{"name": "proxy", "resources": {"requests": {"cpu": "1"}}}],
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}
            ],
        }
    }


@pytest.mark.parametrize(
    ("upper", "lower", "expected"),
    [
        # the lower pod observed its generation and has the upper resources
        (_sized({"cpu": "1"}, generation=3), _sized({"cpu": "1"}, generation=2, observed=2), 3),
        # the lower pod has not observed its latest generation
        (_sized({"cpu": "1"}, generation=3), _sized({"cpu": "1"}, generation=2, observed=1), None),
        # the upper resize has not reached the lower pod
        (_sized({"cpu": "2"}, generation=3), _sized({"cpu": "1"}, generation=2, observed=2), None),
        # a lower node that reports no observedGeneration
        (_sized({"cpu": "1"}, generation=3), _sized({"cpu": "1"}, generation=2), None),
    ],
)
def test_observed_generation_is_the_upper_one_once_the_lower_pod_caught_up(
    upper: dict[str, Any], lower: dict[str, Any], expected: int | None
) -> None:
    assert observed_generation(upper=upper, lower=lower) == expected


def test_upper_status_brings_up_a_resize_in_upper_generations() -> None:
    lower = _sized({"cpu": "40"}, generation=2, observed=2)
    lower["status"]["conditions"] = [
        {"type": "Ready", "status": "True"},
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible",
         "message": "no room", "observedGeneration": 2},
    ]  # fmt: skip
    lower["status"]["containerStatuses"] = [
        {"name": "main", "resources": {"requests": {"cpu": "1"}},
         "allocatedResources": {"cpu": "1"}},
    ]  # fmt: skip
    upper = _sized({"cpu": "40"}, generation=5, observed=4)
    status = upper_status(lower, upper=upper, node_ip="192.0.2.10")
    assert status["observedGeneration"] == 5
    pending = next(c for c in status["conditions"] if c["type"] == "PodResizePending")
    assert pending == {"type": "PodResizePending", "status": "True", "reason": "Infeasible",
                       "message": "no room", "observedGeneration": 5}  # fmt: skip
    assert status["containerStatuses"] == lower["status"]["containerStatuses"]
    # Not caught up below: the upper status keeps its generation, and the lower
    # condition's, which counts lower generations, is not brought up as it is.
    upper = _sized({"cpu": "48"}, generation=6, observed=5)
    status = upper_status(lower, upper=upper, node_ip="192.0.2.10")
    assert status["observedGeneration"] == 5
    pending = next(c for c in status["conditions"] if c["type"] == "PodResizePending")
    assert "observedGeneration" not in pending


def test_a_resize_condition_the_lower_pod_dropped_is_not_kept_upstairs() -> None:
    upper = _sized({"cpu": "1"}, generation=2, observed=1)
    upper["status"]["conditions"] = [
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible"},
        {"type": "example.com/canary", "status": "True"},
    ]
    lower = _sized({"cpu": "1"}, generation=2, observed=2)
    lower["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    types = [c["type"] for c in upper_status(lower, upper=upper, node_ip="1.2.3.4")["conditions"]]
    assert types == ["Ready", "example.com/canary"]


@pytest.mark.parametrize(
    ("refused_generation", "shown"),
    [
        (6, True),  # the upper pod's current generation: the refusal stands
        (5, False),  # an earlier one: the upper pod was resized since
    ],
)
def test_a_refused_resize_shows_as_infeasible_for_its_generation(
    refused_generation: int, shown: bool
) -> None:
    lower = _sized({"cpu": "1"}, generation=2, observed=2)
    lower["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    upper = _sized({"cpu": "40"}, generation=6, observed=4)
    refused = RefusedResize(generation=refused_generation, message="no room", at="T")
    status = upper_status(lower, upper=upper, node_ip="1.2.3.4", refused=refused)
    pending = [c for c in status["conditions"] if c["type"] == "PodResizePending"]
    if shown:
        assert pending == [{"type": "PodResizePending", "status": "True", "reason": "Infeasible",
                            "message": "no room", "observedGeneration": 6,
                            "lastTransitionTime": "T"}]  # fmt: skip
        assert status["observedGeneration"] == 6
    else:
        assert pending == []
        assert status["observedGeneration"] == 4
