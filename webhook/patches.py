"""RFC 6902 JSON patches that set or remove object members (pure).

The webhook changes a few whole fields of a pod (`/spec/nodeSelector`, `/spec/affinity`,
`/spec/tolerations`, one annotation), so its patch replaces each changed field with an
`add` (which RFC 6902 defines as "replace" for an existing member) or drops it with a
`remove`, creating missing parent objects (`/metadata/annotations`) on the way. Paths are
JSON pointers (RFC 6901: `~` and `/` in a key are escaped as `~0` and `~1`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

Operation = dict[str, Any]


def pointer(path: Sequence[str]) -> str:
    """Return the JSON pointer of `path` (keys from the document's root)."""
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


def set_member(document: Mapping[str, Any], path: Sequence[str], value: object) -> list[Operation]:
    """Return the operations that make the member at `path` equal `value` in `document`
    (none when it already is). Missing (or null) parent objects are added with it. The operations
    hold `value` itself (serialise them; do not change it). Raises ValueError for an empty
    path or a parent that exists but is not an object."""
    if not path:
        raise ValueError("a member path needs at least one key")
    node: Any = document
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping):
            raise ValueError(f"{pointer(path[:depth])} is not an object")
        if node.get(key) is None:  # absent, or null: JSON's "none" (an add replaces it)
            nested: Any = value
            for outer in reversed(path[depth + 1 :]):
                nested = {outer: nested}
            return [{"op": "add", "path": pointer(path[: depth + 1]), "value": nested}]
        node = node[key]
    if node == value and type(node) is type(value):
        return []
    return [{"op": "add", "path": pointer(path), "value": value}]


def remove_member(document: Mapping[str, Any], path: Sequence[str]) -> list[Operation]:
    """Return the operation that removes the member at `path` from `document`, or none when
    it is not there."""
    node: Any = document
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return []
        node = node[key]
    return [{"op": "remove", "path": pointer(path)}]


def apply(document: Mapping[str, Any], operations: Sequence[Operation]) -> dict[str, Any]:
    """Return a copy of `document` with `operations` applied: the `add` and `remove` on
    object members this module makes, as a JSON patch implementation would (for tests and
    the idempotence check). Raises ValueError for anything else."""
    result = copy.deepcopy(dict(document))
    for operation in operations:
        keys = [
            part.replace("~1", "/").replace("~0", "~")
            for part in str(operation["path"]).split("/")[1:]
        ]
        parent: Any = result
        for key in keys[:-1]:
            parent = parent[key]
        if not isinstance(parent, dict):
            raise ValueError(f"{operation['path']}: parent is not an object")
        if operation["op"] == "add":
            parent[keys[-1]] = copy.deepcopy(operation["value"])
        elif operation["op"] == "remove":
            del parent[keys[-1]]
        else:
            raise ValueError(f"unsupported operation {operation['op']!r}")
    return result
