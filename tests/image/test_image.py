"""The image (Dockerfile) built by `make image` runs its programs as its config says: as
user 65532, on a read-only root filesystem; it holds no shell, package manager, pip or
compiler, and its build writes a CycloneDX SBOM beside it naming what it holds.

Skipped unless buildah (Debian: `apt-get install buildah mmdebstrap`) is installed and
this runs as root (the root filesystem is mounted and entered with unshare and chroot: no
container runtime is needed). Not part of `make test`: the first build takes minutes
(`make test-image` runs it). The build reuses buildah's layer cache afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast
from urllib.parse import unquote

import pytest

from devcluster import netns

ROOT = Path(__file__).parents[2]
IMAGE = "localhost/tensile/tensile:test"

pytestmark = pytest.mark.skipif(
    shutil.which("buildah") is None or os.geteuid() != 0,
    reason="needs buildah (apt-get install buildah mmdebstrap) and root",
)


def buildah(*args: str) -> str:
    env = {**os.environ, "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}
    done = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, check=True, env=env, timeout=120
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def sbom(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the build writes the image's SBOM."""
    return tmp_path_factory.mktemp("sbom") / "tensile.cdx.json"


@pytest.fixture(scope="module")
def image_root(sbom: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """Build the image, mount a container of it; yield its root and its config."""
    subprocess.run(
        [str(ROOT / "hack" / "build-image.sh")],
        env={**os.environ, "IMAGE": IMAGE, "BUILDER": "buildah", "SBOM": str(sbom)},
        # The build reaches Debian's mirror and PyPI: out of the tests' private network.
        preexec_fn=netns.in_host_network(),
        check=True,
        timeout=1500,
    )
    config = json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"]
    container = buildah("from", IMAGE)
    try:
        yield Path(buildah("mount", container)), config
    finally:
        buildah("umount", container)
        buildah("rm", container)


def run_in(
    root: Path,
    config: dict[str, object],
    argv: list[str],
    *,
    tmpfs: tuple[str, ...] = (),
    mnt: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in the image's root, made read-only, with its Env and User (chroot
    starts it in /, not in WorkingDir). `tmpfs`: directories of the image to mount an
    empty writable filesystem on (as a pod's emptyDir); `mnt`: a host directory to mount
    read-only at /mnt."""
    variables = cast("list[str]", config.get("Env") or [])
    env = {name: value for name, _, value in (v.partition("=") for v in variables)}
    user = str(config.get("User") or "0")
    mounts = [f"mount --bind {root} {root}", f"mount -o remount,bind,ro {root}"]
    mounts += [f"mount -t tmpfs -o mode=1777 tmpfs {root}{path}" for path in tmpfs]
    if mnt is not None:
        mounts.append(f"mount --bind -o ro {mnt} {root}/mnt")
    script = " && ".join([*mounts, f'exec /usr/sbin/chroot --userspec={user} {root} "$@"'])
    return subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c", script, "sh", *argv],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_image_runs_its_programs_as_a_non_root_user_on_a_read_only_root(
    image_root: tuple[Path, dict[str, object]],
) -> None:
    root, config = image_root
    assert config["User"] == "65532:65532"
    programs = [
        "virtual-node", "tensile-webhook", "tensile-descheduler", "tensile-scheduler",
        "kubectl-tensile",
    ]  # fmt: skip
    for program in programs:
        done = run_in(root, config, [program, "version"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{program} "), done.stdout
    # The root filesystem really was read-only, and the user really not root (asked of
    # Python: the image has no shell).
    probe = "import os; print(os.getuid()); open('/opt/tensile/x', 'w')"
    done = run_in(root, config, ["python3", "-c", probe])
    assert done.stdout.split()[0] == "65532"
    assert "Read-only file system" in done.stderr


def test_the_image_holds_no_shell_package_manager_pip_or_compiler(
    image_root: tuple[Path, dict[str, object]],
) -> None:
    root, _ = image_root
    for tool in ("sh", "bash", "dash", "apt", "apt-get", "dpkg", "pip", "pip3", "gcc", "cc"):
        for directory in ("usr/bin", "usr/sbin", "usr/local/bin", "opt/tensile/bin"):
            assert not (root / directory / tool).exists(), f"/{directory}/{tool}"
    site = next((root / "opt" / "tensile" / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("pip*")), "pip is installed in the venv"
    assert not list(site.glob("setuptools*"))


def test_the_sbom_names_the_debian_and_python_packages_in_the_image(
    image_root: tuple[Path, dict[str, object]], sbom: Path
) -> None:
    root, _ = image_root
    document = json.loads(sbom.read_text())
    assert document["bomFormat"] == "CycloneDX"
    purls = [c.get("purl", "") for c in document["components"]]
    assert any(p.startswith("pkg:deb/debian/python3.11-minimal@") for p in purls), purls
    assert any(p.startswith("pkg:deb/debian/libssl3@") for p in purls)
    for package in ("tensile", "kubernetes", "aiohttp", "cryptography"):
        assert any(p.startswith(f"pkg:pypi/{package}@") for p in purls), package
    # Every Debian package the image records is in the SBOM, and nothing it does not hold.
    status = (root / "var" / "lib" / "dpkg" / "status").read_text()
    recorded = {
        line.split(": ", 1)[1] for line in status.splitlines() if line.startswith("Package: ")
    }
    named = {unquote(p.split("/")[2].split("@")[0]) for p in purls if p.startswith("pkg:deb/")}
    assert named == recorded
    assert not any(p.startswith("pkg:pypi/pip@") for p in purls)


@pytest.mark.parametrize(
    ("tmpfs", "outcome"),
    [
        ((), "No usable temporary directory"),
        (("/tmp",), "cannot reach the upper cluster"),
    ],
    ids=["root-only", "with-tmp"],
)
def test_a_kubeconfig_with_embedded_data_needs_a_writable_tmp(
    image_root: tuple[Path, dict[str, object]],
    tmp_path: Path,
    tmpfs: tuple[str, ...],
    outcome: str,
) -> None:
    # The kubernetes client writes certificate-authority-data to a temporary file: on the
    # read-only root that needs /tmp mounted (the chart's emptyDir), or loading fails.
    root, config = image_root
    ca = base64.b64encode(Path("/etc/ssl/certs/ca-certificates.crt").read_bytes()).decode()
    cluster = {"server": "https://127.0.0.1:1", "certificate-authority-data": ca}
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig))
    tmp_path.chmod(0o755)
    (tmp_path / "kubeconfig").chmod(0o644)
    done = run_in(
        root,
        config,
        ["virtual-node", "--nodename=x", "--kubeconfig=/mnt/kubeconfig",
         "--client-kubeconfig=/mnt/kubeconfig", "--cert-dir=/run/pki"],
        tmpfs=("/run", *tmpfs),
        mnt=tmp_path,
    )  # fmt: skip
    assert outcome in done.stdout + done.stderr, done.stderr[-2000:]
