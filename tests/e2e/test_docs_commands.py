"""The commands the documentation tells a user to type work: every fenced block marked
runnable (```bash title="runnable"```) on a page under docs/ is run, page by page in
order, against the session fleet, as a user runs them in `tensile-devcluster shell`: the
same environment (`KUBECONFIG`, `TENSILE_<CLUSTER>_KUBECONFIG`, ...), kubectl, helm and the
programs on PATH, a working directory with the repository's `manifests/` and `charts/`, and
one virtual node between the upper and the lower cluster (`VIRTUAL_NODE` names it). A block
may sit in a list item, indented."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import binaries, netns
from devcluster.__main__ import env_values
from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import delete_if_present, get, wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_OPEN = re.compile(r'^( *)```bash title="runnable"\s*$')
_CLOSE = re.compile(r"^ *```\s*$")


def runnable_blocks(markdown: str) -> list[str]:
    """The bodies of the runnable fenced blocks of a page, in order; a block inside a list
    item (indented) loses its indentation."""
    blocks: list[str] = []
    body: list[str] | None = None
    indent = 0
    for line in markdown.splitlines():
        if body is None:
            opened = _OPEN.match(line)
            if opened:
                body, indent = [], len(opened.group(1))
        elif _CLOSE.match(line):
            blocks.append("\n".join(body))
            body = None
        else:
            assert not line[:indent].strip(), f"a runnable block's line is not indented: {line}"
            body.append(line[indent:])
    assert body is None, "a runnable block is not closed"
    return blocks


PAGES = sorted(
    p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if runnable_blocks(p.read_text())
)


def test_the_pages_have_runnable_blocks_and_each_is_closed() -> None:
    # The marker is matched exactly: a page whose blocks silently stopped matching would
    # otherwise test nothing.
    assert len(PAGES) >= 5, PAGES
    assert runnable_blocks('x\n```bash title="runnable"\necho a\n```\n```bash\nno\n```') == [
        "echo a"
    ]
    indented = '1. step\n\n    ```bash title="runnable"\n    echo b\n      more\n    ```\n'
    assert runnable_blocks(indented) == ["echo b\n  more"]


@pytest.fixture(scope="module")
def docs_node(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One virtual node between the fleet's upper and lower cluster for every page."""
    node = VirtualNodeProcess(
        fleet, name=f"vn-docs-{secrets.token_hex(3)}", log_dir=tmp_path_factory.mktemp("docs")
    )
    node.start()
    try:
        yield node.name
    finally:
        code = node.stop()
        node.delete_node()
        assert code == 0, f"virtual-node exited {code}; log {node.log}"


def _namespaces(fleet: Fleet) -> dict[str, set[str]]:
    return {
        name: {
            n["metadata"]["name"] for n in c.rest().request("GET", "/api/v1/namespaces")["items"]
        }
        for name, c in (("upper", fleet.upper), ("lower", fleet.lower))
    }


@pytest.fixture(scope="module")
def helm() -> Path:
    """The helm of the chart's tests, for the install guide's `helm install`."""
    return binaries.ensure(preexec_fn=netns.in_host_network())["helm"]


PAGES_NAMESPACE = "tensile-system"
"""The namespace the pages install tensile into (`kubectl create namespace`)."""


@pytest.mark.parametrize("page", PAGES)
def test_the_runnable_commands_of_a_page_work(
    page: str, fleet: Fleet, docs_node: str, helm: Path, tmp_path: Path
) -> None:
    (tmp_path / "manifests").symlink_to(ROOT / "manifests")
    (tmp_path / "charts").symlink_to(ROOT / "charts")
    env = {
        **os.environ,
        **env_values(fleet),
        "VIRTUAL_NODE": docs_node,
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), str(helm.parent),
                                 os.environ.get("PATH", ""))),
    }  # fmt: skip
    # The pages start where a reader starts, without tensile's namespace: earlier tests on
    # the session fleet may have left one (they make it when absent and keep it).
    _delete_namespaces(
        [(c, PAGES_NAMESPACE) for c in (fleet.upper, fleet.lower)],
        what=f"{PAGES_NAMESPACE} gone before {page}",
    )
    before = _namespaces(fleet)
    try:
        for number, block in enumerate(runnable_blocks((DOCS / page).read_text()), start=1):
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert result.returncode == 0, (
                f"{page}, runnable block {number} exited {result.returncode}:\n{block}\n"
                f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
            )
    finally:
        # What a page made is removed, so the session fleet is as the next test expects;
        # and gone, not Terminating: the next page may make a namespace of the same name
        # (tensile-system), which the apiserver refuses while the old one terminates.
        after = _namespaces(fleet)
        made = [(fleet.upper, n) for n in after["upper"] - before["upper"]]
        made += [(fleet.lower, n) for n in after["lower"] - before["lower"]]
        _delete_namespaces(made, what=f"the namespaces {page} made gone")


def _delete_namespaces(namespaces: list[tuple[Cluster, str]], *, what: str) -> None:
    """Delete each (cluster, namespace) and wait until all are gone, not Terminating (the
    apiserver refuses to make a namespace of that name again until then)."""
    for cluster, name in namespaces:
        delete_if_present(cluster.rest(), f"/api/v1/namespaces/{name}")
    wait_for(
        what,
        lambda: all(get(c.rest(), f"/api/v1/namespaces/{n}") is None for c, n in namespaces),
        timeout=60,
    )
