"""The harness's child programs (`devcluster.programs`): started, waited for, checked,
killed, restarted and stopped, on a real child process serving HTTP on 127.0.0.1 (a small
stand-in for tensile's commands, which the e2e suite runs the same way)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devcluster import ports, processes, programs

# Answers /readyz 503 until it has been asked three times, then 200; /metrics in the
# Prometheus text format.
SERVER = """
import http.server, sys
asked = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global asked
        if self.path == "/readyz":
            asked += 1
            status, body = (200, b"ok") if asked >= 3 else (503, b"not yet")
        elif self.path == "/metrics":
            status = 200
            body = b'# HELP moves_total x\\nmoves_total{kind="evict",outcome="moved"} 2\\n'
            body += b'moves_total{kind="recreate",outcome="moved"} 1\\nother 7\\n'
        else:
            status, body = 404, b"no"
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _program(tmp_path: Path, *, argv: list[str] | None = None) -> programs.Program:
    port = ports.pick()
    return programs.Program(
        process_name="stand-in",
        argv=argv or [sys.executable, "-c", SERVER, str(port)],
        log=tmp_path / "stand-in.log",
        endpoint=f"http://127.0.0.1:{port}",
    )


def test_start_waits_until_ready_and_metrics_are_read(tmp_path: Path) -> None:
    program = _program(tmp_path).start(timeout=30)
    try:
        assert program.get("/readyz") == (200, "ok")
        assert program.metric("moves_total") == 3
        assert program.metric("moves_total", outcome="moved", kind="evict") == 2
        assert program.metric("absent") == 0
        assert program.get("/nothing") == (404, "no")
    finally:
        program.stop()


def test_a_killed_program_is_reported_dead_and_restarts(tmp_path: Path) -> None:
    program = _program(tmp_path).start(timeout=30)
    try:
        program.kill()
        assert program.get("/readyz") == (0, "")  # nothing answers
        with pytest.raises(processes.ComponentDied, match="stand-in exited with code"):
            program.check()
        program.restart(timeout=30)
        assert program.get("/readyz")[0] == 200
        assert program.log.read_text().count("serving") == 2  # the log was appended to
    finally:
        assert program.stop() is not None
    assert program.process is not None
    assert not program.process.alive()


def test_a_program_that_dies_at_start_says_why(tmp_path: Path) -> None:
    program = _program(tmp_path, argv=[sys.executable, "-c", "print('bad flag'); exit(2)"])
    with pytest.raises(processes.ComponentDied, match=r"(?s)code 2.*bad flag"):
        program.start(timeout=30)


def test_a_program_never_ready_times_out_naming_its_log(tmp_path: Path) -> None:
    program = _program(tmp_path, argv=[sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(TimeoutError, match=r"stand-in not ready after 1s; log .*stand-in"):
            program.start(timeout=1)
    finally:
        program.stop()


def test_only_http_endpoints_are_taken(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="http"):
        programs.Program(process_name="x", argv=["true"], log=tmp_path / "x", endpoint="file:/")


def test_stopping_what_never_started_is_nothing(tmp_path: Path) -> None:
    program = _program(tmp_path)
    assert program.stop() is None
    program.check()
    program.kill()
    with pytest.raises(RuntimeError, match="never started"):
        program.restart()
