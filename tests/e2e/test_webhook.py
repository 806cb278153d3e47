"""tensile-webhook registered in the real upper apiserver: pods converted on creation,
scheduled onto a virtual node and placed below as they asked; the failure policies with the
webhook down; bootstrapped TLS shared by replicas; abuse of the live server; the manifests.

Each webhook is registered by a URL-based MutatingWebhookConfiguration scoped to the
test's namespace (other tests of the shared fleet never meet it) and deleted afterwards.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devcluster import kwok, webhooks
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError
from devcluster.vnodes import VirtualNodeProcess
from devcluster.webhooks import WebhookProcess
from tensile.contracts import clusterselector
from tensile.contracts.labels import SELECTED_NODE_ANNOTATION as SELECTED_NODE
from tests.e2e.helpers import (
    Storage,
    create,
    delete_if_present,
    get,
    phase,
    token_kubeconfig,
    wait_for,
)

MANIFESTS = Path(__file__).parents[2] / "manifests" / "webhook"
VNODE_TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}


def _hook(
    fleet: Fleet, namespace: str, tmp_path: Path, *, name: str | None = None
) -> WebhookProcess:
    name = name or f"wh-{secrets.token_hex(3)}"
    return WebhookProcess(
        fleet, name=name, log_dir=tmp_path, secret_namespace=namespace, configuration=name
    )


@pytest.fixture
def webhook(fleet: Fleet, namespace: str, tmp_path: Path) -> Iterator[WebhookProcess]:
    """A running webhook, registered (failurePolicy Fail) for `namespace`, called by the
    apiserver; stopped and unregistered afterwards, having exited 0."""
    hook = _hook(fleet, namespace, tmp_path)
    webhooks.register(
        fleet.upper, webhooks.configuration(hook.name, url=hook.url, namespace=namespace)
    )
    try:
        hook.start()
        webhooks.wait_admitting(fleet.upper, namespace=namespace)
        yield hook
    finally:
        code = hook.stop()
        webhooks.unregister(fleet.upper, hook.name)
        assert code == 0, f"tensile-webhook exited {code}; log {hook.log}"


@pytest.fixture
def ssd_node(fleet: Fleet, namespace: str) -> Iterator[str]:
    """A lower kwok node labelled disk=ssd and tainted so that only pods of this test
    (tolerating it) land there; deleted afterwards."""
    name = f"lower-ssd-{secrets.token_hex(3)}"
    taint = {"key": "tensile.io/ssd-only", "value": namespace, "effect": "NoSchedule"}
    fleet.add_lower_node(kwok.FakeNode(name=name, labels={"disk": "ssd"}, taints=(taint,)))
    try:
        yield name
    finally:
        fleet.lower.rest().request("DELETE", f"/api/v1/nodes/{name}")


def _deployment(name: str, *, node: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "virtual-pod": "true"}},
                "spec": {
                    # disk: for the lower cluster; hostname names the virtual node: stays.
                    "nodeSelector": {"disk": "ssd", "kubernetes.io/hostname": node},
                    "tolerations": [
                        {"key": "tensile.io/ssd-only", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [{"name": "main", "image": "nginx:1.27"}],
                },
            },
        },
    }


def _pods(client: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    found = client.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
    )
    return list(found.get("items") or [])


def test_a_deployment_asking_for_ssd_lands_on_the_ssd_node_below(
    fleet: Fleet,
    namespace: str,
    webhook: WebhookProcess,
    virtual_node: VirtualNodeProcess,
    ssd_node: str,
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    fleet.upper.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(_deployment("fast", node=virtual_node.name, namespace=namespace)),
    )
    fleet.upper.kubectl("rollout", "status", "deployment/fast", "-n", namespace, "--timeout=90s")
    above = _pods(upper, namespace, "app=fast")
    assert len(above) == 2
    for found in above:
        spec = found["spec"]
        assert spec["nodeName"] == virtual_node.name  # the real upper scheduler's choice
        assert spec["nodeSelector"] == {"kubernetes.io/hostname": virtual_node.name}
        assert VNODE_TOLERATION in spec["tolerations"]
        selector = clusterselector.parse(found["metadata"]["annotations"]["clusterSelector"])
        assert selector is not None
        assert selector["nodeSelector"] == {"disk": "ssd"}
    below = wait_for(
        "two lower pods", lambda: (p := _pods(lower, namespace, "app=fast")) and len(p) == 2 and p
    )
    for found in below:
        assert found["spec"]["nodeName"] == ssd_node
        assert found["spec"]["nodeSelector"] == {"disk": "ssd"}
        tolerations = found["spec"]["tolerations"]
        assert {"key": "tensile.io/ssd-only", "operator": "Exists", "effect": "NoSchedule"} in (
            tolerations
        )
        assert VNODE_TOLERATION not in tolerations  # the webhook's stays upstairs
    fleet.upper.kubectl("delete", "deployment/fast", "-n", namespace, "--wait=false")
    assert 'result="mutated"' in webhook.metrics()


def test_a_pod_using_a_claim_provisioned_for_a_virtual_node_is_scheduled_there(
    fleet: Fleet,
    namespace: str,
    webhook: WebhookProcess,
    storage: Storage,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
) -> None:
    """Two virtual nodes; a claim of a class nothing provisions upstairs, followed down by
    a pod placed on the first one by name (tensile-kube's migration path, as in
    tests/e2e/test_volumes.py): bound below, the first node shows its volume upstairs and
    writes `volume.kubernetes.io/selected-node: <first>` on the claim. A new pod of the
    claim, with no node constraint of its own and no toleration of the virtual nodes' taint,
    passes the real webhook -- which pins it to that node and tolerates the taint -- and
    the real upper scheduler binds it there; the second node was Ready and tolerated too.
    (The volume the node shows upstairs is pinned to it as well, so the scheduler's volume
    binding agrees: the test checks the webhook's requirement on the stored pod.)"""
    upper = fleet.upper.rest()
    first = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--lower-storage-class={storage.legacy_class}={storage.lower_class}"],
    )
    second = VirtualNodeProcess(fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path)
    for node in (first, second):
        nodes.append(node)
        node.start()
    claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    upper.request(
        "POST",
        claims,
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": storage.legacy_class,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    data = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    create(
        upper,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "first"},
            "spec": {
                "nodeName": first.name,
                "tolerations": [VNODE_TOLERATION],
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": data,
            },
        },
    )
    claim = wait_for(
        "selected-node written by the first virtual node",
        lambda: (
            (found := get(upper, f"{claims}/data"))
            and (found["metadata"].get("annotations") or {}).get(SELECTED_NODE) == first.name
            and found
        ),
        timeout=90,
    )
    volume = claim["spec"]["volumeName"]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "second", "labels": {"virtual-pod": "true"}},
        "spec": {"containers": [{"name": "app", "image": "busybox"}], "volumes": data},
    }
    try:
        # The webhook learns of the annotation through its informer: shortly after it is
        # written. Asked without creating anything until it pins, then created for real.
        wait_for(
            "the webhook's pin",
            lambda: upper.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                body=manifest,
                query={"dryRun": "All"},
            )["spec"].get("affinity"),
            timeout=15,
        )
        created = create(upper, namespace, manifest)
        assert clusterselector.required_terms(created["spec"]["affinity"]) == [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [first.name]}
                ]
            }
        ]
        assert "nodeName" not in created["spec"]  # left to the upper scheduler
        assert VNODE_TOLERATION in created["spec"]["tolerations"]
        wait_for(
            "second Running", lambda: phase(upper, namespace, "second") == "Running", timeout=90
        )
        placed = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/second")
        assert placed["spec"]["nodeName"] == first.name
        # The other virtual node could take such a pod: Ready, and its taint tolerated.
        other = upper.request("GET", f"/api/v1/nodes/{second.name}")
        assert {"type": "Ready", "status": "True"}.items() <= next(
            c for c in other["status"]["conditions"] if c["type"] == "Ready"
        ).items()
        assert all(t["key"] == VNODE_TOLERATION["key"] for t in other["spec"].get("taints") or [])
    finally:
        for name in ("second", "first"):
            upper.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        upper.request("DELETE", f"{claims}/data")
        wait_for("the claim gone", lambda: get(upper, f"{claims}/data") is None, timeout=60)
        # Shown from a Retain volume below: the upper volume is left Released; remove it.
        upper.request("DELETE", f"/api/v1/persistentvolumes/{volume}")


def _selected_node(claim: dict[str, Any] | None) -> str | None:
    annotations = ((claim or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(SELECTED_NODE)


def test_a_claim_selected_but_not_bound_does_not_pin_a_new_pod(
    fleet: Fleet,
    namespace: str,
    webhook: WebhookProcess,
    storage: Storage,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
) -> None:
    """Issue 22, section 4: the scheduler has selected virtual node `failing` for a claim
    of the virtual nodes' class (for pod `first`, pinned there by its own nodeSelector),
    and `failing` is down, so the claim stays selected and unbound. Pod `second` of the
    claim is created in that window. `failing` comes back, its lower cluster refuses the
    claim (a ResourceQuota below), and it takes `selected-node` away so the scheduler may
    choose again: `second`, which prefers `working`, must be free to go there. Pinned by
    the webhook to `failing` (immutable), it stayed Pending for good."""
    upper, lower_2 = fleet.upper.rest(), fleet.cluster("lower-2").rest()
    failing = VirtualNodeProcess(
        fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path, lower="lower-2"
    )
    working = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--lower-storage-class={storage.upper_class}={storage.lower_class}"],
    )
    for node in (failing, working):
        nodes.append(node)
        node.start(wait=False)  # both start at once
    for node in (failing, working):
        node.wait_ready()
    lower_2.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    try:
        quotas = f"/api/v1/namespaces/{namespace}/resourcequotas"
        lower_2.request(
            "POST",
            quotas,
            body={
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "no-claims"},
                "spec": {"hard": {"persistentvolumeclaims": "0"}},
            },
        )
        wait_for(
            "the quota in force",
            lambda: (get(lower_2, f"{quotas}/no-claims") or {}).get("status", {}).get("hard"),
        )
        # Down for less than the node monitor's grace period: still Ready upstairs.
        assert failing.stop() == 0
        upper.request(
            "POST",
            claims,
            body={
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage.upper_class,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        data = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        container = [{"name": "app", "image": "busybox"}]
        first = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "first"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": failing.name},
                "tolerations": [VNODE_TOLERATION],
                "containers": container,
                "volumes": data,
                "terminationGracePeriodSeconds": 0,
            },
        }
        create(upper, namespace, first)
        wait_for(
            "the scheduler's selected-node on the unbound claim",
            lambda: _selected_node(get(upper, f"{claims}/data")) == failing.name,
        )
        prefer = {
            "weight": 100,
            "preference": {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [working.name]}
                ]
            },
        }
        second = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "second", "labels": {"virtual-pod": "true"}},
            "spec": {
                "affinity": {
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [prefer]}
                },
                "containers": container,
                "volumes": data,
            },
        }
        created = create(upper, namespace, second)
        upper.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/first")
        failing.restart()
        wait_for(
            "second Running", lambda: phase(upper, namespace, "second") == "Running", timeout=90
        )
        placed = upper.request("GET", f"/api/v1/namespaces/{namespace}/pods/second")
        assert placed["spec"]["nodeName"] == working.name
        assert clusterselector.required_terms(created["spec"].get("affinity") or {}) == []
        bound = upper.request("GET", f"{claims}/data")
        assert bound["metadata"]["annotations"][SELECTED_NODE] == working.name
        refused = upper.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": "involvedObject.name=data,reason=ProvisioningFailed"},
        )
        assert any("exceeded quota" in e["message"] for e in refused["items"])
    finally:
        for name in ("second", "first"):
            try:
                upper.request(
                    "DELETE",
                    f"/api/v1/namespaces/{namespace}/pods/{name}",
                    body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                )
            except ApiStatusError as exc:
                if exc.code != 404:
                    raise
        volume = ((get(upper, f"{claims}/data") or {}).get("spec") or {}).get("volumeName")
        delete_if_present(upper, f"{claims}/data")
        if volume:
            wait_for("the claim gone", lambda: get(upper, f"{claims}/data") is None, timeout=60)
            delete_if_present(upper, f"/api/v1/persistentvolumes/{volume}")
        delete_if_present(lower_2, f"/api/v1/namespaces/{namespace}")


def test_with_the_webhook_down_ignore_admits_pods_and_fail_refuses_them(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    upper = fleet.upper.rest()
    hook = _hook(fleet, namespace, tmp_path)
    webhooks.register(
        fleet.upper,
        webhooks.configuration(
            hook.name, url=hook.url, namespace=namespace, failure_policy="Ignore"
        ),
    )
    try:
        hook.start()
        webhooks.wait_admitting(fleet.upper, namespace=namespace)
        assert hook.stop() == 0
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "still-created", "labels": {"virtual-pod": "true"}},
            "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "c", "image": "i"}]},
        }
        created = create(upper, namespace, manifest)
        assert created["spec"]["nodeSelector"] == {"disk": "ssd"}  # not converted
        assert "clusterSelector" not in (created["metadata"].get("annotations") or {})
        # The same configuration with Fail refuses labelled pods, and only those.
        webhooks.register(
            fleet.upper,
            webhooks.configuration(hook.name, url=hook.url, namespace=namespace),
        )
        manifest["metadata"]["name"] = "refused"

        def refused() -> str | None:
            try:
                upper.request(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/pods",
                    body=manifest,
                    query={"dryRun": "All"},
                )
            except ApiStatusError as exc:
                return str(exc)
            return None

        message = wait_for("a refusal", refused, timeout=15)
        assert "failed calling webhook" in message
        unlabelled = {**manifest, "metadata": {"name": "other"}}
        create(upper, namespace, unlabelled)
    finally:
        hook.stop()
        webhooks.unregister(fleet.upper, hook.name)


def _served(fleet: Fleet, port: int, ca_pem: bytes) -> bytes:
    """The certificate served on `port`, verified against `ca_pem` for the node address."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    connection = http.client.HTTPSConnection(fleet.node_ip, port, context=context, timeout=10)
    try:
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        assert connection.sock is not None
        der = connection.sock.getpeercert(binary_form=True)
    finally:
        connection.close()
    assert der is not None
    return der


def test_replicas_share_one_bootstrapped_certificate_and_keep_the_ca_bundle(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    name = f"wh-{secrets.token_hex(3)}"
    replicas = [
        WebhookProcess(
            fleet,
            name=name,
            log_dir=tmp_path / str(i),
            secret_namespace=namespace,
            configuration=name,
        )
        for i in range(2)
    ]
    webhooks.register(
        fleet.upper, webhooks.configuration(name, url=replicas[0].url, namespace=namespace)
    )
    try:
        for replica in replicas:  # at once: they race for the Secret
            replica.start(wait=False)
        for replica in replicas:
            replica.wait_ready()
        ca = wait_for("the caBundle", lambda: webhooks.ca_bundle(fleet.upper, name))
        secret = fleet.upper.rest().request(
            "GET", f"/api/v1/namespaces/{namespace}/secrets/{name}-tls"
        )
        assert base64.b64decode(secret["data"]["ca.crt"]) == ca
        served = {_served(fleet, r.port, ca) for r in replicas}
        assert len(served) == 1  # one certificate, verified by the CA the apiserver trusts
        webhooks.wait_admitting(fleet.upper, namespace=namespace)
        # A configuration replaced without its caBundle gets it back at once (watched).
        config = webhooks.configuration(name, url=replicas[0].url, namespace=namespace)
        current = fleet.upper.rest().request("GET", f"{webhooks.CONFIGURATIONS}/{name}")
        config["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        replaced = fleet.upper.rest().request(
            "PUT", f"{webhooks.CONFIGURATIONS}/{name}", body=config
        )
        assert "caBundle" not in replaced["webhooks"][0]["clientConfig"]
        assert wait_for("the caBundle back", lambda: webhooks.ca_bundle(fleet.upper, name)) == ca
    finally:
        codes = [r.stop() for r in replicas]
        webhooks.unregister(fleet.upper, name)
    assert codes == [0, 0]


def test_the_manifests_rbac_is_all_the_webhook_needs(
    fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    """Run as the manifests' ServiceAccount, with the names its RBAC allows: the Secret
    tensile-system/tensile-webhook-tls and the configuration tensile-webhook (scoped here to
    the test's namespace)."""
    kubeconfig = token_kubeconfig(
        fleet.upper, MANIFESTS / "rbac.yaml", tmp_path / "webhook.kubeconfig",
        service_account="tensile-webhook",
    )  # fmt: skip
    hook = WebhookProcess(
        fleet, name="tensile-webhook", log_dir=tmp_path, secret_namespace="tensile-system",
        configuration="tensile-webhook", kubeconfig=kubeconfig,
    )  # fmt: skip
    upper = fleet.upper.rest()
    webhooks.register(
        fleet.upper, webhooks.configuration("tensile-webhook", url=hook.url, namespace=namespace)
    )
    try:
        hook.start()
        mutated = webhooks.wait_admitting(fleet.upper, namespace=namespace)
        assert "clusterSelector" in mutated["metadata"]["annotations"]
        forbidden = [
            line
            for line in hook.metrics().splitlines()
            if line.startswith("tensile_api_requests_total") and 'code="403"' in line
        ]
        assert forbidden == []
    finally:
        code = hook.stop()
        webhooks.unregister(fleet.upper, "tensile-webhook")
        try:
            upper.request("DELETE", "/api/v1/namespaces/tensile-system/secrets/tensile-webhook-tls")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise
    assert code == 0


# -- abuse of the live server -------------------------------------------------------------------

ANSWER_WITHIN = 10.0  # seconds
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
requirements = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["disk", "clusterID", "kubernetes.io/hostname", "type"])
        | st.text(max_size=5)
    },
    optional={
        "operator": st.sampled_from(["In", "NotIn", "Exists", "Gt"]) | json_values,
        "values": st.lists(st.text(max_size=6), max_size=3) | json_values,
    },
)
pod_specs = st.fixed_dictionaries(
    {},
    optional={
        "nodeSelector": st.dictionaries(st.text(max_size=8), st.text(max_size=8)) | json_values,
        "affinity": st.builds(
            lambda terms: {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                }
            },
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "matchExpressions": st.lists(requirements),
                        "matchFields": st.lists(requirements),
                    },
                ),
                max_size=3,
            ),
        )
        | json_values,
        "tolerations": st.lists(json_values, max_size=3),
        "volumes": st.lists(
            st.fixed_dictionaries(
                {"persistentVolumeClaim": st.fixed_dictionaries({"claimName": json_values})}
            ),
            max_size=2,
        ),
    },
)
reviews = st.builds(
    lambda version, operation, namespace, labels, spec, annotations: {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": operation,
            "namespace": namespace,
            "object": {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec},
        },
    },
    st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]) | json_values,
    st.sampled_from(["CREATE", "UPDATE", "DELETE"]) | json_values,
    st.sampled_from(["shop", "kube-system", ""]) | json_values,
    st.sampled_from([{"virtual-pod": "true"}, {}]) | json_values,
    pod_specs,
    st.dictionaries(st.sampled_from(["clusterSelector", "x"]), st.text(max_size=30)) | json_values,
)
bodies = st.one_of(
    reviews.map(lambda r: json.dumps(r).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)


@pytest.fixture
def live(fleet: Fleet, namespace: str, tmp_path: Path) -> Iterator[WebhookProcess]:
    hook = _hook(fleet, namespace, tmp_path)
    hook.start()
    try:
        yield hook
        assert hook.get("/healthz") == (200, "ok")  # alive after everything
        tracebacks = [line for line in hook.log.read_text().splitlines() if "Traceback" in line]
        assert not tracebacks, f"tracebacks in {hook.log}"
    finally:
        assert hook.stop() == 0


@FUZZ
@given(
    body=bodies,
    content_type=st.sampled_from(
        ["application/json", "application/json; charset=utf-8", "text/plain"]
    ),
    timeout=st.sampled_from(["", "?timeout=5s", "?timeout=0s", "?timeout=bogus", "?timeout=1h"]),
)
def test_any_admission_review_gets_a_bounded_non_5xx_answer(
    live: WebhookProcess, body: bytes, content_type: str, timeout: str
) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection(
        live.fleet.node_ip, live.port, context=context, timeout=ANSWER_WITHIN
    )
    started = time.monotonic()
    try:
        connection.request(
            "POST", "/mutate" + timeout, body=body, headers={"Content-Type": content_type}
        )
        response = connection.getresponse()
        text = response.read()
    finally:
        connection.close()
    assert time.monotonic() - started < ANSWER_WITHIN
    assert response.status in (200, 400, 415), (response.status, text[:300])
    if response.status == 200:
        answer = json.loads(text)
        assert answer["response"]["uid"] == "fuzz"
        assert answer["response"]["allowed"] is True
        assert answer["apiVersion"] == json.loads(body)["apiVersion"]


# -- the manifests ----------------------------------------------------------------------------


def test_the_manifests_apply_to_a_real_apiserver(fleet: Fleet) -> None:
    # Server-side dry-run validates every object (schemas, RBAC rules, the webhook
    # configuration's rules) without creating anything; the namespace must exist for it.
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tensile-system"}}
    if get(fleet.upper.rest(), "/api/v1/namespaces/tensile-system") is None:
        fleet.upper.rest().request("POST", "/api/v1/namespaces", body=namespace)
    result = fleet.upper.kubectl("apply", "--dry-run=server", "-f", str(MANIFESTS))
    applied = result.stdout.splitlines()
    for kind in (
        "serviceaccount/tensile-webhook",
        "clusterrole.rbac.authorization.k8s.io/tensile-webhook",
        "role.rbac.authorization.k8s.io/tensile-webhook",
        "deployment.apps/tensile-webhook",
        "service/tensile-webhook",
        "poddisruptionbudget.policy/tensile-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/tensile-webhook",
    ):
        assert any(line.startswith(kind) and "(server dry run)" in line for line in applied), (
            kind,
            applied,
        )
