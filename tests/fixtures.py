"""pytest fixtures for the local fleet of clusters (`devcluster`).

`tests/conftest.py` loads them for the whole suite (`pytest_plugins`); they live with the
tests so that no module of the shipped packages imports pytest.

- The session enters a private network namespace before the first test, where that is
  possible (root on Linux), so the fleet's nodes publish routable 192.0.2.x addresses;
  see `devcluster.netns`. With `TENSILE_DEVCLUSTER_DIR` set, it joins the network of
  the fleet that `tensile-devcluster up --dir` left running there instead.
- `fleet` (session): a started `Fleet` of two upper and two lower clusters (`upper`,
  `upper-2`, `lower` with 3 nodes, `lower-2` with 2), stopped at the end of the session;
  or the running one of `TENSILE_DEVCLUSTER_DIR` (left running).
- `start_fleet` (function): starts a fleet of the `FleetSettings` given, for tests that need
  clusters of their own (stopped after the test).
- `private_network` (function): the current network, failing the test where a private one
  should exist but does not, and skipping it where none can exist (not root).
- `namespace` (function): a fresh namespace of the same name in `fleet.upper` and
  `fleet.lower`, with its `default` ServiceAccount present in both, deleted afterwards.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from devcluster import netns
from devcluster.cluster import Cluster, FleetSettings, LowerClusterSettings
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError, RestClient

_LONG_LIVED = pytest.StashKey[set[int]]()
SESSION_FLEET = FleetSettings(
    uppers=2,
    lowers=(
        LowerClusterSettings(nodes=3),
        LowerClusterSettings(
            nodes=2, admission_plugins=("PodTolerationRestriction", "PodNodeSelector")
        ),
    ),
)
"""The session's fleet: enough for both multi-cluster topologies (one upper over two
lowers, two uppers over one lower) while pair tests use `upper` and `lower`. lower-2 runs
the admission plugins a lower administrator confines tenants with (they act only on
namespaces annotated for them: tests/e2e/test_tenant_boundary.py)."""


def pytest_configure(config: pytest.Config) -> None:
    """Enter the fleet's network before any test (and so any thread) runs."""
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        Fleet.attach(Path(existing)).join_network()
    elif netns.unavailable_reason() is None:
        netns.enter_private()


def long_lived_pids(config: pytest.Config) -> set[int]:
    """Process ids started by session fixtures; a per-test leak check must not count them."""
    return config.stash.setdefault(_LONG_LIVED, set())


@pytest.fixture(scope="session")
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Yield the running fleet (see the module docstring)."""
    existing = os.environ.get("TENSILE_DEVCLUSTER_DIR")
    if existing:
        yield Fleet.attach(Path(existing))
        return
    directory = Path(tempfile.mkdtemp(prefix="tensile-fleet-"))
    started = Fleet.start(directory=directory, settings=SESSION_FLEET, owns_directory=True)
    long_lived_pids(request.config).update(started.pids())
    try:
        yield started
    finally:
        started.stop()
        long_lived_pids(request.config).difference_update(started.pids())


@pytest.fixture
def start_fleet() -> Iterator[Callable[[FleetSettings], Fleet]]:
    """Yield a function that starts a fleet of its own for this test (stopped afterwards)."""
    started: list[Fleet] = []

    def start(settings: FleetSettings) -> Fleet:
        directory = Path(tempfile.mkdtemp(prefix="tensile-fleet-"))
        one = Fleet.start(directory=directory, settings=settings, owns_directory=True)
        started.append(one)
        return one

    try:
        yield start
    finally:
        for one in started:
            one.stop()


@pytest.fixture
def private_network() -> netns.Network:
    """Return the private network the fleet runs in; fail where it should exist but does
    not (root on Linux), and in CI (`CI` set), where the real fleet must run; skip only on
    a developer's machine where it cannot (saying why)."""
    network = netns.current()
    if network.private:
        return network
    reason = netns.unavailable_reason()
    if reason is None:
        pytest.fail("the session should run in a private network namespace, but does not")
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the tests of the private network namespace, but: {reason}")
    pytest.skip(f"needs a private network namespace: {reason}")


@pytest.fixture
def namespace(fleet: Fleet, request: pytest.FixtureRequest) -> Iterator[str]:
    """Yield the name of a new namespace that exists in both `fleet.upper` and `fleet.lower`."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    clusters = (fleet.upper, fleet.lower)
    name = create_namespace(clusters, prefix=base or "t")
    try:
        yield name
    finally:
        delete_namespace(clusters, name)


def create_namespace(clusters: Iterable[Cluster], *, prefix: str) -> str:
    """Create `<prefix>-<random>` in every cluster, wait for its `default` ServiceAccount in
    each, and return the name. Raises ApiStatusError."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    clients = [c.rest() for c in clusters]
    for client in clients:
        client.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    for client in clients:
        _wait_default_service_account(client, name)
    return name


def delete_namespace(clusters: Iterable[Cluster], name: str) -> None:
    """Delete namespace `name` from every cluster (absent is fine)."""
    for c in clusters:
        try:
            c.rest().request("DELETE", f"/api/v1/namespaces/{name}")
        except ApiStatusError as exc:
            if exc.code != 404:
                raise


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
