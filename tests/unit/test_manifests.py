"""What the shipped manifests of the webhook, the descheduler and the virtual node's replicas
manifests/descheduler) say, setting by setting: the availability and hardening of their
Deployments, the webhook's registration, and their RBAC verb by verb (least privilege: any
added right fails here). That the apiserver accepts them is tests/e2e
(`kubectl apply --dry-run=server`); that the programs need nothing more than this RBAC is
tests/e2e too (they run with these accounts' tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from descheduler import policyfile
from descheduler.cli import parse as descheduler_flags
from tensile.contracts import avoidance
from vnode.cli import parse as vnode_flags

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def documents(component: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((MANIFESTS / component).glob("*.yaml")):
        found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def one(component: str, kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [
        d
        for d in documents(component)
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


Grant = tuple[str, str, str, str]
"""(apiGroup, resource, resourceName or "", verb)."""


def grants(role: dict[str, Any]) -> set[Grant]:
    found = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    for verb in rule["verbs"]:
                        found.add((group, resource, name, verb))
    return found


def verbs(*items: str) -> set[Grant]:
    """Grants written as "group/resource[#name]: verb verb ..." ("" group: the core one)."""
    found = set()
    for item in items:
        what, _, listed = item.partition(": ")
        scope, _, name = what.partition("#")
        group, _, resource = scope.partition("/")
        found |= {(group, resource, name, v) for v in listed.split()}
    return found


def bound_to(component: str, kind: str, name: str, account: str) -> None:
    binding = one(component, f"{kind}Binding", name)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": kind,
        "name": name,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "tensile-system"}
    ]


def hardened_deployment(component: str, name: str) -> dict[str, Any]:
    """The Deployment `name`, checked for what both programs' issues require: two replicas,
    probes, resource requests, non-root, a read-only root filesystem. Returns its only
    container."""
    deployment = one(component, "Deployment", name)
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == name
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Never on a virtual node: it must run in the upper cluster itself.
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]} in term[
        "matchExpressions"
    ]
    [container] = pod["containers"]
    assert container["command"] == [f"tensile-{name.removeprefix('tensile-')}"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    return dict(container)


# -- the webhook -------------------------------------------------------------------------------


def test_the_webhook_deployment_is_highly_available_and_hardened() -> None:
    container = hardened_deployment("webhook", "tensile-webhook")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert "--port=8443" in container["args"]
    assert ports == {"https": 8443}
    # The probes ask the HTTPS port, where /readyz fails from SIGTERM on.
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "https"
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    labels = one("webhook", "Deployment")["spec"]["template"]["metadata"]["labels"]
    budget = one("webhook", "PodDisruptionBudget", "tensile-webhook")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one("webhook", "Service", "tensile-webhook")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https"}]


def test_the_webhook_is_registered_for_labelled_pods_outside_kube_system_only() -> None:
    configuration = one("webhook", "MutatingWebhookConfiguration", "tensile-webhook")
    assert configuration["apiVersion"] == "admissionregistration.k8s.io/v1"
    [hook] = configuration["webhooks"]
    assert hook["admissionReviewVersions"][0] == "v1"
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["objectSelector"] == {"matchLabels": {"virtual-pod": "true"}}
    [excluded] = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["key"] == "kubernetes.io/metadata.name"
    assert excluded["operator"] == "NotIn"
    assert {"kube-system", "tensile-system"} <= set(excluded["values"])
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    # The Service above, and no caBundle: the webhook sets the CA it bootstrapped.
    assert hook["clientConfig"] == {
        "service": {
            "name": "tensile-webhook",
            "namespace": "tensile-system",
            "path": "/mutate",
            "port": 443,
        }
    }


def test_the_webhook_rbac_is_what_it_needs_and_nothing_more() -> None:
    assert one("webhook", "ServiceAccount")["metadata"] == {
        "name": "tensile-webhook",
        "namespace": "tensile-system",
    }
    assert grants(one("webhook", "ClusterRole", "tensile-webhook")) == verbs(
        "/nodes: list watch",
        "/persistentvolumeclaims: list watch",
        "admissionregistration.k8s.io/mutatingwebhookconfigurations#tensile-webhook: "
        "get list watch patch",
        # Who may read its /metrics.
        "authentication.k8s.io/tokenreviews: create",
        "authorization.k8s.io/subjectaccessreviews: create",
    )
    role = one("webhook", "Role", "tensile-webhook")
    assert role["metadata"]["namespace"] == "tensile-system"
    assert grants(role) == verbs(
        "/secrets: create",
        "/secrets#tensile-webhook-tls: get update",
        f"/configmaps#{avoidance.DEFAULT_LOCATION[1]}: list watch",
    )
    bound_to("webhook", "ClusterRole", "tensile-webhook", "tensile-webhook")
    bound_to("webhook", "Role", "tensile-webhook", "tensile-webhook")
    # The names the rights are limited to are the ones the Deployment uses.
    args = one("webhook", "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-secret=$(POD_NAMESPACE)/tensile-webhook-tls" in args
    assert "--webhook-configuration=tensile-webhook" in args


# -- the descheduler ---------------------------------------------------------------------------


def test_the_descheduler_deployment_is_highly_available_and_hardened() -> None:
    container = hardened_deployment("descheduler", "tensile-descheduler")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": 10260, "healthz": 10259}
    # /metrics to the network over HTTPS, behind the reviews of its callers.
    assert "--secure-port=10260" in container["args"]
    # Metrics over plain HTTP stay on the pod's loopback; the probes have their own port.
    assert "--metrics-addr=127.0.0.1:10258" in container["args"]
    assert "--healthz-addr=:10259" in container["args"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == 10259
    # Its flags parse; the policy it mounts is a valid DeschedulerPolicy.
    settings, _ = descheduler_flags(
        [a for a in container["args"] if not a.startswith("--policy-config-file")]
    )
    assert (settings.avoid_namespace, settings.avoid_name) == avoidance.DEFAULT_LOCATION
    assert settings.leader_election is not None  # two replicas: one acts
    policy = one("descheduler", "ConfigMap", "tensile-descheduler-policy")
    assert policyfile.parse(policy["data"]["policy.yaml"]).max_pod_lifetime == 600
    [mount] = container["volumeMounts"]
    assert "--policy-config-file=" + mount["mountPath"] + "/policy.yaml" in container["args"]


def test_the_descheduler_rbac_is_what_it_needs_and_nothing_more() -> None:
    assert grants(one("descheduler", "ClusterRole", "tensile-descheduler")) == verbs(
        "/pods: get list watch create patch delete",
        "/pods/eviction: create",
        "/nodes: list watch",
        "policy/poddisruptionbudgets: list watch",
        "/persistentvolumeclaims: list watch",
        "/persistentvolumes: list watch",
        "/events: create patch",
        "authentication.k8s.io/tokenreviews: create",
        "authorization.k8s.io/subjectaccessreviews: create",
    )
    role = one("descheduler", "Role", "tensile-descheduler")
    assert role["metadata"]["namespace"] == "tensile-system"
    assert grants(role) == verbs(
        "coordination.k8s.io/leases#tensile-descheduler: get update",
        "coordination.k8s.io/leases: create",
        f"/configmaps#{avoidance.DEFAULT_LOCATION[1]}: get list watch update",
        "/configmaps: create",
    )
    bound_to("descheduler", "ClusterRole", "tensile-descheduler", "tensile-descheduler")
    bound_to("descheduler", "Role", "tensile-descheduler", "tensile-descheduler")


@pytest.mark.parametrize("component", ["webhook", "descheduler"])
def test_no_rule_grants_a_wildcard(component: str) -> None:
    for document in documents(component):
        for rule in document.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in (rule.get(field) or []), (document["metadata"], rule)


# -- the virtual node's replicas ---------------------------------------------------------------


def test_the_virtual_node_replicas_elect_one_leader_on_different_hosts_through_a_drain() -> None:
    deployment = one("vnode", "Deployment", "tensile-virtual-node")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    labels = spec["selector"]["matchLabels"]
    pod = spec["template"]["spec"]
    # hostNetwork and one kubelet port: never two replicas on one host.
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"] == {"matchLabels": labels}
    budget = one("vnode", "PodDisruptionBudget", "tensile-virtual-node")
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": labels}}
    [container] = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    args = [a.replace("$(POD_IP)", "10.0.0.1") for a in container["args"]]
    election = vnode_flags(args, env={}).leader_election
    assert election is not None  # two replicas: one acts
    assert_election_granted(election.namespace, election.name)


def assert_election_granted(namespace: str, lease: str) -> None:
    """upper-rbac.yaml's election Role lets the node's account keep Lease `lease` and
    create Leases in `namespace` (create cannot be limited to names), and nothing else."""
    role = one("vnode", "Role", "tensile-virtual-node-election")
    assert role["metadata"]["namespace"] == namespace
    assert grants(role) >= verbs(f"coordination.k8s.io/leases#{lease}: get list watch update")
    named = {name for _group, _resource, name, _verb in grants(role) if name}
    assert grants(role) == verbs(
        *(f"coordination.k8s.io/leases#{name}: get list watch update" for name in named),
        "coordination.k8s.io/leases: create",
    )
    bound_to("vnode", "Role", "tensile-virtual-node-election", "tensile-virtual-node")


def test_one_replica_of_the_virtual_node_elects_too() -> None:
    """A stale process of the StatefulSet's node (cut off from the upper cluster) stops
    writing below before its replacement may lead: it runs with --leader-elect, its Lease
    named after its pod, granted by upper-rbac.yaml."""
    statefulset = one("vnode", "StatefulSet", "virtual-kubelet")
    assert statefulset["spec"]["replicas"] == 1
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    pod_name = f"{statefulset['metadata']['name']}-0"
    args = [
        a.replace("$(POD_IP)", "10.0.0.1").replace("$(POD_NAME)", pod_name)
        for a in container["args"]
    ]
    election = vnode_flags(args, env={}).leader_election
    assert election is not None
    assert election.name == f"tensile-virtual-node-{pod_name}"
    assert (election.lease_duration, election.renew_deadline) == (15.0, 10.0)
    assert_election_granted(election.namespace, election.name)
