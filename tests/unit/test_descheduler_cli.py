"""`tensile-descheduler`'s command line: tensile-kube's flags and ours, the policy file as
their defaults, and one clear message with exit 2 for anything unusable."""

from __future__ import annotations

from pathlib import Path

import pytest

from descheduler import cli
from descheduler.__main__ import main
from tensile.serving import election_flags
from tensile.serving.flags import UsageError

POLICY = """apiVersion: descheduler/v1alpha1
kind: DeschedulerPolicy
nodeSelector: zone=a
maxNoOfPodsToEvictPerNode: 4
strategies:
  PodLifeTime:
    enabled: true
    params:
      maxPodLifeTimeSeconds: 180
"""


def test_defaults() -> None:
    settings, warnings = cli.parse([], holder="me")
    assert warnings == ()
    assert settings.interval == 10.0
    assert settings.criteria.unschedulable_timeout == 60.0
    assert settings.criteria.max_pod_lifetime is None
    assert settings.criteria.max_pods_per_node == 0
    assert not settings.criteria.evict_local_storage_pods
    assert settings.moves.avoid_ttl == 300.0
    assert not settings.moves.dry_run
    assert (settings.avoid_namespace, settings.avoid_name) == ("tensile-system", "tensile-avoid")
    election = settings.leader_election
    assert election is not None
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (15, 10, 2)
    assert (election.namespace, election.name, election.identity) == (
        "tensile-system",
        "tensile-descheduler",
        "me",
    )


def test_tensile_kubes_flags_and_the_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    settings, _ = cli.parse(
        [
            f"--policy-config-file={policy}",
            "--descheduling-interval=30s",
            "--dry-run",
            "--evict-local-storage-pods",
            "--v=3",
            "--unschedulable-timeout=2m",
            "--avoid-ttl=10m",
            "--avoid-configmap=ops/avoid",
            "--leader-elect=false",
        ]
    )
    assert settings.interval == 30
    assert settings.moves.dry_run
    assert settings.criteria.evict_local_storage_pods
    assert settings.criteria.max_pod_lifetime == 180
    assert settings.criteria.node_selector.matches({"zone": "a"})
    assert not settings.criteria.node_selector.matches({"zone": "b"})
    assert settings.criteria.max_pods_per_node == 4
    assert settings.criteria.unschedulable_timeout == 120
    assert settings.moves.avoid_ttl == 600
    assert (settings.avoid_namespace, settings.avoid_name) == ("ops", "avoid")
    assert settings.leader_election is None
    # Flags given on the command line win over the policy file.
    flagged, _ = cli.parse(
        [f"--policy-config-file={policy}", "--node-selector=", "--max-pods-to-evict-per-node=0"]
    )
    assert flagged.criteria.node_selector.matches({"zone": "b"})
    assert flagged.criteria.max_pods_per_node == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--descheduling-interval=soon"], "not a duration"),
        (["--node-selector=a b"], "--node-selector"),
        (["--max-pods-to-evict-per-node=-1"], "must be >= 0"),
        (["--avoid-configmap=just-a-name"], "namespace/name"),
        # Names the apiserver would refuse at every write: refused at start instead, as the
        # webhook refuses the same --avoid-configmap.
        (["--avoid-configmap=Tensile/avoid"], "'Tensile' is not a namespace name"),
        (["--avoid-configmap=tensile-system/avoid_me"], "'avoid_me' is not an object name"),
        (["--leader-elect-resource-namespace=a.b"], "'a.b' is not a namespace name"),
        (["--leader-elect-resource-name=Lease"], "'Lease' is not an object name"),
        (["--avoid-ttl=0"], "--avoid-ttl"),
        (["--eviction-burst=0"], "--eviction-burst"),
        (["--eviction-rate=nan"], "--eviction-rate must be a finite number >= 0"),
        (["--eviction-rate=inf"], "--eviction-rate must be a finite number >= 0"),
        (["--kube-api-qps=nan"], "--kube-api-qps must be a finite number >= 0"),
        # Its expiries are RFC 3339 times: 3 million years do not fit before year 9999
        # (every round failed at its first move).
        (["--avoid-ttl=99999999999999s"], "--avoid-ttl must be greater than 0 and at most"),
        (["--avoid-ttl=8761h"], "--avoid-ttl must be greater than 0 and at most 365 days"),
        (["--leader-elect-renew-deadline=20s"], "lease duration must be greater than renew"),
        (["--metrics-addr=nowhere"], "--metrics-addr"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_flags(args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        cli.parse(args)


def test_a_bad_policy_file_is_one_message_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("PodLifeTime", "PodLifetime"))
    assert main([f"--policy-config-file={policy}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"tensile-descheduler: error: --policy-config-file: {policy}: "
        "strategies.PodLifetime: unknown strategy (known: PodLifeTime, RemoveDuplicates, "
        "LowNodeUtilization, RemovePodsViolatingInterPodAntiAffinity, "
        "RemovePodsViolatingNodeAffinity, RemovePodsViolatingNodeTaints, "
        "RemovePodsHavingTooManyRestarts, RemovePodsViolatingTopologySpreadConstraint)\n"
    )
    assert main([f"--policy-config-file={tmp_path / 'missing.yaml'}"]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_a_missing_kubeconfig_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"--kubeconfig={tmp_path / 'none'}"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_identities_are_unique_per_process() -> None:
    assert election_flags.identity() != election_flags.identity()


def test_metrics_go_to_the_network_on_an_https_port_of_their_own_by_default() -> None:
    """kube-controller-manager's secure serving: on by default, on every address, a
    self-signed certificate unless files are given; 0 serves none."""
    settings, _ = cli.parse([], holder="me")
    server = settings.server
    assert server is not None
    assert (server.address, server.port, server.from_files) == ("0.0.0.0", cli.SECURE_PORT, False)
    assert server.flags.port == "--secure-port"
    assert settings.metrics_addr == ""
    files = ["--tls-cert-file=/tls/tls.crt", "--tls-private-key-file=/tls/tls.key"]
    settings, _ = cli.parse(["--secure-port=10443", "--bind-address=::1", *files], holder="me")
    server = settings.server
    assert server is not None
    assert (server.address, server.port) == ("::1", 10443)
    assert (server.cert_file, server.key_file) == ("/tls/tls.crt", "/tls/tls.key")
    assert cli.parse(["--secure-port=0"], holder="me")[0].server is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--secure-port=65536"], "--secure-port must be 0-65535"),
        (["--secure-port=-1"], "--secure-port must be 0-65535"),
        (["--bind-address=example.com"], "--bind-address must be an IP address"),
        (["--tls-cert-file=/c"], "--tls-cert-file and --tls-private-key-file go together"),
        (["--tls-private-key-file=/k"], "--tls-cert-file and --tls-private-key-file go together"),
    ],
)
def test_unusable_secure_serving_flags_are_refused_naming_the_flag(
    args: list[str], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        cli.parse(args, holder="me")
