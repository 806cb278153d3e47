"""Flags of the `virtual-node` command that unit tests can check without a cluster:
lower kubelet access, durations and the streaming idle timeout."""

from __future__ import annotations

from pathlib import Path

import pytest

from vnode import __main__ as main
from vnode import cli
from vnode.settings import ApiSettings, LowerKubeletSettings

BASE = ["--client-kubeconfig=lower.kubeconfig"]
REQUIRED = BASE


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], LowerKubeletSettings(access="proxy", insecure_tls=False)),
        (["--lower-kubelet-access=direct"], LowerKubeletSettings(access="direct")),
        (
            ["--lower-kubelet-access=direct", "--lower-kubelet-insecure-tls"],
            LowerKubeletSettings(access="direct", insecure_tls=True),
        ),
        (
            ["--lower-kubelet-access=direct", "--lower-kubelet-token-file=/run/kubelet-token"],
            LowerKubeletSettings(access="direct", token_file="/run/kubelet-token"),
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
        (["--lower-kubelet-token-file=/t"], "token-file needs --lower-kubelet-access=direct"),
    ],
)
def test_bad_lower_kubelet_flags(flags: list[str], message: str) -> None:
    with pytest.raises(cli.UsageError, match=message):
        cli.parse([*BASE, *flags], env={})


@pytest.mark.parametrize("content", [None, "", "two words\n"])
def test_a_kubelet_token_file_that_holds_no_token_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    kubeconfig = tmp_path / "lower.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: main}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    token = tmp_path / "kubelet-token"
    if content is not None:
        token.write_text(content)
    code = main.main(
        [
            f"--client-kubeconfig={kubeconfig}",
            f"--kubeconfig={kubeconfig}",
            "--lower-kubelet-access=direct",
            f"--lower-kubelet-token-file={token}",
            f"--cert-dir={tmp_path / 'pki'}",
        ]
    )
    assert code == 2
    assert "--lower-kubelet-token-file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("4h", 14400.0),
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("1h2m3.5s", 3723.5),
        ("500ms", 0.5),
        ("250us", 0.00025),
        ("1.5h", 5400.0),
        ("90", 90.0),  # plain seconds
        ("0.25", 0.25),
        ("0", 0.0),
    ],
)
def test_durations_are_seconds_or_go_durations(text: str, seconds: float) -> None:
    assert cli.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "abc", "4x", "1d", "h", "1 h", "4h-", "-1", "-1s", "nan", "inf", "\u0663", "\u0663s"],
)
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        cli.parse_duration(text)


def test_the_idle_timeout_defaults_to_the_kubelets_4h() -> None:
    assert cli.parse(REQUIRED, env={}).api.streaming_idle_timeout == 4 * 3600
    assert ApiSettings().streaming_idle_timeout == 4 * 3600


@pytest.mark.parametrize(("value", "seconds"), [("2s", 2.0), ("30m", 1800.0), ("0", 0.0)])
def test_the_idle_timeout_flag(value: str, seconds: float) -> None:
    settings = cli.parse([*REQUIRED, f"--streaming-connection-idle-timeout={value}"], env={})
    assert settings.api.streaming_idle_timeout == seconds


def test_a_bad_idle_timeout_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(cli.UsageError) as info:
        cli.parse([*REQUIRED, "--streaming-connection-idle-timeout=soon"], env={})
    assert str(info.value) == (
        "argument --streaming-connection-idle-timeout: not a duration: 'soon' (e.g. 30s, 1m30s, 4h)"
    )
    assert main.main([*REQUIRED, "--streaming-connection-idle-timeout=-5s"]) == 2
    assert "--streaming-connection-idle-timeout" in capsys.readouterr().err
