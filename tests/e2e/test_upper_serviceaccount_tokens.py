"""--enable-serviceaccount with --upper-api-address on the real fleet: the lower pod holds a
bound token of its upper ServiceAccount that the upper apiserver accepts, living the hour
it asked for (not the year kube-apiserver makes of 3607 s), renewed before it expires,
gone with the pod; and only the lower pod the node made for a pod bound to it ever gets
one: lower pods carrying the node's marks elsewhere, extra sources of the token volume and
Secrets planted in the token's name get nothing. With --upper-token-kubeconfig the node
asks as `system:node:<name>`, which the upper apiserver (Node authorizer, NodeRestriction)
confines to pods bound to it."""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devcluster.fleet import Fleet
from devcluster.kubeconfig import write_kubeconfig
from devcluster.pki import KeyPair
from devcluster.rest import ApiStatusError, RestClient
from devcluster.vnodes import VirtualNodeProcess
from tensile.contracts import ownership
from tests.e2e.helpers import (
    create,
    events_for,
    get,
    phase,
    pod,
    pod_manifest,
    token_kubeconfig,
    wait_for,
)
from vnode.providers.k2k import boundtokens

MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def _secrets_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")


def _token_secret(lower: RestClient, namespace: str, upper: RestClient) -> dict[str, Any] | None:
    """The token Secret below of the upper pod "web" (None: not there yet)."""
    found = pod(upper, namespace, "web")
    if found is None:
        return None
    name = boundtokens.secret_name("web", found["metadata"]["uid"])
    return get(lower, _secrets_path(namespace, name))


def _tokens_in(secret: dict[str, Any] | None) -> list[str]:
    data = (secret or {}).get("data") or {}
    return [base64.b64decode(v).decode() for k, v in sorted(data.items()) if k.endswith(".token")]


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def _review(upper: RestClient, token: str) -> dict[str, Any]:
    answer = upper.request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token}},
    )  # fmt: skip
    return dict(answer["status"])


def _token_node(
    fleet: Fleet,
    tmp_path: Path,
    *,
    args: tuple[str, ...] = (),
    name: str = "",
    upper_kubeconfig: Path | None = None,
) -> VirtualNodeProcess:
    address = urllib.parse.urlsplit(fleet.upper.server).netloc
    return VirtualNodeProcess(
        fleet,
        name=name or f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[f"--upper-api-address={address}", *args],
        upper_kubeconfig=upper_kubeconfig,
    )


def _token_secrets(lower: RestClient, namespace: str) -> list[dict[str, Any]]:
    """The Secrets of the lower `namespace` of the token Secrets' type."""
    items = lower.request("GET", _secrets_path(namespace)).get("items") or []
    return [s for s in items if s.get("type") == boundtokens.SECRET_TYPE]


def _stays(what: str, condition: Any, *, seconds: float) -> None:
    """Fail as soon as `condition()` is falsy within `seconds`: what must never happen (a
    token for a pod that may not have one) is given that long to show."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition(), what
        time.sleep(0.2)


def test_the_lower_pod_holds_a_bound_token_of_an_hour_renewed_before_it_expires(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    # A token of an hour is renewed after max(0.001 of it, the 60 s floor).
    node = _token_node(fleet, tmp_path, args=("--serviceaccount-token-refresh-fraction=0.001",))
    nodes.append(node)
    node.start()
    created = create(upper, namespace, pod_manifest("web", node=node.name))
    # The injected volume asks for 3607 s, which kube-apiserver would make a year.
    injected = [v for v in created["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    token_source = injected[0]["projected"]["sources"][0]["serviceAccountToken"]
    assert token_source["expirationSeconds"] == boundtokens.EXTENDED_EXPIRATION
    wait_for("web Running", lambda: phase(upper, namespace, "web") == "Running")

    secret = wait_for("the token below", lambda: _token_secret(lower, namespace, upper))
    first = wait_for(
        "the token written", lambda: _tokens_in(_token_secret(lower, namespace, upper))
    )
    secret = _token_secret(lower, namespace, upper) or secret
    review = _review(upper, first[0])
    assert review.get("authenticated") is True, review
    assert review["user"]["username"] == f"system:serviceaccount:{namespace}:default"
    assert review["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["web"]
    claims = _claims(first[0])
    assert 3500 <= claims["exp"] - claims["iat"] <= 3600, claims  # an hour, not a year
    expires = dt.datetime.fromisoformat(
        secret["metadata"]["annotations"][boundtokens.EXPIRES_ANNOTATION]
    )
    assert expires.timestamp() == claims["exp"]

    below = pod(lower, namespace, "web")
    assert below is not None
    assert secret["metadata"]["ownerReferences"][0]["uid"] == below["metadata"]["uid"]
    assert (
        base64.b64decode(secret["data"]["ca.crt"]).decode()
        == upper.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt")[
            "data"
        ]["ca.crt"]
    )
    assert base64.b64decode(secret["data"]["namespace"]).decode() == namespace
    env = {e["name"]: e.get("value") for e in below["spec"]["containers"][0]["env"]}
    address = urllib.parse.urlsplit(fleet.upper.server).netloc
    host, _, port = address.rpartition(":")
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (host, port)
    mounts = {m["mountPath"]: m["name"] for m in below["spec"]["containers"][0]["volumeMounts"]}
    volume = mounts[SA_PATH]
    assert volume.startswith("kube-api-access-")  # the upper pod's volume, now below
    (projected,) = [v for v in below["spec"]["volumes"] if v["name"] == volume]
    names = {s["secret"]["name"] for s in projected["projected"]["sources"]}
    assert names == {secret["metadata"]["name"]}  # token, CA and namespace: all the node's

    renewed = wait_for(
        "a renewed token",
        lambda: (t := _tokens_in(_token_secret(lower, namespace, upper))) != first and t,
        timeout=150,
    )
    assert _review(upper, renewed[0]).get("authenticated") is True

    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/web",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    wait_for("lower pod gone", lambda: pod(lower, namespace, "web") is None)
    wait_for("token Secret gone below", lambda: not _token_secrets(lower, namespace))


def _forged(
    *,
    name: str,
    namespace: str,
    upper_namespace: str,
    upper_uid: str,
    owner: ownership.NodeIdentity,
    secret: str,
) -> dict[str, Any]:
    """A lower pod anyone who may create pods below can make: the node's marks copied,
    naming an upper pod and mounting a Secret of the token's name."""
    labels, annotations = ownership.owner_marks(owner)
    annotations = {
        **annotations,
        ownership.UPPER_NAMESPACE_ANNOTATION: upper_namespace,
        ownership.UPPER_UID_ANNOTATION: upper_uid,
    }
    volume = {"name": "kube-api-access-forged", "projected": {"sources": [
        {"secret": {"name": secret, "items": [{"key": "kube-api-access-x.token",
                                               "path": "token"}]}},
    ]}}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nginx:1.27",
                    "volumeMounts": [{"name": volume["name"], "mountPath": SA_PATH}],
                }
            ],
            "volumes": [volume],
            "automountServiceAccountToken": False,
        },
    }


def test_lower_pods_forged_with_the_node_s_marks_get_no_token_after_a_restart(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = _token_node(fleet, tmp_path)
    nodes.append(node)
    node.start()
    create(upper, namespace, pod_manifest("web", node=node.name))
    wait_for("web Running", lambda: phase(upper, namespace, "web") == "Running")
    first = wait_for("web's token", lambda: _tokens_in(_token_secret(lower, namespace, upper)))
    # Bound to this node, but waiting for a ConfigMap: it has no lower pod.
    waiting = create(upper, namespace, pod_manifest("waiting", node=node.name, spec={
        "volumes": [{"name": "cfg", "configMap": {"name": "not-yet"}}],
    }))  # fmt: skip
    # Bound to another node.
    elsewhere = create(upper, namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere"},
        "spec": {"nodeName": f"{node.name}-other", "containers": [{"name": "c", "image": "x"}]},
    })  # fmt: skip
    forged_namespace = f"{namespace}-forged"
    lower.request("POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": forged_namespace},
    })  # fmt: skip
    try:
        owner = node.owner
        # (1) the marks of "waiting", in a lower namespace its namespace does not map to.
        uid = waiting["metadata"]["uid"]
        create(lower, forged_namespace, _forged(
            name="waiting", namespace=forged_namespace, upper_namespace=namespace,
            upper_uid=uid, owner=owner, secret=boundtokens.secret_name("waiting", uid),
        ))  # fmt: skip
        # (2) at the key of an upper pod that is not bound to this node.
        uid = elsewhere["metadata"]["uid"]
        forged = create(lower, namespace, _forged(
            name="elsewhere", namespace=namespace, upper_namespace=namespace, upper_uid=uid,
            owner=owner, secret=boundtokens.secret_name("elsewhere", uid),
        ))  # fmt: skip
        node.stop()
        node.restart()  # a fresh start takes over the lower pods it finds with its marks

        # At start every lower pod of its own is due at once: web's token is asked again.
        wait_for(
            "web's token renewed at the start",
            lambda: (t := _tokens_in(_token_secret(lower, namespace, upper))) != first and t,
            timeout=60,
        )

        def owned_by_forged() -> list[dict[str, Any]]:
            return [
                s
                for s in _token_secrets(lower, namespace)
                if any(
                    o.get("uid") == forged["metadata"]["uid"]
                    for o in s["metadata"].get("ownerReferences") or []
                )
            ]

        _stays(
            "no token Secret for the forged lower pods",
            lambda: not _token_secrets(lower, forged_namespace) and not owned_by_forged(),
            seconds=15,
        )
        # Asked for upstairs since the restart: web's token only (a Secret written for (2)
        # would be gone with it, as the node deletes that pod: the count shows it).
        assert node.metric("tensile_serviceaccount_token_requests_total", result="issued") == 1
    finally:
        lower.request("DELETE", f"/api/v1/namespaces/{forged_namespace}")


def test_extra_sources_of_the_token_volume_are_references_like_any_other(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = _token_node(fleet, tmp_path)
    nodes.append(node)
    node.start()
    create(upper, namespace, pod_manifest("web", node=node.name))
    wait_for("web's token", lambda: _tokens_in(_token_secret(lower, namespace, upper)))
    below = pod(lower, namespace, "web")
    assert below is not None
    (web_secret,) = {
        s["secret"]["name"]
        for v in below["spec"]["volumes"]
        for s in (v.get("projected") or {}).get("sources") or []
        if "secret" in s
    }
    # A Secret of the lower namespace that is nobody's upstairs (another tenant's, a lower
    # controller's).
    create(
        lower,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "lower-only"},
            "stringData": {"k": "v"},
        },
    )

    def volume(*extra: dict[str, Any]) -> dict[str, Any]:
        return {"name": "kube-api-access-own", "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            *extra,
        ]}}  # fmt: skip

    def tenant_pod(name: str, source: dict[str, Any]) -> dict[str, Any]:
        mount = {"name": "kube-api-access-own", "mountPath": SA_PATH}
        return pod_manifest(
            name,
            node=node.name,
            spec={
                "containers": [{"name": "main", "image": "nginx:1.27", "volumeMounts": [mount]}],
                "volumes": [volume(source)],
            },
        )

    # An optional source of a Secret upstairs does not have: left out below, not resolved
    # to the lower namespace's Secret of that name.
    create(
        upper,
        namespace,
        tenant_pod("optional", {"secret": {"name": "lower-only", "optional": True}}),
    )
    # Another pod's token Secret: refused (the name is the node's).
    create(upper, namespace, tenant_pod("thief", {"secret": {"name": web_secret}}))
    wait_for("optional Running", lambda: phase(upper, namespace, "optional") == "Running")
    made = pod(lower, namespace, "optional")
    assert made is not None
    (projected,) = [v for v in made["spec"]["volumes"] if v["name"] == "kube-api-access-own"]
    named = {s["secret"]["name"] for s in projected["projected"]["sources"] if "secret" in s}
    assert "lower-only" not in named, projected
    wait_for(
        "the thief refused",
        lambda: any(
            e.get("reason") == "ProviderCreateFailed" and web_secret in e.get("message", "")
            for e in events_for(upper, namespace, "thief")
        ),
    )
    assert pod(lower, namespace, "thief") is None


def test_a_secret_planted_below_in_the_token_s_name_is_neither_taken_over_nor_mounted(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    node = _token_node(fleet, tmp_path)
    nodes.append(node)
    node.start()
    # Not bound yet (no scheduler of that name): its UID, and so its token's name, is known
    # before the node sees it; it is then bound as a scheduler binds it.
    manifest = pod_manifest("planted", node=node.name, spec={"schedulerName": "nobody"})
    made = create(upper, namespace, manifest)
    name = boundtokens.secret_name("planted", made["metadata"]["uid"])
    # What another upper cluster's virtual node (or anyone who may write Secrets below)
    # could leave there: a token Secret of the type, but not this node's.
    other = ownership.NodeIdentity(node_name=node.name, cluster_id="another-cluster")
    _, marks = ownership.owner_marks(other)
    planted = create(lower, namespace, {
        "apiVersion": "v1", "kind": "Secret", "type": boundtokens.SECRET_TYPE,
        "metadata": {"name": name, "annotations": {
            **marks, ownership.UPPER_UID_ANNOTATION: made["metadata"]["uid"]}},
        "stringData": {"kube-api-access-x.token": "forged", "ca.crt": "forged"},
    })  # fmt: skip
    upper.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods/planted/binding",
        body={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "planted"},
              "target": {"apiVersion": "v1", "kind": "Node", "name": node.name}},
    )  # fmt: skip
    wait_for(
        "the pod refused",
        lambda: any(
            e.get("reason") == "ProviderCreateFailed" and name in e.get("message", "")
            for e in events_for(upper, namespace, "planted")
        ),
    )
    assert pod(lower, namespace, "planted") is None  # nothing mounts it
    now = get(lower, _secrets_path(namespace, name))
    assert now is not None
    assert now["metadata"]["resourceVersion"] == planted["metadata"]["resourceVersion"]


# -- the node's own identity (--upper-token-kubeconfig) -----------------------------------


def _node_kubeconfig(fleet: Fleet, directory: Path, *, node_name: str) -> Path:
    """What an administrator gives a virtual node: a client certificate of
    `system:node:<node_name>` (group system:nodes) from the upper cluster's
    kube-apiserver-client-kubelet signer, approved, in a kubeconfig."""
    upper = fleet.upper.rest()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
    ])  # fmt: skip
    request = (
        x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    )
    csr_name = f"{node_name}-client"
    upper.request("POST", CSRS, body={
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": csr_name},
        "spec": {
            "request": base64.b64encode(request.public_bytes(serialization.Encoding.PEM)).decode(),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    })  # fmt: skip

    def issued() -> str | None:
        found = upper.request("GET", f"{CSRS}/{csr_name}")
        status = found.get("status") or {}
        if not any(c.get("type") == "Approved" for c in status.get("conditions") or []):
            status["conditions"] = [{"type": "Approved", "status": "True",
                                     "reason": "TestApproved", "message": "e2e"}]  # fmt: skip
            found["status"] = status
            try:
                upper.request("PUT", f"{CSRS}/{csr_name}/approval", body=found)
            except ApiStatusError as exc:
                if exc.code != 409:  # approved meanwhile (the requester may approve)
                    raise
        return status.get("certificate")

    certificate = wait_for("the certificate issued", issued)
    cert, key_file = directory / f"{node_name}.crt", directory / f"{node_name}.key"
    cert.write_bytes(base64.b64decode(certificate))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return write_kubeconfig(
        path=directory / f"{node_name}.kubeconfig",
        cluster="upper",
        server=fleet.upper.server,
        ca=fleet.upper.ca,
        user=f"system:node:{node_name}",
        credentials=KeyPair(cert=cert, key=key_file),
    )


def test_with_the_node_s_own_identity_the_upper_apiserver_grants_tokens_of_its_pods_only(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    name = f"vn-{secrets.token_hex(3)}"
    kubeconfig = _node_kubeconfig(fleet, tmp_path, node_name=name)
    # The node's account has upper-rbac.yaml's rights only: no serviceaccounts/token.
    account = token_kubeconfig(
        fleet.upper, MANIFESTS / "upper-rbac.yaml", tmp_path / "upper-sa.kubeconfig", node=name
    )
    review = upper.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "system:serviceaccount:tensile-system:tensile-virtual-node",
                 "groups": ["system:serviceaccounts"],
                 "resourceAttributes": {"namespace": namespace, "verb": "create",
                                        "resource": "serviceaccounts", "subresource": "token"}},
    })  # fmt: skip
    assert review["status"].get("allowed") is not True, review
    node = _token_node(
        fleet,
        tmp_path,
        name=name,
        args=(f"--upper-token-kubeconfig={kubeconfig}",),
        upper_kubeconfig=account,
    )
    nodes.append(node)
    node.start()
    create(upper, namespace, pod_manifest("web", node=node.name))
    tokens = wait_for("web's token", lambda: _tokens_in(_token_secret(lower, namespace, upper)))
    review = _review(upper, tokens[0])
    assert review.get("authenticated") is True, review
    assert review["user"]["extra"]["authentication.kubernetes.io/node-name"] == [name]

    # What the upper apiserver itself refuses that identity, whatever the node is told.
    as_node = RestClient(
        server=fleet.upper.server, ca=fleet.upper.ca,
        cert=tmp_path / f"{name}.crt", key=tmp_path / f"{name}.key",
    )  # fmt: skip
    elsewhere = create(upper, namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere"},
        "spec": {"nodeName": f"{name}-other", "containers": [{"name": "c", "image": "x"}]},
    })  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default/token"
    meta = elsewhere["metadata"]
    refused = {
        "bound to a pod of another node": {"boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": "elsewhere", "uid": meta["uid"]}},
        "not bound to a pod": {},
    }  # fmt: skip
    for what, spec in refused.items():
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600, **spec}}  # fmt: skip
        with pytest.raises(ApiStatusError) as refusal:
            as_node.request("POST", path, body=body)
        assert refusal.value.code == 403, what


def test_an_upper_token_kubeconfig_of_another_identity_stops_the_node_at_start(
    fleet: Fleet, tmp_path: Path
) -> None:
    node = _token_node(
        fleet, tmp_path, args=(f"--upper-token-kubeconfig={fleet.upper.kubeconfig}",)
    )
    node.start(wait=False)
    wait_for(
        "the node to exit",
        lambda: node.process is not None and node.process.returncode is not None,
        timeout=60,
    )
    assert node.process is not None
    log = node.log.read_text()
    assert node.process.returncode == 1, log
    assert f"it must be this node's identity system:node:{node.name}" in log
    assert "Traceback" not in log
