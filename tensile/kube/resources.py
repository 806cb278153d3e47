"""API resources and their URL paths (pure)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts.objects import meta_of


@dataclass(frozen=True, kw_only=True)
class Resource:
    """A resource type of the Kubernetes API, e.g. core/v1 pods."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The apiVersion of its objects ("v1", "coordination.k8s.io/v1")."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """Return the URL path of the collection, an object, or an object's subresource.

        A namespaced resource without `namespace` gives the all-namespaces collection.
        Raises ValueError for a subresource without a name, or a namespace on a cluster
        resource.
        """
        if namespace and not self.namespaced:
            raise ValueError(f"{self.plural} is not namespaced")
        if subresource and not name:
            raise ValueError("a subresource needs an object name")
        if name and self.namespaced and not namespace:
            raise ValueError(f"{self.plural} {name!r} needs a namespace")
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if namespace:
            parts.append(f"namespaces/{_quote(namespace)}")
        parts.append(self.plural)
        if name:
            parts.append(_quote(name))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def object_key(obj: Mapping[str, Any]) -> str:
    """Return the cache key of an object: "namespace/name", or "name" for cluster objects."""
    meta = meta_of(obj)
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def split_key(key: str) -> tuple[str | None, str]:
    """Split a cache key into (namespace or None, name)."""
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else (None, namespace)


PODS = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
NODES = Resource(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
NAMESPACES = Resource(
    group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False
)
CONFIG_MAPS = Resource(
    group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True
)
SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)
RESOURCE_QUOTAS = Resource(
    group="", version="v1", plural="resourcequotas", kind="ResourceQuota", namespaced=True
)
SERVICE_ACCOUNTS = Resource(
    group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
)
SERVICES = Resource(group="", version="v1", plural="services", kind="Service", namespaced=True)
ENDPOINT_SLICES = Resource(
    group="discovery.k8s.io",
    version="v1",
    plural="endpointslices",
    kind="EndpointSlice",
    namespaced=True,
)
INGRESSES = Resource(
    group="networking.k8s.io",
    version="v1",
    plural="ingresses",
    kind="Ingress",
    namespaced=True,
)
PERSISTENT_VOLUME_CLAIMS = Resource(
    group="",
    version="v1",
    plural="persistentvolumeclaims",
    kind="PersistentVolumeClaim",
    namespaced=True,
)
PERSISTENT_VOLUMES = Resource(
    group="", version="v1", plural="persistentvolumes", kind="PersistentVolume", namespaced=False
)
STORAGE_CLASSES = Resource(
    group="storage.k8s.io",
    version="v1",
    plural="storageclasses",
    kind="StorageClass",
    namespaced=False,
)
EVENTS = Resource(group="", version="v1", plural="events", kind="Event", namespaced=True)
LEASES = Resource(
    group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
)
POD_DISRUPTION_BUDGETS = Resource(
    group="policy",
    version="v1",
    plural="poddisruptionbudgets",
    kind="PodDisruptionBudget",
    namespaced=True,
)
CERTIFICATE_SIGNING_REQUESTS = Resource(
    group="certificates.k8s.io",
    version="v1",
    plural="certificatesigningrequests",
    kind="CertificateSigningRequest",
    namespaced=False,
)


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases a pod never leaves: it will not run again and holds no resources."""


def pod_is_terminal(pod: Mapping[str, Any]) -> bool:
    """Tell whether `pod` has finished for good (phase Succeeded or Failed).

    A terminal pod holds no resources: kube-scheduler leaves such pods out of a node's
    requested totals, and the kubelet will not restart them.
    """
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
