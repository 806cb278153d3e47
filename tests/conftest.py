"""Suite-wide checks: no asyncio task and no child process may outlive the test that made it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from devcluster import processes

# The pure tests run beside the e2e tests on two cores (hack/run-tests.sh), so wall time
# per example says nothing about the code: Hypothesis's deadline and its input-generation
# speed check are timed assertions, and a busy machine failed them. Both are off.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# The fleet's fixtures; also the hook that enters its private network before any test runs.
pytest_plugins = ["tests.fixtures"]


@pytest.fixture(autouse=True)
def _no_leaked_child_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    # Imported here, not above: pytest rewrites the asserts of a plugin only if it is the
    # first to import it (`pytest_plugins`).
    from tests.fixtures import long_lived_pids  # noqa: PLC0415

    before = processes.children_of(os.getpid())
    yield
    deadline = time.monotonic() + 3.0
    while True:
        allowed = before | long_lived_pids(request.config)
        leaked = processes.children_of(os.getpid()) - allowed
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if leaked:
        for pid in leaked:
            processes.stop_group(pid, timeout=2.0)
        pytest.fail(f"test left child processes behind: {sorted(leaked)}")


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    leaked = [
        t for t in asyncio.all_tasks() if t not in before and t is not current and not t.done()
    ]
    if leaked:
        for task in leaked:
            task.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"test left asyncio tasks running: {sorted(t.get_name() for t in leaked)}")
