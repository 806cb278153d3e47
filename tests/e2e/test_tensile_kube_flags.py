"""tensile's programs started the way tensile-kube's were, on the session fleet.

The virtual node with the args of tensile-kube's manifest (`--disable-taint=true`,
`--klog.v=5`, ...; only the paths and ports of this machine put in) registers Ready and
untainted; before, it exited 2 on its first flag. With node-cli's kubelet auth cache flags,
a denial is not cached when the unauthorized TTL is 0 (the default keeps it 30 s).

tensile-descheduler started the way tensile-kube's was (its manifest's args and a
kubeconfig, nothing else), on the session fleet's second upper cluster, where nothing of
tensile's exists (no tensile-system namespace, no RBAC of ours):

- as the cluster's administrator it must act: it makes the namespace of its Lease and
  leads within seconds (before: it retried the Lease forever after one warning);
- with tensile-kube's own ServiceAccount and ClusterRole (which grant neither the
  PodDisruptionBudgets, claims and volumes our caches list nor Leases) it must stop at once
  saying what to do (before: its reflectors retried forever).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster
from devcluster.fleet import Fleet
from devcluster.rest import ApiStatusError
from devcluster.vnodes import VirtualNodeProcess
from tests.e2e.helpers import get, kubelet_request, wait_for

DATA = json.loads((Path(__file__).parents[1] / "data" / "tensile_kube_args.json").read_text())
NAMESPACE = "tensile-system"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/tensile-descheduler"
UPPER = "upper-2"


def _tensile_kube_argv(tmp_path: Path, kubeconfig: Path) -> list[str]:
    (command,) = [c for c in DATA["commands"] if c["program"] == "tensile-descheduler"]
    policy = tmp_path / "policy.yaml"
    policy.write_text(DATA["files"]["/policy-dir/policy.yaml"])
    args = [a.replace("/policy-dir/policy.yaml", str(policy)) for a in command["args"]]
    return [sys.executable, "-m", "descheduler", f"--kubeconfig={kubeconfig}", *args]


@pytest.fixture
def bare_upper(fleet: Fleet) -> Iterator[Cluster]:
    """The second upper cluster without tensile-system (deleted again afterwards)."""
    upper = fleet.cluster(UPPER)
    client = upper.rest()
    _delete_namespace(upper)
    wait_for(
        f"{NAMESPACE} gone from {UPPER}",
        lambda: get(client, f"/api/v1/namespaces/{NAMESPACE}") is None,
        timeout=60,
    )
    yield upper
    _delete_namespace(upper)


def _delete_namespace(upper: Cluster) -> None:
    try:
        upper.rest().request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
    except ApiStatusError as exc:
        if exc.code != 404:
            raise


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_descheduler_started_as_tensile_kube_was_makes_its_namespace_and_leads(
    bare_upper: Cluster, tmp_path: Path
) -> None:
    log = tmp_path / "descheduler.log"
    process = _start(_tensile_kube_argv(tmp_path, bare_upper.kubeconfig), log)
    client = bare_upper.rest()
    try:

        def holder() -> str | None:
            assert process.poll() is None, f"descheduler exited:\n{log.read_text()}"
            lease: dict[str, Any] | None = get(client, LEASE)
            return None if lease is None else lease["spec"].get("holderIdentity")

        wait_for(f"the descheduler to lead\n{log.read_text()}", holder, timeout=20)
        namespace = get(client, f"/api/v1/namespaces/{NAMESPACE}")
        assert namespace is not None
        labels = namespace["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") == "tensile-descheduler"
    finally:
        _stop(process)
    assert f"created namespace {NAMESPACE} for the Lease" in log.read_text()


def _tensile_kube_rbac(upper: Cluster, tmp_path: Path) -> Path:
    """Apply tensile-kube's descheduler RBAC (its ClusterRole, ServiceAccount and binding,
    under names of this test) and return a kubeconfig with a token of that account."""
    rbac = DATA["descheduler_rbac"]
    namespace, account = rbac["service_account"].split("/")
    account = f"{account}-tensile-kube-test"
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": account}, "rules": rbac["cluster_role_rules"]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": account},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ]  # fmt: skip
    upper.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    token = upper.kubectl(
        "create", "token", account, "-n", namespace, "--duration=10m"
    ).stdout.strip()
    path = tmp_path / "tensile-kube-sa.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": upper.server, "certificate-authority": str(upper.ca)},
                    }
                ],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
            }
        )
    )
    return path


def test_descheduler_with_tensile_kube_rbac_stops_at_once_saying_what_to_do(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Its permissions are checked first, whether tensile-system exists or not.
    kubeconfig = _tensile_kube_rbac(fleet.cluster(UPPER), tmp_path)
    log = tmp_path / "descheduler.log"
    started = time.monotonic()
    process = _start(_tensile_kube_argv(tmp_path, kubeconfig), log)
    try:
        code = process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        _stop(process)
        pytest.fail(f"still waiting after 15s:\n{log.read_text()}")
    output = log.read_text()
    assert code == 1, output
    assert time.monotonic() - started < 15
    # tensile-kube's ClusterRole lacks what our caches list (it had no such caches)
    assert "this identity lacks list poddisruptionbudgets.policy, watch poddisruptionbudgets" in (
        output
    )
    assert "list persistentvolumes" in output


def _manifest_args(node: VirtualNodeProcess, lower_kubeconfig: Path) -> list[str]:
    """tensile-kube's virtual-node args, with $(VAR) from its env (the node name ours) and
    its in-image paths and ports replaced by this machine's."""
    (command,) = [c for c in DATA["commands"] if c["source"] == "manifeasts/virtual-node.yaml"]
    env = {**command["env"], "DEFAULT_NODE_NAME": node.name}
    expanded = (re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in command["args"])
    return [
        a.replace("/root/kube.config", str(lower_kubeconfig)).replace(
            ":10455", f"127.0.0.1:{node.metrics_port}"
        )
        for a in expanded
    ]


def test_virtual_node_with_tensile_kube_manifest_args_registers(
    fleet: Fleet, tmp_path: Path
) -> None:
    node = VirtualNodeProcess(fleet, name=f"vn-tk-{secrets.token_hex(3)}", log_dir=tmp_path)
    node.argv.extend(_manifest_args(node, fleet.lower.kubeconfig))
    node.start()
    try:
        found = get(fleet.upper.rest(), f"/api/v1/nodes/{node.name}")
        assert found is not None
        taints = [t["key"] for t in found["spec"].get("taints") or []]
        assert "virtual-kubelet.io/provider" not in taints  # --disable-taint=true
    finally:
        assert node.stop() == 0
        node.delete_node()


def test_a_denial_is_not_cached_with_unauthorized_ttl_zero(
    fleet: Fleet, tmp_path: Path, namespace: str
) -> None:
    node = VirtualNodeProcess(
        fleet, name=f"vn-ttl-{secrets.token_hex(3)}", log_dir=tmp_path,
        args=["--authentication-token-webhook=true",
              "--authorization-webhook-cache-unauthorized-ttl=0"],
    )  # fmt: skip
    role = f"pods-reader-{node.name}"
    fleet.upper.kubectl("create", "serviceaccount", "late", "-n", namespace)
    token = fleet.upper.kubectl("create", "token", "late", "-n", namespace).stdout.strip()
    node.start()
    try:
        assert kubelet_request(fleet, node.kubelet_port, "/pods", token=token)[0] == 403
        fleet.upper.kubectl(
            "create", "clusterrole", role, "--verb=get", "--resource=nodes/pods",
            f"--resource-name={node.name}",
        )  # fmt: skip
        fleet.upper.kubectl(
            "create", "clusterrolebinding", role, f"--clusterrole={role}",
            f"--serviceaccount={namespace}:late",
        )  # fmt: skip
        # With the default (30 s) the 403 would be answered from the cache until then.
        wait_for(
            "the grant to count at once",
            lambda: kubelet_request(fleet, node.kubelet_port, "/pods", token=token)[0] == 200,
            timeout=5,
        )
    finally:
        fleet.upper.kubectl("delete", "clusterrolebinding,clusterrole", role, check=False)
        assert node.stop() == 0
        node.delete_node()
