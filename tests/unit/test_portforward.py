"""port-forward pieces that decide: pairing streams, ports."""

from __future__ import annotations

import pytest

from vnode.api import portforward as pf


def test_streams_pair_by_request_id_or_by_adjacent_stream_ids() -> None:
    assert pf.pair_key(request_id="7", stream_id=3, kind="error") == "7"
    assert pf.pair_key(request_id="7", stream_id=5, kind="data") == "7"
    # Old clients: the error stream comes first, its data stream two ids later.
    assert pf.pair_key(request_id="", stream_id=1, kind="error") == "1"
    assert pf.pair_key(request_id="", stream_id=3, kind="data") == "1"


def test_ports_in_stream_headers() -> None:
    assert pf.parse_port("8080") == 8080
    for bad in ("", "0", "65536", "80a", "-1"):
        with pytest.raises(ValueError, match="invalid port"):
            pf.parse_port(bad)
