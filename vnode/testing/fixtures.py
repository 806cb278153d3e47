"""pytest fixtures for the local cluster pair.

Load them with `pytest_plugins = ["vnode.testing.fixtures"]`.


- `cluster_pair` (session): a started `ClusterPair`, stopped at the end of the session. With
  `TENSILE_DEVCLUSTER_DIR` set, the pair that `tensile-devcluster up --dir` left running there
  is used instead (and left running), for fast local iteration.
- `namespace` (function): a fresh namespace of the same name in both clusters, with its
  `default` ServiceAccount present in both, deleted afterwards.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vnode.testing.cluster import PairSettings
from vnode.testing.pair import ClusterPair
from vnode.testing.rest import ApiStatusError, RestClient

_LONG_LIVED = pytest.StashKey[set[int]]()


def long_lived_pids(config: pytest.Config) -> set[int]:
    """Process ids started by session fixtures; a per-test leak check must not count them."""
    return config.stash.setdefault(_LONG_LIVED, set())


@pytest.fixture(scope="session")
def cluster_pair(request: pytest.FixtureRequest) -> Iterator[ClusterPair]:
    """Yield the running upper + lower pair (see the module docstring)."""
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        yield ClusterPair.attach(Path(existing))
        return
    directory = Path(tempfile.mkdtemp(prefix="tensile-pair-"))
    pair = ClusterPair.start(directory=directory, settings=PairSettings(), owns_directory=True)
    long_lived_pids(request.config).update(pair.pids())
    try:
        yield pair
    finally:
        pair.stop()
        long_lived_pids(request.config).difference_update(pair.pids())


@pytest.fixture
def namespace(cluster_pair: ClusterPair, request: pytest.FixtureRequest) -> Iterator[str]:
    """Yield the name of a new namespace that exists in both clusters."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = create_namespace(cluster_pair, prefix=base or "t")
    try:
        yield name
    finally:
        for client in (cluster_pair.upper.rest(), cluster_pair.lower.rest()):
            try:
                client.request("DELETE", f"/api/v1/namespaces/{name}")
            except ApiStatusError as exc:
                if exc.code != 404:
                    raise


def create_namespace(pair: ClusterPair, *, prefix: str) -> str:
    """Create `<prefix>-<random>` in both clusters, wait for its `default` ServiceAccount in
    both, and return the name. Raises ApiStatusError."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    clients = [pair.upper.rest(), pair.lower.rest()]
    for client in clients:
        client.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    for client in clients:
        _wait_default_service_account(client, name)
    return name


def _wait_default_service_account(
    client: RestClient, namespace: str, timeout: float = 30.0
) -> None:
    # Pods are refused until the ServiceAccount controller has made `default`.
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except ApiStatusError as exc:
            if exc.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)
