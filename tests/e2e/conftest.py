"""e2e tests run against the real local control-plane pair."""

import pytest

E2E_TIMEOUT = 180  # seconds; each test also bounds its own waits below this


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))
