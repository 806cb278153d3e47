"""The image (Dockerfile) built by `make image` runs its programs as its config says: as
user 65532, on a read-only root filesystem.

Skipped unless buildah (Debian: `apt-get install buildah mmdebstrap`) is installed and
this runs as root (the root filesystem is mounted and entered with unshare and chroot: no
container runtime is needed). Not part of `make test`: the first build takes minutes
(`make test-image` runs it). The build reuses buildah's layer cache afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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
def image_root() -> Iterator[tuple[Path, dict[str, object]]]:
    """Build the image, mount a container of it; yield its root and its config."""
    subprocess.run(
        [str(ROOT / "hack" / "build-image.sh")],
        env={**os.environ, "IMAGE": IMAGE, "BUILDER": "buildah"},
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
    root: Path, config: dict[str, object], argv: list[str]
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in the image's root, made read-only, with its Env and User (chroot
    starts it in /, not in WorkingDir)."""
    env = dict(str(e).split("=", 1) for e in config.get("Env") or [])  # type: ignore[attr-defined]
    user = str(config.get("User") or "0")
    script = (
        f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
        f'exec /usr/sbin/chroot --userspec={user} {root} "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c", script, "sh", *argv],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_image_runs_its_programs_as_a_non_root_user_on_a_read_only_root(
    image_root: tuple[Path, dict[str, object]],
) -> None:
    root, config = image_root
    assert config["User"] == "65532:65532"
    # `--version` where the programs have it (issue 24 §1), `--help` before.
    has_version = (ROOT / "vnode" / "serving" / "version.py").exists()
    for program in ("virtual-node", "tensile-webhook", "tensile-descheduler"):
        flag = "--version" if has_version else "--help"
        done = run_in(root, config, [program, flag])
        assert done.returncode == 0, done.stderr
        assert program in done.stdout
    # The root filesystem really was read-only, and the user really not root.
    done = run_in(root, config, ["/bin/sh", "-c", "id -u; touch /opt/tensile/x"])
    assert done.stdout.split()[0] == "65532"
    assert "Read-only file system" in done.stderr
