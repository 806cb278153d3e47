"""--enable-serviceaccount with --upper-api-address on the real fleet: the lower pod holds a
bound token of its upper ServiceAccount that the upper apiserver accepts, renewed before it
expires, gone with the pod."""

from __future__ import annotations

import base64
import secrets
import urllib.parse
from pathlib import Path
from typing import Any

from devcluster.fleet import Fleet
from devcluster.rest import RestClient
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import create, get, phase, pod, pod_manifest, wait_for
from vnode.providers.k2k import boundtokens

# A token asked for 3607 s (the injected volume's) is renewed after 0.001 of it: 3.6 s.
FRACTION = "0.001"


def _token(lower: RestClient, namespace: str, name: str) -> str | None:
    found = get(lower, f"/api/v1/namespaces/{namespace}/secrets/{boundtokens.secret_name(name)}")
    if found is None:
        return None
    tokens = [v for k, v in (found.get("data") or {}).items() if k.endswith(".token")]
    return base64.b64decode(tokens[0]).decode() if tokens else None


def _review(upper: RestClient, token: str) -> dict[str, Any]:
    answer = upper.request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token}},
    )  # fmt: skip
    return dict(answer["status"])


def test_the_lower_pod_holds_a_renewed_bound_token_of_its_upper_service_account(
    fleet: Fleet, tmp_path: Path, namespace: str, nodes: list[VirtualNodeProcess]
) -> None:
    upper, lower = fleet.upper.rest(), fleet.lower.rest()
    address = urllib.parse.urlsplit(fleet.upper.server).netloc
    node = VirtualNodeProcess(
        fleet,
        name=f"vn-{secrets.token_hex(3)}",
        log_dir=tmp_path,
        args=[
            f"--upper-api-address={address}",
            f"--serviceaccount-token-refresh-fraction={FRACTION}",
        ],
    )
    nodes.append(node)
    node.start()
    create(upper, namespace, pod_manifest("web", node=node.name))
    wait_for("web Running", lambda: phase(upper, namespace, "web") == "Running")

    first = wait_for("the token below", lambda: _token(lower, namespace, "web"))
    review = _review(upper, first)
    assert review.get("authenticated") is True, review
    assert review["user"]["username"] == f"system:serviceaccount:{namespace}:default"
    assert review["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["web"]

    below = pod(lower, namespace, "web")
    assert below is not None
    secret = get(lower, f"/api/v1/namespaces/{namespace}/secrets/{boundtokens.secret_name('web')}")
    assert secret is not None
    assert secret["metadata"]["ownerReferences"][0]["uid"] == below["metadata"]["uid"]
    assert (
        base64.b64decode(secret["data"]["ca.crt"]).decode()
        == upper.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt")[
            "data"
        ]["ca.crt"]
    )
    env = {e["name"]: e.get("value") for e in below["spec"]["containers"][0]["env"]}
    host, _, port = address.rpartition(":")
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (host, port)
    mounts = {m["mountPath"]: m["name"] for m in below["spec"]["containers"][0]["volumeMounts"]}
    volume = mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
    assert volume.startswith("kube-api-access-")  # the upper pod's volume, now below

    renewed = wait_for(
        "a renewed token", lambda: (t := _token(lower, namespace, "web")) != first and t, timeout=20
    )
    assert _review(upper, str(renewed)).get("authenticated") is True

    upper.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/web",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    wait_for("lower pod gone", lambda: pod(lower, namespace, "web") is None)
    wait_for("token Secret gone below", lambda: _token(lower, namespace, "web") is None)
