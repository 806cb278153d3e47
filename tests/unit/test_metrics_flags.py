"""`--metrics-addr` serves plain-HTTP /metrics on loopback only unless `--metrics-insecure`
(tensile.serving.metrics_flags), the same for every program's command line."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from descheduler import cli as descheduler_cli
from scheduler import cli as scheduler_cli
from tensile.serving import metrics_flags
from tensile.serving.flags import UsageError
from vnode import cli as vnode_cli
from webhook import cli as webhook_cli


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("192.0.2.7", False),
        ("::", False),
        ("[2001:db8::1]", False),
        ("metrics.example", False),  # a name may resolve to any address
        ("", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert metrics_flags.is_loopback(host) is loopback


def _vnode(argv: Sequence[str]) -> tuple[str, str]:
    settings = vnode_cli.parse(
        ["--nodename=n", "--client-kubeconfig=/lower", *argv], env={}, holder="h"
    )
    return settings.metrics_addr, settings.healthz_addr


def _webhook(argv: Sequence[str]) -> tuple[str, str]:
    return webhook_cli.parse(list(argv), env={}).server.metrics_addr, ""


def _scheduler(argv: Sequence[str]) -> tuple[str, str]:
    tls = ["--tls-cert-file=/c", "--tls-private-key-file=/k", "--client-ca-file=/ca"]
    return scheduler_cli.parse([*tls, *argv]).server.metrics_addr, ""


def _descheduler(argv: Sequence[str]) -> tuple[str, str]:
    settings, _ = descheduler_cli.parse(list(argv), holder="h")
    return settings.metrics_addr, settings.healthz_addr


PROGRAMS: dict[str, Callable[[Sequence[str]], tuple[str, str]]] = {
    "virtual-node": _vnode,
    "webhook": _webhook,
    "scheduler": _scheduler,
    "descheduler": _descheduler,
}


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_program_refuses_plain_metrics_off_loopback_naming_the_flags(program: str) -> None:
    parse = PROGRAMS[program]
    assert parse(["--metrics-addr=127.0.0.1:10455"])[0] == "127.0.0.1:10455"
    assert parse([])[0] == ""
    for addr in (":10455", "0.0.0.0:10455", "192.0.2.7:10455", "node-1:10455"):
        with pytest.raises(UsageError) as refused:
            parse([f"--metrics-addr={addr}"])
        message = str(refused.value)
        assert message.startswith(f"--metrics-addr={addr} would serve /metrics over plain HTTP")
        assert "--metrics-insecure" in message
    # Asked for: served where it says (pflag's boolean forms).
    assert parse(["--metrics-addr=:10455", "--metrics-insecure"])[0] == "0.0.0.0:10455"
    assert parse(["--metrics-addr=192.0.2.7:1", "--metrics-insecure=true"])[0] == "192.0.2.7:1"
    with pytest.raises(UsageError):
        parse(["--metrics-addr=192.0.2.7:1", "--metrics-insecure=false"])


@pytest.mark.parametrize("program", ["virtual-node", "descheduler"])
def test_the_probes_address_may_be_any(program: str) -> None:
    parse = PROGRAMS[program]
    assert parse(["--healthz-addr=:10456"]) == ("", "0.0.0.0:10456")
    assert parse(["--healthz-addr=192.0.2.7:10456"]) == ("", "192.0.2.7:10456")
    with pytest.raises(UsageError, match="--healthz-addr must be host:port"):
        parse(["--healthz-addr=nowhere"])
