"""What the virtual node admits before it creates a pod below, beside the refusals of
`pod_decisions.rejection`: a kubelet's admission, for pods no scheduler looked at.

A pod bound by `spec.nodeName` skips kube-scheduler and so the extender: nothing checked
that it tolerates the node's taint or fits its namespace's quota slices. Like a kubelet,
whose admission refuses a pod not tolerating the node's NoExecute taints (pkg/kubelet/
lifecycle/predicate.go), the virtual node refuses it (Failed, as `kubelet.rejectPod` does):

- a pod not tolerating a NoSchedule or NoExecute taint the virtual node registers
  (`untolerated`): reason `TaintToleration`, the kubelet's own words. The virtual node's
  taint is the pod's consent to run in another cluster, so NoSchedule counts too;
- a pod its namespace's quota slices do not admit on this node (`SliceAdmission`, through
  the extender's own `tensile.placement.slices.admit`), or whose namespace's record cannot
  be read: reason `OutOfQuotaSlices`.

Admission is first come, first served: a pod counts against its namespace's slices from the
moment it is admitted (or found already created below) until it finishes or goes, so pods
admitted once are never refused later, whatever was bound after them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from tensile.contracts.objects import Obj, namespace_of
from tensile.contracts.scheduling import FILTERED_EFFECTS, tolerates
from tensile.kube.client import ApiClient
from tensile.kube.informer import Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.resources import RESOURCE_QUOTAS
from tensile.placement.requests import pod_requests
from tensile.placement.slices import InForceReader, Units, admit, units

TAINT_REASON: Final = "TaintToleration"
"""The kubelet's reason for a pod refused for a taint (the TaintToleration predicate)."""
TAINT_MESSAGE: Final = (
    "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
)
"""The kubelet's message for it (`PredicateFailureError.Error()`)."""
SLICES_REASON: Final = "OutOfQuotaSlices"
"""The reason of a pod its namespace's quota slices do not admit (as a kubelet's OutOfcpu)."""
_BY_NAMESPACE: Final = "pod-admission/namespace"


def untolerated(pod: Mapping[str, Any], taints: Iterable[Mapping[str, Any]]) -> bool:
    """Whether `pod` does not tolerate one of `taints` (the virtual node's own) whose effect
    keeps pods off (NoSchedule, NoExecute; `tensile.contracts.scheduling.tolerates`)."""
    tolerations = (pod.get("spec") or {}).get("tolerations")
    return any(
        taint.get("effect") in FILTERED_EFFECTS and not tolerates(tolerations, taint)
        for taint in taints
    )


def requests_of(pod: Mapping[str, Any]) -> Units:
    """What `pod` counts against its namespace's slices (`Units`); {} for a quantity the
    apiserver would not have admitted."""
    try:
        return units(pod_requests(pod))
    except (ValueError, TypeError):
        return {}


class PlacedPods:
    """The requests of the pods this node admitted, summed by namespace (pure bookkeeping)."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, Units]] = {}
        """Pod key -> (its namespace, its requests)."""
        self._sums: dict[str, Units] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._pods

    def add(self, key: str, namespace: str, requests: Units) -> None:
        """Count the pod `key` (once)."""
        if key in self._pods:
            return
        self._pods[key] = (namespace, requests)
        total = self._sums.setdefault(namespace, {})
        for name, amount in requests.items():
            total[name] = total.get(name, 0) + amount

    def discard(self, key: str) -> None:
        """Stop counting the pod `key` (finished, or gone)."""
        found = self._pods.pop(key, None)
        if found is None:
            return
        namespace, requests = found
        total = self._sums.get(namespace, {})
        for name, amount in requests.items():
            total[name] = total.get(name, 0) - amount
        if not any(total.values()):
            self._sums.pop(namespace, None)

    def usage(self, namespace: str) -> Units:
        """The summed requests of `namespace`'s admitted pods ({} when none)."""
        return self._sums.get(namespace, {})


PlacedBelow = Callable[[str], Iterable[tuple[str, Obj]]]
"""namespace -> (key, pod) of its pods bound to the node, not finished, that have a pod
below already (admitted before this process started)."""


class SliceAdmission:
    """Holds pods to their namespace's quota slices on this node, from the upper
    ResourceQuotas (where the record is) and the pods this node admitted."""

    def __init__(
        self,
        *,
        client: ApiClient,
        informers: InformerFactory,
        node_name: str,
        namespace: str | None,
    ) -> None:
        """`client` reads the upper ResourceQuotas (of `namespace` only when the node serves
        one); `node_name` is the virtual node's name, the record's key."""
        self._node_name = node_name
        self.quotas = informers.informer(
            client, RESOURCE_QUOTAS, name="upper-resourcequotas", namespace=namespace
        )
        self.quotas.store.add_indexer(_BY_NAMESPACE, lambda q: [namespace_of(q)])
        self._reader = InForceReader()
        self.placed = PlacedPods()
        self._counted: set[str] = set()
        """Namespaces whose pods already below have been counted since the start."""

    def informers(self) -> Sequence[Informer]:
        """The ResourceQuota cache (pods wait for its first list)."""
        return [self.quotas]

    def admit(self, key: str, pod: Mapping[str, Any], *, below: PlacedBelow) -> str | None:
        """Admit the pod `key` (not yet created below) and count it, or say why not (one
        line). `below` lists the namespace's pods created below before this process
        started: they are counted first, once. Synchronous, so that two workers never
        admit against the same sums."""
        namespace = namespace_of(pod)
        quotas = self.quotas.store.by_index(_BY_NAMESPACE, namespace)
        in_force = self._reader.read(namespace, quotas)
        requests = requests_of(pod)
        if in_force.constrained:
            if namespace not in self._counted:
                for other, found in below(namespace):
                    if other != key:
                        self.placed.add(other, namespace, requests_of(found))
                self._counted.add(namespace)
            used = self.placed.usage(namespace)
            reason = admit(
                in_force=in_force, node=self._node_name, requests=requests, placed=[used]
            )
            if reason is not None:
                return reason
        self.placed.add(key, namespace, requests)
        return None

    def count(self, key: str, pod: Mapping[str, Any]) -> None:
        """Count the pod `key`, found created below."""
        if key not in self.placed:
            self.placed.add(key, namespace_of(pod), requests_of(pod))

    def forget(self, key: str) -> None:
        """Stop counting the pod `key` (finished, or gone)."""
        self.placed.discard(key)
