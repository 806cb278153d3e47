"""One transient error at start-up is retried, never a crash: node registration and the
clean-up of orphaned lower pods, failed on purpose by the real apiservers.

The failures are real: a validating admission webhook whose endpoint refuses connections
(an address of the fleet's private network, a closed port) makes the apiserver answer
500 InternalError ("failed calling webhook") to the requests it matches, until the test
deletes it, as an apiserver with a broken webhook or a struggling etcd would.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for

_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def failing_webhook(
    cluster: Cluster, fleet: Fleet, *, operation: str, resource: str, labels: dict[str, str]
) -> str:
    """Install a webhook that fails `operation` on `resource` objects with `labels`; return
    its name (delete it with `remove_webhook`)."""
    name = f"refuse-{secrets.token_hex(3)}"
    body: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.tensile.test",
                "clientConfig": {"url": f"https://{fleet.node_ip}:1/refuse"},
                "rules": [
                    {
                        "operations": [operation],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": [resource],
                    }
                ],
                "objectSelector": {"matchLabels": labels},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    cluster.rest().request("POST", _WEBHOOKS, body=body)
    return name


def remove_webhook(cluster: Cluster, name: str) -> None:
    try:
        cluster.rest().request("DELETE", f"{_WEBHOOKS}/{name}")
    except ApiStatusError as exc:
        if exc.code != 404:
            raise


def refused(request: Any) -> bool:
    """Whether `request()` is refused by the failing webhook (a 500 naming it)."""
    try:
        request()
    except ApiStatusError as exc:
        return exc.code == 500 and "failed calling webhook" in str(exc)
    return False


def test_node_registration_is_retried_until_the_apiserver_takes_it(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    name = f"vn-{secrets.token_hex(3)}"
    webhook = failing_webhook(
        fleet.upper, fleet, operation="CREATE", resource="nodes",
        labels={"kubernetes.io/hostname": name},
    )  # fmt: skip
    try:
        probe = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }
        client = fleet.upper.rest()
        wait_for(
            "the webhook to fail node creation",
            lambda: refused(
                lambda: client.request("POST", "/api/v1/nodes", body=probe, query={"dryRun": "All"})
            ),
        )
        node = VirtualNodeProcess(fleet, name=name, log_dir=tmp_path)
        nodes.append(node)
        node.start(wait=False)
        wait_for(
            "two failed registrations",
            lambda: f"registering node {name} failed (attempt 2)" in node.log.read_text(),
        )
        node.check()  # still running
    finally:
        remove_webhook(fleet.upper, webhook)
    node.wait_ready(timeout=60)


def test_orphan_clean_up_is_retried_in_the_background(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    nodes.append(node)
    node.start()
    create(upper, namespace, pod_manifest("orphan", node=node.name))
    wait_for("orphan Running", lambda: phase(upper, namespace, "orphan") == "Running")
    node.kill()
    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/orphan",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    wait_for("orphan gone upstairs", lambda: pod(upper, namespace, "orphan") is None)
    webhook = failing_webhook(
        fleet.lower, fleet, operation="DELETE", resource="pods", labels={"app": "orphan"}
    )
    try:
        path = f"/api/v1/namespaces/{namespace}/pods/orphan"
        wait_for(
            "the webhook to fail the orphan's deletion",
            lambda: refused(lambda: lower.request("DELETE", path, query={"dryRun": "All"})),
        )
        node.restart()
        wait_for(
            "a failed clean-up",
            lambda: (
                "deleting lower pods of deleted upper pods failed (attempt 1)"
                in node.log.read_text()
            ),
        )
        # The node works meanwhile: new pods are created, the orphan waits.
        create(upper, namespace, pod_manifest("fresh", node=node.name))
        wait_for("fresh Running", lambda: phase(upper, namespace, "fresh") == "Running")
        assert pod(lower, namespace, "orphan") is not None
        node.check()
    finally:
        remove_webhook(fleet.lower, webhook)
    wait_for(
        "the orphan deleted below", lambda: pod(lower, namespace, "orphan") is None, timeout=90
    )
    assert pod(lower, namespace, "fresh") is not None


def test_copies_left_by_a_create_cut_short_are_collected_at_the_next_start(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, namespace: str
) -> None:
    # What a node killed between copying a pod's Secret and creating the pod leaves behind:
    # a copy of ours that no pod uses. Someone else's object of the same kind stays.
    lower = fleet.lower.rest()
    node = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    nodes.append(node)
    labels, annotations = ownership.owner_marks(node.owner)
    leftover = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "leftover", "labels": labels, "annotations": annotations},
        "data": {},
    }
    create(lower, namespace, leftover)
    create(lower, namespace, {**leftover, "metadata": {"name": "theirs"}})
    node.start()
    path = f"/api/v1/namespaces/{namespace}/secrets"
    wait_for("the leftover copy collected", lambda: get(lower, f"{path}/leftover") is None)
    assert get(lower, f"{path}/theirs") is not None
