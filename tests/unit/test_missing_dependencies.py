"""What a pod waiting for a ConfigMap or Secret shows, and how repeated events are counted.

Pure decisions (vnode.providers.k2k.missing, vnode.controllers.pod_decisions.waiting_status) and the
EventRecorder's aggregation against a recording fake ApiClient: the recorder's own logic in
isolation (a real apiserver accepts any count; tests/e2e/test_missing_dependencies.py shows
the result in a real cluster).
"""

from __future__ import annotations

from typing import Any

from tensile.kube.events import EventRecorder
from tensile.kube.resources import EVENTS
from vnode.controllers.pod_decisions import waiting_status
from vnode.providers.k2k import missing
from vnode.testing.fakeapi import FakeApi

NOW = "2026-11-24T10:00:00Z"


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "team", "uid": "u-1"},
        "spec": {"containers": [{"name": "main", "image": "nginx"}], **spec},
        "status": {"phase": "Pending"},
    }


def env_ref(kind: str, name: str, key: str, *, optional: bool | None = None) -> dict[str, Any]:
    field = "configMapKeyRef" if kind == "ConfigMap" else "secretKeyRef"
    ref: dict[str, Any] = {"name": name, "key": key}
    if optional is not None:
        ref["optional"] = optional
    return {"name": key.upper(), "valueFrom": {field: ref}}


def lookup_in(objects: dict[tuple[str, str], dict[str, Any]]) -> missing.Lookup:
    return lambda kind, name: objects.get((kind, name))


def test_a_missing_mandatory_config_map_is_the_kubelets_error_and_vks_reason() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [env_ref("ConfigMap", "settings", "mode")]
    gaps = missing.unresolved(p, lookup=lookup_in({}))
    error = missing.first_mandatory(gaps, namespace="team")
    assert error is not None
    assert str(error) == 'configmap "settings" not found'
    assert error.reason == "MandatoryConfigMapNotFound"
    assert (error.kind, error.namespace, error.name, error.key) == (
        "ConfigMap",
        "team",
        "settings",
        None,
    )
    assert missing.skipped_events(gaps, namespace="team") == []


def test_a_missing_key_of_an_existing_secret_names_the_key() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [env_ref("Secret", "db", "password")]
    secret = {"data": {"user": "YQ=="}}
    error = missing.first_mandatory(
        missing.unresolved(p, lookup=lookup_in({("Secret", "db"): secret})), namespace="team"
    )
    assert error is not None
    assert str(error) == "couldn't find key password in Secret team/db"
    assert error.reason == "MandatorySecretKeyNotFound"
    # The key present: nothing is missing.
    secret["data"]["password"] = "cA=="
    assert missing.unresolved(p, lookup=lookup_in({("Secret", "db"): secret})) == []


def test_config_map_keys_count_in_binary_data_too() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [env_ref("ConfigMap", "blob", "bin")]
    cm = {"binaryData": {"bin": "AAE="}}
    assert missing.unresolved(p, lookup=lookup_in({("ConfigMap", "blob"): cm})) == []


def test_optional_references_are_skipped_with_vks_event_reasons() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [
        env_ref("Secret", "maybe", "token", optional=True),
        env_ref("ConfigMap", "partial", "absent", optional=True),
    ]
    p["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "extra", "optional": True}}]
    p["spec"]["volumes"] = [{"name": "v", "secret": {"secretName": "vol", "optional": True}}]
    objects = {("ConfigMap", "partial"): {"data": {"present": "1"}}}
    gaps = missing.unresolved(p, lookup=lookup_in(objects))
    assert missing.first_mandatory(gaps, namespace="team") is None
    events = missing.skipped_events(gaps, namespace="team")
    # An optional volume is mounted empty without an event, as by a kubelet.
    assert [(e.type, e.reason) for e in events] == [
        ("Warning", "OptionalSecretNotFound"),
        ("Warning", "OptionalConfigMapKeyNotFound"),
        ("Warning", "OptionalConfigMapNotFound"),
    ]
    assert "Secret team/maybe" in events[0].message
    assert "key absent of ConfigMap team/partial" in events[1].message


def test_a_volume_is_reported_first_in_the_failed_mount_wording() -> None:
    p = pod(volumes=[{"name": "conf", "configMap": {"name": "settings"}}])
    p["spec"]["containers"][0]["env"] = [env_ref("Secret", "db", "password")]
    error = missing.first_mandatory(missing.unresolved(p, lookup=lookup_in({})), namespace="team")
    assert error is not None
    assert error.volume == "conf"
    assert str(error) == (
        'MountVolume.SetUp failed for volume "conf" : configmap "settings" not found'
    )


def test_image_pull_secrets_never_block_a_pod() -> None:
    p = pod(imagePullSecrets=[{"name": "registry"}])
    assert missing.unresolved(p, lookup=lookup_in({})) == []


def test_each_gap_is_reported_once() -> None:
    p = pod()
    p["spec"]["containers"].append({"name": "side", "image": "busybox"})
    for container in p["spec"]["containers"]:
        container["env"] = [env_ref("ConfigMap", "settings", "mode")]
    assert len(missing.unresolved(p, lookup=lookup_in({}))) == 1


def test_a_waiting_pod_shows_create_container_config_error_like_a_kubelet() -> None:
    p = pod()
    p["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-24T09:00:00Z"}
    ]
    status = waiting_status(
        p, reason="CreateContainerConfigError", message='configmap "x" not found', now=NOW
    )
    assert status["phase"] == "Pending"
    [container] = status["containerStatuses"]
    assert container["name"] == "main"
    assert container["ready"] is False
    assert container["state"] == {
        "waiting": {"reason": "CreateContainerConfigError", "message": 'configmap "x" not found'}
    }
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["PodScheduled"]["status"] == "True"
    assert by_type["Initialized"]["status"] == "True"
    assert by_type["Ready"]["status"] == "False"
    assert by_type["Ready"]["reason"] == "ContainersNotReady"
    assert by_type["ContainersReady"]["message"] == "containers with unready status: [main]"
    assert p["status"] == {"phase": "Pending", "conditions": p["status"]["conditions"]}


def test_with_init_containers_the_init_container_waits_and_the_others_initialize() -> None:
    p = pod(initContainers=[{"name": "setup", "image": "busybox"}])
    p["spec"]["restartPolicy"] = "Never"  # still Pending: a kubelet retries until it appears
    status = waiting_status(p, reason="CreateContainerConfigError", message="m", now=NOW)
    assert status["phase"] == "Pending"
    assert status["initContainerStatuses"][0]["state"]["waiting"]["reason"] == (
        "CreateContainerConfigError"
    )
    assert status["containerStatuses"][0]["state"]["waiting"] == {"reason": "PodInitializing"}
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Initialized"]["reason"] == "ContainersNotInitialized"


def test_a_terminal_pod_keeps_its_status() -> None:
    p = pod()
    p["status"] = {"phase": "Failed", "reason": "Evicted"}
    assert waiting_status(p, reason="ContainerCreating", message=None, now=NOW) == p["status"]


async def test_a_repeated_event_is_counted_not_recorded_again() -> None:
    api = FakeApi()
    recorder = EventRecorder(api, component="vn/pod-controller", host="vn")
    p = pod()
    for _ in range(3):
        await recorder.record(p, type="Warning", reason="R", message="same")
    await recorder.record(p, type="Warning", reason="R", message="different")
    methods = [(r.method, r.body.get("count")) for r in api.requests]
    assert methods == [("POST", 1), ("PATCH", 2), ("PATCH", 3), ("POST", 1)]
    first_name = api.requests[0].body["metadata"]["name"]
    assert api.requests[1].path.endswith(f"/namespaces/team/events/{first_name}")


async def test_an_expired_event_is_recorded_anew() -> None:
    api = FakeApi()
    recorder = EventRecorder(api, component="vn/pod-controller", host="vn")
    p = pod()
    await recorder.record(p, type="Warning", reason="R", message="m")
    [expired] = api.objects(EVENTS)
    await api.request("DELETE", api.requests[0].path + "/" + expired["metadata"]["name"])
    await recorder.record(p, type="Warning", reason="R", message="m")
    assert [r.method for r in api.requests] == ["POST", "DELETE", "PATCH", "POST"]
    assert api.requests[3].body["count"] == 1


async def test_the_recorder_forgets_the_least_recent_events_first() -> None:
    api = FakeApi()
    recorder = EventRecorder(api, component="c", host="h", remembered=2)
    p = pod()
    for message in ("a", "b", "c", "a"):
        await recorder.record(p, type="Normal", reason="R", message=message)
    assert [r.method for r in api.requests] == ["POST"] * 4
