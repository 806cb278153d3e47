"""The programs' start-up check (tensile.serving.preflight, and the descheduler's use of it in
descheduler.preflight): what a dry-run create's status means, what the descheduler needs to
create, and the messages that say what to do."""

from __future__ import annotations

import pytest

from descheduler import cli, preflight
from tensile.serving import preflight as program_preflight
from vnode import cli as vnode_cli
from vnode.preflight import lease_need


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
    assert program_preflight.verdict(code) == verdict


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
    assert program_preflight.no_namespace_message(lease) == (
        "namespace tensile-system (of the Lease tensile-descheduler) does not exist and this "
        "identity may not create it: kubectl create namespace tensile-system (or apply "
        "manifests/descheduler/rbac.yaml), or choose with --leader-elect-resource-namespace/"
        "-name, or --leader-elect=false when only one replica runs"
    )
    forbidden = program_preflight.forbidden_message(lease, "leases is forbidden")
    assert forbidden.startswith("leases is forbidden; this identity must be able to create ")
    assert "get/update on leases/tensile-descheduler" in forbidden
    assert preflight.missing_message(
        [preflight.Permission("list", "poddisruptionbudgets", "policy"),
         preflight.Permission("create", "pods", subresource="eviction")]
    ).startswith(
        "this identity lacks list poddisruptionbudgets.policy, create pods/eviction across "
        "the cluster"
    )  # fmt: skip


def test_the_virtual_node_needs_its_lease_only_when_it_elects() -> None:
    base = ["--client-kubeconfig=lower.kubeconfig", "--nodename=vn-a"]
    assert lease_need(vnode_cli.parse(base, env={})) is None
    need = lease_need(vnode_cli.parse([*base, "--leader-elect"], env={}))
    assert need is not None
    assert (need.kind, need.namespace, need.name) == (
        "Lease",
        "tensile-system",
        "tensile-virtual-node-vn-a",
    )
    assert program_preflight.no_namespace_message(need) == (
        "namespace tensile-system (of the Lease tensile-virtual-node-vn-a) does not exist and "
        "this identity may not create it: kubectl create namespace tensile-system (or apply "
        "manifests/vnode/upper-rbac.yaml), or choose with --leader-elect-resource-namespace/"
        "-name"
    )
