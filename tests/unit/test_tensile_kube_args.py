"""tensile-kube's own command lines (tests/data/tensile_kube_args.json: every manifest of
its repository, and its README's) start our programs' parsers without a usage error.

The data file holds the facts only: each container's args and literal env, and the files
they name (the descheduler's policy, from the manifest's ConfigMap)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from descheduler import cli as descheduler_cli
from tensile.serving.flags import UsageError
from vnode import cli as vnode_cli
from webhook import cli as webhook_cli

DATA = json.loads((Path(__file__).parents[1] / "data" / "tensile_kube_args.json").read_text())
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expanded(text: str, env: dict[str, str], files: dict[str, Path]) -> str:
    # The kubelet expands $(VAR) in args from the container's env; paths of the files the
    # manifests mount point at the copies written for the test.
    text = _VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text)
    for original, copy in files.items():
        text = text.replace(original, str(copy))
    return text


@pytest.mark.parametrize("command", DATA["commands"], ids=lambda c: f"{c['program']}:{c['source']}")
def test_tensile_kube_command_lines_parse(command: dict[str, Any], tmp_path: Path) -> None:
    files = {}
    for index, (original, content) in enumerate(DATA["files"].items()):
        files[original] = tmp_path / f"file-{index}"
        files[original].write_text(content)
    env = dict(command["env"])
    argv = [_expanded(arg, env, files) for arg in command["args"]]
    program = command["program"]
    if any(_plain_metrics_off_loopback(a) for a in argv):
        # tensile-kube served plain-HTTP metrics on every address; tensile refuses that at
        # start, naming the flag, unless asked for (docs/operations/monitoring.md).
        with pytest.raises(UsageError, match=r"--metrics-addr=.* --metrics-insecure"):
            _parse(program, argv, env)
        argv.append("--metrics-insecure")
    if program == "virtual-node":
        settings = vnode_cli.parse(argv, env)
        assert settings.provider == "k8s"
        assert settings.log_level == "debug"
    elif program == "tensile-webhook":
        assert webhook_cli.parse(argv, env).server.port == 443
    else:
        parsed, _warnings = descheduler_cli.parse(argv)
        assert parsed.interval == 10.0
        assert parsed.criteria.max_pod_lifetime == 180


def test_every_manifest_of_tensile_kube_is_covered() -> None:
    sources = {c["source"] for c in DATA["commands"]}
    assert sources == {
        "manifeasts/virtual-node.yaml",
        "manifeasts/webhook.yaml",
        "manifeasts/descheduler.yaml",
        "README.md",
    }


def _plain_metrics_off_loopback(arg: str) -> bool:
    return arg.startswith("--metrics-addr=") and not arg.startswith("--metrics-addr=127.")


def _parse(program: str, argv: list[str], env: dict[str, str] | None = None) -> object:
    if program == "virtual-node":
        return vnode_cli.parse(["--client-kubeconfig=/k", *argv], env or {})
    if program == "tensile-webhook":
        return webhook_cli.parse(argv, env or {})
    return descheduler_cli.parse(argv)


@pytest.mark.parametrize(
    ("program", "flag", "value"),
    [
        (program, flag, value)
        for program in ("virtual-node", "tensile-webhook", "tensile-descheduler")
        for flag, value in DATA["flags"][program]
    ],
)
def test_every_tensile_kube_flag_is_accepted(program: str, flag: str, value: str) -> None:
    # Both pflag forms: --flag=value, and --flag value (booleans only take the first).
    # Plain-HTTP metrics off loopback are accepted when asked for (--metrics-insecure).
    more = ["--metrics-insecure"] if flag == "--metrics-addr" else []
    _parse(program, [f"{flag}={value}", *more])
    if value not in ("true", "false"):
        _parse(program, [flag, value, *more])
