"""Pure parts of the kubelet API: log options and the authorization attributes of a request."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from devcluster.pki import CertificateAuthority
from vnode.api import auth, logs


def test_log_options_map_to_the_log_subresource() -> None:
    options = logs.parse(
        {"follow": "true", "tailLines": "0", "timestamps": "1", "limitBytes": "100"}
    )
    assert options.tail_lines == 0  # no lines at all, not "everything"
    assert options.query() == {"follow": "true", "timestamps": "true", "tailLines": "0",
                               "limitBytes": "100"}  # fmt: skip
    assert logs.parse({}).query() == {}
    assert logs.parse({"tail": "all"}).tail_lines is None
    assert logs.parse({"tail": "5"}).tail_lines == 5
    assert logs.parse({"stream": "Stdout"}).query() == {"stream": "Stdout"}
    assert logs.parse({"stream": "All"}).query() == {}


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ({"tailLines": "-1"}, 400, "tailLines: must be >= 0"),
        ({"tailLines": "x"}, 400, "not an integer"),
        ({"sinceSeconds": "0"}, 400, "sinceSeconds: must be >= 1"),
        ({"limitBytes": "0"}, 400, "limitBytes: must be >= 1"),
        ({"sinceTime": "yesterday"}, 400, "not an RFC 3339 time"),
        ({"sinceSeconds": "1", "sinceTime": "2026-01-01T00:00:00Z"}, 422, "at most one"),
        ({"follow": "maybe"}, 400, "not a boolean"),
        ({"stream": "Both"}, 400, "stream: must be one of"),
        ({"tail": "-3"}, 400, "tail: must be >= 0"),
    ],
)
def test_invalid_log_options(query: dict[str, str], status: int, message: str) -> None:
    with pytest.raises(logs.LogOptionsError, match=message) as info:
        logs.parse(query)
    assert info.value.status == status


@pytest.mark.parametrize(
    ("path", "subresource"),
    [
        ("/containerLogs/ns/p/c", "proxy"),
        ("/exec/ns/p/c", "proxy"),
        ("/portForward/ns/p", "proxy"),
        ("/pods", "pods proxy"),
        ("/runningpods/", "pods proxy"),
        ("/healthz", "healthz proxy"),
        ("/configz", "configz proxy"),
        ("/podsx", "proxy"),
        ("/run/ns/p/c", "proxy"),
        ("/run/ns/p/uid/c", "proxy"),
        ("/stats/summary", "stats"),
        ("/metrics/resource", "metrics"),
        ("/metrics", "metrics"),
        ("/logs/syslog", "log"),
        ("/statsfoo", "proxy"),
    ],
)
def test_paths_map_to_node_subresources_as_a_kubelets_do(path: str, subresource: str) -> None:
    assert auth.subresources(path) == tuple(subresource.split())


def test_methods_map_to_verbs() -> None:
    assert [auth.verb(m) for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")] == [
        "get", "get", "create", "update", "patch", "delete"
    ]  # fmt: skip


def test_a_client_certificate_names_user_and_groups(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(directory=tmp_path, name="ca")
    pair = ca.issue(directory=tmp_path, name="c", common_name="kube-apiserver-kubelet-client",
                    organizations=("system:masters",), client=True)  # fmt: skip
    der = x509.load_pem_x509_certificate(pair.cert.read_bytes()).public_bytes(Encoding.DER)
    user = auth.user_from_certificate(der)
    assert user == auth.User(name="kube-apiserver-kubelet-client", groups=("system:masters",))
