"""A pod whose ConfigMap or Secret is missing, as `kubectl describe pod` shows it upstairs.

Like on a real node: a mandatory one missing keeps the pod Pending with its container waiting
in CreateContainerConfigError (the kubelet's message), one aggregated Warning event with
virtual-kubelet's reason, nothing created below; the pod starts as soon as the object is
created. An optional one missing is an event, and the pod runs without it.
"""

from __future__ import annotations

from typing import Any

from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, events_for, get, phase, pod, pod_manifest, wait_for

# Below the pod controller's 20 s backstop retry: a pod that starts within this started
# because the node noticed the ConfigMap, not because it polled.
PROMPT = 12.0


def _waiting(upper: Any, namespace: str, name: str) -> dict[str, Any] | None:
    current = pod(upper, namespace, name) or {}
    for status in (current.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError":
            return waiting
    return None


def _events(upper: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(upper, namespace, name) if e.get("reason") == reason]


def test_a_pod_waits_for_its_config_map_like_on_a_kubelet_and_starts_when_it_appears(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    manifest = pod_manifest("web", node=virtual_node.name)
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}
    ]
    create(upper, namespace, manifest)

    waiting = wait_for("CreateContainerConfigError", lambda: _waiting(upper, namespace, "web"))
    assert waiting["message"] == 'configmap "settings" not found'
    assert phase(upper, namespace, "web") == "Pending"
    [event] = wait_for(
        "the Warning event",
        lambda: _events(upper, namespace, "web", "MandatoryConfigMapNotFound") or None,
    )
    assert event["type"] == "Warning"
    assert event["message"] == 'configmap "settings" not found'
    assert get(lower, f"/api/v1/namespaces/{namespace}/pods/web") is None

    # The ConfigMap without the key: still waiting, now for the key.
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}
    create(upper, namespace, {**config_map, "data": {"other": "x"}})
    key_message = f"couldn't find key mode in ConfigMap {namespace}/settings"
    wait_for(
        "the key to be named",
        lambda: (_waiting(upper, namespace, "web") or {}).get("message") == key_message,
        timeout=PROMPT,
    )
    assert _events(upper, namespace, "web", "MandatoryConfigMapKeyNotFound")

    upper.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/configmaps/settings",
        body={"data": {"mode": "fast"}},
        content_type="application/merge-patch+json",
    )
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running", timeout=PROMPT)
    lower_pod = get(lower, f"/api/v1/namespaces/{namespace}/pods/web")
    assert lower_pod is not None
    # Retries were counted on the one Event, not recorded as new ones.
    assert len(_events(upper, namespace, "web", "MandatoryConfigMapNotFound")) == 1


def test_a_missing_secret_volume_keeps_the_pod_creating_with_failed_mount(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper = fleet.upper.rest()
    manifest = pod_manifest("web", node=virtual_node.name)
    manifest["spec"]["volumes"] = [{"name": "creds", "secret": {"secretName": "db"}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "creds", "mountPath": "/c"}]
    create(upper, namespace, manifest)
    [event] = wait_for(
        "FailedMount", lambda: _events(upper, namespace, "web", "FailedMount") or None
    )
    assert event["message"] == 'MountVolume.SetUp failed for volume "creds" : secret "db" not found'
    status = (pod(upper, namespace, "web") or {}).get("status") or {}
    [container] = status["containerStatuses"]
    assert container["state"] == {"waiting": {"reason": "ContainerCreating"}}
    create(
        upper,
        namespace,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "data": {"k": "dg=="}},
    )
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running", timeout=PROMPT)


def test_optional_references_missing_are_events_and_the_pod_runs(
    fleet: Fleet, virtual_node: VirtualNodeProcess, namespace: str
) -> None:
    upper = fleet.upper.rest()
    manifest = pod_manifest("web", node=virtual_node.name)
    manifest["spec"]["containers"][0]["env"] = [
        {
            "name": "TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "maybe", "key": "t", "optional": True}},
        },
        {
            "name": "MODE",
            "valueFrom": {"configMapKeyRef": {"name": "extra", "key": "m", "optional": True}},
        },
    ]
    create(upper, namespace, manifest)
    wait_for("Running", lambda: phase(upper, namespace, "web") == "Running")
    reasons = wait_for(
        "both events",
        lambda: (
            found
            if len(found := {e["reason"] for e in events_for(upper, namespace, "web")}
                   & {"OptionalSecretNotFound", "OptionalConfigMapNotFound"}) == 2
            else None
        ),
    )  # fmt: skip
    assert reasons == {"OptionalSecretNotFound", "OptionalConfigMapNotFound"}
