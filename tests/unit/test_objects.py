"""Reading objects one way (`tensile.contracts.objects`, and `ownership.upper_uid_of`): the
accessors return the object's own parts, never raise on a malformed object, and never copy
or change it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensile.contracts.objects import (
    annotations_of,
    deletion_timestamp_of,
    labels_of,
    meta_of,
    name_of,
    namespace_of,
    owner_references_of,
    resource_version_of,
    uid_of,
)
from tensile.contracts.ownership import UPPER_UID_ANNOTATION, upper_uid_of

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "web-1",
        "namespace": "shop",
        "uid": "u-1",
        "resourceVersion": "42",
        "deletionTimestamp": "2026-01-02T03:04:05Z",
        "labels": {"app": "web"},
        "annotations": {UPPER_UID_ANNOTATION: "up-1", "note": "x"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "uid": "rs-1"}],
    },
}

ACCESSORS = (
    meta_of,
    labels_of,
    annotations_of,
    name_of,
    namespace_of,
    uid_of,
    resource_version_of,
    deletion_timestamp_of,
    owner_references_of,
    upper_uid_of,
)


def test_a_well_formed_object_reads_as_its_own_parts() -> None:
    meta = POD["metadata"]
    assert meta_of(POD) is meta
    assert labels_of(POD) is meta["labels"]
    assert annotations_of(POD) is meta["annotations"]
    assert owner_references_of(POD) is meta["ownerReferences"]
    assert (name_of(POD), namespace_of(POD), uid_of(POD)) == ("web-1", "shop", "u-1")
    assert resource_version_of(POD) == "42"
    assert deletion_timestamp_of(POD) == "2026-01-02T03:04:05Z"
    assert upper_uid_of(POD) == "up-1"


@pytest.mark.parametrize(
    "obj",
    [{}, {"metadata": None}, {"metadata": "x"}, {"metadata": ["name"]}, {"metadata": 3}],
)
def test_missing_or_malformed_metadata_reads_as_empty(obj: dict[str, Any]) -> None:
    assert meta_of(obj) == labels_of(obj) == annotations_of(obj) == {}
    for read in (name_of, namespace_of, uid_of, resource_version_of):
        assert read(obj) == ""
    assert deletion_timestamp_of(obj) is None
    assert upper_uid_of(obj) is None
    assert list(owner_references_of(obj)) == []


def test_malformed_fields_read_as_empty() -> None:
    malformed = {
        "name": 7,
        "namespace": None,
        "uid": ["u"],
        "resourceVersion": 42,
        "deletionTimestamp": "",
        "labels": ["a"],
        "annotations": {UPPER_UID_ANNOTATION: 5},
        "ownerReferences": {"kind": "ReplicaSet"},
    }
    obj = {"metadata": malformed}
    assert meta_of(obj) is malformed
    assert labels_of(obj) == {}
    for read in (name_of, namespace_of, uid_of, resource_version_of):
        assert read(obj) == ""
    assert deletion_timestamp_of(obj) is None
    assert upper_uid_of(obj) is None
    assert list(owner_references_of(obj)) == []
    assert upper_uid_of({"metadata": {"annotations": {UPPER_UID_ANNOTATION: ""}}}) is None
    assert annotations_of({"metadata": {"annotations": "x"}}) == {}


def test_an_empty_part_is_read_only_and_shared() -> None:
    empty = labels_of({})
    with pytest.raises(TypeError):
        empty["x"] = "y"  # type: ignore[index]
    assert meta_of({}) is empty
    assert annotations_of({"metadata": None}) is empty


texts = st.text(max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=12,
)
metadata_keys = st.sampled_from(
    [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "deletionTimestamp",
        "labels",
        "annotations",
        "ownerReferences",
        UPPER_UID_ANNOTATION,
    ]
)
metadata_like = st.recursive(
    json_values,
    lambda inner: st.dictionaries(metadata_keys | texts, inner, max_size=6),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(metadata=metadata_like)
def test_accessors_never_raise_nor_change_the_object(metadata: object) -> None:
    obj = {"metadata": metadata}
    before = copy.deepcopy(obj)
    for read in ACCESSORS:
        value = read(obj)
        assert value is None or isinstance(value, str | tuple | list | dict) or value == {}
    assert obj == before
