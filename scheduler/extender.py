"""The extender's decisions (pure): kube-scheduler's extender API, filter and prioritize.

Shapes are those of k8s.io/kube-scheduler/extender/v1 (types.go), whose fields carry no
JSON tags: Go writes them under their field names, and reads them matching names
case-insensitively (encoding/json), which `read_extender_args` does too:

- ExtenderArgs: {"Pod": Pod, "Nodes": NodeList or null, "NodeNames": [string] or null};
  with `nodeCacheCapable: true` the scheduler sends only "NodeNames".
- ExtenderFilterResult: {"Nodes" or "NodeNames": what passes, "FailedNodes": {name:
  reason}, "FailedAndUnresolvableNodes": {}, "Error": ""}; the reasons of FailedNodes end
  up in the pod's FailedScheduling event ("0/3 nodes are available: ...").
- HostPriorityList: [{"Host": name, "Score": 0..MAX_EXTENDER_PRIORITY}], which the
  scheduler scales by the extender's weight and adds to its plugins' scores.

For each virtual node among the candidates, the pod's lower placement is worked out as the
virtual node would work it out (`tensile.placement.lower.lower_placement`: its
clusterSelector, minus what the virtual node itself satisfied) and judged against the
lower cluster's summary (`tensile.placement.summary.Summary.best_fit`). A virtual node goes
on failedNodes (not failedAndUnresolvable: preempting upper pods there frees room below);
so does one whose Node says its lower control plane does not answer
(`lowerhealth.LOWER_REACHABLE_CONDITION` False).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from scheduler.summaries import NodeSummary, Summaries
from tensile.contracts import clusterselector, lowerhealth
from tensile.contracts.labels import DEFAULT_TAINT_KEY
from tensile.contracts.objects import as_mapping, meta_of, name_of
from tensile.contracts.scheduling import REQUIRED
from tensile.kube import codec
from tensile.placement import fit
from tensile.placement.lower import lower_placement
from tensile.placement.summary import Choice

MAX_EXTENDER_PRIORITY: Final = 10
"""extender/v1 MaxExtenderPriority: the highest score an extender may give."""


class BadArgs(ValueError):
    """A body that is not an ExtenderArgs; the message says which part."""


@dataclass(frozen=True, kw_only=True)
class Call:
    """One filter or prioritize call."""

    pod: Mapping[str, Any]
    names: tuple[str, ...]
    """The candidate node names, in the scheduler's order."""
    nodes: tuple[Mapping[str, Any], ...] | None
    """The candidate Node objects when the scheduler sent a NodeList (nodeCacheCapable
    false), else None."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """How the extender judges (from the flags)."""

    headroom: float = 0.0
    """Share (0..1) of each lower cluster's allocatable cpu and memory a placement should
    leave free; a virtual node that would go below it scores 0 (it still passes)."""
    taint_key: str = DEFAULT_TAINT_KEY
    """The virtual nodes' taint key (their --taint), whose toleration the webhook adds."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the extender says of one candidate node."""

    name: str
    virtual: bool
    choice: Choice | None = None
    """The lower cluster's answer (None: not virtual, or the pod could not be judged)."""
    keeps_headroom: bool = True
    lower_unreachable: bool = False
    """The virtual node's lower control plane does not answer: nothing fits there now."""

    @property
    def fits(self) -> bool:
        """Whether the node passes the filter."""
        if self.lower_unreachable:
            return False
        return self.choice is None or self.choice.node is not None

    @property
    def score(self) -> int:
        """0..MAX_EXTENDER_PRIORITY: 0 for a node that is not virtual, does not fit or
        would break the headroom; else 1 plus 9 times the tightness of the best fit."""
        if self.lower_unreachable or self.choice is None or self.choice.node is None:
            return 0
        if not self.keeps_headroom:
            return 0
        return 1 + round((MAX_EXTENDER_PRIORITY - 1) * self.choice.tightness)

    def reason(self) -> str:
        """The failedNodes reason (for a node that does not fit)."""
        if self.lower_unreachable:
            return (
                f"lower cluster of {self.name}: its control plane does not answer "
                f"({lowerhealth.LOWER_REACHABLE_CONDITION} is False)"
            )
        assert self.choice is not None
        return f"lower cluster of {self.name}: {self.choice.message()}"


def read_extender_args(body: object) -> Call:
    """Return the call in `body` (decoded JSON). Raises BadArgs naming the bad part."""
    if not isinstance(body, Mapping):
        raise BadArgs("the body must be a JSON object (ExtenderArgs)")
    fields = {str(key).lower(): value for key, value in body.items()}
    pod = fields.get("pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        raise BadArgs('"Pod" must be a Pod object with a spec')
    names = fields.get("nodenames")
    node_list = fields.get("nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadArgs('"NodeNames" must be a list of node names')
        return Call(pod=pod, names=tuple(names), nodes=None)
    if node_list is not None:
        items = as_mapping(node_list).get("items")
        if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
            raise BadArgs('"Nodes" must be a NodeList with "items"')
        found = tuple(name_of(i) for i in items)
        return Call(pod=pod, names=found, nodes=tuple(items))
    raise BadArgs('neither "NodeNames" nor "Nodes" is given')


RecentKey = tuple[bytes, str, int]
"""(`judged` of the pod, virtual node name, summary generation)."""


_JUDGED_CONTAINER_FIELDS: Final = ("resources", "ports", "restartPolicy")
"""What a verdict reads of a container: its requests and limits (`requests.pod_requests`,
which also tells sidecars by `restartPolicy`) and its host ports (`fit.host_ports`)."""


def judged(pod: Mapping[str, Any]) -> bytes:
    """A digest (BLAKE2b, 16 bytes) of everything of `pod` a verdict depends on: its spec
    (requests, nodeSelector, affinity, tolerations, overhead...) but its volumes and, of its
    containers and init containers, all but `_JUDGED_CONTAINER_FIELDS`, and its
    clusterSelector annotation. Two calls with equal digests are judged alike, whatever
    UID or resourceVersion they name, so a call cannot leave a verdict behind for another
    pod: at most for a pod alike in all a verdict reads, which would be judged the same.
    What is left out differs between the pods of one Deployment (each pod's service account
    token volume has a name of its own, which its containers mount), so their verdicts are
    shared for as long as the summary stays the same."""
    spec = as_mapping(pod.get("spec"))
    annotations = as_mapping(meta_of(pod).get("annotations"))
    selector = annotations.get(clusterselector.ANNOTATION)
    body = codec.canonical([_judged_spec(spec), selector if isinstance(selector, str) else None])
    return hashlib.blake2b(body, digest_size=16).digest()


def _judged_spec(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """`spec` without what `judged` leaves out; `spec` itself when its containers are not
    lists of objects (a malformed pod is digested whole)."""
    kept = {key: value for key, value in spec.items() if key != "volumes"}
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            continue
        if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
            return spec
        kept[field] = [
            {name: c[name] for name in _JUDGED_CONTAINER_FIELDS if name in c} for c in containers
        ]
    return kept


class Recent:
    """The verdicts of the last `size` (pod, virtual node, summary) judged: kube-scheduler
    asks prioritize right after filter for the same pod and nodes, and a verdict stays
    true while what was judged of the pod (`judged`: its spec and clusterSelector, not its
    name, UID or resourceVersion, which a caller may name freely) and the summary are the
    same."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._verdicts: OrderedDict[RecentKey, Verdict] = OrderedDict()

    def get(self, key: RecentKey) -> Verdict | None:
        """The verdict remembered under `key`, or None."""
        return self._verdicts.get(key)

    def put(self, key: RecentKey, verdict: Verdict) -> None:
        """Remember `verdict` (the oldest is forgotten past `size`)."""
        self._verdicts[key] = verdict
        if len(self._verdicts) > self._size:
            self._verdicts.popitem(last=False)


def judge(
    call: Call,
    *,
    summaries: Summaries,
    policy: Policy,
    recent: Recent | None = None,
    explain: bool = True,
) -> list[Verdict]:
    """Return a verdict for every candidate node of `call`, in its order. `explain`: work
    out why a virtual node does not fit (filter's reasons; prioritize needs none);
    `recent` remembers verdicts between the calls for one pod."""
    spec = as_mapping(call.pod.get("spec"))
    meta = meta_of(call.pod)
    annotations = as_mapping(meta.get("annotations"))
    selector = clusterselector.parse(annotations.get(clusterselector.ANNOTATION))
    pod_key = judged(call.pod) if recent is not None else b""
    # The lower placement depends on the virtual node only through the upper nodeSelector
    # and required affinity it satisfied; without either it is the same for every node.
    shared = not as_mapping(spec.get("nodeSelector")) and not as_mapping(
        as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(REQUIRED)
    )
    needs: dict[str, fit.PodNeed | None] = {}
    verdicts = []
    for name in call.names:
        node = summaries.get(name)
        if node is None:
            verdicts.append(Verdict(name=name, virtual=False))
            continue
        if node.lower_unreachable:
            # Its summary is as last seen, and a pod bound there would wait for the lower
            # apiserver: another node, or the pod Pending upstairs, is the better answer.
            verdicts.append(Verdict(name=name, virtual=True, lower_unreachable=True))
            continue
        key = (pod_key, name, node.generation)
        known = recent.get(key) if recent is not None else None
        if known is not None and _reusable(known, explain=explain):
            verdicts.append(known)
            continue
        slot = "" if shared else name
        if slot not in needs:
            needs[slot] = _need(node, spec=spec, selector=selector, policy=policy)
        verdict = _verdict(node, need=needs[slot], policy=policy, explain=explain)
        if recent is not None:
            recent.put(key, verdict)
        verdicts.append(verdict)
    return verdicts


def _reusable(known: Verdict, *, explain: bool) -> bool:
    """Whether a remembered verdict answers this call: one without reasons (from
    prioritize) does not answer a filter that must explain a refusal."""
    return not explain or known.fits or known.choice is None or bool(known.choice.reasons)


def _need(
    node: NodeSummary,
    *,
    spec: Mapping[str, Any],
    selector: Mapping[str, Any] | None,
    policy: Policy,
) -> fit.PodNeed | None:
    lower = lower_placement(
        spec,
        cluster_selector=selector,
        node_name=node.name,
        node_labels=node.labels,
        taint_key=policy.taint_key,
    )
    try:
        return fit.need_of(lower)
    except ValueError:
        return None  # a quantity the apiserver would not have admitted: not ours to refuse


def _verdict(
    node: NodeSummary, *, need: fit.PodNeed | None, policy: Policy, explain: bool
) -> Verdict:
    if need is None:
        return Verdict(name=node.name, virtual=True)
    return Verdict(
        name=node.name,
        virtual=True,
        choice=node.summary.best_fit(need, explain=explain),
        keeps_headroom=node.summary.keeps_headroom(need, headroom=policy.headroom),
    )


def filter_result(call: Call, verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Return the ExtenderFilterResult for `verdicts` (in the form the call came in)."""
    failed = {v.name: v.reason() for v in verdicts if not v.fits}
    passed = [v.name for v in verdicts if v.fits]
    result: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
    if call.nodes is None:
        result["NodeNames"] = passed
    else:
        kept = set(passed)
        items = [n for n in call.nodes if name_of(n) in kept]
        result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}
    return result


def priorities(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    """Return the HostPriorityList for `verdicts`."""
    return [{"Host": v.name, "Score": v.score} for v in verdicts]
