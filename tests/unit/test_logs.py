"""Logging set-up of tensile's programs (`tensile.serving.logs`)."""

from __future__ import annotations

import logging
import sys

from aiohttp import http_exceptions

from tensile.serving import logs


def _record(exc: BaseException | None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
        ("127.0.0.1",), exc_info,
    )  # fmt: skip


def test_a_malformed_request_is_one_info_line_without_a_traceback() -> None:
    bad = http_exceptions.InvalidURLError(message="Unexpected start char in url:\n  b'GET ?x'")
    record = _record(bad)
    assert logs.quiet_bad_requests(record)
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
    assert record.getMessage() == ("malformed request answered 400: Unexpected start char in url:")
    assert record.exc_info is None


def test_other_errors_keep_their_level_and_traceback() -> None:
    try:
        raise RuntimeError("a real bug")
    except RuntimeError:
        record = _record(sys.exc_info()[1])
    assert logs.quiet_bad_requests(record)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
