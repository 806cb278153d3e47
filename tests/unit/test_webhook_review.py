"""AdmissionReview parsing and answers (`webhook.review`) and label selectors as the webhook
reads --pod-selector (`tensile.contracts.selectors`, shared with the descheduler)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tensile.contracts.selectors import SelectorError, parse
from webhook import review


def body(**request: Any) -> dict[str, Any]:
    base = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "shop",
        "object": {"metadata": {"name": "web"}, "spec": {}},
    }
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


def encode(document: object) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize("version", review.API_VERSIONS)
def test_a_pod_creation_is_parsed_in_either_version(version: str) -> None:
    document = body()
    document["apiVersion"] = version
    parsed = review.parse(encode(document))
    assert (parsed.api_version, parsed.uid, parsed.operation) == (
        version,
        "705ab4f5-6393-11e8-b7cc-42010a800002",
        "CREATE",
    )
    assert parsed.admission is not None
    assert parsed.admission.namespace == "shop"
    assert parsed.admission.pod == {"metadata": {"name": "web"}, "spec": {}}


@pytest.mark.parametrize(
    "request_",
    [
        {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}},
        {"subResource": "status"},
        {"operation": "DELETE", "object": None},
    ],
)
def test_what_is_not_a_pod_itself_is_answered_without_a_decision(request_: dict[str, Any]) -> None:
    assert review.parse(encode(body(**request_))).admission is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (b"[" * 100_000, "the body is not JSON"),
        (b"[]", "the body is not a JSON object"),
        (
            encode({**body(), "apiVersion": "admission.k8s.io/v2"}),
            'apiVersion "admission.k8s.io/v2"',
        ),
        (encode({**body(), "apiVersion": None}), "apiVersion (missing) is not supported"),
        (encode({**body(), "kind": "Pod"}), 'kind "Pod" is not AdmissionReview'),
        (encode({**body(), "request": None}), "the AdmissionReview has no request"),
        (encode(body(uid="")), "request.uid is missing"),
        (encode(body(uid=7)), "request.uid is missing"),
        (encode(body(operation=None)), "request.operation is missing"),
        (encode(body(namespace=["x"])), "request.namespace is not a string"),
        (encode(body(kind="Pod")), "request.kind is missing"),
        (encode(body(object=None)), "request.object is missing (a Pod is needed for CREATE)"),
        (encode(body(object="pod")), "request.object is missing"),
        (encode(body(object={"spec": []})), "request.object is not a Pod: spec is not an object"),
        (
            encode(body(operation="create")),
            'request.operation "create" is not one of CREATE, UPDATE, DELETE, CONNECT',
        ),
        (
            encode(body(object={"metadata": {"labels": ["virtual-pod"]}})),
            "request.object is not a Pod: metadata.labels is not an object",
        ),
        (
            encode(body(object={"metadata": {"annotations": []}})),
            "request.object is not a Pod: metadata.annotations is not an object",
        ),
    ],
)
def test_bad_reviews_are_refused_with_a_reason(raw: bytes, message: str) -> None:
    with pytest.raises(review.BadReview, match=message.replace("(", r"\(").replace(")", r"\)")):
        review.parse(raw)


def test_answers_echo_the_uid_in_the_version_asked_with_a_base64_patch() -> None:
    patch = [{"op": "add", "path": "/spec/tolerations", "value": []}]
    answer = review.response(
        api_version="admission.k8s.io/v1beta1", uid="u1", patch=patch, warnings=["w" * 300]
    )
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "u1",
        True,
        "JSONPatch",
    )
    assert json.loads(base64.b64decode(response["patch"])) == patch
    assert response["warnings"] == ["w" * 253 + "..."]
    assert review.response(api_version="admission.k8s.io/v1", uid="u2")["response"] == {
        "uid": "u2",
        "allowed": True,
    }


@pytest.mark.parametrize(
    ("text", "labels", "selected"),
    [
        ("virtual-pod=true", {"virtual-pod": "true"}, True),
        ("virtual-pod=true", {"virtual-pod": "false"}, False),
        ("virtual-pod=true", {}, False),
        ("virtual-pod==true,app", {"virtual-pod": "true", "app": "x"}, True),
        ("virtual-pod==true,app", {"virtual-pod": "true"}, False),
        ("tier in (a, b),!legacy", {"tier": "b"}, True),
        ("tier in (a, b),!legacy", {"tier": "b", "legacy": ""}, False),
        ("tier notin (a,b)", {}, True),
        ("tier!=a", {"tier": "a"}, False),
        ("tier!=a", {}, True),
        ("example.com/role=", {"example.com/role": ""}, True),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selectors(text: str, labels: dict[str, str], selected: bool) -> None:
    assert parse(text).matches(labels) is selected


@pytest.mark.parametrize(
    "text", ["a=b,,c", "tier in (a", "tier in a)", "a b", "=x", "a=b c", "a=" + "x" * 64, "-a"]
)
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(SelectorError):
        parse(text)
