"""Several upper clusters on one lower cluster: ownership by node name and cluster identity,
tenants' namespaces, references that never resolve to someone else's objects, and the
Pod Security Standards, on the session fleet's two upper clusters over one lower cluster.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, token_kubeconfig, wait_for
from tests.fixtures import create_namespace, delete_namespace


@pytest.fixture
def shared(fleet: Fleet) -> Iterator[str]:
    """A namespace of the same name in both upper clusters and the lower cluster."""
    clusters = (fleet.upper, fleet.cluster("upper-2"), fleet.lower)
    name = create_namespace(clusters, prefix="shared")
    try:
        yield name
    finally:
        delete_namespace(clusters, name)


def twins(
    fleet: Fleet,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
    *,
    args: tuple[str, ...] = (),
    first_args: tuple[str, ...] = (),
) -> tuple[VirtualNodeProcess, VirtualNodeProcess]:
    """Two virtual nodes of the same name, one in each upper cluster, over `fleet.lower`
    (as two teams that both kept the default --nodename would run them); `first_args` go
    to the first one only."""
    name = f"vk-{secrets.token_hex(3)}"
    pair = []
    for upper, extra in (("upper", first_args), ("upper-2", ())):
        node = VirtualNodeProcess(
            fleet, name=name, log_dir=tmp_path / upper, upper=upper, args=(*args, *extra)
        )
        nodes.append(node)
        pair.append(node.start())
    return pair[0], pair[1]


def provider_failure(client: RestClient, namespace: str, name: str) -> str | None:
    """The message of a pod the node refused (reason ProviderFailed), else None."""
    found = pod(client, namespace, name) or {}
    status = found.get("status") or {}
    return str(status.get("message")) if status.get("reason") == "ProviderFailed" else None


def lower_uids(lower: Cluster, namespace: str, names: list[str]) -> dict[str, str | None]:
    return {
        n: ((pod(lower.rest(), namespace, n) or {}).get("metadata") or {}).get("uid") for n in names
    }


def test_same_node_name_in_two_upper_clusters_never_touches_the_others_pods(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, shared: str
) -> None:
    # The reproduction of the review's finding: B's node restarts after one of its pods was
    # deleted upstairs; its clean-up must delete that one lower pod and nothing of A's.
    # A names its upper cluster with --cluster-id: that identity is what its lower pods
    # carry, and what keeps B's hands off them.
    cluster_a = f"team-a.{secrets.token_hex(3)}"
    node_a, node_b = twins(fleet, nodes, tmp_path, first_args=(f"--cluster-id={cluster_a}",))
    first, second, lower = fleet.upper.rest(), fleet.cluster("upper-2").rest(), fleet.lower
    a_pods, b_pods = [f"a-{i}" for i in range(3)], [f"b-{i}" for i in range(3)]
    for client, node, names in ((first, node_a, a_pods), (second, node_b, b_pods)):
        for name in names:
            create(client, shared, pod_manifest(name, node=node.name))
    for client, names in ((first, a_pods), (second, b_pods)):
        for name in names:
            wait_for(f"{name} Running", lambda c=client, n=name: phase(c, shared, n) == "Running")
    before = lower_uids(lower, shared, a_pods)
    assert all(before.values())
    for name in a_pods:
        marks = (pod(lower.rest(), shared, name) or {}).get("metadata") or {}
        assert marks["labels"][ownership.CLUSTER_LABEL] == cluster_a
        assert marks["annotations"][ownership.CLUSTER_ANNOTATION] == cluster_a
    assert node_a.owner.cluster_id == cluster_a
    assert node_a.owner != node_b.owner
    assert node_a.owner.node_name == node_b.owner.node_name

    node_b.kill()
    second.request("DELETE", f"/api/v1/namespaces/{shared}/pods/b-0")
    node_b.restart()
    wait_for("b-0 gone above", lambda: pod(second, shared, "b-0") is None)
    wait_for("b-0 gone below", lambda: pod(lower.rest(), shared, "b-0") is None)

    assert lower_uids(lower, shared, a_pods) == before
    for name in a_pods:
        assert phase(first, shared, name) == "Running"
    for name in ("b-1", "b-2"):
        assert phase(second, shared, name) == "Running"
        assert pod(lower.rest(), shared, name) is not None


def test_a_name_taken_below_by_another_cluster_is_a_conflict_not_an_adoption(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, shared: str
) -> None:
    node_a, node_b = twins(fleet, nodes, tmp_path)
    first, second, lower = fleet.upper.rest(), fleet.cluster("upper-2").rest(), fleet.lower.rest()

    def secret(value: str) -> dict[str, Any]:
        data = base64.b64encode(value.encode()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"k": data},
        }

    def using_creds(name: str, node: str) -> dict[str, Any]:
        return pod_manifest(
            name,
            node=node,
            spec={"volumes": [{"name": "creds", "secret": {"secretName": "creds"}}]},
        )

    create(first, shared, secret("a's"))
    create(second, shared, secret("b's"))
    create(first, shared, pod_manifest("web", node=node_a.name))
    create(first, shared, using_creds("a-creds", node_a.name))
    wait_for(
        "A's pods Running",
        lambda: phase(first, shared, "web") == phase(first, shared, "a-creds") == "Running",
    )
    a_web = pod(lower, shared, "web")
    assert a_web is not None

    # The same pod name from B: refused, naming A's pod and its owner.
    create(second, shared, pod_manifest("web", node=node_b.name))
    message = wait_for("B's web refused", lambda: provider_failure(second, shared, "web"))
    assert f"pod {shared}/web exists in the lower cluster" in message
    assert f"upper cluster {node_a.owner.cluster_id}" in message
    # A B pod using B's Secret "creds": refused, A's copy untouched.
    create(second, shared, using_creds("b-creds", node_b.name))
    message = wait_for("B's b-creds refused", lambda: provider_failure(second, shared, "b-creds"))
    assert f"Secret {shared}/creds exists in the lower cluster" in message
    copy = lower.request("GET", f"/api/v1/namespaces/{shared}/secrets/creds")
    assert base64.b64decode(copy["data"]["k"]) == b"a's"
    assert ownership.is_owned(copy, owner=node_a.owner)
    assert pod(lower, shared, "b-creds") is None
    below = pod(lower, shared, "web")
    assert below is not None
    assert below["metadata"]["uid"] == a_web["metadata"]["uid"]
    assert phase(first, shared, "web") == "Running"


def test_prefixed_namespaces_that_collide_are_refused(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    # t1- + x-y and t1-x- + y are both t1-x-y below.
    tag = secrets.token_hex(2)
    first, second, lower = fleet.upper, fleet.cluster("upper-2"), fleet.lower
    above_a, above_b = f"x{tag}-y{tag}", f"y{tag}"
    prefix_a, prefix_b = f"t{tag}-", f"t{tag}-x{tag}-"
    create_namespace_named(first, above_a)
    create_namespace_named(second, above_b)
    try:
        node_a = start(
            fleet, nodes, tmp_path, upper="upper", args=(f"--namespace-prefix={prefix_a}",)
        )
        node_b = start(
            fleet, nodes, tmp_path, upper="upper-2", args=(f"--namespace-prefix={prefix_b}",)
        )
        lower_ns = prefix_a + above_a
        assert lower_ns == prefix_b + above_b
        create(first.rest(), above_a, pod_manifest("a", node=node_a.name))
        wait_for("a Running", lambda: phase(first.rest(), above_a, "a") == "Running")
        made = lower.rest().request("GET", f"/api/v1/namespaces/{lower_ns}")
        assert made["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
        assert (
            made["metadata"]["annotations"][ownership.CLUSTER_ANNOTATION] == node_a.owner.cluster_id
        )
        create(second.rest(), above_b, pod_manifest("b", node=node_b.name))
        message = wait_for("b refused", lambda: provider_failure(second.rest(), above_b, "b"))
        assert f"lower namespace {lower_ns} belongs to upper cluster" in message
        assert [p["metadata"]["name"] for p in list_pods(lower.rest(), lower_ns)] == ["a"]
        # A namespace name too long once prefixed is refused, not half-created.
        long_ns = "l" + "o" * (63 - len(prefix_b))
        create_namespace_named(second, long_ns)
        try:
            create(second.rest(), long_ns, pod_manifest("c", node=node_b.name))
            message = wait_for("c refused", lambda: provider_failure(second.rest(), long_ns, "c"))
            assert "not a valid namespace name" in message
        finally:
            delete_namespaces(second, long_ns)
    finally:
        delete_namespaces(first, above_a)
        delete_namespaces(second, above_b)
        delete_namespaces(lower, prefix_a + above_a)


def test_a_pod_never_runs_with_a_lower_object_that_was_not_copied_for_it(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, shared: str
) -> None:
    [node] = [start(fleet, nodes, tmp_path, upper="upper")]
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    # Objects that exist only below, e.g. the virtual node's own identity there.
    create(
        lower,
        shared,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "powerful"}},
    )
    create(
        lower,
        shared,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "lower-only"},
            "data": {"k": "lower"},
        },
    )
    create(
        lower,
        shared,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}, "data": {}},
    )
    # A ServiceAccount of the same name upstairs does not make the lower one ours.
    create(
        upper,
        shared,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "powerful"}},
    )
    create(
        upper,
        shared,
        pod_manifest("as-powerful", node=node.name, spec={"serviceAccountName": "powerful"}),
    )
    message = wait_for(
        "as-powerful refused", lambda: provider_failure(upper, shared, "as-powerful")
    )
    assert (
        f"ServiceAccount {shared}/powerful exists in the lower cluster and is not managed by "
        "tensile" in message
    )
    assert pod(lower, shared, "as-powerful") is None
    # Optional references missing upstairs are removed below, not resolved to lower objects.
    spec = {
        "volumes": [{"name": "cfg", "configMap": {"name": "lower-only", "optional": True}}],
        "imagePullSecrets": [{"name": "pull"}],
    }
    manifest = pod_manifest("optional", node=node.name, spec=spec)
    manifest["spec"]["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": "lower-only", "optional": True}}
    ]
    create(upper, shared, manifest)
    wait_for("optional Running", lambda: phase(upper, shared, "optional") == "Running")
    below = pod(lower, shared, "optional")
    assert below is not None
    [volume] = [v for v in below["spec"]["volumes"] if v["name"] == "cfg"]
    assert volume == {"name": "cfg", "emptyDir": {}}
    assert "imagePullSecrets" not in below["spec"]
    assert not below["spec"]["containers"][0].get("envFrom")


def test_a_service_account_token_secret_is_never_copied_below(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, shared: str
) -> None:
    # An upper ServiceAccount token is an upper credential: copied below it would leak it
    # to the lower cluster (and its token controller owns such Secrets there). A pod that
    # must have it is refused; one for which it is optional runs without it, and never
    # with a same-named lower Secret in its place.
    [node] = [start(fleet, nodes, tmp_path, upper="upper")]
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    create(
        upper,
        shared,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "token",
                "annotations": {"kubernetes.io/service-account.name": "default"},
            },
            "type": "kubernetes.io/service-account-token",
        },
    )
    lower_only = base64.b64encode(b"lower").decode()
    create(
        lower,
        shared,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "token"},
            "data": {"token": lower_only},
        },
    )
    mandatory = pod_manifest(
        "mandatory",
        node=node.name,
        spec={"volumes": [{"name": "t", "secret": {"secretName": "token"}}]},
    )
    create(upper, shared, mandatory)
    message = wait_for("mandatory refused", lambda: provider_failure(upper, shared, "mandatory"))
    assert f"Secret {shared}/token holds a ServiceAccount token of the upper cluster" in message
    assert pod(lower, shared, "mandatory") is None
    optional = pod_manifest(
        "optional",
        node=node.name,
        spec={"volumes": [{"name": "t", "secret": {"secretName": "token", "optional": True}}]},
    )
    optional["spec"]["containers"][0]["env"] = [
        {
            "name": "TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "token", "key": "token", "optional": True}},
        }
    ]
    create(upper, shared, optional)
    wait_for("optional Running", lambda: phase(upper, shared, "optional") == "Running")
    below = pod(lower, shared, "optional")
    assert below is not None
    [volume] = [v for v in below["spec"]["volumes"] if v["name"] == "t"]
    assert volume == {"name": "t", "emptyDir": {}}
    assert not [v for v in below["spec"]["containers"][0].get("env") or [] if v["name"] == "TOKEN"]
    theirs = lower.request("GET", f"/api/v1/namespaces/{shared}/secrets/token")
    assert theirs["data"] == {"token": lower_only}
    assert not ownership.is_owned(theirs, owner=node.owner)


def test_pods_above_the_pod_security_level_are_refused_even_in_adopted_namespaces(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path, shared: str
) -> None:
    # `shared` was made below without any pod-security label: the node itself must refuse.
    [node] = [start(fleet, nodes, tmp_path, upper="upper")]
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    labels = lower.request("GET", f"/api/v1/namespaces/{shared}")["metadata"].get("labels") or {}
    assert "pod-security.kubernetes.io/enforce" not in labels
    host = pod_manifest(
        "host",
        node=node.name,
        spec={"hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
    )
    create(upper, shared, host)
    message = wait_for("host refused", lambda: provider_failure(upper, shared, "host"))
    assert message.startswith('violates PodSecurity "baseline"')
    assert "hostNetwork=true" in message
    assert 'hostPath volumes (volume "root")' in message
    assert pod(lower, shared, "host") is None


def test_a_lower_namespace_deleted_under_a_running_node_is_made_again(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    upper, lower = fleet.upper, fleet.lower
    above = create_namespace((upper,), prefix="recreated")
    prefix = f"r{secrets.token_hex(2)}-"
    try:
        node = start(fleet, nodes, tmp_path, upper="upper", args=(f"--namespace-prefix={prefix}",))
        create(upper.rest(), above, pod_manifest("first", node=node.name))
        wait_for("first Running", lambda: phase(upper.rest(), above, "first") == "Running")
        delete_namespaces(lower, prefix + above)
        wait_for(
            "lower namespace gone",
            lambda: get(lower.rest(), f"/api/v1/namespaces/{prefix + above}") is None,
            timeout=60,
        )
        create(upper.rest(), above, pod_manifest("second", node=node.name))
        wait_for(
            "second Running", lambda: phase(upper.rest(), above, "second") == "Running", timeout=60
        )
        assert pod(lower.rest(), prefix + above, "second") is not None
    finally:
        delete_namespace((upper,), above)
        delete_namespaces(lower, prefix + above)


def test_a_pod_whose_lower_namespace_is_still_being_deleted_waits_for_it_then_runs(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    # The lower apiserver refuses the pod (403 NamespaceTerminating) while its namespace is
    # being deleted: a wait, not a refusal of the pod (restartPolicy Never would end it).
    upper, lower = fleet.upper, fleet.lower
    above = create_namespace((upper,), prefix="terminating")
    prefix = f"d{secrets.token_hex(2)}-"
    below = prefix + above
    held = f"/api/v1/namespaces/{below}/configmaps/held"
    try:
        node = start(fleet, nodes, tmp_path, upper="upper", args=(f"--namespace-prefix={prefix}",))
        create(upper.rest(), above, pod_manifest("first", node=node.name))
        wait_for("first Running", lambda: phase(upper.rest(), above, "first") == "Running")
        # An object with a finalizer keeps the lower namespace Terminating until it goes.
        holder = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "held", "finalizers": ["tensile.test/hold"]},
        }
        lower.rest().request("POST", f"/api/v1/namespaces/{below}/configmaps", body=holder)
        delete_namespaces(lower, below)
        wait_for(
            "the lower namespace Terminating",
            lambda: (
                (get(lower.rest(), f"/api/v1/namespaces/{below}") or {})
                .get("status", {})
                .get("phase")
                == "Terminating"
            ),
        )
        once = pod_manifest("second", node=node.name, spec={"restartPolicy": "Never"})
        create(upper.rest(), above, once)
        deadline = time.monotonic() + 5  # refused at once before waiting was made
        while time.monotonic() < deadline:
            assert provider_failure(upper.rest(), above, "second") is None
            assert phase(upper.rest(), above, "second") == "Pending"
            time.sleep(0.5)
        lower.rest().request(
            "PATCH",
            held,
            body={"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )
        wait_for(
            "second Running", lambda: phase(upper.rest(), above, "second") == "Running", timeout=60
        )
        made = lower.rest().request("GET", f"/api/v1/namespaces/{below}")
        annotations = made["metadata"]["annotations"]
        assert annotations[ownership.CLUSTER_ANNOTATION] == node.owner.cluster_id
        assert annotations[ownership.UPPER_NAMESPACE_ANNOTATION] == above
        assert pod(lower.rest(), below, "second") is not None
    finally:
        with contextlib.suppress(ApiStatusError):
            lower.rest().request(
                "PATCH",
                held,
                body={"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
        delete_namespace((upper,), above)
        delete_namespaces(lower, below)


# -- helpers -------------------------------------------------------------------------------


def start(
    fleet: Fleet,
    nodes: list[VirtualNodeProcess],
    tmp_path: Path,
    *,
    upper: str,
    args: tuple[str, ...] = (),
) -> VirtualNodeProcess:
    node = VirtualNodeProcess(
        fleet, name=f"vn-{secrets.token_hex(3)}", log_dir=tmp_path, upper=upper, args=args
    )
    nodes.append(node)
    return node.start()


def create_namespace_named(cluster: Cluster, name: str) -> None:
    cluster.rest().request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    wait_for(
        f"{name}'s default ServiceAccount",
        lambda: get(cluster.rest(), f"/api/v1/namespaces/{name}/serviceaccounts/default"),
    )


def delete_namespaces(cluster: Cluster, name: str) -> None:
    delete_namespace((cluster,), name)


def list_pods(client: RestClient, namespace: str) -> list[dict[str, Any]]:
    return list(client.request("GET", f"/api/v1/namespaces/{namespace}/pods").get("items") or [])


# -- who can read what below -------------------------------------------------------------

LOWER_NAMESPACED = Path(__file__).parents[2] / "manifests" / "vnode" / "lower-rbac-namespaced.yaml"
NAMESPACE_ROLE = "tensile-virtual-node-lower-namespaced"


def lower_identity(lower: Cluster, tenant: str, directory: Path) -> tuple[Path, str]:
    """lower-rbac-namespaced.yaml for upper cluster `tenant` (its copy, as the file says to
    make one: `tenant-a` renamed), applied to `lower`; returns a kubeconfig of the identity
    and its token."""
    manifest = directory / f"lower-rbac-{tenant}.yaml"
    manifest.write_text(LOWER_NAMESPACED.read_text().replace("tenant-a", tenant))
    kubeconfig = token_kubeconfig(
        lower,
        manifest,
        directory / f"lower-{tenant}.kubeconfig",
        service_account=f"tensile-virtual-node-{tenant}",
    )
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    return kubeconfig, str(token)


def as_token(
    cluster: Cluster, token: str, method: str, path: str, body: dict[str, Any] | None = None
) -> int:
    """The HTTP status `cluster`'s apiserver answers `method path` sent with `token`."""
    request = urllib.request.Request(
        f"{cluster.server}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(cluster.ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_another_upper_cluster_s_lower_identity_cannot_read_this_one_s_copies(
    fleet: Fleet, nodes: list[VirtualNodeProcess], tmp_path: Path
) -> None:
    """Each upper cluster has its own lower identity (lower-rbac-namespaced.yaml): A's node
    makes its namespace, binds its rights there and copies a pod's Secret into it; B's
    identity, which may do as much in namespaces of its own prefix, gets 403 on A's Secret,
    on listing A's namespace, on binding itself into it and on making a namespace of A's
    prefix. (With lower-rbac.yaml, one ClusterRole for every upper cluster, B read it.)"""
    upper, lower = fleet.upper, fleet.lower
    tag = secrets.token_hex(2)
    prefix_a = f"ta{tag}-"
    kubeconfig_a, _ = lower_identity(lower, f"ta{tag}", tmp_path)
    _, token_b = lower_identity(lower, f"tb{tag}", tmp_path)
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        lower_kubeconfig=kubeconfig_a,
        args=(f"--namespace-prefix={prefix_a}", f"--lower-namespace-role={NAMESPACE_ROLE}"),
    )
    nodes.append(node)
    node.start()
    namespace = create_namespace((upper,), prefix="who-reads")
    below = f"{prefix_a}{namespace}"
    try:
        create(upper.rest(), namespace, {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
            "stringData": {"password": "only-for-a"},
        })  # fmt: skip
        manifest = pod_manifest("uses-creds", node=node.name)
        manifest["spec"]["volumes"] = [{"name": "c", "secret": {"secretName": "creds"}}]
        create(upper.rest(), namespace, manifest)
        wait_for(
            "the pod to run below A's prefix",
            lambda: phase(upper.rest(), namespace, "uses-creds") == "Running",
            timeout=90,
        )
        assert get(lower.rest(), f"/api/v1/namespaces/{below}/secrets/creds")
        binding = get(
            lower.rest(), f"/apis/rbac.authorization.k8s.io/v1/namespaces/{below}/rolebindings/"
            "tensile-virtual-node",
        )  # fmt: skip
        assert binding is not None
        assert binding["roleRef"]["name"] == NAMESPACE_ROLE
        # B's lower credentials.
        assert as_token(lower, token_b, "GET", f"/api/v1/namespaces/{below}/secrets/creds") == 403
        assert as_token(lower, token_b, "GET", f"/api/v1/namespaces/{below}/secrets") == 403
        assert as_token(lower, token_b, "GET", "/api/v1/secrets") == 403
        assert as_token(lower, token_b, "GET", f"/api/v1/namespaces/{below}/configmaps") == 403
        steal = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "steal"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": NAMESPACE_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": f"tensile-virtual-node-tb{tag}",
                          "namespace": "tensile-system"}],
        }  # fmt: skip
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{below}/rolebindings"
        assert as_token(lower, token_b, "POST", path, steal) == 403
        squat = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{below}-x"}}
        assert as_token(lower, token_b, "POST", "/api/v1/namespaces", squat) == 403
        # What B may do, it may do under its own prefix only.
        own = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"tb{tag}-ok"}}
        assert as_token(lower, token_b, "POST", "/api/v1/namespaces", own) == 201
    finally:
        delete_namespace((upper,), namespace)
        delete_namespaces(lower, below)
        lower.kubectl("delete", "namespace", f"tb{tag}-ok", "--ignore-not-found", "--wait=false")
