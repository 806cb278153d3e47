"""Reading Kubernetes objects as the API sends them: plain JSON dicts whose parts may be
missing, null or of the wrong shape (a malformed or hostile object). Pure; nothing here
copies or mutates its input.

`Obj` is the type every program keeps objects as (stores, informers, providers); the
readers return an empty value of the expected shape in place of anything else, so a
decision never fails on a missing or malformed part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object (or part of one) as decoded JSON."""


def as_mapping(value: object) -> Mapping[str, Any]:
    """Return `value` itself when it is a mapping, else an empty one (read-only)."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    """Return `value` itself when it is a list, else a new empty list."""
    return value if isinstance(value, list) else []


def dicts_in(value: object) -> list[dict[str, Any]]:
    """Return the dict items of `value` when it is a list (a new list of the same items;
    anything else a malformed object carries there is left out), else []."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
