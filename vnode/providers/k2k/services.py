"""Services and EndpointSlices of the upper cluster, as they are mirrored below (pure).

Every selected upper Service exists below in the mapped namespace with the same type,
ports and session affinity but **no selector**, so the lower EndpointSlice controller
leaves it alone; its endpoints are the upper cluster's EndpointSlices, mirrored below with
`kubernetes.io/service-name` and our own `endpointslice.kubernetes.io/managed-by` value
(the lower EndpointSlice and EndpointSlice-mirroring controllers only touch slices they
manage, discovery.k8s.io/v1 docs "EndpointSlices: Ownership"). A pod below then reaches
any upper Service by its usual DNS name, and the addresses it gets are the pod IPs the
pods' clusters gave them: this works where pod networks are routable between the
clusters (tensile-kube's flat-network assumption, see the README).

Which slices and endpoints travel is decided in `endpointslices` from what the node can
verify, never from a label the slice's writer chooses: a slice goes only beside this upper
cluster's copy of its very Service, and an endpoint only when it is the IP of an upper pod
that Service selects (a selector-less Service's endpoints only when the administrator names
it, --selectorless-services). --endpointslice-managers only narrows which slices are
considered (`ServiceSelection.takes_slice`).

Exposure is the lower administrator's call (issue 22): a copy exists so that pods below
reach the Service, not to open it outside the lower cluster. So a copy is ClusterIP below
unless --lower-service-types names its type (`ServiceExposure`); a Service whose type was
narrowed gets one Event upstairs saying so (`narrowed`). ExternalName is always copied (a
DNS alias inside the tenant's namespace exposes nothing). A NodePort or LoadBalancer copy
the flag allows carries what restricts or places that exposure: `externalTrafficPolicy`,
`loadBalancerSourceRanges`, `loadBalancerClass`, `allocateLoadBalancerNodePorts` and the
upper Service's annotations --lower-service-annotations names (cloud load-balancer
settings such as "internal"; none by default: others pin addresses, pools or subnets of
the lower network, like `loadBalancerIP`; `podpolicy.annotation_allowed`). Their keys are
listed in `COPIED_ANNOTATIONS` so they go again when the upper ones, the type or the
flag's permission go.
When the flag changes, existing copies are patched in place (Kubernetes allows ClusterIP,
NodePort and LoadBalancer to change into each other; the apiserver frees the node ports);
only a changed `loadBalancerClass` (immutable) or a change to or from ExternalName or
headless replaces the copy.

What is left out below, and why:
- `nodePort`/`healthCheckNodePort`: numbers of the upper cluster's nodes; copied they
  collide below (tensile-kube §10.16), also between upper clusters sharing the lower one;
  the lower cluster allocates its own.
- `externalIPs` and `loadBalancerIP`: addresses of the upper cluster's network (and
  `externalIPs` lets a Service capture any address's traffic, CVE-2020-8554).
- the ClusterIP: the lower cluster's own is allocated (a headless Service stays headless);
  it is recorded on the upper Service, one annotation per virtual node.
- `internalTrafficPolicy`, `ipFamilies`/`ipFamilyPolicy`: `Local` would route only to
  endpoints on the lower node itself (mirrored endpoints name no lower node), and the
  families of the upper cluster may not exist below: the lower defaults apply. The same
  holds for an allowed `externalTrafficPolicy: Local`: external traffic then finds no
  local endpoint (it is the tenant's choice, copied as given).
- annotations of a ClusterIP copy; its labels are kept.
- of each endpoint: `nodeName`, `targetRef`, `hints`: they name upper nodes and pods
  (a lower node or pod of the same name is another one); addresses, conditions, hostname
  and zone are kept, so readiness and headless DNS records work below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensile.contracts import ownership, podpolicy
from tensile.contracts.objects import Obj, annotations_of, labels_of, meta_of, name_of, namespace_of
from tensile.kube.mirror.spec import Change, KindSpec, Patch, Replace
from tensile.kube.resources import SERVICES
from vnode.providers.k2k import naming

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label tying an EndpointSlice to its Service (discovery.k8s.io/v1)."""
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
"""On lower EndpointSlices the virtual node mirrors: value `MANAGED_BY`, so the lower
EndpointSlice controllers leave them alone."""
MANAGED_BY = "endpointslice-mirror.tensile.io"
"""Our `managed-by` value: the lower controllers manage only slices with theirs
(`endpointslice-controller.k8s.io`, `endpointslicemirroring-controller.k8s.io`)."""
CLUSTER_IP_ANNOTATION_PREFIX = "cluster-ip.tensile.io/"
"""+ `ownership.label_value(<virtual node>)`: the lower ClusterIP of an upper Service as one
virtual node mirrored it ("None" for a headless one)."""
COPIED_ANNOTATIONS = "tensile.io/copied-annotations"
"""On a lower Service: the comma-separated keys of the upper annotations copied with an
allowed exposure type (so they are removed once they no longer travel)."""
POLICY_ANNOTATION = "tensile.io/policy"
"""On a lower copy of a NodePort or LoadBalancer Service, and of an EndpointSlice of a
selector-less Service: the digest of the settings its maker wrote it under
(--lower-service-types, --lower-service-annotations: `ServiceExposure.policy`;
--selectorless-services: `endpointslices.SelectorlessServices.policy`). A sibling virtual
node under other settings leaves the copy to its maker instead of writing it its own way
(`sibling_conflict`)."""
CLUSTER_IP = "ClusterIP"
NODE_PORT = "NodePort"
LOAD_BALANCER = "LoadBalancer"
EXTERNAL_NAME = "ExternalName"
_EXPOSING = frozenset({NODE_PORT, LOAD_BALANCER})
_EXPOSURE_FIELDS = {
    NODE_PORT: ("externalTrafficPolicy",),
    LOAD_BALANCER: (
        "externalTrafficPolicy",
        "loadBalancerSourceRanges",
        "loadBalancerClass",
        "allocateLoadBalancerNodePorts",
    ),
}
"""The exposure fields that travel with an allowed type."""
_ALL_EXPOSURE_FIELDS = ("healthCheckNodePort", *_EXPOSURE_FIELDS[LOAD_BALANCER])
# Annotations of the upper Service that are never copied: kubectl's record of the applied
# object, and what virtual nodes write on it.
_UNCOPIED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
_SKIPPED_NAMESPACES = frozenset({"kube-system"})
# The upper apiserver's own Service: below, `default/kubernetes` is the lower apiserver's.
_SKIPPED_SERVICES = frozenset({("default", "kubernetes")})
_PORT_FIELDS = ("name", "protocol", "port", "targetPort", "appProtocol")
_SLICE_PORT_FIELDS = ("name", "protocol", "port", "appProtocol")
_ENDPOINT_FIELDS = ("addresses", "conditions", "hostname", "zone")


@dataclass(frozen=True, kw_only=True)
class ServiceSelection:
    """Which upper Services (and so EndpointSlices) are mirrored."""

    namespaces: frozenset[str] = frozenset()
    """--service-namespaces: only these upper namespaces (empty: all but kube-system)."""
    slice_managers: frozenset[str] = frozenset()
    """--endpointslice-managers: only upper EndpointSlices whose managed-by label is one of
    these are considered (empty: all). It narrows, it grants no trust: the label is the
    slice writer's choice."""

    def covers(self, namespace: str, name: str) -> bool:
        """Tell whether the Service `namespace/name` is mirrored: never kube-system's or
        the upper apiserver's own `default/kubernetes`."""
        if namespace in _SKIPPED_NAMESPACES or (namespace, name) in _SKIPPED_SERVICES:
            return False
        return not self.namespaces or namespace in self.namespaces

    def takes_slice(self, endpoint_slice: Mapping[str, Any]) -> bool:
        """Tell whether the upper EndpointSlice `endpoint_slice` is considered at all: one
        of a mirrored Service, with a managed-by label --endpointslice-managers names (when
        it names any). Whether it is copied, and which of its endpoints, is
        `endpointslices.judge`'s: the label proves nothing (its writer chooses it)."""
        labels = labels_of(endpoint_slice)
        service = labels.get(SERVICE_NAME_LABEL)
        namespace = namespace_of(endpoint_slice)
        if not service or not self.covers(namespace, str(service)):
            return False
        return not self.slice_managers or labels.get(MANAGED_BY_LABEL) in self.slice_managers


@dataclass(frozen=True, kw_only=True)
class ServiceExposure:
    """Which Service types the lower cluster takes as they are (--lower-service-types), and
    which annotations go with them (--lower-service-annotations)."""

    types: frozenset[str] = frozenset({CLUSTER_IP})
    """Types copied as they are, with their exposure fields; ClusterIP always."""
    annotations: tuple[str, ...] = ()
    """Annotation keys, or prefixes ending in `*` (`*`: all), copied onto a copy of an
    allowed exposing type (`podpolicy.annotation_allowed`); none by default."""

    @property
    def policy(self) -> str:
        """The digest of these settings (`podpolicy.digest`), recorded on the copies they
        decide (`POLICY_ANNOTATION`)."""
        return podpolicy.digest({"types": self.types, "annotations": frozenset(self.annotations)})

    def decides(self, upper: Mapping[str, Any]) -> bool:
        """Tell whether these settings decide the copy of `upper`: a NodePort or
        LoadBalancer (other types are copied alike under any)."""
        return str((upper.get("spec") or {}).get("type") or CLUSTER_IP) in _EXPOSING

    def lower_type(self, upper: Mapping[str, Any]) -> str:
        """Return the type of the lower copy of the upper Service `upper`: its own when
        allowed (or ExternalName), else ClusterIP."""
        upper_type = str((upper.get("spec") or {}).get("type") or CLUSTER_IP)
        if upper_type == EXTERNAL_NAME or upper_type in self.types:
            return upper_type
        return CLUSTER_IP

    def narrowed(self, upper: Mapping[str, Any], *, node_name: str) -> str | None:
        """Return the message of the Event telling that the copy of `upper` below is
        ClusterIP although it asked for more, or None when its type travels."""
        upper_type = str((upper.get("spec") or {}).get("type") or CLUSTER_IP)
        if self.lower_type(upper) == upper_type:
            return None
        allowed = ",".join(sorted(self.types))
        return (
            f"the lower cluster of virtual node {node_name} takes Services of type "
            f"{upper_type} as ClusterIP (--lower-service-types={allowed}): pods there reach "
            "this Service, nothing outside that cluster does"
        )


def cluster_ip_annotation(node_name: str) -> str:
    """Return the annotation on upper Services that records `node_name`'s lower ClusterIP
    (an annotation name part is at most 63 characters: longer node names are hashed)."""
    return CLUSTER_IP_ANNOTATION_PREFIX + ownership.label_value(node_name)


def _marks(
    upper: Mapping[str, Any], *, owner: ownership.NodeIdentity
) -> tuple[dict[str, str], dict[str, str]]:
    meta = meta_of(upper)
    labels, annotations = ownership.owner_marks(owner)
    annotations[ownership.UPPER_NAMESPACE_ANNOTATION] = str(meta.get("namespace"))
    annotations[ownership.UPPER_UID_ANNOTATION] = str(meta.get("uid"))
    return labels, annotations


def _ports(ports: Any, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{f: p[f] for f in fields if p.get(f) is not None} for p in ports or []]


def is_headless(service: Mapping[str, Any]) -> bool:
    """Tell whether a Service is headless (clusterIP None)."""
    return (service.get("spec") or {}).get("clusterIP") == "None"


def lower_service(
    upper: Mapping[str, Any],
    *,
    owner: ownership.NodeIdentity,
    prefix: str,
    exposure: ServiceExposure = ServiceExposure(),
) -> Obj:
    """Return the lower Service standing for an upper one (see the module docstring)."""
    meta = meta_of(upper)
    spec = upper.get("spec") or {}
    labels, annotations = _marks(upper, owner=owner)
    lower_spec: dict[str, Any] = {"type": exposure.lower_type(upper)}
    ports = _ports(spec.get("ports"), _PORT_FIELDS)
    if ports:
        lower_spec["ports"] = ports
    if is_headless(upper):
        lower_spec["clusterIP"] = "None"
    for field in ("sessionAffinity", "sessionAffinityConfig", "publishNotReadyAddresses"):
        if spec.get(field) is not None:
            lower_spec[field] = spec[field]
    if lower_spec["type"] == EXTERNAL_NAME:
        lower_spec["externalName"] = spec.get("externalName")
    if exposure.decides(upper):
        annotations[POLICY_ANNOTATION] = exposure.policy
    if lower_spec["type"] in _EXPOSING:
        for field in _EXPOSURE_FIELDS[lower_spec["type"]]:
            if spec.get(field) is not None:
                lower_spec[field] = spec[field]
        copied = {
            k: v
            for k, v in (meta.get("annotations") or {}).items()
            if k not in annotations
            and k not in _UNCOPIED_ANNOTATIONS
            and not k.startswith(CLUSTER_IP_ANNOTATION_PREFIX)
            and k not in (COPIED_ANNOTATIONS, POLICY_ANNOTATION)
            and podpolicy.annotation_allowed(k, exposure.annotations)
        }
        annotations = {**copied, **annotations}
        if copied:
            annotations[COPIED_ANNOTATIONS] = ",".join(sorted(copied))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": meta.get("name"),
            "namespace": naming.lower_namespace(str(meta.get("namespace")), prefix=prefix),
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": annotations,
        },
        "spec": lower_spec,
    }


def _service_view(service: Mapping[str, Any]) -> dict[str, Any]:
    """What of a Service's spec we keep equal, with the apiserver's defaults filled in (so
    a lower Service is not 'different' only because the apiserver defaulted it)."""
    spec = service.get("spec") or {}
    ports = []
    for port in spec.get("ports") or []:
        ports.append(
            {
                "name": port.get("name") or "",
                "protocol": port.get("protocol") or "TCP",
                "port": port.get("port"),
                "targetPort": port.get("targetPort", port.get("port")),
                "appProtocol": port.get("appProtocol"),
            }
        )
    affinity = spec.get("sessionAffinity") or "None"
    service_type = spec.get("type") or CLUSTER_IP
    exposing = service_type in _EXPOSING
    balancing = service_type == LOAD_BALANCER
    return {
        "externalTrafficPolicy": (spec.get("externalTrafficPolicy") or "Cluster")
        if exposing
        else None,
        "loadBalancerSourceRanges": sorted(spec.get("loadBalancerSourceRanges") or [])
        if balancing
        else [],
        "loadBalancerClass": spec.get("loadBalancerClass") if balancing else None,
        "allocateLoadBalancerNodePorts": spec.get("allocateLoadBalancerNodePorts", True)
        if balancing
        else None,
        "ports": ports,
        "sessionAffinity": affinity,
        "sessionAffinityConfig": spec.get("sessionAffinityConfig") if affinity != "None" else None,
        "publishNotReadyAddresses": bool(spec.get("publishNotReadyAddresses")),
        "externalName": spec.get("externalName"),
    }


def _metadata_patch(lower: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch of labels (exactly the desired ones) and of our annotations."""
    current_meta = meta_of(lower)
    desired_meta = meta_of(desired)
    patch: dict[str, Any] = {}
    current_labels = current_meta.get("labels") or {}
    desired_labels = desired_meta.get("labels") or {}
    if current_labels != desired_labels:
        patch["labels"] = {
            **{k: None for k in current_labels if k not in desired_labels},
            **desired_labels,
        }
    current_annotations = current_meta.get("annotations") or {}
    wanted = desired_meta.get("annotations") or {}
    # Upper annotations copied before and no longer wanted (their upper key went, or the
    # type no longer travels) are removed; the lower cluster's own are left alone.
    stale = {
        k: None
        for k in str(current_annotations.get(COPIED_ANNOTATIONS) or "").split(",")
        if k and k in current_annotations and k not in wanted
    }
    for own in (COPIED_ANNOTATIONS, POLICY_ANNOTATION):
        if own in current_annotations and own not in wanted:
            stale[own] = None
    if stale or any(current_annotations.get(k) != v for k, v in wanted.items()):
        patch["annotations"] = {**stale, **wanted}
    return patch


def compare_service(lower: Mapping[str, Any], desired: Mapping[str, Any]) -> Change:
    """Return how to bring a lower Service to `desired` (pure): a replacement when it
    turns to or from ExternalName or headless, or its loadBalancerClass changes (none can
    be patched in place), else a merge patch of what differs, or None. A change between
    ClusterIP, NodePort and LoadBalancer is patched in place, with the exposure fields the
    new type does not have set to null and the ports sent without node ports (the apiserver
    releases them); otherwise node ports the lower cluster allocated are kept."""
    lower_type = (lower.get("spec") or {}).get("type") or CLUSTER_IP
    desired_type = desired["spec"]["type"]
    if lower_type != desired_type and EXTERNAL_NAME in (lower_type, desired_type):
        return Replace(f"type {lower_type} -> {desired_type}")
    if is_headless(lower) != is_headless(desired):
        return Replace("headless changed")
    current, wanted = _service_view(lower), _service_view(desired)
    if (
        lower_type == desired_type == LOAD_BALANCER
        and current["loadBalancerClass"] != wanted["loadBalancerClass"]
    ):
        return Replace("loadBalancerClass changed")
    patch: dict[str, Any] = {}
    meta = _metadata_patch(lower, desired)
    if meta:
        patch["metadata"] = meta
    spec = _spec_patch(lower, desired, current=current, wanted=wanted)
    if spec:
        patch["spec"] = spec
    return Patch(patch) if patch else None


def _spec_patch(
    lower: Mapping[str, Any],
    desired: Mapping[str, Any],
    *,
    current: Mapping[str, Any],
    wanted: Mapping[str, Any],
) -> dict[str, Any]:
    """The spec part of `compare_service`'s patch (`current`, `wanted`: their views)."""
    lower_type = (lower.get("spec") or {}).get("type") or CLUSTER_IP
    desired_type = desired["spec"]["type"]
    spec: dict[str, Any] = {}
    if lower_type != desired_type:
        spec["type"] = desired_type
        spec.update({f: desired["spec"].get(f) for f in _ALL_EXPOSURE_FIELDS})
        if desired_type == CLUSTER_IP:
            spec["ports"] = [dict(p) for p in desired["spec"].get("ports") or []]
    else:
        for field in _ALL_EXPOSURE_FIELDS[1:]:
            if current[field] != wanted[field]:
                spec[field] = desired["spec"].get(field)
    if "ports" not in spec and current["ports"] != wanted["ports"]:
        node_ports = {
            (p.get("port"), p.get("protocol") or "TCP"): p["nodePort"]
            for p in (lower.get("spec") or {}).get("ports") or []
            if p.get("nodePort")
        }
        ports = []
        for port in desired["spec"].get("ports") or []:
            node_port = node_ports.get((port.get("port"), port.get("protocol") or "TCP"))
            ports.append({**port, "nodePort": node_port} if node_port else dict(port))
        spec["ports"] = ports
    for field in ("sessionAffinity", "sessionAffinityConfig", "publishNotReadyAddresses"):
        if current[field] != wanted[field]:
            spec[field] = desired["spec"].get(field)
    if current["externalName"] != wanted["externalName"]:
        spec["externalName"] = desired["spec"].get("externalName")
    return spec


def report_cluster_ip(node_name: str) -> Callable[[Obj, Obj], Obj | None]:
    """Return the `KindSpec.report` function recording the lower ClusterIP on the upper
    Service under `cluster_ip_annotation(node_name)` (ExternalName Services have none)."""
    key = cluster_ip_annotation(node_name)

    def report(upper: Obj, lower: Obj) -> Obj | None:
        ip = (lower.get("spec") or {}).get("clusterIP")
        if not ip:
            return None
        if annotations_of(upper).get(key) == ip:
            return None
        return {"metadata": {"annotations": {key: ip}}}

    return report


def siblings_within(
    selection: ServiceSelection, *, service_of: Callable[[Obj], Any]
) -> Callable[[str, Obj], bool]:
    """Return `KindSpec.keeps_siblings` of the Service and slice mirrors: a lower copy
    another virtual node of the same upper cluster made is kept (in its name: that node may
    be gone) when this node's selection covers its Service too; a node with a narrower
    --service-namespaces leaves the others' copies outside it alone."""

    def keeps(key: str, lower: Obj) -> bool:
        return selection.covers(key.partition("/")[0], str(service_of(lower)))

    return keeps


def _other_policy(exposure: ServiceExposure) -> Callable[[Obj, Obj], str | None]:
    """Return `KindSpec.sibling_conflict` of the Service mirror: a sibling's copy of a
    Service `exposure` decides (NodePort, LoadBalancer) that records other settings than
    `exposure`'s (`POLICY_ANNOTATION`, or none: written before it was recorded) is its
    maker's to write; written ours, the two nodes would turn it back and forth."""
    ours = exposure.policy

    def conflict(lower: Obj, upper: Obj) -> str | None:
        theirs = annotations_of(lower).get(POLICY_ANNOTATION)
        if not exposure.decides(upper) or theirs == ours:
            return None
        return (
            f"written under another policy ({POLICY_ANNOTATION} {theirs or '(none)'}, this "
            f"node's {ours}: --lower-service-types, --lower-service-annotations); the "
            "virtual nodes of one upper cluster over one lower cluster need the same "
            "policy flags"
        )

    return conflict


def service_spec(
    *,
    tenancy: naming.NodeTenancy,
    selection: ServiceSelection,
    exposure: ServiceExposure = ServiceExposure(),
) -> KindSpec:
    """Return the mirror of upper Services into the lower cluster (pure; see the module
    docstring). A lower Service of the same name that another virtual node of the same
    upper cluster made serves as the copy and is kept like our own (`siblings_within`),
    unless it was written under another exposure policy (`_other_policy`): then it is left
    to its maker.
    A Service whose type `exposure` narrows gets one notice (`ServiceExposure.narrowed`)."""
    owner, prefix = tenancy.owner, tenancy.prefix

    def selects(upper: Obj) -> bool:
        # A Service being deleted (held by a finalizer, e.g. a load balancer's cleanup, or
        # its namespace going) no longer serves upstairs: its copy goes too.
        meta = meta_of(upper)
        return not meta.get("deletionTimestamp") and selection.covers(
            str(meta.get("namespace")), str(meta.get("name"))
        )

    return KindSpec(
        name="services_to_lower",
        kind="Service",
        source=SERVICES,
        target=SERVICES,
        selects=selects,
        translate=lambda upper: lower_service(upper, owner=owner, prefix=prefix, exposure=exposure),
        compare=compare_service,
        notice=lambda upper: exposure.narrowed(upper, node_name=owner.node_name),
        collectable=lambda _lower, upper: upper is None,
        keeps_siblings=siblings_within(selection, service_of=name_of),
        sibling_conflict=_other_policy(exposure),
        report=report_cluster_ip(owner.node_name),
    )


def lower_slice(
    upper: Mapping[str, Any],
    *,
    owner: ownership.NodeIdentity,
    prefix: str,
    endpoints: Sequence[Mapping[str, Any]] | None = None,
    policy: str | None = None,
) -> Obj:
    """Return the lower EndpointSlice standing for an upper one (see the module docstring),
    with `endpoints` of it (those that cross, `endpointslices.judge`; None: all of them)
    and, when given, the digest of the `policy` it was written under
    (`POLICY_ANNOTATION`)."""
    meta = meta_of(upper)
    labels, annotations = _marks(upper, owner=owner)
    if policy is not None:
        annotations[POLICY_ANNOTATION] = policy
    chosen = (upper.get("endpoints") or []) if endpoints is None else endpoints
    kept = [{f: e[f] for f in _ENDPOINT_FIELDS if e.get(f) is not None} for e in chosen]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": meta.get("name"),
            "namespace": naming.lower_namespace(str(meta.get("namespace")), prefix=prefix),
            "labels": {**(meta.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY, **labels},
            "annotations": annotations,
        },
        "addressType": upper.get("addressType"),
        "endpoints": kept,
        "ports": _ports(upper.get("ports"), _SLICE_PORT_FIELDS),
    }


def _slice_view(endpoint_slice: Mapping[str, Any]) -> tuple[Any, Any]:
    endpoints = [
        {f: e[f] for f in _ENDPOINT_FIELDS if e.get(f) is not None}
        for e in endpoint_slice.get("endpoints") or []
    ]
    return endpoints, _ports(endpoint_slice.get("ports"), _SLICE_PORT_FIELDS)


def compare_slice(lower: Mapping[str, Any], desired: Mapping[str, Any]) -> Change:
    """Return how to bring a lower EndpointSlice to `desired` (pure): a replacement when
    its addressType changed (immutable), else a merge patch replacing the endpoints and
    ports lists and the labels that differ, or None."""
    if lower.get("addressType") != desired.get("addressType"):
        return Replace("addressType changed")
    patch: dict[str, Any] = {}
    meta = _metadata_patch(lower, desired)
    if meta:
        patch["metadata"] = meta
    current_endpoints, current_ports = _slice_view(lower)
    wanted_endpoints, wanted_ports = _slice_view(desired)
    if current_endpoints != wanted_endpoints:
        patch["endpoints"] = desired.get("endpoints") or []
    if current_ports != wanted_ports:
        patch["ports"] = desired.get("ports") or []
    return Patch(patch) if patch else None
