"""The `tensile-webhook` command line: tensile-kube's flags, tensile's, and one-line usage
errors (exit 2)."""

from __future__ import annotations

import pytest

from tensile.serving.flags import UsageError
from webhook import cli
from webhook.__main__ import main


def test_defaults() -> None:
    settings = cli.parse([], env={})
    assert (settings.server.address, settings.server.port) == ("0.0.0.0", 8080)
    mutation = settings.mutation
    assert mutation.pod_selector.text == "virtual-pod=true"
    assert mutation.excluded_namespaces == frozenset({"kube-system"})
    assert mutation.ignore_selector_keys == frozenset({"clusterID"})
    assert (mutation.not_ready_seconds, mutation.unreachable_seconds) == (300, 300)
    assert mutation.taint_key == "virtual-kubelet.io/provider"
    assert not settings.server.from_files
    secret = settings.server.secret
    assert secret is not None
    assert (secret.namespace, secret.name) == ("tensile-system", "tensile-webhook-tls")
    assert settings.webhook_configuration == "tensile-webhook"
    assert secret.names == (
        "tensile-webhook",
        "tensile-webhook.tensile-system",
        "tensile-webhook.tensile-system.svc",
        "tensile-webhook.tensile-system.svc.cluster.local",
    )
    assert settings.virtual_node_selector == "type=virtual-kubelet"


def test_tensile_kubes_flags_are_accepted() -> None:
    settings = cli.parse(
        [
            "--address=10.0.0.7", "--port=443", "--tlscert=/tls/cert.pem",
            "--tlskey=/tls/key.pem", "--CA=/tls/ca.pem", "--kubeconfig=/k",
            "--ignore-selector-keys=clusterID, region", "--master=https://x", "--incluster",
            "--v=6",
        ],
        env={},
    )  # fmt: skip
    assert (settings.server.address, settings.server.port) == ("10.0.0.7", 443)
    assert (settings.server.cert_file, settings.server.key_file) == (
        "/tls/cert.pem",
        "/tls/key.pem",
    )
    assert settings.server.client_ca_file == "/tls/ca.pem"
    assert settings.server.from_files
    assert settings.kubeconfig == "/k"
    assert settings.mutation.ignore_selector_keys == frozenset({"clusterID", "region"})
    assert settings.log_level == "debug"  # klog's --v=6


def test_tensiles_own_flags_and_environment() -> None:
    settings = cli.parse(
        [
            "--pod-selector=tier in (batch)", "--excluded-namespaces=kube-system,ops",
            "--default-not-ready-toleration-seconds=-1",
            "--default-unreachable-toleration-seconds=0", "--tls-san=192.0.2.1,hook.example",
            "--tls-san=::1", "--shutdown-delay=0", "--tls-resync=10s",
        ],
        env={"POD_NAMESPACE": "platform", "VKUBELET_TAINT_KEY": "example.com/vk"},
    )  # fmt: skip
    mutation = settings.mutation
    assert mutation.pod_selector.matches({"tier": "batch"})
    assert mutation.excluded_namespaces == frozenset({"kube-system", "ops"})
    assert (mutation.not_ready_seconds, mutation.unreachable_seconds) == (None, 0)
    assert mutation.taint_key == "example.com/vk"
    secret = settings.server.secret
    assert secret is not None
    assert secret.namespace == "platform"
    assert secret.names[-3:] == ("192.0.2.1", "hook.example", "::1")
    assert "tensile-webhook.platform.svc" in secret.names
    assert (settings.server.shutdown_delay, settings.server.resync) == (0.0, 10.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port=70000"], "--port must be 1-65535, got 70000"),
        (["--port=http"], "argument --port: invalid int value: 'http'"),
        (["--address=any"], "--address must be an IP address, got 'any'"),
        (["--tlscert=/c"], "--tlscert and --tlskey go together"),
        (["--pod-selector=tier in (a"], "--pod-selector: unbalanced '('"),
        (["--virtual-node-selector=a b"], "--virtual-node-selector: 'a b'"),
        (["--default-not-ready-toleration-seconds=-2"], "must be -1 (never evicted) or seconds"),
        (["--tls-secret=tls"], "--tls-secret must be namespace/name, got 'tls'"),
        (["--service=a/b/c"], "--service must be namespace/name"),
        (["--service=shop/Web_1"], "--service: 'Web_1' is not a Service name"),
        (["--tls-secret=Shop/tls"], "--tls-secret: 'Shop' is not a namespace name"),
        (["--tls-secret=shop/tls!"], "--tls-secret: 'tls!' is not an object name"),
        (["--tls-san=hook,bücher.example"], "--tls-san: 'bücher.example' is not a DNS name"),
        (["--tls-san=a b"], "--tls-san: 'a b' is not a DNS name or an IP address"),
        (["--shutdown-delay=soon"], "argument --shutdown-delay: not a duration: 'soon'"),
        (["--tls-resync=0"], "--tls-resync must be more than 0"),
        (["--max-request-bytes=10"], "--max-request-bytes must be at least 1024"),
        (["--taint= "], "--taint must not be empty"),
        (["--metrics-addr=nowhere"], "--metrics-addr must be host:port or :port"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_values_are_one_usage_error_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UsageError) as info:
        cli.parse(flags, env={})
    assert message in str(info.value)
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensile-webhook: error: ")
    assert err.count("\n") == 1
