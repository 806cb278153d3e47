"""The hot-path JSON codec: the same documents as the json module, faster."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from tensile.kube import codec

POD = {
    "metadata": {"name": "p", "labels": {"app": "wéb"}, "annotations": {}},
    "spec": {"containers": [{"name": "c", "args": ["a", "b"], "ports": [{"port": 80}]}]},
    "status": {"phase": "Running", "ready": True, "restarts": 0, "ratio": 0.5, "none": None},
}


def test_round_trip_matches_the_json_module() -> None:
    encoded = codec.dumps(POD)
    assert isinstance(encoded, bytes)
    assert json.loads(encoded) == POD
    assert codec.loads(encoded) == POD
    assert codec.loads(json.dumps(POD)) == POD
    assert b" " not in encoded, "compact"
    assert "wéb".encode() in encoded, "UTF-8, not \\u escapes"


def test_deep_copy_shares_nothing() -> None:
    copied = codec.deep_copy(POD)
    assert copied == POD
    copied["spec"]["containers"][0]["args"].append("c")
    copied["metadata"]["labels"]["app"] = "x"
    assert POD["spec"]["containers"][0]["args"] == ["a", "b"]
    assert POD["metadata"]["labels"]["app"] == "wéb"


def test_deep_copy_of_what_json_cannot_hold_falls_back() -> None:
    odd = {"big": 2**70, "keys": {1: "int key"}}
    copied = codec.deep_copy(odd)
    assert copied == odd
    assert copied["keys"] is not odd["keys"]


def test_not_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"."):
        codec.loads(b"<html>proxy error</html>")
    with pytest.raises(ValueError, match=r"."):
        codec.loads(b'{"truncated": ')


def test_packed_holds_no_slack() -> None:
    # What an encoded store keeps for every object: the text, not orjson's working buffer
    # (sys.getsizeof cannot tell: it reports the length, not the allocation).
    big = {**POD, "data": {f"key-{i}": "v" * 40 for i in range(60)}}
    assert codec.packed(big) == codec.dumps(big)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [codec.packed(big) for _ in range(50)]
        per_copy = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert per_copy < len(kept[0]) + 128
