"""Finding the control-plane binaries: KUBEBUILDER_ASSETS first, then the cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devcluster import binaries


def _fake_binaries(directory: Path, names: tuple[str, ...], *, stamp: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    recipes = binaries.recipes()
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        if stamp:
            (directory / f"{name}.stamp").write_text(recipes[name] + "\n")


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


def test_a_cached_binary_of_another_recipe_is_not_used(tmp_path: Path) -> None:
    env = {"TENSILE_CACHE_DIR": str(tmp_path / "cache")}
    cache = binaries.cache_dir(env=env)
    _fake_binaries(cache, binaries.COMPONENTS)
    (cache / "kwok.stamp").write_text("v0.0.1+old\n")
    _fake_binaries(cache, ("etcd",), stamp=False)
    (cache / "etcd.stamp").unlink()
    found, missing = binaries.locate(env=env)
    assert missing == ["etcd", "kwok"]
    assert set(found) == set(binaries.COMPONENTS) - {"etcd", "kwok"}


def test_the_kwok_recipe_matches_the_build_script() -> None:
    # The build script stamps kwok with the same digest of hack/kwok-patch/.
    script = binaries.BUILD_SCRIPT.read_text()
    assert "kwok-patch/* | LC_ALL=C sort) | sha256sum | cut -c1-16" in script
    here = binaries.BUILD_SCRIPT.parent
    digest = subprocess.run(
        ["bash", "-c", f'cat $(ls "{here}"/kwok-patch/* | LC_ALL=C sort) | sha256sum | cut -c1-16'],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    version = binaries.load_versions()["KWOK_VERSION"]
    assert binaries.recipes()["kwok"] == f"{version}+{digest}"


def test_the_e2e_suite_recipe_matches_the_build_script() -> None:
    # The build script stamps the suite with the same digest of its wrapper test.
    script = binaries.BUILD_SCRIPT.read_text()
    assert '$(sha256sum < "${here}/vk-e2e/e2e_test.go" | cut -c1-16)' in script
    digest = subprocess.run(
        ["bash", "-c", f'sha256sum < "{binaries.VK_E2E_WRAPPER}" | cut -c1-16'],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    version = binaries.load_versions()["VIRTUAL_KUBELET_VERSION"]
    assert binaries.recipes()["virtual-kubelet-e2e"] == f"{version}+{digest}"


def test_the_cache_is_keyed_by_the_pinned_kubernetes_version(tmp_path: Path) -> None:
    version = binaries.load_versions()["KUBERNETES_VERSION"]
    assert (
        binaries.cache_dir(env={"TENSILE_CACHE_DIR": str(tmp_path)}) == tmp_path / version / "bin"
    )


def test_missing_binaries_without_go_name_the_remedies(tmp_path: Path) -> None:
    env = {"TENSILE_CACHE_DIR": str(tmp_path), "PATH": str(tmp_path)}
    with pytest.raises(binaries.MissingBinaries) as info:
        binaries.ensure(build=True, env=env)
    message = str(info.value)
    assert "missing control-plane binaries: " + ", ".join(binaries.COMPONENTS) in message
    assert "'go' tool is not on PATH" in message
    assert "KUBEBUILDER_ASSETS" in message


def test_versions_file_pins_every_component() -> None:
    versions = binaries.load_versions()
    assert set(versions) >= {
        "KUBERNETES_VERSION",
        "KWOK_VERSION",
        "ETCD_VERSION",
        "METRICS_SERVER_VERSION",
        "VIRTUAL_KUBELET_VERSION",
        "HELM_VERSION",
        "PROMETHEUS_VERSION",
    }
    assert all(v.startswith("v") for k, v in versions.items() if k.endswith("_VERSION"))
