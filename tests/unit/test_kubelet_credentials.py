"""What the node sends the lower kubelets, and what the RBAC manifests grant for it: the
kubelet token file, the start-up warnings about the main credential, and the manifests'
rules (nodes/proxy only in its own file)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from vnode.providers.k2k.scrape import BearerTokenFile, access_warnings, bearer

MANIFESTS = Path(__file__).parents[2] / "manifests" / "vnode"


@pytest.mark.parametrize(
    ("text", "header"),
    [("abc.def-ghi_123", "Bearer abc.def-ghi_123"), ("  tok\n", "Bearer tok")],
)
def test_a_token_files_text_becomes_a_bearer_header(text: str, header: str) -> None:
    assert bearer(text, source="f") == header


@pytest.mark.parametrize("text", ["", " \n", "two words", "a\nb", "tab\there", "bell\x07"])
def test_what_is_not_one_token_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="f does not hold a bearer token"):
        bearer(text, source="f")


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = BearerTokenFile(str(path))
    assert token.authorization() == "Bearer first"
    # Projected ServiceAccount tokens are swapped in by a rename: a new inode.
    replacement = tmp_path / "token.new"
    replacement.write_text("second-token\n")
    os.replace(replacement, path)
    assert token.authorization() == "Bearer second-token"
    path.write_text("third-token-x\n")  # rewritten in place: another size
    assert token.authorization() == "Bearer third-token-x"
    path.unlink()
    with pytest.raises(FileNotFoundError):
        token.authorization()


def test_the_proxy_sends_nothing_to_the_nodes_so_no_warning() -> None:
    assert access_warnings(direct=False, insecure_tls=False, token_file=False) == []


def test_direct_mode_with_the_main_credential_warns_and_louder_without_tls() -> None:
    [(level, message)] = access_warnings(direct=True, insecure_tls=False, token_file=False)
    assert level == logging.WARNING
    assert "main credential" in message
    assert "--lower-kubelet-token-file" in message
    [(level, message)] = access_warnings(direct=True, insecure_tls=True, token_file=False)
    assert level == logging.ERROR
    assert message.startswith("INSECURE:")
    assert "capture the credential" in message


def test_direct_mode_with_its_own_token_warns_only_without_tls() -> None:
    assert access_warnings(direct=True, insecure_tls=False, token_file=True) == []
    [(level, message)] = access_warnings(direct=True, insecure_tls=True, token_file=True)
    assert level == logging.WARNING
    assert "unverified" in message


def _rules(manifest: str) -> list[dict[str, Any]]:
    documents = list(yaml.safe_load_all((MANIFESTS / manifest).read_text()))
    return [r for d in documents if d and d["kind"] == "ClusterRole" for r in d["rules"]]


def _subjects(manifest: str) -> list[dict[str, Any]]:
    documents = list(yaml.safe_load_all((MANIFESTS / manifest).read_text()))
    return [s for d in documents if d and d["kind"] == "ClusterRoleBinding" for s in d["subjects"]]


def _grants(manifest: str) -> set[tuple[str, str]]:
    return {(res, verb) for r in _rules(manifest) for res in r["resources"] for verb in r["verbs"]}


def test_the_base_lower_manifest_grants_nothing_on_the_kubelets() -> None:
    kubelet = {"nodes/proxy", "nodes/metrics", "nodes/stats", "nodes/log", "nodes/spec"}
    assert not {res for res, _ in _grants("lower-rbac.yaml")} & kubelet


def test_nodes_proxy_is_granted_only_by_its_own_manifest_which_says_why() -> None:
    assert _grants("lower-rbac-metrics-proxy.yaml") == {("nodes/proxy", "get")}
    assert _subjects("lower-rbac-metrics-proxy.yaml") == [
        {"kind": "ServiceAccount", "name": "tensile-virtual-node", "namespace": "tensile-system"}
    ]
    text = (MANIFESTS / "lower-rbac-metrics-proxy.yaml").read_text()
    for implication in ("exec", "attach", "GET", "lower-rbac-kubelet-metrics.yaml"):
        assert implication in text
    others = [p.name for p in MANIFESTS.glob("*.yaml") if p.name != "lower-rbac-metrics-proxy.yaml"]
    for other in others:
        assert "nodes/proxy" not in {res for res, _ in _grants(other)}, other


def test_the_kubelet_metrics_manifest_is_read_only_metrics_and_stats() -> None:
    assert _grants("lower-rbac-kubelet-metrics.yaml") == {
        ("nodes/metrics", "get"),
        ("nodes/stats", "get"),
    }
    assert _subjects("lower-rbac-kubelet-metrics.yaml") == [
        {"kind": "ServiceAccount", "name": "tensile-kubelet-metrics", "namespace": "tensile-system"}
    ]
