"""The API objects that make a local metrics-server serve `metrics.k8s.io` in an upper cluster.

The shapes follow metrics-server's own deployment manifests (its README "Deployment"
section) with one difference: metrics-server runs as a local process, not a pod, so its
Service has no selector and its one EndpointSlice, written here, names the process's
address (a 192.0.2.x one: the aggregation layer refuses loopback endpoints). The apiserver
reaches it directly (--enable-aggregator-routing) and verifies its certificate, signed by
the cluster's CA, against the APIService's caBundle. Everything here is pure.
"""

from __future__ import annotations

import base64
from typing import Any

from tensile.contracts.objects import namespace_of

NAMESPACE = "kube-system"
NAME = "metrics-server"
SERVICE_DNS_NAME = f"{NAME}.{NAMESPACE}.svc"
"""The name the aggregation layer verifies the serving certificate for."""
API_SERVICE = "v1beta1.metrics.k8s.io"
ROLE = "system:metrics-server"
_PORT_NAME = "https"


def objects(*, address: str, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Return, in creation order, the objects of a metrics-server at `address:port`.

    `ca_bundle` is the PEM of the CA that signed its serving certificate. The
    ServiceAccount's ClusterRole is what metrics-server needs (read Nodes and Pods, get
    nodes/metrics from kubelets); the two bindings let it check requests the aggregation
    layer passes on (the extension-apiserver-authentication ConfigMap, TokenReview and
    SubjectAccessReview).
    """
    rbac = "rbac.authorization.k8s.io/v1"
    sa_subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": ROLE},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": ROLE,
            },
            "subjects": sa_subject,
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{NAME}:system:auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": sa_subject,
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": f"{NAME}-auth-reader", "namespace": NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": sa_subject,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"k8s-app": NAME}},
            "spec": {"ports": [{"name": _PORT_NAME, "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": NAME,
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": NAME,
                    "endpointslice.kubernetes.io/managed-by": "tensile-devcluster",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": _PORT_NAME, "port": port, "protocol": "TCP"}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": API_SERVICE},
            "spec": {
                "service": {"name": NAME, "namespace": NAMESPACE, "port": 443},
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "caBundle": base64.b64encode(ca_bundle).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


def collection_path(obj: dict[str, Any]) -> str:
    """Return the REST collection path `obj` is created in (for the objects above)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    plural = {
        "ServiceAccount": "serviceaccounts",
        "Service": "services",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "RoleBinding": "rolebindings",
        "EndpointSlice": "endpointslices",
        "APIService": "apiservices",
    }[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    namespace = namespace_of(obj)
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


def token_request(*, seconds: int) -> dict[str, Any]:
    """Return a TokenRequest for the ServiceAccount's token, valid `seconds`."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }


def available(api_service: dict[str, Any]) -> bool:
    """Tell whether an APIService's Available condition is True."""
    for condition in (api_service.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Available":
            return bool(condition.get("status") == "True")
    return False
