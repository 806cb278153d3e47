"""The mirror of upper EndpointSlices into the lower cluster, and what of them crosses (pure).

A lower EndpointSlice labelled `kubernetes.io/service-name: S` gives its addresses to
whatever lower Service `S` of its namespace is (kube-proxy and the lower DNS read slices
by that label alone), so a copy below decides where lower traffic goes. What the node
copies is therefore decided from what it can verify, never from a label the slice's
writer chooses (`endpointslice.kubernetes.io/managed-by` is one: anyone allowed to write
EndpointSlices upstairs writes the EndpointSlice controller's name, the population of
CVE-2021-25740):

- a slice crosses, and stays, only beside this upper cluster's copy of its very Service:
  the lower Service of that name carries the ownership marks of this node or of a sibling
  (another virtual node of the same upper cluster whose copy of the same Service serves),
  and records the UID of the upper Service the slice belongs to (`ownership.upper_uid_of`).
  When the Service copy is refused (the lower Service is someone else's, e.g. the lower
  cluster's own), the slices do not cross and the copies already below are deleted;
- an endpoint crosses only when its `targetRef` is an upper Pod of the slice's namespace
  (of the UID it names, when it names one) that the Service's selector selects, and every
  address of the endpoint is one of that pod's IPs (`status.podIPs`): the pods this node
  forwarded, or any other pod of the upper cluster the Service selects (on sibling virtual
  nodes, on the upper cluster's own nodes). That is what the upper EndpointSlice controller
  writes (pkg/controller/endpointslice: one endpoint per selected pod, its IPs, a targetRef
  to it), so its slices cross whole; anything else is dropped and the slice gets one Event
  naming what and why (`dropped_message`);
- a selector-less Service selects no pod: its slices are written by hand (or by the
  EndpointSlice-mirroring controller from a hand-written Endpoints object), so their
  addresses are their writer's choice. They cross, as written, only for the Services the
  node's administrator names (--selectorless-services, `SelectorlessServices`): a flag,
  because only the administrator of the lower cluster may vouch for addresses of the lower
  network; an annotation would be the tenant's to write.

The decision reads three caches through read-only views (`Caches`): the upper Services,
the lower copies of this upper cluster's Services, and the upper pods (slimmed by
`slim_upper_pod`). When they change, the assembly revisits the slices concerned
(`service_of_slice`, `pods_of_slice`, `pod_changed`), and the patrol compares every slice
with the same decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tensile.contracts import ownership, podpolicy
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    deletion_timestamp_of,
    labels_of,
    meta_of,
    name_of,
    namespace_of,
    uid_of,
)
from tensile.kube.mirror.spec import KindSpec
from tensile.kube.resources import ENDPOINT_SLICES
from vnode.providers.k2k import naming, services

ALL_SERVICES = "*"
"""As the name in --selectorless-services NAMESPACE/*: every selector-less Service of the
namespace."""
NOTICE_SETTLE = 5.0
"""Seconds a slice's dropped endpoints must stay the same before its Event is written: an
endpoint whose pod the upper pod cache has not shown yet (the EndpointSlice controller
and this node watch the same pod change) is verified a moment later and told nothing."""
_MENTIONED = 5
"""Dropped endpoints named in one Event; more are counted."""


class Lookup(Protocol):
    """A read-only view of one cache: the object of a key ("namespace/name"), or None (an
    informer's `Store`, or a dict in a test)."""

    def get(self, key: str, /) -> Obj | None:
        """The object of `key`, or None."""


@dataclass(frozen=True, kw_only=True)
class Caches:
    """What the decision reads besides the slice (read-only)."""

    upper_services: Lookup
    """The upper Services, by upper key."""
    service_copies: Lookup
    """The lower Services of this upper cluster (its virtual nodes' marks), by lower key."""
    upper_pods: Lookup
    """The upper pods not in a terminal phase, as `slim_upper_pod` keeps them, by key."""


@dataclass(frozen=True, kw_only=True)
class SelectorlessServices:
    """--selectorless-services: the selector-less upper Services whose endpoints the lower
    cluster's administrator vouches for; their slices cross as written."""

    names: frozenset[tuple[str, str]] = frozenset()
    """(namespace, Service name or `ALL_SERVICES`) pairs."""

    def named(self, namespace: str, name: str) -> bool:
        """Tell whether the Service `namespace/name` is named (itself, or its namespace)."""
        return (namespace, name) in self.names or (namespace, ALL_SERVICES) in self.names

    @property
    def policy(self) -> str:
        """The digest of these names (`podpolicy.digest`), recorded on the copies of the
        slices of selector-less Services (`services.POLICY_ANNOTATION`): the only slices
        whose copy this flag decides."""
        return podpolicy.digest({"selectorless": self.names})


@dataclass(frozen=True)
class Dropped:
    """An endpoint that does not cross: its addresses and why."""

    addresses: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Verdict:
    """What of one upper EndpointSlice crosses."""

    crosses: bool
    """Whether the slice is copied at all (False: no copy, and one below is deleted)."""
    endpoints: tuple[Mapping[str, Any], ...] = ()
    """The endpoints that cross, as the upper slice has them."""
    dropped: tuple[Dropped, ...] = ()
    """The endpoints that do not, with why."""
    selectorless: bool = False
    """Whether the slice's Service has no selector: what crosses of it is then decided by
    --selectorless-services, and its copy records that flag's digest."""


_NOT_COPIED = Verdict(crosses=False)
_SELECTORLESS = "the Service has no selector and --selectorless-services does not name it"


def copy_serves(
    copy: Mapping[str, Any] | None,
    *,
    upper_service: Mapping[str, Any],
    tenancy: naming.NodeTenancy,
) -> bool:
    """Tell whether the lower Service `copy` (None: there is none) is this upper cluster's
    copy of `upper_service`: it carries this node's ownership marks, or a sibling's made
    for the same upper key, and records the upper Service's UID."""
    if copy is None:
        return False
    key = f"{namespace_of(upper_service)}/{name_of(upper_service)}"
    ours = tenancy.owned(copy) or (tenancy.same_tenant(copy) and tenancy.source_key(copy) == key)
    return ours and ownership.upper_uid_of(copy) == uid_of(upper_service)


def selects_pods(service: Mapping[str, Any], *, selection: services.ServiceSelection) -> bool:
    """Tell whether the endpoints of an upper Service's slices are checked against upper
    pods: it is mirrored (`selection.covers`) and selects pods (a non-empty
    `spec.selector`; a selector-less Service's slices name no pod `judge` reads). Only the
    namespaces of such Services have their upper pods cached."""
    meta = service.get("metadata") or {}
    return selection.covers(str(meta.get("namespace", "")), str(meta.get("name", ""))) and bool(
        (service.get("spec") or {}).get("selector")
    )


def selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """Tell whether a Service's `spec.selector` (equality on every key, core/v1 ServiceSpec)
    selects a pod of `labels`; an empty selector selects none (a selector-less Service)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ips(pod: Mapping[str, Any]) -> frozenset[str]:
    """Return the IPs of a pod: `status.podIPs`, or the older `status.podIP`."""
    status = pod.get("status") or {}
    ips = {p["ip"] for p in status.get("podIPs") or () if isinstance(p, dict) and p.get("ip")}
    if status.get("podIP"):
        ips.add(status["podIP"])
    return frozenset(str(ip) for ip in ips)


def judge(
    upper_slice: Mapping[str, Any],
    *,
    caches: Caches,
    tenancy: naming.NodeTenancy,
    selectorless: SelectorlessServices,
) -> Verdict:
    """Return what of `upper_slice` crosses (see the module docstring). Reads `caches`;
    raises nothing on a malformed object (what cannot be verified does not cross)."""
    namespace = namespace_of(upper_slice)
    service_name = labels_of(upper_slice).get(services.SERVICE_NAME_LABEL)
    if not isinstance(service_name, str) or not service_name:
        return _NOT_COPIED
    key = f"{namespace}/{service_name}"
    upper_service = caches.upper_services.get(key)
    if upper_service is None or deletion_timestamp_of(upper_service):
        return _NOT_COPIED
    copy = caches.service_copies.get(tenancy.target_key(key))
    if not copy_serves(copy, upper_service=upper_service, tenancy=tenancy):
        return _NOT_COPIED
    endpoints = [e for e in upper_slice.get("endpoints") or () if isinstance(e, dict)]
    selector = (upper_service.get("spec") or {}).get("selector") or {}
    if not selector:
        if selectorless.named(namespace, service_name):
            return Verdict(crosses=True, endpoints=tuple(endpoints), selectorless=True)
        return Verdict(
            crosses=True,
            dropped=tuple(Dropped(_addresses(e), _SELECTORLESS) for e in endpoints),
            selectorless=True,
        )
    kept: list[Mapping[str, Any]] = []
    dropped: list[Dropped] = []
    for endpoint in endpoints:
        reason = _unverified(endpoint, namespace=namespace, selector=selector, caches=caches)
        if reason is None:
            kept.append(endpoint)
        else:
            dropped.append(Dropped(_addresses(endpoint), reason))
    return Verdict(crosses=True, endpoints=tuple(kept), dropped=tuple(dropped))


def _addresses(endpoint: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(a) for a in endpoint.get("addresses") or ())


def _unverified(  # noqa: PLR0911 - one reason per check
    endpoint: Mapping[str, Any],
    *,
    namespace: str,
    selector: Mapping[str, Any],
    caches: Caches,
) -> str | None:
    """Return why `endpoint` of a slice of `namespace` does not cross, or None when it is
    the IP of an upper pod the Service's `selector` selects."""
    ref = endpoint.get("targetRef")
    if not isinstance(ref, dict) or ref.get("kind") != "Pod" or not ref.get("name"):
        return "its targetRef names no Pod"
    name = str(ref["name"])
    if ref.get("namespace") not in (None, "", namespace):
        return f"its targetRef names Pod {ref.get('namespace')}/{name} of another namespace"
    pod = caches.upper_pods.get(f"{namespace}/{name}")
    if pod is None:
        return f"no running Pod {name} upstairs"
    if ref.get("uid") and ref["uid"] != uid_of(pod):
        return f"Pod {name} is not the one its targetRef names (another UID)"
    if not selects(selector, labels_of(pod)):
        return f"the Service does not select Pod {name}"
    addresses = _addresses(endpoint)
    if not addresses or not set(addresses) <= pod_ips(pod):
        return f"not an IP of Pod {name}"
    return None


def dropped_message(verdict: Verdict, *, node_name: str) -> str | None:
    """Return the message of the Event on an upper slice some of whose endpoints do not
    cross, or None when all do (or the slice does not cross at all)."""
    if not verdict.crosses or not verdict.dropped:
        return None
    told = [
        f"{','.join(d.addresses) or '(no address)'} ({d.reason})"
        for d in verdict.dropped[:_MENTIONED]
    ]
    more = len(verdict.dropped) - _MENTIONED
    if more > 0:
        told.append(f"and {more} more")
    return (
        f"endpoints not copied to the lower cluster of virtual node {node_name}: "
        f"{'; '.join(told)}. Only IPs of upper pods the Service selects cross (a "
        "selector-less Service's endpoints only when --selectorless-services names it)"
    )


def slice_spec(
    *,
    tenancy: naming.NodeTenancy,
    selection: services.ServiceSelection,
    selectorless: SelectorlessServices,
    caches: Caches,
    notice_settle: float = NOTICE_SETTLE,
) -> KindSpec:
    """Return the mirror of upper EndpointSlices into the lower cluster: the slices of
    every mirrored Service that `selection` considers and `judge` lets cross, each with
    the endpoints that cross; what is dropped is told after `notice_settle` seconds
    (`dropped_message`); a sibling's copy is kept like our own (`services.siblings_within`),
    unless it is the slice of a selector-less Service written under other
    --selectorless-services (then it is left to its maker).
    Its functions read `caches` as they are when called."""
    owner, prefix = tenancy.owner, tenancy.prefix

    def judged(upper: Obj) -> Verdict:
        return judge(upper, caches=caches, tenancy=tenancy, selectorless=selectorless)

    def chosen(upper: Obj) -> bool:
        return selection.takes_slice(upper) and judged(upper).crosses

    def translate(upper: Obj) -> Obj:
        verdict = judged(upper)
        return services.lower_slice(
            upper,
            owner=owner,
            prefix=prefix,
            endpoints=verdict.endpoints,
            policy=selectorless.policy if verdict.selectorless else None,
        )

    def other_policy(lower: Obj, upper: Obj) -> str | None:
        # Siblings named different selector-less Services would copy such a slice whole
        # and empty in turn: the copy is left to the node whose names it records.
        theirs = annotations_of(lower).get(services.POLICY_ANNOTATION)
        if not judged(upper).selectorless or theirs == selectorless.policy:
            return None
        return (
            f"written under another policy ({services.POLICY_ANNOTATION} {theirs or '(none)'}, "
            f"this node's {selectorless.policy}: --selectorless-services); the virtual nodes "
            "of one upper cluster over one lower cluster need the same policy flags"
        )

    return KindSpec(
        name="endpointslices_to_lower",
        kind="EndpointSlice",
        source=ENDPOINT_SLICES,
        target=ENDPOINT_SLICES,
        selects=chosen,
        translate=translate,
        compare=services.compare_slice,
        notice=lambda upper: dropped_message(judged(upper), node_name=owner.node_name),
        notice_settle=notice_settle,
        collectable=lambda _lower, upper: upper is None,
        keeps_siblings=services.siblings_within(
            selection,
            service_of=lambda lower: labels_of(lower).get(services.SERVICE_NAME_LABEL),
        ),
        sibling_conflict=other_policy,
    )


# -- what the assembly needs to revisit slices ------------------------------------------------

UPPER_POD_FIELD_SELECTOR = "status.phase!=Failed,status.phase!=Succeeded"
"""The upper pods that may be endpoints: the EndpointSlice controller leaves out pods in a
terminal phase (pkg/api/v1/endpoints ShouldPodBeInEndpoints), and so does this cache."""


def slim_upper_pod(pod: Obj) -> Obj:
    """Return what the upper pod cache keeps of a pod (a new object): its key, UID and
    resourceVersion (the watch resumes from it), its labels and its IPs. About 360 bytes
    a pod in an encoded store."""
    meta = meta_of(pod)
    status = pod.get("status") or {}
    slim_status = {k: status[k] for k in ("podIP", "podIPs") if status.get(k)}
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "labels")
            if k in meta
        },
        "status": slim_status,
    }


def pod_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Tell whether an upper pod changed in what `judge` reads of it (UID, labels, IPs)."""
    return (
        uid_of(old) != uid_of(new)
        or labels_of(old) != labels_of(new)
        or pod_ips(old) != pod_ips(new)
    )


def service_of_slice(upper_slice: Obj) -> list[str]:
    """Index function: the key of the upper Service an upper slice belongs to."""
    name = labels_of(upper_slice).get(services.SERVICE_NAME_LABEL)
    return [f"{namespace_of(upper_slice)}/{name}"] if isinstance(name, str) and name else []


def pods_of_slice(upper_slice: Obj) -> list[str]:
    """Index function: the keys of the upper pods an upper slice's endpoints name."""
    namespace = namespace_of(upper_slice)
    keys = set()
    for endpoint in upper_slice.get("endpoints") or ():
        ref = endpoint.get("targetRef") if isinstance(endpoint, dict) else None
        if isinstance(ref, dict) and ref.get("kind") == "Pod" and ref.get("name"):
            keys.add(f"{namespace}/{ref['name']}")
    return sorted(keys)
