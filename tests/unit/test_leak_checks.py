"""The suite-wide checks fail a test that leaves a task or a child process running."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_ROOT = Path(__file__).parents[2]
_CONFTEST = (_ROOT / "tests" / "conftest.py").read_text()


@pytest.fixture(autouse=True)
def _suite_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The copied conftest loads `tests.fixtures`: the inner run imports it from this checkout.
    monkeypatch.setenv("PYTHONPATH", str(_ROOT))


def _run(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makeconftest(_CONFTEST)
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_inner=body)
    return pytester.runpytest_subprocess("-q")


def test_a_leaked_task_fails_the_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, (
        "import asyncio\n"
        "async def test_leaks():\n"
        "    asyncio.get_running_loop().create_task(asyncio.sleep(60), name='forgotten')\n"
    ))  # fmt: skip
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test left asyncio tasks running: *forgotten*"])


def test_a_leaked_child_process_fails_the_test_and_is_stopped(pytester: pytest.Pytester) -> None:
    pid_file = pytester.path / "pid"
    result = _run(pytester, (
        "import subprocess\n"
        "def test_leaks():\n"
        "    p = subprocess.Popen(['sleep', '60'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
    ))  # fmt: skip
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test left child processes behind*"])
    assert not Path(f"/proc/{pid_file.read_text()}").exists()


def test_a_clean_test_passes(pytester: pytest.Pytester) -> None:
    result = _run(pytester, (
        "import asyncio, subprocess\n"
        "async def test_clean():\n"
        "    await asyncio.sleep(0)\n"
        "    subprocess.run(['true'], check=True)\n"
    ))  # fmt: skip
    result.assert_outcomes(passed=1)
