"""The package users install (`pip install tensile`, `pipx install tensile`): a wheel and an
sdist built from this checkout as a release would be, checked by twine as PyPI checks an
upload, installed from the wheel into a clean venv with pip and with pipx, and every
program run from there.

Built once per module with `python -m build --no-isolation` (the build system's setuptools
and wheel are in the test venv), from a copy of the package's files so that the checkout
gets no build/ or egg-info. No network: the clean venvs get the wheel with `--no-deps
--no-index`, and its dependencies from the test venv's site-packages (a .pth line placed
after the venv's own site-packages, so the installed wheel is what imports).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = (
    "tensile",
    "vnode",
    "webhook",
    "descheduler",
    "scheduler",
    "kubectl_tensile",
    "devcluster",
)
PROGRAMS = (
    "virtual-node",
    "tensile-webhook",
    "tensile-descheduler",
    "tensile-scheduler",
    "kubectl-tensile",
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built from the sdist: {"sdist": path, "wheel": path}."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True, check=True, timeout=300,
    )  # fmt: skip
    return {"sdist": next(out.glob("*.tar.gz")), "wheel": next(out.glob("*.whl"))}


def test_twine_accepts_the_wheel_and_the_sdist(dist: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.values())],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_package_holds_the_programs_and_no_test_code(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = wheel.read(entry_points).decode()
    with tarfile.open(dist["sdist"]) as sdist:
        sdist_names = [name.partition("/")[2] for name in sdist.getnames()]
    for program in (*PROGRAMS, "tensile-devcluster"):
        assert f"\n{program} = " in scripts, scripts
    assert {name.partition("/")[0] for name in names if "/" in name} >= set(PACKAGES)
    for listing in (names, sdist_names):
        tests = [
            n
            for n in listing
            if n.startswith("tests/") or "/tests/" in n or n.endswith("conftest.py")
        ]
        assert tests == [], tests


def with_test_dependencies(venv: Path) -> None:
    """Let `venv` import the dependencies installed in this test venv, after its own."""
    own = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    own.mkdir(parents=True, exist_ok=True)
    (own / "zz-test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")


def run_versions(bin_dir: Path, cwd: Path) -> dict[str, str]:
    """`<program> version` of every program in `bin_dir`, run from `cwd`: program -> output.
    Fails on a non-zero exit."""
    outputs = {}
    for program in PROGRAMS:
        done = subprocess.run(
            [str(bin_dir / program), "version"], cwd=cwd, capture_output=True, text=True,
            timeout=60, check=False, env={**os.environ, "PYTHONPATH": ""},
        )  # fmt: skip
        assert done.returncode == 0, f"{program}: {done.stderr}"
        outputs[program] = done.stdout
    return outputs


def test_pip_installs_the_wheel_and_every_program_runs(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "--no-index", "--disable-pip-version-check", "--quiet", str(dist["wheel"])],
        check=True, timeout=120,
    )  # fmt: skip
    with_test_dependencies(venv)
    outputs = run_versions(venv / "bin", tmp_path)
    for program, output in outputs.items():
        assert output.startswith(f"{program} 0."), output
    # What ran is the installed wheel, not this checkout.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"import {', '.join(PACKAGES)}\n"
         + "".join(f"print({package}.__file__)\n" for package in PACKAGES)],
        cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    for path in where.stdout.split():
        assert path.startswith(str(venv)), where.stdout


def test_pipx_installs_the_wheel_and_every_program_runs(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    # pipx's shared venv (the pip it installs with, on every pipx venv's path after the
    # venv's own packages) made here on this test venv's packages: pipx would fetch pip from
    # PyPI to make it, and the dependencies are found there.
    shared = tmp_path / "pipx" / "shared"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(shared)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(shared), "platbase": str(shared)}))
    site.rmdir()
    site.symlink_to(sysconfig.get_path("purelib"))
    pip = shared / "bin" / "pip"  # what pipx checks a shared venv for
    launcher = "import sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
    pip.write_text(f"#!{shared / 'bin' / 'python'}\n{launcher}")
    pip.chmod(0o755)
    env = {
        **os.environ,
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "bin"),
        "PIPX_MAN_DIR": str(tmp_path / "man"),
        "PIP_NO_INDEX": "1",
        "PIPX_DISABLE_SHARED_LIBS_AUTO_UPGRADE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipx", "install", "--pip-args=--no-deps", str(dist["wheel"])],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = run_versions(tmp_path / "bin", tmp_path)
    assert sorted(outputs) == sorted(PROGRAMS)
