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
# 2-core machine (a loaded one, scaled to the suite's usual 17 minutes: the order is what
# counts); refresh from the "e2e time per file" summary when it drifts.
SECONDS_PER_FILE: dict[str, float] = {
    "test_hostile.py": 132,
    "test_descheduler.py": 130,
    "test_webhook.py": 127,
    "test_kubelet_websocket.py": 107,
    "test_partitions.py": 104,
    "test_virtual_node.py": 103,
    "test_virtual_node_lifecycle.py": 102,
    "test_services.py": 98,
    "test_tenancy.py": 84,
    "test_exec.py": 77,
    "test_kubelet_api.py": 75,
    "test_serving_certificate.py": 73,
    "test_scheduler.py": 71,
    "test_chart.py": 71,
    "test_docs_commands.py": 61,
    "test_tenant_boundary.py": 61,
    "test_upper_serviceaccount_tokens.py": 61,
    "test_volumes.py": 52,
    "test_devcluster_command.py": 43,
    "test_fleet.py": 38,
    "test_kubelet_metrics.py": 38,
    "test_node_pools.py": 36,
    "test_faults.py": 36,
    "test_replicas.py": 33,
    "test_kubelet_api_fuzz.py": 30,
    "test_terminal.py": 29,
    "test_tensile_kube_adoption.py": 24,
    "test_tensile_kube_flags.py": 22,
    "test_patrol.py": 12,
    "test_missing_dependencies.py": 9,
    "test_mirror.py": 9,
    "test_startup_faults.py": 9,
    "test_leader_election.py": 8,
    "test_virtual_kubelet_suite.py": 8,
    "test_rbac.py": 7,
    "test_mock_provider.py": 6,
    "test_control_plane.py": 6,
    "test_kubectl_plugin.py": 5,
    "test_dependency_copies.py": 3,
    "test_port_forward.py": 2,
    "test_tracing.py": 2,
    "test_webhook_tls.py": 0,
    "test_slices.py": 0,
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
