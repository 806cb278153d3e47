"""The descheduler's start-up check (descheduler.preflight): what a dry-run create's status
means, what it needs to create, and the messages that say what to do."""

from __future__ import annotations

import pytest

from descheduler import cli, preflight


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (201, "writable"),
        (200, "writable"),
        (409, "writable"),  # it exists already
        (404, "create-namespace"),
        (403, "forbidden"),
        (500, None),
        (429, None),
        (422, None),
    ],
)
def test_verdict(code: int, verdict: str | None) -> None:
    assert preflight.verdict(code) == verdict


@pytest.mark.parametrize(
    ("argv", "needed"),
    [
        ([], [("Lease", "tensile-system", "tensile-descheduler"),
              ("ConfigMap", "tensile-system", "tensile-avoid")]),
        (["--leader-elect=false"], [("ConfigMap", "tensile-system", "tensile-avoid")]),
        (
            ["--leader-elect-resource-namespace=kube-system", "--avoid-configmap=ops/avoid"],
            [("Lease", "kube-system", "tensile-descheduler"), ("ConfigMap", "ops", "avoid")],
        ),
    ],
)  # fmt: skip
def test_needs(argv: list[str], needed: list[tuple[str, str, str]]) -> None:
    settings, _ = cli.parse(argv)
    assert [(n.kind, n.namespace, n.name) for n in preflight.needs(settings)] == needed


def test_messages_say_what_to_do() -> None:
    settings, _ = cli.parse([])
    lease = preflight.needs(settings)[0]
    assert preflight.no_namespace_message(lease) == (
        "namespace tensile-system (of the Lease tensile-descheduler) does not exist and this "
        "identity may not create it: kubectl create namespace tensile-system (or apply "
        "manifests/descheduler/rbac.yaml), or choose with --leader-elect-resource-namespace/"
        "-name, or --leader-elect=false when only one replica runs"
    )
    forbidden = preflight.forbidden_message(lease, "leases is forbidden")
    assert forbidden.startswith("leases is forbidden; this identity must be able to create ")
    assert "get/update on leases/tensile-descheduler" in forbidden
    assert preflight.missing_message(
        [preflight.Permission("list", "poddisruptionbudgets", "policy"),
         preflight.Permission("create", "pods", subresource="eviction")]
    ).startswith(
        "this identity lacks list poddisruptionbudgets.policy, create pods/eviction across "
        "the cluster"
    )  # fmt: skip
