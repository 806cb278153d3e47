"""Finding the control-plane binaries: KUBEBUILDER_ASSETS first, then the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from vnode.testing import binaries


def _fake_binaries(directory: Path, names: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


def test_kubebuilder_assets_take_precedence_over_the_cache(tmp_path: Path) -> None:
    env = {
        "TENSILE_CACHE_DIR": str(tmp_path / "cache"),
        "KUBEBUILDER_ASSETS": str(tmp_path / "assets"),
    }
    cache = binaries.cache_dir(env=env)
    _fake_binaries(cache, binaries.COMPONENTS)
    _fake_binaries(tmp_path / "assets", ("etcd", "kube-apiserver"))
    found, missing = binaries.locate(env=env)
    assert missing == []
    assert found["etcd"] == tmp_path / "assets" / "etcd"
    assert found["kwok"] == cache / "kwok"


def test_the_cache_is_keyed_by_the_pinned_kubernetes_version(tmp_path: Path) -> None:
    version = binaries.load_versions()["KUBERNETES_VERSION"]
    assert (
        binaries.cache_dir(env={"TENSILE_CACHE_DIR": str(tmp_path)}) == tmp_path / version / "bin"
    )


def test_missing_binaries_without_build_name_the_remedies(tmp_path: Path) -> None:
    env = {"TENSILE_CACHE_DIR": str(tmp_path), "PATH": str(tmp_path)}
    with pytest.raises(binaries.MissingBinaries) as info:
        binaries.ensure(env=env)
    message = str(info.value)
    assert "missing control-plane binaries: " + ", ".join(binaries.COMPONENTS) in message
    assert "'go' tool is not on PATH" in message
    assert "KUBEBUILDER_ASSETS" in message


def test_versions_file_pins_every_component() -> None:
    versions = binaries.load_versions()
    assert set(versions) >= {"KUBERNETES_VERSION", "KWOK_VERSION", "ETCD_VERSION"}
    assert all(v.startswith("v") for v in versions.values())
