"""Flags of the `virtual-node` command that unit tests can check without a cluster:
lower kubelet access, durations and the streaming idle timeout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensile.serving import flags as serving_flags
from vnode import __main__ as main
from vnode import cli
from vnode.settings import ApiSettings, IngressSettings, LowerKubeletSettings

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
    with pytest.raises(serving_flags.UsageError, match=message):
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
    assert serving_flags.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "abc", "4x", "1d", "h", "1 h", "4h-", "-1", "-1s", "nan", "inf", "\u0663", "\u0663s"],
)
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        serving_flags.parse_duration(text)


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
    with pytest.raises(serving_flags.UsageError) as info:
        cli.parse([*REQUIRED, "--streaming-connection-idle-timeout=soon"], env={})
    assert str(info.value) == (
        "argument --streaming-connection-idle-timeout: not a duration: 'soon' (e.g. 30s, 1m30s, 4h)"
    )
    assert main.main([*REQUIRED, "--streaming-connection-idle-timeout=-5s"]) == 2
    assert "--streaming-connection-idle-timeout" in capsys.readouterr().err


# -- environment variables are flag defaults ---------------------------------------------


def test_a_flag_wins_over_the_environment_variable_that_feeds_it() -> None:
    env = {
        "DEFAULT_NODE_NAME": "from-env",
        "VKUBELET_TAINT_KEY": "env.example/taint",
        "APISERVER_CA_CERT_LOCATION": "/env/ca.crt",
    }
    from_env = cli.parse(BASE, env=env)
    assert from_env.node.name == "from-env"
    assert from_env.node.taint is not None
    assert from_env.node.taint.key == "env.example/taint"
    assert from_env.api.client_ca_file == "/env/ca.crt"
    flags = cli.parse(
        [*BASE, "--nodename=from-flag", "--taint=flag.example/taint", "--client-verify-ca=/f"],
        env=env,
    )
    assert flags.node.name == "from-flag"
    assert flags.node.taint is not None
    assert flags.node.taint.key == "flag.example/taint"
    assert flags.api.client_ca_file == "/f"
    defaults = cli.parse(BASE, env={})
    assert defaults.node.name == "virtual-kubelet"
    assert defaults.node.taint is not None
    assert defaults.node.taint.key == "virtual-kubelet.io/provider"


def test_help_names_the_variable_beside_each_flag_it_feeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.parse(["--help"], env={})
    text = " ".join(capsys.readouterr().out.split())
    for flag, variable in (
        ("--nodename", "DEFAULT_NODE_NAME"),
        ("--taint", "VKUBELET_TAINT_KEY"),
        ("--client-verify-ca", "APISERVER_CA_CERT_LOCATION"),
        ("--kubeconfig", "KUBECONFIG"),
    ):
        after = text[text.rindex(f"{flag} ") :]  # the options section, after the usage
        assert f"env {variable}" in after[:300], flag


# -- tenancy: cluster identity, namespace prefix, pod security ----------------------------


def test_tenancy_defaults() -> None:
    pods = cli.parse(BASE, env={}).pods
    assert pods.cluster_id == ""  # read from the upper kube-system namespace at start
    assert pods.pod_security_level == "baseline"
    assert pods.namespace_prefix == ""


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--cluster-id=has space", "--cluster-id must be a label value"),
        ("--cluster-id=-leading", "--cluster-id must be a label value"),
        ("--cluster-id=" + "x" * 64, "--cluster-id must be a label value"),
        ("--cluster-id=  ", "--cluster-id must not be blank"),
        ("--pod-security-level=lax", "invalid choice: 'lax'"),
        ("--namespace-prefix=T1-", "may hold only a-z, 0-9 and '-'"),
        ("--namespace-prefix=-t1", "must start with a letter or digit"),
        ("--namespace-prefix=t\u0131-", "may hold only a-z, 0-9 and '-'"),
        ("--namespace-prefix=" + "t" * 31, "at most 30 characters"),
    ],
)
def test_bad_tenancy_flags(flag: str, message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=message):
        cli.parse([*BASE, flag], env={})


def test_good_tenancy_flags() -> None:
    pods = cli.parse(
        [
            *BASE,
            "--cluster-id=eu-west.prod_1",
            "--pod-security-level=restricted",
            "--namespace-prefix=" + "t" * 30,
        ],
        env={},
    ).pods
    assert (pods.cluster_id, pods.pod_security_level) == ("eu-west.prod_1", "restricted")
    assert pods.namespace_prefix == "t" * 30


def test_event_budget_defaults_to_the_kubelets_and_takes_flags() -> None:
    assert cli.parse(BASE, env={}).events.qps == 50.0
    assert cli.parse(BASE, env={}).events.burst == 100
    settings = cli.parse([*BASE, "--event-qps=5", "--event-burst=7"], env={})
    assert (settings.events.qps, settings.events.burst) == (5.0, 7)
    # 0: no limit, as the kubelet's.
    assert cli.parse([*BASE, "--event-qps=0"], env={}).events.qps == 0.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--event-qps=-1"], "--event-qps must be >= 0, got -1.0"),
        (["--event-qps=nan"], "--event-qps must be >= 0, got nan"),
        (["--event-burst=0"], "--event-burst must be >= 1, got 0"),
        (["--event-qps=x"], "argument --event-qps: invalid float value: 'x'"),
    ],
)
def test_bad_event_budgets(flags: list[str], message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=re.escape(message)):
        cli.parse([*BASE, *flags], env={})


def test_the_patrol_runs_every_five_minutes_on_a_budget_of_its_own_by_default() -> None:
    patrol = cli.parse(BASE, env={}).patrol
    assert (patrol.period, patrol.qps, patrol.burst) == (300.0, 5.0, 10)
    patrol = cli.parse(
        [*BASE, "--patrol-period=2m", "--patrol-qps=0", "--patrol-burst=3"], env={}
    ).patrol
    assert (patrol.period, patrol.qps, patrol.burst) == (120.0, 0.0, 3)
    assert cli.parse([*BASE, "--patrol-period=0"], env={}).patrol.period == 0.0  # off


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--patrol-period=-5s"], "argument --patrol-period: not a duration: '-5s'"),
        (["--patrol-period=nan"], "argument --patrol-period: not a duration: 'nan'"),
        (["--patrol-qps=-1"], "--patrol-qps must be >= 0, got -1.0"),
        (["--patrol-burst=0"], "--patrol-burst must be >= 1, got 0"),
    ],
)
def test_bad_patrol_flags(flags: list[str], message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=re.escape(message)):
        cli.parse([*BASE, *flags], env={})


# -- fair queuing -------------------------------------------------------------------------


def test_namespace_weights_default_to_equal_and_take_pairs() -> None:
    assert cli.parse(BASE, env={}).pods.namespace_weights == ()
    pods = cli.parse([*BASE, "--namespace-weights= team-b=2, team-a=10 ,"], env={}).pods
    assert pods.namespace_weights == (("team-a", 10), ("team-b", 2))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("team-a", "expected NAMESPACE=WEIGHT"),
        ("Team=2", "expected NAMESPACE=WEIGHT"),
        ("=2", "expected NAMESPACE=WEIGHT"),
        ("team-a=0", "weight of team-a must be a whole number from 1 to 1000, got '0'"),
        ("team-a=1.5", "must be a whole number"),
        ("team-a=1001", "must be a whole number"),
        ("team-a=\u0663", "must be a whole number"),  # an Arabic-Indic digit
        ("team-a=1,team-a=2", "team-a is given twice"),
    ],
)
def test_bad_namespace_weights(value: str, message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=message):
        cli.parse([*BASE, f"--namespace-weights={value}"], env={})


# -- providers ------------------------------------------------------------------------------


def test_the_mock_provider_needs_no_lower_cluster() -> None:
    settings = cli.parse(["--provider=mock", "--provider-config=mock.json"], env={})
    assert (settings.provider, settings.provider_config) == ("mock", "mock.json")
    assert cli.parse(BASE, env={}).provider == "k8s"
    with pytest.raises(serving_flags.UsageError, match="--client-kubeconfig is required"):
        cli.parse([], env={})
    with pytest.raises(serving_flags.UsageError, match="invalid choice: 'aws'"):
        cli.parse([*BASE, "--provider=aws"], env={})


def test_a_bad_mock_config_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "upper.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: main}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    config = tmp_path / "mock.json"
    config.write_text('{"someone-else": {}}')
    code = main.main(
        [
            "--provider=mock",
            f"--provider-config={config}",
            f"--kubeconfig={kubeconfig}",
            "--nodename=vn-1",
            f"--cert-dir={tmp_path / 'pki'}",
        ]
    )
    assert code == 2
    assert "has no object for node 'vn-1'" in capsys.readouterr().err


def test_one_process_leads_alone_by_default() -> None:
    assert cli.parse(BASE, env={}).leader_election is None


@pytest.mark.parametrize(
    ("flags", "namespace", "name", "timing"),
    [
        (["--leader-elect"], "tensile-system", "tensile-virtual-node-vk", (15.0, 10.0, 2.0)),
        (
            [
                "--leader-elect=true",
                "--leader-elect-resource-namespace=ops",
                "--leader-elect-resource-name=one-lease",
                "--leader-elect-lease-duration=4s",
                "--leader-elect-renew-deadline=3s",
                "--leader-elect-retry-period=500ms",
            ],
            "ops",
            "one-lease",
            (4.0, 3.0, 0.5),
        ),
    ],
    ids=["defaults", "given"],
)
def test_replicas_compete_for_a_lease_named_after_the_node(
    flags: list[str], namespace: str, name: str, timing: tuple[float, float, float]
) -> None:
    election = cli.parse([*BASE, "--nodename=vk", *flags], env={}, holder="me").leader_election
    assert election is not None
    assert (election.namespace, election.name, election.identity) == (namespace, name, "me")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == timing


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--leader-elect=maybe"], "not a boolean"),
        (["--leader-elect-resource-namespace=a.b"], "'a.b' is not a namespace name"),
        (["--nodename=VK"], "'tensile-virtual-node-VK' is not an object name"),
        (["--leader-elect-renew-deadline=20s"], "lease duration must be greater than renew"),
        (["--leader-elect-retry-period=9s"], "renew deadline must be greater than retry"),
        (["--leader-elect-lease-duration=1e308"], "lease duration must be at most 2147483647s"),
    ],
)
def test_bad_leader_election_flags_name_the_flag(flags: list[str], message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=message):
        cli.parse([*BASE, "--leader-elect", *flags], env={})


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], IngressSettings()),
        (
            [
                "--enable-ingress",
                "--ingress-class-map=public=tenants, internal=tenants-internal",
                "--lower-ingress-annotations=example.com/*,a.io/b",
            ],
            IngressSettings(
                enabled=True,
                class_map=(("public", "tenants"), ("internal", "tenants-internal")),
                annotations=("example.com/*", "a.io/b"),
            ),
        ),
    ],
)
def test_ingress_flags(flags: list[str], expected: IngressSettings) -> None:
    assert cli.parse([*BASE, *flags], env={}).controllers.ingress == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--enable-ingress", "--enable-controllers=PVControllers"],
            "--enable-ingress needs ServiceControllers",
        ),
        (["--ingress-class-map=public"], "--ingress-class-map: expected UPPER=LOWER"),
        (["--ingress-class-map=a=b,a=c"], "--ingress-class-map: a is mapped twice"),
        (["--ingress-class-map=A_B=c"], "is not a IngressClass name"),
        (["--lower-ingress-annotations=a*b"], "--lower-ingress-annotations: 'a*b'"),
    ],
)
def test_bad_ingress_flags_are_refused_with_the_flag_named(flags: list[str], message: str) -> None:
    with pytest.raises(serving_flags.UsageError, match=re.escape(message)):
        cli.parse([*BASE, *flags], env={})
