"""Where the e2e suite's time goes, and the order its files are handed to the workers.

The suite runs whole files per xdist worker (hack/run-tests.sh), so its wall time is the
busier worker's. Files are handed out longest first (the classic longest-processing-time
rule), which keeps one long file from starting last on a worker that is otherwise done;
`SECONDS_PER_FILE` holds each file's time as last measured, and the terminal summary prints
the measured times of this run so the table can be refreshed when it drifts.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

import pytest

# Seconds of one worker per file (setup of its fleets included), as measured on a
# 2-core machine with three workers; refresh from the "e2e time per file" summary when it
# drifts (the order is what counts).
SECONDS_PER_FILE: dict[str, float] = {
    "test_descheduler.py": 260,
    "test_partitions.py": 243,
    "test_hostile.py": 198,
    "test_virtual_node_lifecycle.py": 121,
    "test_virtual_node.py": 101,
    "test_upper_serviceaccount_tokens.py": 97,
    "test_webhook.py": 96,
    "test_docs_commands.py": 93,
    "test_faults.py": 85,
    "test_services.py": 84,
    "test_kubelet_websocket.py": 78,
    "test_tenancy.py": 73,
    "test_scheduler.py": 63,
    "test_serving_certificate.py": 59,
    "test_exec.py": 57,
    "test_chart.py": 54,
    "test_fleet.py": 51,
    "test_kubelet_api.py": 49,
    "test_replicas.py": 44,
    "test_volumes.py": 43,
    "test_node_pools.py": 42,
    "test_tenant_boundary.py": 41,
    "test_kubelet_api_fuzz.py": 36,
    "test_devcluster_command.py": 35,
    "test_leader_election.py": 31,
    "test_patrol.py": 25,
    "test_terminal.py": 20,
    "test_kubelet_metrics.py": 20,
    "test_mirror.py": 18,
    "test_tensile_kube_adoption.py": 17,
    "test_virtual_kubelet_suite.py": 14,
    "test_startup_faults.py": 12,
    "test_kubectl_plugin.py": 12,
    "test_port_forward.py": 11,
    "test_dependency_copies.py": 10,
    "test_rbac.py": 9,
    "test_missing_dependencies.py": 8,
    "test_webhook_tls.py": 8,
    "test_tensile_kube_flags.py": 6,
    "test_mock_provider.py": 4,
    "test_control_plane.py": 3,
    "test_tracing.py": 2,
    "test_slices.py": 1,
}
# A file not in the table yet: placed after the long ones, before the short ones.
UNKNOWN_FILE_SECONDS = 30.0


def file_of(nodeid: str) -> str:
    """The file name (`test_x.py`) a test's node id belongs to."""
    return PurePosixPath(nodeid.split("::", 1)[0]).name


def longest_first(items: list[pytest.Item]) -> None:
    """Reorders `items` in place: whole files, the longest expected first; a file's own
    tests keep their order (module fixtures depend on it)."""
    position = {file_of(item.nodeid): index for index, item in reversed(list(enumerate(items)))}
    items.sort(
        key=lambda item: (
            -SECONDS_PER_FILE.get(file_of(item.nodeid), UNKNOWN_FILE_SECONDS),
            position[file_of(item.nodeid)],
        )
    )


class FileClock:
    """Sums the setup, call and teardown durations (seconds) of each file's tests as the
    reports reach the controller, and prints them at the end of the run."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "tests/e2e/" in report.nodeid:
            self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section("e2e time per file (seconds of one worker)")
        for name, seconds in sorted(self.seconds.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f'    "{name}": {seconds:.0f},')
        total = sum(self.seconds.values())
        terminalreporter.write_line(f"    total {total:.0f} s over all workers")
