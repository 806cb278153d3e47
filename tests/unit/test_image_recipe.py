"""The image's recipe stays in step with the package: every direct dependency is pinned
in hack/image-constraints.txt inside pyproject.toml's range, and every package the
project installs is let into the build context (.dockerignore)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in (ROOT / "hack" / "image-constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {raw!r}"
            out[canonicalize_name(name)] = version
    return out


@pytest.mark.parametrize("dependency", PYPROJECT["project"]["dependencies"])
def test_each_dependency_is_pinned_within_its_range(dependency: str) -> None:
    requirement = Requirement(dependency)
    pinned = pins().get(canonicalize_name(requirement.name))
    assert pinned is not None, f"{requirement.name} is not in hack/image-constraints.txt"
    assert requirement.specifier.contains(pinned), f"{requirement.name}=={pinned} vs {dependency}"


@pytest.mark.parametrize(
    "package",
    [p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]],
)
def test_each_package_is_let_into_the_build(package: str) -> None:
    # The Dockerfile copies each package by name (what it copies later, hack/image-rootfs.py,
    # then changes no installed layer); .dockerignore lets only these through.
    assert f"\nCOPY {package} {package}/\n" in (ROOT / "Dockerfile").read_text()
    assert f"!{package}\n" in (ROOT / ".dockerignore").read_text()
