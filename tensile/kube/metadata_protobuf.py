"""Metadata-only lists in Kubernetes' protobuf encoding, read for what a cache audit compares.

A cache audit (`tensile.kube.cacheaudit`) lists every object of an informer again, metadata
only, to compare keys and resourceVersions. In JSON, most of each item is its managedFields,
and decoding them was two thirds of the patrol's CPU at 10,000 pods. The apiserver also
answers in protobuf (`PROTOBUF`, asked for with `METADATA_LIST`), which protobuf's C parser
reads skipping every field a schema does not name: the schema here names only an item's
name, namespace and resourceVersion, and the list's resourceVersion and continue token.

The encoding ("Protobuf serialization", Kubernetes API concepts): the four bytes `k8s\\0`,
then a `runtime.Unknown` whose `raw` holds the object; field numbers are those of
k8s.io/apimachinery's generated.proto (pkg/runtime: Unknown, TypeMeta; pkg/apis/meta/v1:
ObjectMeta, ListMeta, PartialObjectMetadata(List), Status). Custom resources have no
protobuf encoding: their lists come back in JSON, which the client decodes as always.
"""

from __future__ import annotations

import functools
from typing import Any, Final

PROTOBUF: Final = "application/vnd.kubernetes.protobuf"
"""The Content-Type of an answer in Kubernetes' protobuf encoding."""
MAGIC: Final = b"k8s\x00"

_PACKAGE = "tensile.kube.metadata"

_SCHEMA: Final[dict[str, list[tuple[str, int, str]]]] = {
    # (field, number, a scalar type or a message of this schema; "[]": repeated)
    # runtime.TypeMeta and runtime.Unknown (pkg/runtime/generated.proto)
    "TypeMeta": [("apiVersion", 1, "string"), ("kind", 2, "string")],
    "Unknown": [
        ("typeMeta", 1, "TypeMeta"),
        ("raw", 2, "bytes"),
        ("contentEncoding", 3, "string"),
        ("contentType", 4, "string"),
    ],
    # meta/v1 (pkg/apis/meta/v1/generated.proto), only the fields read
    "ObjectMeta": [
        ("name", 1, "string"),
        ("namespace", 3, "string"),
        ("resourceVersion", 6, "string"),
    ],
    "ListMeta": [("resourceVersion", 2, "string"), ("continue", 3, "string")],
    "PartialObjectMetadata": [("metadata", 1, "ObjectMeta")],
    "PartialObjectMetadataList": [
        ("metadata", 1, "ListMeta"),
        ("items", 2, "[]PartialObjectMetadata"),
    ],
    "Status": [
        ("status", 2, "string"),
        ("message", 3, "string"),
        ("reason", 4, "string"),
        ("code", 6, "int32"),
    ],
}


@functools.cache
def _classes() -> dict[str, Any]:
    """The message classes of `_SCHEMA`, from a descriptor made here (no generated code;
    typed Any: their fields are made at run time). protobuf is imported here, at the first
    answer in its encoding: a process that never audits loads none of it (a node that does
    not trace loads nothing of OpenTelemetry's stack, tests/unit/test_tracing.py)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: PLC0415

    file = descriptor_pb2.FileDescriptorProto(
        name="tensile/kube/metadata.proto", package=_PACKAGE, syntax="proto2"
    )
    field_type = descriptor_pb2.FieldDescriptorProto
    scalars = {
        "string": field_type.TYPE_STRING,
        "bytes": field_type.TYPE_BYTES,
        "int32": field_type.TYPE_INT32,
    }
    for name, fields in _SCHEMA.items():
        kind = file.message_type.add(name=name)
        for field_name, number, type_ in fields:
            field = kind.field.add(name=field_name, number=number, label=field_type.LABEL_OPTIONAL)
            if type_ in scalars:
                field.type = scalars[type_]
                continue
            field.type = field_type.TYPE_MESSAGE
            field.type_name = f".{_PACKAGE}.{type_.removeprefix('[]')}"
            if type_.startswith("[]"):
                field.label = field_type.LABEL_REPEATED
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _SCHEMA
    }


def _parse(kind: str, data: bytes, what: str) -> Any:
    """`data` parsed as message `kind`. Raises ValueError naming `what` when it does not
    parse."""
    from google.protobuf import message  # noqa: PLC0415 - imported late, see _classes

    parsed = _classes()[kind]()
    try:
        parsed.ParseFromString(data)
    except message.DecodeError as exc:
        raise ValueError(f"{what} that does not parse: {exc}") from None
    return parsed


def _unknown(payload: bytes) -> Any:
    if not payload.startswith(MAGIC):
        raise ValueError("not Kubernetes protobuf: no k8s\\0 prefix")
    envelope = _parse("Unknown", payload[len(MAGIC) :], "not Kubernetes protobuf: a body")
    if envelope.contentEncoding:
        raise ValueError(f"an encoded protobuf body ({envelope.contentEncoding!r})")
    return envelope


def decode(payload: bytes) -> dict[str, Any]:
    """Return an answer in Kubernetes' protobuf encoding as the JSON answer's subset the
    audit reads: a PartialObjectMetadataList as {"metadata": {"resourceVersion",
    "continue"?}, "items": [{"metadata": {"name", "namespace"?, "resourceVersion"}}]}, a
    Status as {"kind": "Status", "status", "message", "reason", "code"} (an error answer).
    Raises ValueError for anything else (no `k8s\\0` prefix, a body that does not parse, an
    encoded body, another kind)."""
    envelope = _unknown(payload)
    kind = envelope.typeMeta.kind
    if kind == "Status":
        status = _parse("Status", envelope.raw, "a Status")
        return {
            "kind": "Status",
            "status": status.status,
            "message": status.message,
            "reason": status.reason,
            "code": status.code,
        }
    if kind != "PartialObjectMetadataList":
        raise ValueError(f"a protobuf {kind or 'object'}, not a PartialObjectMetadataList")
    listed = _parse("PartialObjectMetadataList", envelope.raw, "a PartialObjectMetadataList")
    meta: dict[str, Any] = {"resourceVersion": listed.metadata.resourceVersion}
    token = getattr(listed.metadata, "continue")  # a Python keyword, a field name here
    if token:
        meta["continue"] = token
    items = []
    for item in listed.items:
        item_meta = item.metadata
        entry = {"name": item_meta.name, "resourceVersion": item_meta.resourceVersion}
        if item_meta.namespace:
            entry["namespace"] = item_meta.namespace
        items.append({"metadata": entry})
    return {"kind": "PartialObjectMetadataList", "metadata": meta, "items": items}
