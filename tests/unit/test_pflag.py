"""pflag's command-line forms on argparse (tensile.serving.pflag, flags.Parser), the klog
flags' mapping onto tensile's logging, the version line, and the kubelet auth caches'
lifetimes. Tables of pure decisions; the parsers are the programs' own."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from descheduler import cli as descheduler_cli
from kubectl_tensile import __main__ as kubectl_tensile
from scheduler import cli as scheduler_cli
from tensile.serving import flags, pflag, version
from vnode import cli as vnode_cli
from vnode.api import auth
from vnode.testing.fakeapi import FakeApi
from webhook import cli as webhook_cli

VALUED = {"--kubeconfig", "--v", "--taint", "--log-dir", "--CA"}
BOOLEANS = {"--disable-taint", "--logtostderr", "--version", "--dry-run"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # booleans: bare is true, a value only with '='
        (["--disable-taint"], ["--disable-taint=true"]),
        (["--disable-taint=true"], ["--disable-taint=true"]),
        (["--disable-taint=false"], ["--disable-taint=false"]),
        (["--disable-taint", "--v=3"], ["--disable-taint=true", "--v=3"]),
        (["--disable_taint=false"], ["--disable-taint=false"]),
        # valued flags: the next word is the value, whatever it looks like
        (["--kubeconfig", "/k"], ["--kubeconfig=/k"]),
        (["--taint", "-x"], ["--taint=-x"]),
        (["--kubeconfig=a=b"], ["--kubeconfig=a=b"]),
        (["--kubeconfig"], ["--kubeconfig"]),  # argparse says it expected one argument
        # '_' for '-' (WordSepNormalizeFunc), node-cli's klog. prefix, Go's one dash
        (["--log_dir=/tmp"], ["--log-dir=/tmp"]),
        (["--klog.v=5"], ["--v=5"]),
        (["--klog.v", "4"], ["--v=4"]),
        (["--klog.log_dir", "/tmp"], ["--log-dir=/tmp"]),
        (["--klog.logtostderr"], ["--logtostderr=true"]),
        (["-v=3"], ["--v=3"]),
        (["-v", "3"], ["--v=3"]),
        (["-logtostderr"], ["--logtostderr=true"]),
        # left alone: unknown names as typed, case, short options, words, after --
        (["--no_such_flag=1"], ["--no_such_flag=1"]),
        (["--klog.nope"], ["--klog.nope"]),
        (["--CA=/ca.pem"], ["--CA=/ca.pem"]),
        (["-h"], ["-h"]),
        (["version"], ["version"]),
        (["-"], ["-"]),
        (["--", "--disable-taint"], ["--", "--disable-taint"]),
    ],
)
def test_normalize(argv: list[str], expected: list[str]) -> None:
    assert pflag.normalize(argv, valued=VALUED, booleans=BOOLEANS) == expected


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["version"], True),
        (["--kubeconfig=/k", "version"], True),
        (["--version=true"], True),
        (["--version=1"], True),
        (["--version=false"], False),
        (["--version=yes"], False),  # not Go's: argparse refuses it, naming the flag
        (["--kubeconfig=version"], False),  # a flag's value, not the command
        (["--", "version"], False),
        (["why", "version"], False),  # a pod named version
        ([], False),
    ],
)
def test_wants_version(argv: list[str], wanted: bool) -> None:
    assert pflag.wants_version(argv) is wanted


def _parser() -> flags.Parser:
    p = flags.Parser(prog="t")
    p.add_argument("--store", action="store_true")
    p.add_argument("--typed", type=flags.boolean, nargs="?", const=True, default=True)
    p.add_argument("--name", default="")
    p.add_argument("--many", action="append", default=[])
    flags.add_logging_flags(p)
    return p


@pytest.mark.parametrize(
    ("argv", "attribute", "value"),
    [
        ([], "store", False),
        (["--store"], "store", True),
        (["--store=true"], "store", True),
        (["--store=false"], "store", False),
        (["--store=F"], "store", False),
        ([], "typed", True),
        (["--typed=false"], "typed", False),
        (["--typed"], "typed", True),
        (["--name", "--dashed"], "name", "--dashed"),
        (["--many", "a", "--many=b"], "many", ["a", "b"]),
        (["--klog.v=7"], "klog_v", 7),
    ],
)
def test_every_boolean_is_pflags(argv: list[str], attribute: str, value: object) -> None:
    assert getattr(_parser().parse_args(argv), attribute) == value


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--store=maybe"], "argument --store: not a boolean: 'maybe' (true or false)"),
        (["--store=yes"], "argument --store: not a boolean: 'yes' (true or false)"),
        (["--version=yes"], "argument --version: not a boolean: 'yes' (true or false)"),
        (["--v=-1"], "argument --v: klog verbosity must be a whole number >= 0, got '-1'"),
        (["--v=high"], "argument --v: klog verbosity must be a whole number >= 0, got 'high'"),
        (["--nam=x"], "unrecognized arguments: --nam=x"),  # no abbreviations, as pflag
        (["--name"], "argument --name: expected one argument"),
        (["--log-level=loud"], "argument --log-level: invalid choice: 'loud'"),
    ],
)
def test_bad_values_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(flags.UsageError) as caught:
        _parser().parse_args(argv)
    assert str(caught.value).startswith(message)


def test_a_commands_own_version_flag_is_the_parsers() -> None:
    p = _parser()
    p.add_argument("--version", action="store_true", help="print the version and exit")
    with pytest.raises(flags.VersionRequested):
        p.parse_args(["--version"])


def test_version_is_asked_before_anything_is_judged() -> None:
    with pytest.raises(flags.VersionRequested):
        _parser().parse_args(["--store=maybe", "version"])
    with pytest.raises(flags.VersionRequested):
        _parser().parse_args(["--version"])


@pytest.mark.parametrize(
    ("argv", "level", "notes"),
    [
        ([], "info", ()),
        (["--v=3"], "info", ()),
        (["--v=4"], "debug", ()),
        (["--klog.v=5", "--log-level=warn"], "warn", ()),  # --log-level wins
        (["--log-level=warning"], "warn", ()),
        (["--logtostderr"], "info", ()),
        (
            ["--klog.log_dir=/var/log", "--alsologtostderr"],
            "info",
            (
                "--log-dir is ignored: tensile logs every level to stderr (info and above)",
                "--alsologtostderr is ignored: tensile logs every level to stderr (info and above)",
            ),
        ),
        (["--add_dir_header=false"], "info", ()),  # ignored and false: nothing to say
    ],
)
def test_logging_choice(argv: list[str], level: str, notes: tuple[str, ...]) -> None:
    choice = flags.logging_choice(_parser().parse_args(argv))
    assert (choice.level, choice.notes) == (level, notes)


def test_logtostderr_false_is_refused_with_what_to_do() -> None:
    with pytest.raises(flags.UsageError, match="stderr only"):
        flags.logging_choice(_parser().parse_args(["--logtostderr=false"]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("https://10.0.0.1:6443", "https://10.0.0.1:6443"),
        ("https://api.example/", "https://api.example"),
        ("http://127.0.0.1:8080/prefix", "http://127.0.0.1:8080/prefix"),
    ],
)
def test_server_url(text: str, expected: str) -> None:
    assert flags.server_url(text, "MASTER_URI") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1:6443", "MASTER_URI must be an apiserver URL like https://host:6443"),
        ("ftp://x", "MASTER_URI must be an apiserver URL"),
        ("https://x:port", "MASTER_URI: the port of 'https://x:port' is not a port number"),
        ("https://x/?a=b", "MASTER_URI must be an apiserver URL without ?query"),
    ],
)
def test_server_url_refused(text: str, message: str) -> None:
    with pytest.raises(flags.UsageError) as caught:
        flags.server_url(text, "MASTER_URI")
    assert str(caught.value).startswith(message)


def test_master_uri_and_master_replace_the_kubeconfig_server() -> None:
    settings = vnode_cli.parse(
        ["--client-kubeconfig=/k"], {"MASTER_URI": "https://upper.example:6443/"}
    )
    assert settings.upper.server == "https://upper.example:6443"
    assert settings.lower.server == ""
    assert webhook_cli.parse(["--master=https://m:443"], {}).master == "https://m:443"
    with pytest.raises(flags.UsageError, match="MASTER_URI"):
        vnode_cli.parse(["--client-kubeconfig=/k"], {"MASTER_URI": "upper:6443"})


def test_version_line_names_version_commit_and_kubernetes() -> None:
    line = version.text("virtual-node")
    assert line.startswith(f"virtual-node {version.version()} (commit ")
    assert line.endswith(f", Kubernetes {version.KUBERNETES_VERSION})")
    assert version.commit() != ""


def test_kubernetes_version_is_the_tested_one() -> None:
    versions = Path(__file__).resolve().parents[2] / "hack" / "versions.env"
    pinned = dict(line.split("=", 1) for line in versions.read_text().splitlines() if "=" in line)[
        "KUBERNETES_VERSION"
    ]
    assert pinned == version.KUBERNETES_VERSION


@pytest.mark.parametrize(
    ("argv", "ttls"),
    [
        ([], (120.0, 300.0, 30.0)),  # the kubelet's defaults
        (
            [
                "--authentication-token-webhook",
                "--authentication-token-webhook-cache-ttl=10s",
                "--authorization-webhook-cache-authorized-ttl=1m",
                "--authorization-webhook-cache-unauthorized-ttl=0",
            ],
            (10.0, 60.0, 0.0),
        ),
    ],
)
def test_kubelet_auth_cache_flags(argv: list[str], ttls: tuple[float, float, float]) -> None:
    api = vnode_cli.parse(["--client-kubeconfig=/k", *argv], {}).api
    assert (api.token_cache_ttl, api.authorized_cache_ttl, api.unauthorized_cache_ttl) == ttls


def test_token_webhook_off_is_refused() -> None:
    with pytest.raises(flags.UsageError, match="always checks bearer tokens"):
        vnode_cli.parse(["--client-kubeconfig=/k", "--authentication-token-webhook=false"], {})
    # Beside --no-verify-clients (development: nothing is checked) it says nothing more.
    unchecked = vnode_cli.parse(
        ["--client-kubeconfig=/k", "--authentication-token-webhook=false", "--no-verify-clients"],
        {},
    )
    assert not unchecked.api.verify_clients


@pytest.mark.parametrize(
    ("argv", "notes"),
    [
        ([], ()),
        (
            ["--full-resync-period=1m"],
            (
                "--full-resync-period=60s is ignored: informers are event-driven and the "
                "patrol re-checks both clusters every 300s (--patrol-period)",
            ),
        ),
    ],
)
def test_full_resync_period_says_it_is_ignored(argv: list[str], notes: tuple[str, ...]) -> None:
    assert vnode_cli.parse(["--client-kubeconfig=/k", *argv], {}).notes == notes


def test_descheduler_and_webhook_take_klog_verbosity() -> None:
    settings, _ = descheduler_cli.parse(["--v=4", "--logtostderr"])
    assert settings.log_level == "debug"
    assert webhook_cli.parse(["-v=6"], {}).log_level == "debug"


# Fakes: the upper cluster is a FakeApi answering every review the same way; what is
# under test is how often the Authenticator/Authorizer ask it, which only a fake counts.
async def _reviews(**ttls: float) -> tuple[int, int]:
    upper = FakeApi()
    upper.answer(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {"status": {"authenticated": True, "user": {"username": "u"}}},
    )
    upper.answer(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {"status": {"allowed": False}}
    )
    gate = auth.ReviewGate()
    authenticator = auth.Authenticator(upper, gate=gate, cache_ttl=ttls["token"])
    authorizer = auth.Authorizer(
        upper, gate=gate, allowed_ttl=ttls["allowed"], denied_ttl=ttls["denied"]
    )
    [log] = auth.attributes(node_name="n", method="GET", path="/logs/")
    for _ in range(3):
        user = await authenticator.authenticate(ssl_object=None, authorization="Bearer t")
        assert not await authorizer.allowed(user, log)
    return (
        len(upper.requests_of("POST", "tokenreviews")),
        len(upper.requests_of("POST", "subjectaccessreviews")),
    )


@pytest.mark.parametrize(
    ("ttls", "asked"),
    [
        ({"token": 120.0, "allowed": 300.0, "denied": 30.0}, (1, 1)),
        ({"token": 0.0, "allowed": 300.0, "denied": 0.0}, (3, 3)),
        ({"token": 120.0, "allowed": 0.0, "denied": 30.0}, (1, 1)),
    ],
)
async def test_review_caches_keep_answers_their_lifetime(
    ttls: dict[str, float], asked: tuple[int, int]
) -> None:
    assert await _reviews(**ttls) == asked


def test_parsers_have_no_store_true_left() -> None:
    # Every boolean of every program takes pflag's forms, including flags added later.
    for parser in (
        vnode_cli._parser({}),
        webhook_cli._parser({}),
        descheduler_cli._parser(),
        scheduler_cli._parser(),
        kubectl_tensile._parser(),
    ):
        kinds = {
            type(action).__name__
            for action in parser._actions
            if isinstance(action, argparse._StoreTrueAction)
        }
        assert kinds == set()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--authentication-token-webhook-cache-ttl=soon"],
            "argument --authentication-token-webhook-cache-ttl: not a duration: 'soon'",
        ),
        (["--enable-node-lease=maybe"], "argument --enable-node-lease: not a boolean: 'maybe'"),
        (["--klog.v=five"], "argument --v: klog verbosity must be a whole number >= 0"),
    ],
)
def test_virtual_node_bad_values(argv: list[str], message: str) -> None:
    with pytest.raises(flags.UsageError) as caught:
        vnode_cli.parse(["--client-kubeconfig=/k", *argv], {})
    assert str(caught.value).startswith(message)
