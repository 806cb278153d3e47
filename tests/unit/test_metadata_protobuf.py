"""Metadata-only lists in Kubernetes' protobuf encoding (tensile/kube/metadata_protobuf.py):
the envelope and the fields the cache audit compares are read, every other field (an
item's managedFields, labels, the list's remainingItemCount) is skipped, a Status becomes
the JSON Status the errors module reads, and anything else is refused with a ValueError.
The bytes are made by hand on the wire format of k8s.io/apimachinery's generated.proto;
tests/e2e/test_patrol.py lists a real apiserver this way."""

from __future__ import annotations

import pytest

from tensile.kube import metadata_protobuf
from tensile.kube.metadata_protobuf import MAGIC, decode


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _number(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _envelope(kind: str, raw: bytes, *, encoding: str = "") -> bytes:
    type_meta = _field(1, "meta.k8s.io/v1") + _field(2, kind)
    body = _field(1, type_meta) + _field(2, raw)
    if encoding:
        body += _field(3, encoding)
    return MAGIC + body + _field(4, metadata_protobuf.PROTOBUF)


def _item(name: str, namespace: str, version: str) -> bytes:
    managed = _field(1, "kubectl") + _field(7, b'{"f:metadata":{"f:labels":{}}}' * 50)
    meta = (
        _field(1, name)
        + _field(3, namespace)
        + _field(5, "uid-" + name)
        + _field(6, version)
        + _number(7, 3)
        + _field(11, _field(1, "app") + _field(2, "web"))
        + _field(17, managed)
        + _field(17, managed)
    )
    return _field(1, meta)


def test_a_page_is_read_as_the_json_pages_subset_the_audit_compares() -> None:
    list_meta = _field(2, "1234") + _field(3, "token-2") + _number(4, 998)
    raw = (
        _field(1, list_meta)
        + _field(2, _item("web-0", "shop", "101"))
        + _field(2, _item("node-a", "", "102"))
    )
    assert decode(_envelope("PartialObjectMetadataList", raw)) == {
        "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "1234", "continue": "token-2"},
        "items": [
            {"metadata": {"name": "web-0", "namespace": "shop", "resourceVersion": "101"}},
            {"metadata": {"name": "node-a", "resourceVersion": "102"}},
        ],
    }


def test_the_last_page_has_no_continue_token() -> None:
    answer = decode(_envelope("PartialObjectMetadataList", _field(1, _field(2, "7"))))
    assert answer["metadata"] == {"resourceVersion": "7"}
    assert answer["items"] == []


def test_an_error_answer_becomes_a_json_status() -> None:
    raw = (
        _field(2, "Failure")
        + _field(3, "the provided continue parameter is too old")
        + _field(4, "Expired")
        + _number(6, 410)
    )
    assert decode(_envelope("Status", raw)) == {
        "kind": "Status",
        "status": "Failure",
        "message": "the provided continue parameter is too old",
        "reason": "Expired",
        "code": 410,
    }


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b'{"kind": "PartialObjectMetadataList"}', "no k8s"),
        (MAGIC + b"\xff\xff\xff", "not Kubernetes protobuf"),
        (_envelope("PodList", b""), "not a PartialObjectMetadataList"),
        (_envelope("PartialObjectMetadataList", b"", encoding="gzip"), "an encoded protobuf"),
        (_envelope("PartialObjectMetadataList", b"\x12\x05ab"), "does not parse"),
    ],
)
def test_anything_else_is_refused(payload: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        decode(payload)
