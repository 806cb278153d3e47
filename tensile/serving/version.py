"""What `<program> version` and `--version` print: tensile's version, the commit it was built
from, and the Kubernetes version it is built and tested against (the three facts
virtual-kubelet's node-cli and tensile-kube's descheduler print, in one line)."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

KUBERNETES_VERSION = "v1.37.1"
"""The Kubernetes release tensile is tested against (hack/versions.env KUBERNETES_VERSION;
a unit test keeps the two equal)."""
COMMIT = ""
"""The commit of a packaged build: written here by an image or wheel build ("" in a
checkout, where git tells)."""
_SOURCE = Path(__file__).resolve().parents[2]


def commit() -> str:
    """Return the commit tensile runs from: `COMMIT` when a build wrote it, else the
    checkout's HEAD (12 hex digits) when this file is in a git checkout, else "unknown"."""
    if COMMIT:
        return COMMIT
    if not (_SOURCE / ".git").exists():
        return "unknown"
    try:
        done = subprocess.run(
            ["git", "-C", str(_SOURCE), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def version() -> str:
    """Return tensile's package version ("unknown" when it is not installed)."""
    try:
        return importlib.metadata.version("tensile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def text(program: str) -> str:
    """Return the one line `program version` prints, e.g. "virtual-node 0.1.0 (commit
    5cdcb85a1b2c, Kubernetes v1.37.1)"."""
    return f"{program} {version()} (commit {commit()}, Kubernetes {KUBERNETES_VERSION})"
