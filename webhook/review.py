"""AdmissionReview in and out (pure): what the apiserver sends a mutating webhook, checked,
and the answer, in the API version it was asked in.

Kubernetes "Dynamic Admission Control": the apiserver POSTs an AdmissionReview
(`admission.k8s.io/v1`, or `v1beta1` for configurations that ask for it) whose `request`
carries a `uid`, the object's `kind`, the `operation`, the `namespace` and the `object`; the
webhook answers an AdmissionReview of the same version whose `response` echoes the `uid`,
says `allowed`, and may carry a base64 `JSONPatch` and `warnings` (shown to the client,
each at most 256 characters, or the apiserver truncates them).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensile.contracts.objects import meta_of
from webhook.mutation import CREATE, PodAdmission

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
"""What `request.operation` may be (admission.k8s.io/v1 `Operation`); the answer's metrics
are labelled with it, so no other value gets that far."""
KIND = "AdmissionReview"
MAX_WARNING_LENGTH = 256
"""Longest warning the apiserver passes on untruncated."""


class BadReview(ValueError):
    """The request is not an AdmissionReview the webhook can answer; the message says why
    (the server answers 400 with it)."""


@dataclass(frozen=True, kw_only=True)
class Review:
    """A checked AdmissionReview request."""

    api_version: str
    uid: str
    operation: str
    admission: PodAdmission | None
    """The pod to decide on; None when the request is not about a Pod object itself (another
    kind, or a subresource such as pods/status): it is allowed unchanged."""


def parse(body: bytes) -> Review:
    """Check and parse an AdmissionReview request body (JSON). Raises BadReview."""
    api_version, request = _envelope(body)
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise BadReview("request.operation is missing")
    if operation not in OPERATIONS:
        raise BadReview(
            f"request.operation {_shown(operation)} is not one of {', '.join(OPERATIONS)}"
        )
    namespace = request.get("namespace", "")
    if not isinstance(namespace, str):
        raise BadReview("request.namespace is not a string")
    pod = request.get("object")
    if not _is_pod_request(request) or (pod is None and operation != CREATE):
        return Review(api_version=api_version, uid=uid, operation=operation, admission=None)
    if not isinstance(pod, dict):
        raise BadReview(f"request.object is missing (a Pod is needed for {operation})")
    for part in ("metadata", "spec"):
        if not isinstance(pod.get(part, {}), dict):
            raise BadReview(f"request.object is not a Pod: {part} is not an object")
    metadata = meta_of(pod)
    for part in ("labels", "annotations"):
        # null is how JSON says "none" (the decision reads it so); anything else but an
        # object is not a Pod's metadata.
        if not isinstance(metadata.get(part, {}), dict | None):
            raise BadReview(f"request.object is not a Pod: metadata.{part} is not an object")
    return Review(
        api_version=api_version,
        uid=uid,
        operation=operation,
        admission=PodAdmission(operation=operation, namespace=namespace, pod=pod),
    )


def _envelope(body: bytes) -> tuple[str, dict[str, Any]]:
    """Return (apiVersion, request) of an AdmissionReview body. Raises BadReview."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadReview(f"the body is not JSON: {_first_line(exc)}") from None
    if not isinstance(document, dict):
        raise BadReview("the body is not a JSON object (an AdmissionReview)")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if not isinstance(api_version, str) or api_version not in API_VERSIONS:
        raise BadReview(
            f"apiVersion {_shown(api_version)} is not supported ({' or '.join(API_VERSIONS)})"
        )
    if kind != KIND:
        raise BadReview(f"kind {_shown(kind)} is not {KIND}")
    request = document.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    return api_version, request


def response(
    *,
    api_version: str,
    uid: str,
    patch: Sequence[Mapping[str, Any]] = (),
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """Return the AdmissionReview that allows request `uid`, with `patch` (JSON patch
    operations; none: no patch) and `warnings` (each cut to MAX_WARNING_LENGTH)."""
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        encoded = json.dumps(list(patch), separators=(",", ":")).encode()
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(encoded).decode()
    if warnings:
        answer["warnings"] = [_short(w) for w in warnings]
    return {"apiVersion": api_version, "kind": KIND, "response": answer}


def _is_pod_request(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    if not isinstance(kind, Mapping):
        raise BadReview("request.kind is missing")
    return (
        kind.get("group", "") == "" and kind.get("kind") == "Pod" and not request.get("subResource")
    )


def _shown(value: object) -> str:
    text = json.dumps(value) if value is not None else "(missing)"
    return text if len(text) <= 80 else text[:77] + "..."


def _short(text: str) -> str:
    return text if len(text) <= MAX_WARNING_LENGTH else text[: MAX_WARNING_LENGTH - 3] + "..."


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]
