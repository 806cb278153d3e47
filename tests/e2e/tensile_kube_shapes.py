"""Lower objects shaped exactly as tensile-kube's virtual node wrote them (facts read from its
source at commit ad40680e: pkg/util/conversions.go TrimPod, pkg/provider/pod.go
createConfigMaps/createSecrets, pkg/controllers/utils.go filterService/filterCommon), for
tests of --adopt-tensile-kube that need no tensile-kube binary.

What it did to an upper object before creating it below: cleared uid, resourceVersion,
selfLink and ownerReferences; a pod kept its name, namespace, labels (plus `virtual-pod:
"true"`, minus --ignore-labels, moved into the `tripped-labels` annotation as JSON, `{}`
when none) and annotations, lost `spec.nodeName`, its status and the `default-token-*`
volumes; copies of ConfigMaps, Secrets, claims, Services and Endpoints got the annotation
`global: "true"`; a Service lost its selector (kept as JSON in the `labelSelector`
annotation) and its clusterIP (unless headless).
"""

from __future__ import annotations

import copy
import json
from typing import Any

_SERVER_FIELDS = ("uid", "resourceVersion", "selfLink", "ownerReferences", "creationTimestamp")


def _trimmed_meta(upper: dict[str, Any]) -> dict[str, Any]:
    meta = copy.deepcopy(upper["metadata"])
    for field in (*_SERVER_FIELDS, "managedFields", "generation"):
        meta.pop(field, None)
    return meta


def pod(upper: dict[str, Any]) -> dict[str, Any]:
    """The lower pod tensile-kube made for `upper` (as read back from the upper cluster)."""
    meta = _trimmed_meta(upper)
    meta.setdefault("labels", {})["virtual-pod"] = "true"
    meta.setdefault("annotations", {})["tripped-labels"] = json.dumps({})
    spec = copy.deepcopy(upper["spec"])
    spec.pop("nodeName", None)
    spec["volumes"] = [
        v for v in spec.get("volumes") or [] if not v["name"].startswith("default-token")
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def copy_of(upper: dict[str, Any]) -> dict[str, Any]:
    """The lower ConfigMap or Secret tensile-kube copied from `upper`."""
    result = {k: copy.deepcopy(v) for k, v in upper.items() if k != "metadata"}
    result["metadata"] = _trimmed_meta(upper)
    result["metadata"].setdefault("annotations", {})["global"] = "true"
    return result


def service(upper: dict[str, Any]) -> dict[str, Any]:
    """The lower Service tensile-kube copied from `upper`."""
    result = copy_of(upper)
    spec = result["spec"]
    selector = spec.pop("selector", None)
    if spec.get("clusterIP") != "None":
        spec.pop("clusterIP", None)
        spec.pop("clusterIPs", None)
    if selector is not None:
        result["metadata"]["annotations"]["labelSelector"] = json.dumps(selector)
    result.pop("status", None)
    return result


def takes_as_its_pod(lower: dict[str, Any], upper: dict[str, Any]) -> bool:
    """Whether tensile-kube's virtual node, started on `upper`'s node, takes the lower pod
    `lower` as the one it made for `upper` (pkg/provider/pod.go GetPods lists the lower pods
    labelled `virtual-pod: "true"`, GetPod finds one by the upper pod's namespace and name;
    nothing else is compared)."""
    labels = lower["metadata"].get("labels") or {}
    return bool(
        labels.get("virtual-pod") == "true"
        and lower["metadata"]["name"] == upper["metadata"]["name"]
        and lower["metadata"]["namespace"] == upper["metadata"]["namespace"]
    )


def takes_as_its_copy(lower: dict[str, Any]) -> bool:
    """Whether tensile-kube's controllers take a lower ConfigMap, Secret, claim or Service
    as a copy they made and may update or collect (pkg/controllers: the `global: "true"`
    annotation)."""
    return (lower["metadata"].get("annotations") or {}).get("global") == "true"
