"""exec/attach request parsing, protocol negotiation and status conversion (pure)."""

from __future__ import annotations

import json

import pytest

from vnode.api import remotecommand as rc


def test_streams_and_command_are_read_as_a_kubelet_reads_them() -> None:
    options = rc.parse({"input": "1", "output": "1", "error": "1"}, ["sh", "-c", "x"], exec_=True)
    assert options.command == ("sh", "-c", "x")
    assert (options.stdin, options.stdout, options.stderr, options.tty) == (True, True, True, False)
    # With a terminal, stderr is merged into stdout: the stream is dropped.
    tty = rc.parse({"output": "true", "error": "true", "tty": "true"}, ["sh"], exec_=True)
    assert (tty.stderr, tty.tty) == (False, True)


@pytest.mark.parametrize(
    ("query", "commands", "exec_", "message"),
    [
        ({"output": "1"}, [], True, "command is required"),
        ({}, ["ls"], True, "at least one of stdin, stdout, stderr"),
        ({"tty": "1"}, [], False, "at least one of stdin, stdout, stderr"),
    ],
)
def test_bad_requests(
    query: dict[str, str], commands: list[str], exec_: bool, message: str
) -> None:
    with pytest.raises(rc.RequestError, match=message) as info:
        rc.parse(query, commands, exec_=exec_)
    assert info.value.status == 400


def test_the_first_offered_protocol_we_serve_wins() -> None:
    assert rc.negotiate(["v5.channel.k8s.io", "v4.channel.k8s.io"]) == "v5.channel.k8s.io"
    assert rc.negotiate(["v9.channel.k8s.io, v4.channel.k8s.io"]) == "v4.channel.k8s.io"
    assert rc.negotiate(["channel.k8s.io"]) == "channel.k8s.io"


def test_no_common_protocol_is_403_with_what_we_accept() -> None:
    with pytest.raises(rc.RequestError) as info:
        rc.negotiate(["v9.channel.k8s.io"])
    assert info.value.status == 403
    assert "v4.channel.k8s.io" in info.value.headers["X-Accepted-Stream-Protocol-Versions"]
    with pytest.raises(rc.RequestError, match="missing X-Stream-Protocol-Version"):
        rc.negotiate([])


def test_the_status_fits_the_protocol() -> None:
    failure = json.dumps(
        {
            "status": "Failure",
            "message": "command terminated with non-zero exit code",
            "reason": "NonZeroExitCode",
        }
    ).encode()
    success = json.dumps({"metadata": {}, "status": "Success"}).encode()
    assert rc.status_for("v4.channel.k8s.io", failure) == failure
    assert rc.status_for("v5.channel.k8s.io", success) == success
    assert (
        rc.status_for("v3.channel.k8s.io", failure) == b"command terminated with non-zero exit code"
    )
    assert rc.status_for("v2.channel.k8s.io", success) == b""


def test_websocket_protocols_get_their_status_form() -> None:
    failure = rc.failure_status("it broke")
    assert json.loads(failure) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "it broke",
        "reason": "InternalError",
        "code": 500,
    }
    assert rc.status_for("v4.base64.channel.k8s.io", failure) == failure
    assert rc.status_for("base64.channel.k8s.io", failure) == b"it broke"
    assert rc.status_for("", failure) == b"it broke"


def test_resize_data_splits_into_sizes_and_what_is_still_coming() -> None:
    assert rc.take_sizes('{"Width":80,"Height":24}{"Width":100,') == (
        [{"Width": 80, "Height": 24}],
        '{"Width":100,',
    )
    assert rc.take_sizes(' {"Width":1,"Height":2}\n {"Width":3,"Height":4} ') == (
        [{"Width": 1, "Height": 2}, {"Width": 3, "Height": 4}],
        "",
    )
    assert rc.take_sizes("garbage") == ([], "garbage")  # the cap on what waits handles it
    with pytest.raises(ValueError, match="terminal size"):
        rc.take_sizes('[1, 2] {"Width":1,"Height":2}')


@pytest.mark.parametrize(
    "text",
    ['{"Width":-1,"Height":2}', '{"Width":65536,"Height":2}', '{"Width":true,"Height":2}',
     '{"Width":"80","Height":24}', '{"Width":1.5,"Height":2}', "{}" + "x"],
)  # fmt: skip
def test_only_sizes_a_kubelet_accepts_pass(text: str) -> None:
    if text == "{}x":
        # Missing keys are zero, as Go decodes them; what follows waits for more.
        assert rc.take_sizes(text) == ([{"Width": 0, "Height": 0}], "x")
        return
    with pytest.raises(ValueError, match="terminal size"):
        rc.take_sizes(text)


def test_sizes_are_passed_on_with_just_their_two_numbers() -> None:
    sizes, rest = rc.take_sizes('{"Width":80,"Height":24,"Extra":{"big":[1,2,3]}}')
    assert (sizes, rest) == ([{"Width": 80, "Height": 24}], "")


class _Chunks:
    """A resize stream that hands out prepared chunks, then its end."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)
        self.discarded = False

    async def read(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""

    def discard(self) -> None:
        self.discarded = True


async def test_a_flood_of_sizes_in_one_piece_is_refused_unparsed() -> None:
    # Megabytes of valid sizes would keep the event loop parsing: more than 4 KiB at once
    # ends the resize stream instead.
    flood = b'{"Width":80,"Height":24}' * 200
    sizes = rc._TerminalSizes(_Chunks(b'{"Width":1,"Height":2}', flood))  # type: ignore[arg-type]
    assert await sizes.next() == [{"Width": 1, "Height": 2}]
    with pytest.raises(ValueError, match="4096 bytes"):
        await sizes.next()
    ending = rc._TerminalSizes(_Chunks(b'{"Width":3,', b'"Height":4}'))  # type: ignore[arg-type]
    assert await ending.next() == [{"Width": 3, "Height": 4}]
    assert await ending.next() is None


def test_the_streams_of_a_session_follow_the_options() -> None:
    options = rc.parse({"input": "1", "output": "1", "tty": "1"}, ["sh"], exec_=True)
    assert rc.stream_kinds(options) == {"stdin", "stdout", "error", "resize"}
    # SPDY v1 and v2 have no resize stream: a terminal session waits for none.
    assert rc.stream_kinds(options, resize=False) == {"stdin", "stdout", "error"}
    assert {"v2.channel.k8s.io", "channel.k8s.io"} == rc.SPDY_WITHOUT_RESIZE
    assert rc.stream_kinds(rc.parse({"error": "1"}, ["ls"], exec_=True)) == {"stderr", "error"}


def test_deeply_nested_resize_data_is_refused_not_a_crash() -> None:
    with pytest.raises(ValueError, match="deep nesting"):
        rc.take_sizes("[" * 100_000)
