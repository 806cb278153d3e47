"""The avoidance record: which virtual nodes the pods of an owner must avoid, until when.

The descheduler writes it when it evicts a pod a lower cluster could not place; the webhook
reads it when the owner's replacement pod is created, and keeps that pod off the virtual
nodes named (`kubernetes.io/hostname NotIn [...]` in every required node-selector term of
the upper pod). It lives in one ConfigMap (default `tensile-system/tensile-avoid`), so it
survives restarts of both programs and every replica of each sees the same record.

Format of the ConfigMap's `data` (one key per owner):

    "<owner UID>": '{"owner":{"apiVersion":"apps/v1","kind":"ReplicaSet",
                              "namespace":"shop","name":"web-7d9f"},
                     "nodes":{"vn-a":"2026-03-01T12:05:00Z"}}'

The key is the UID of the pod's controller (its ownerReference with `controller: true`);
`owner` names it for people and tooling; `nodes` maps each virtual node to avoid to the
RFC 3339 time the avoidance expires. Readers ignore expired nodes and entries they cannot
parse; the writer prunes both on every write.

A ConfigMap holds at most 1 MiB: at about 200 bytes per owner the record takes some 4,500
owners moved within one expiry period. The writer refuses to grow it past `MAX_RECORD_BYTES`
(`RecordFull`) instead of failing the write or dropping other owners' avoidances, so moves
wait until older entries expire.

The webhook notes on each pod which of the nodes it put into the NotIn were its own
(`ADDED_ANNOTATION`): judging where an owner's next pod could go, the descheduler takes out
only those (`without_avoidances`) and keeps a NotIn the user wrote in the template.

Pure: no I/O, inputs never mutated; it imports only its sibling `labels`.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import labels
from tensile.contracts.objects import annotations_of, as_list, as_mapping, meta_of
from tensile.contracts.scheduling import REQUIRED

DEFAULT_LOCATION: tuple[str, str] = ("tensile-system", "tensile-avoid")
"""(namespace, name) of the record's ConfigMap unless `--avoid-configmap` says otherwise."""
DEFAULT_CONFIGMAP = "/".join(DEFAULT_LOCATION)
"""The same as NAMESPACE/NAME, as `--avoid-configmap` takes it."""
MAX_RECORD_BYTES = 1_000_000
"""Largest record (keys + values, bytes) the writer produces: under the 1 MiB ConfigMap
limit with room for the object's metadata."""

ADDED_ANNOTATION = "tensile.io/avoided-nodes"
"""On a controller's pod: the virtual nodes whose `kubernetes.io/hostname NotIn` the webhook
added to its required node affinity (`render_added`: sorted, comma-separated), those its own
affinity did not exclude already. The descheduler takes out exactly these when it judges
the controller's next pod (`without_avoidances`), never a NotIn the user wrote."""

_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_MAX_KEY = 253


class RecordFull(Exception):
    """Adding an owner would grow the record past MAX_RECORD_BYTES."""


@dataclass(frozen=True, kw_only=True)
class Owner:
    """The controller a pod belongs to, as its ownerReference names it."""

    uid: str
    api_version: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True, kw_only=True)
class Avoidance:
    """One owner's entry: the virtual nodes its pods avoid and until when (aware UTC)."""

    owner: Owner
    nodes: Mapping[str, dt.datetime]

    def live_nodes(self, *, now: dt.datetime) -> frozenset[str]:
        """Return the virtual nodes still avoided at `now` (expiry strictly after it)."""
        return frozenset(node for node, until in self.nodes.items() if until > now)


def controller_of(pod: Mapping[str, Any]) -> Owner | None:
    """Return the pod's controller (its ownerReference with `controller: true` and a UID
    usable as a ConfigMap key), or None for a bare pod."""
    meta = meta_of(pod)
    for item in as_list(meta.get("ownerReferences")):
        ref = as_mapping(item)
        uid = ref.get("uid")
        if ref.get("controller") is True and isinstance(uid, str) and _valid_key(uid):
            return Owner(
                uid=uid,
                api_version=str(ref.get("apiVersion") or ""),
                kind=str(ref.get("kind") or ""),
                namespace=str(meta.get("namespace") or ""),
                name=str(ref.get("name") or ""),
            )
    return None


def parse_entry(uid: str, value: object) -> Avoidance | None:
    """Parse the record's value for owner `uid`; None when it is not a valid entry (not
    JSON, wrong shapes, an expiry that is not RFC 3339)."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
        owner, nodes = as_mapping(parsed).get("owner"), as_mapping(parsed).get("nodes")
        if not isinstance(owner, dict) or not isinstance(nodes, dict):
            return None
        fields = [owner.get(k) for k in ("apiVersion", "kind", "namespace", "name")]
        expiries = {str(node): _parse_time(until) for node, until in nodes.items()}
    except (ValueError, RecursionError):
        return None
    if not all(isinstance(f, str) for f in fields) or "" in expiries:
        return None
    valid = {node: until for node, until in expiries.items() if until is not None}
    if len(valid) != len(expiries):
        return None
    api_version, kind, namespace, name = (str(f) for f in fields)
    return Avoidance(
        owner=Owner(uid=uid, api_version=api_version, kind=kind, namespace=namespace, name=name),
        nodes=valid,
    )


def render_entry(avoidance: Avoidance) -> str:
    """Return the record's value for `avoidance`: compact JSON, nodes sorted by name,
    expiries in whole seconds (`2026-03-01T12:05:00Z`)."""
    owner = avoidance.owner
    return json.dumps(
        {
            "owner": {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "namespace": owner.namespace,
                "name": owner.name,
            },
            "nodes": {
                node: _render_time(avoidance.nodes[node]) for node in sorted(avoidance.nodes)
            },
        },
        separators=(",", ":"),
    )


def avoided_nodes(
    data: Mapping[str, str] | None, *, owner_uid: str, now: dt.datetime
) -> frozenset[str]:
    """Return the virtual nodes the pods of owner `owner_uid` must avoid at `now`, from the
    ConfigMap's `data` (None: no record): empty when there is no valid, live entry. Parses
    only that owner's entry (the webhook calls this once per pod creation)."""
    if not data or owner_uid not in data:
        return frozenset()
    entry = parse_entry(owner_uid, data[owner_uid])
    return frozenset() if entry is None else entry.live_nodes(now=now)


def pruned(data: Mapping[str, str] | None, *, now: dt.datetime) -> dict[str, str]:
    """Return `data` without expired nodes, entries left without a live node, and entries
    that cannot be parsed (the writer's clean-up)."""
    result: dict[str, str] = {}
    for uid, value in (data or {}).items():
        entry = parse_entry(uid, value)
        if entry is None or not _valid_key(uid):
            continue
        live = {node: until for node, until in entry.nodes.items() if until > now}
        if live:
            result[uid] = render_entry(Avoidance(owner=entry.owner, nodes=live))
    return result


def with_avoidance(
    data: Mapping[str, str] | None,
    *,
    owner: Owner,
    nodes: Iterable[str],
    until: dt.datetime,
    now: dt.datetime,
) -> dict[str, str]:
    """Return the record `data` (pruned as `pruned` does) with `owner` avoiding `nodes`
    until `until` (a node already avoided longer keeps its later expiry).

    Raises ValueError for an owner UID that cannot be a ConfigMap key or an empty node
    name, RecordFull when the result would exceed MAX_RECORD_BYTES (the record as it was
    stays valid; nothing is dropped to make room).
    """
    if not _valid_key(owner.uid):
        raise ValueError(f"owner UID {owner.uid!r} cannot be a ConfigMap key")
    result = pruned(data, now=now)
    current = parse_entry(owner.uid, result.get(owner.uid))
    expiries = dict(current.nodes) if current is not None else {}
    for node in nodes:
        if not node:
            raise ValueError("an empty virtual node name")
        expiries[node] = max(expiries.get(node, until), until)
    result[owner.uid] = render_entry(Avoidance(owner=owner, nodes=expiries))
    if record_bytes(result) > MAX_RECORD_BYTES:
        raise RecordFull(
            f"the avoidance record would grow to {record_bytes(result)} bytes "
            f"(at most {MAX_RECORD_BYTES}); the move waits for older entries to expire"
        )
    return result


def record_bytes(data: Mapping[str, str]) -> int:
    """Return the size the apiserver counts against a ConfigMap's 1 MiB: keys plus values,
    in UTF-8 bytes."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


# -- the requirement on the pod -------------------------------------------------------------


def avoiding(affinity: Mapping[str, Any] | None, nodes: Iterable[str]) -> dict[str, Any] | None:
    """Return `affinity` (a pod's spec.affinity, or None) with `kubernetes.io/hostname NotIn
    [nodes]` required in every node-selector term.

    - No required node affinity (or no affinity at all): one is created with a single term
      holding the requirement; preferred terms, podAffinity and podAntiAffinity are kept.
    - Each existing required term gets the requirement, ANDed with what it already says:
      no term is dropped, matchFields are kept as they are, and a term that already has a
      `kubernetes.io/hostname NotIn` expression gets the new nodes merged into its values
      (in order, without repeats) instead of a second expression.
    - An empty term (no expression, no field) selects no node in Kubernetes; it is left
      empty, since adding a requirement would make it select almost every node.
    - With no nodes, `affinity` is returned unchanged (a copy; None stays None).

    This is what the Kubernetes scheduler ANDs within a term and ORs across terms
    (k8s.io/component-helpers/scheduling/corev1/nodeaffinity): the pod then fits no node
    named in `nodes` whichever term it would have matched.
    """
    avoid = list(dict.fromkeys(n for n in nodes if n))
    result = copy.deepcopy(dict(affinity)) if affinity is not None else None
    if not avoid:
        return result
    requirement = {"key": labels.HOSTNAME_LABEL, "operator": "NotIn", "values": avoid}
    result = result or {}
    node_affinity = result.get("nodeAffinity")
    node_affinity = dict(node_affinity) if isinstance(node_affinity, dict) else {}
    required = node_affinity.get(REQUIRED)
    terms = as_list(as_mapping(required).get("nodeSelectorTerms"))
    if not terms:
        node_affinity[REQUIRED] = {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}
    else:
        node_affinity[REQUIRED] = {
            **as_mapping(required),
            "nodeSelectorTerms": [_term_avoiding(as_mapping(t), avoid) for t in terms],
        }
    result["nodeAffinity"] = node_affinity
    return result


def avoided_by_affinity(affinity: Mapping[str, Any] | None) -> frozenset[str]:
    """Return the nodes every required node-selector term of `affinity` excludes by a
    `kubernetes.io/hostname NotIn` expression (what `avoiding` added); empty when there is
    no required node affinity or a non-empty term excludes none."""
    required = as_mapping(as_mapping(as_mapping(affinity).get("nodeAffinity")).get(REQUIRED))
    found: frozenset[str] | None = None
    for item in as_list(required.get("nodeSelectorTerms")):
        term = as_mapping(item)
        expressions = as_list(term.get("matchExpressions"))
        if not expressions and not as_list(term.get("matchFields")):
            continue  # selects nothing anyway
        excluded = frozenset(
            str(v)
            for e in expressions
            if as_mapping(e).get("key") == labels.HOSTNAME_LABEL
            and as_mapping(e).get("operator") == "NotIn"
            for v in as_list(as_mapping(e).get("values"))
        )
        found = excluded if found is None else found & excluded
    return found or frozenset()


def excluded_by_name(affinity: Mapping[str, Any] | None) -> frozenset[str]:
    """Return every node named by a `kubernetes.io/hostname NotIn` expression of any required
    node-selector term of `affinity` (a pod's spec.affinity, or None)."""
    required = as_mapping(as_mapping(as_mapping(affinity).get("nodeAffinity")).get(REQUIRED))
    return frozenset(
        str(v)
        for t in as_list(required.get("nodeSelectorTerms"))
        for e in as_list(as_mapping(t).get("matchExpressions"))
        if _is_avoidance(e)
        for v in as_list(as_mapping(e).get("values"))
    )


def added_nodes(pod: Mapping[str, Any]) -> frozenset[str]:
    """Return the virtual nodes the webhook's `ADDED_ANNOTATION` on `pod` names (empty when
    it has none)."""
    annotations = annotations_of(pod)
    value = annotations.get(ADDED_ANNOTATION)
    if not isinstance(value, str):
        return frozenset()
    return frozenset(n for n in (part.strip() for part in value.split(",")) if n)


def render_added(nodes: Iterable[str]) -> str:
    """Return the value of `ADDED_ANNOTATION` for `nodes`: sorted, comma-separated."""
    return ",".join(sorted(set(nodes)))


def without_avoidances(
    affinity: Mapping[str, Any] | None, nodes: Iterable[str]
) -> dict[str, Any] | None:
    """Return `affinity` (a pod's spec.affinity, or None) without `nodes` in the
    `kubernetes.io/hostname NotIn` expressions of its required node-selector terms: given
    the nodes `avoiding` added (the pod's `ADDED_ANNOTATION`), the affinity a controller's
    next pod has before the webhook applies the avoidances in force then. Values not in
    `nodes` stay, so a NotIn the user wrote keeps its nodes out. An expression left without
    values is dropped; a term left with nothing held only what `avoiding` made (it admitted
    every node but those), and with it the whole required affinity, which is then dropped;
    a term that selects nothing is left as it is. A copy; None stays None."""
    if affinity is None:
        return None
    result = copy.deepcopy(dict(affinity))
    strip = frozenset(nodes)
    node_affinity = result.get("nodeAffinity")
    if not strip or not isinstance(node_affinity, dict) or REQUIRED not in node_affinity:
        return result
    required = as_mapping(node_affinity[REQUIRED])
    terms: list[Any] = []
    for item in as_list(required.get("nodeSelectorTerms")):
        term = dict(as_mapping(item))
        expressions = as_list(term.get("matchExpressions"))
        kept = [_without_values(e, strip) for e in expressions]
        kept = [e for e in kept if e is not None]
        if kept == expressions:
            terms.append(item)
        elif kept or as_list(term.get("matchFields")):
            term["matchExpressions"] = kept
            terms.append({k: v for k, v in term.items() if v != []})
        else:
            del node_affinity[REQUIRED]
            return result
    node_affinity[REQUIRED] = {**required, "nodeSelectorTerms": terms}
    return result


def _without_values(expression: object, strip: frozenset[str]) -> object | None:
    """`expression` less the `strip` values if it is a hostname NotIn (None when none is
    left), else `expression` itself."""
    if not _is_avoidance(expression):
        return expression
    e = as_mapping(expression)
    values = as_list(e.get("values"))
    left = [v for v in values if v not in strip]
    if len(left) == len(values):
        return expression
    return {**e, "values": left} if left else None


def _is_avoidance(expression: object) -> bool:
    e = as_mapping(expression)
    return e.get("key") == labels.HOSTNAME_LABEL and e.get("operator") == "NotIn"


def _term_avoiding(term: Mapping[str, Any], avoid: list[str]) -> dict[str, Any]:
    result = dict(term)
    expressions = [dict(as_mapping(e)) for e in as_list(term.get("matchExpressions"))]
    if not expressions and not as_list(term.get("matchFields")):
        return result  # an empty term selects no node; keep it that way
    for expression in expressions:
        if expression.get("key") == labels.HOSTNAME_LABEL and expression.get("operator") == "NotIn":
            values = [str(v) for v in as_list(expression.get("values"))]
            expression["values"] = values + [n for n in avoid if n not in values]
            break
    else:
        expressions.append(
            {"key": labels.HOSTNAME_LABEL, "operator": "NotIn", "values": list(avoid)}
        )
    result["matchExpressions"] = expressions
    return result


def _valid_key(key: str) -> bool:
    return 0 < len(key) <= _MAX_KEY and _KEY.fullmatch(key) is not None


def _parse_time(value: object) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.astimezone(dt.UTC) if moment.tzinfo is not None else None


def _render_time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
