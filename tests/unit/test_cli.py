"""Flags of the `virtual-node` command that unit tests can check without a cluster."""

from __future__ import annotations

import pytest

from vnode import cli
from vnode.settings import LowerKubeletSettings

BASE = ["--client-kubeconfig=lower.kubeconfig"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], LowerKubeletSettings(access="proxy", insecure_tls=False)),
        (["--lower-kubelet-access=direct"], LowerKubeletSettings(access="direct")),
        (
            ["--lower-kubelet-access=direct", "--lower-kubelet-insecure-tls"],
            LowerKubeletSettings(access="direct", insecure_tls=True),
        ),
    ],
)
def test_lower_kubelet_access(flags: list[str], expected: LowerKubeletSettings) -> None:
    assert cli.parse([*BASE, *flags], env={}).lower_kubelets == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lower-kubelet-access=ssh"], "invalid choice: 'ssh'"),
        (["--lower-kubelet-insecure-tls"], "needs --lower-kubelet-access=direct"),
    ],
)
def test_bad_lower_kubelet_flags(flags: list[str], message: str) -> None:
    with pytest.raises(cli.UsageError, match=message):
        cli.parse([*BASE, *flags], env={})
