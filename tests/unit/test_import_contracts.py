"""The import-linter allow-lists (pyproject.toml) leave no package out: import-linter sees
only the root packages it is given, and a layers contract says nothing of a package it does
not name, so every package the project ships is a root package and has its place in the
layers that say what each program may import."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _config() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def _root_packages() -> set[str]:
    return set(_config()["tool"]["importlinter"]["root_packages"])


def test_every_shipped_package_is_a_root_package_of_the_import_contracts() -> None:
    shipped = {
        p.rstrip("*") for p in _config()["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert _root_packages() == shipped


def test_every_root_package_has_its_place_in_the_allow_list() -> None:
    contracts = _config()["tool"]["importlinter"]["contracts"]
    [allow_list] = [
        c
        for c in contracts
        if c["type"] == "layers" and not c.get("containers") and c["layers"][-1] == "tensile"
    ]
    placed = [m.strip() for layer in allow_list["layers"] for m in layer.split("|")]
    assert sorted(placed) == sorted(_root_packages())
    assert placed[0] == "devcluster", "only the local fleet may import the programs"
