"""Where the control-plane binaries come from: KUBEBUILDER_ASSETS, the build cache, or a build.

Order (DESIGN.md, "The real control plane"): a binary in `$KUBEBUILDER_ASSETS` (the envtest
convention) wins; otherwise the project's cache `${TENSILE_CACHE_DIR:-~/.cache/tensile}/
<kubernetes-version>/bin`, filled by `hack/build-control-plane.sh` from pinned Go module
versions; otherwise a `MissingBinaries` error that says what to install or set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "metrics-server",
    "virtual-kubelet-e2e",
    "helm",
    "promtool",
)
"""Everything the build script makes: the control plane, metrics-server,
virtual-kubelet's provider e2e suite (a Go test binary), helm (the chart's tests) and
promtool (the alerts' checks and unit tests)."""

_REPO_ROOT = Path(__file__).resolve().parents[1]
VERSIONS_FILE = _REPO_ROOT / "hack" / "versions.env"
BUILD_SCRIPT = _REPO_ROOT / "hack" / "build-control-plane.sh"
KWOK_PATCH_DIR = _REPO_ROOT / "hack" / "kwok-patch"
VK_E2E_WRAPPER = _REPO_ROOT / "hack" / "vk-e2e" / "e2e_test.go"


class MissingBinaries(RuntimeError):
    """Some control-plane binaries were not found and could not be built.

    The message names the missing binaries and the ways to get them.
    """


def load_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse the pinned versions file (`KEY=VALUE` lines, `#` comments) into a dict.

    Raises MissingBinaries if the file is absent (the harness runs from a source checkout).
    """
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise MissingBinaries(
            f"{path} not found: the control-plane harness runs from a tensile source checkout; "
            "set KUBEBUILDER_ASSETS to a directory holding " + ", ".join(COMPONENTS)
        ) from exc
    versions: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        versions[key.strip()] = value.strip()
    return versions


def cache_dir(*, env: Mapping[str, str] | None = None) -> Path:
    """Return the build cache's bin directory for the pinned Kubernetes version."""
    env = os.environ if env is None else env
    root = Path(env.get("TENSILE_CACHE_DIR") or Path.home() / ".cache" / "tensile")
    return root / load_versions()["KUBERNETES_VERSION"] / "bin"


def recipes() -> dict[str, str]:
    """Return the build recipe of each component, as the build script stamps it.

    A cached binary whose `<name>.stamp` differs was built from other versions, another
    kwok patch or another e2e wrapper, and is rebuilt rather than used.
    """
    versions = load_versions()
    digest = hashlib.sha256()
    for path in sorted(KWOK_PATCH_DIR.iterdir(), key=lambda p: p.name.encode()):
        digest.update(path.read_bytes())
    wrapper = hashlib.sha256(VK_E2E_WRAPPER.read_bytes()).hexdigest()[:16]
    return {
        "etcd": versions["ETCD_VERSION"],
        "kube-apiserver": versions["KUBERNETES_VERSION"],
        "kube-controller-manager": versions["KUBERNETES_VERSION"],
        "kube-scheduler": versions["KUBERNETES_VERSION"],
        "kwok": f"{versions['KWOK_VERSION']}+{digest.hexdigest()[:16]}",
        "metrics-server": versions["METRICS_SERVER_VERSION"],
        "virtual-kubelet-e2e": f"{versions['VIRTUAL_KUBELET_VERSION']}+{wrapper}",
        "helm": versions["HELM_VERSION"],
        "promtool": f"{versions['PROMETHEUS_VERSION']}+{versions['PROMTOOL_TAGS']}",
    }


def locate(*, env: Mapping[str, str] | None = None) -> tuple[dict[str, Path], list[str]]:
    """Find each component: returns (found name -> path, names not found).

    `$KUBEBUILDER_ASSETS` binaries are taken as they are; cached ones only with the
    current recipe's stamp.
    """
    env = os.environ if env is None else env
    assets = Path(env["KUBEBUILDER_ASSETS"]) if env.get("KUBEBUILDER_ASSETS") else None
    cache = cache_dir(env=env)
    expected = recipes()
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in COMPONENTS:
        if assets is not None and _executable(assets / name):
            found[name] = assets / name
        elif _executable(cache / name) and _stamp(cache / name) == expected[name]:
            found[name] = cache / name
        else:
            missing.append(name)
    return found, missing


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _stamp(binary: Path) -> str | None:
    try:
        return binary.with_name(binary.name + ".stamp").read_text().strip()
    except OSError:
        return None


def ensure(
    *,
    build: bool = True,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> dict[str, Path]:
    """Return the path of every component, building the missing ones with `go` if allowed.

    `preexec_fn` runs in the build's child process before it executes the build script: a
    caller inside a private network namespace passes one that leaves it, as the build needs
    the Go module proxy (the fleet passes `devcluster.netns.in_host_network()`).

    Raises MissingBinaries (naming what is missing, what to install or which variable to
    set) when a binary is absent and cannot be built.
    """
    env = os.environ if env is None else env
    found, missing = locate(env=env)
    if not missing:
        return found
    go = shutil.which("go", path=env.get("PATH"))
    if not build or go is None:
        raise MissingBinaries(_missing_message(missing, env=env, go_found=go is not None))
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), str(cache_dir(env=env))],
        env=dict(env),
        check=False,
        preexec_fn=preexec_fn,
    )
    found, missing = locate(env=env)
    if result.returncode != 0 or missing:
        raise MissingBinaries(
            f"building the control plane with {BUILD_SCRIPT} failed (exit {result.returncode}); "
            + _missing_message(missing or list(COMPONENTS), env=env, go_found=True)
        )
    return found


def _missing_message(missing: list[str], *, env: Mapping[str, str], go_found: bool) -> str:
    lines = [
        "missing control-plane binaries: " + ", ".join(missing) + ".",
        f"Looked in $KUBEBUILDER_ASSETS ({env.get('KUBEBUILDER_ASSETS') or 'unset'}) "
        f"and the build cache {cache_dir(env=env)}.",
    ]
    if not go_found:
        lines.append(
            "The 'go' tool is not on PATH: install Go >= 1.26 (Debian: golang-go is too old; "
            "use the official toolchain) and run `make controlplane`, or set "
            "KUBEBUILDER_ASSETS to a directory holding " + ", ".join(COMPONENTS) + "."
        )
    else:
        lines.append(
            "Run `make controlplane` (hack/build-control-plane.sh) to build them, or set "
            "KUBEBUILDER_ASSETS to a directory holding " + ", ".join(COMPONENTS) + "."
        )
    return " ".join(lines)
