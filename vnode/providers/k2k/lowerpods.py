"""What the provider knows of the lower pods beyond the informer's cache: the writes it has
sent and not yet seen land, the pods someone else deleted, and the capacity the lower
cluster's other pods take.

`LowerPodBook` is fed by the provider's writes (`create_sent`, `delete_sent`, ...) and by
the lower pods informer (`seen`, `gone`); the provider's decisions ask it (`vanished`,
`in_flight`). It does no I/O and holds no lock: it is used from the event loop only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from tensile.contracts import ownership
from tensile.contracts.objects import Obj, name_of, uid_of
from tensile.kube.resources import object_key
from tensile.placement import fit
from tensile.placement.requests import pod_requests
from vnode.providers.k2k import capacity

logger = logging.getLogger(__name__)

Verb = Literal["create", "delete"]


@dataclass(frozen=True, kw_only=True)
class Write:
    """A write to a lower pod that was sent and whose outcome the informer has not shown."""

    verb: Verb
    upper_uid: str
    """The UID of the upper pod it is for, as the book keys it:
    `str(ownership.upper_uid_of(lower))` ("None" for a lower pod without the annotation)."""
    lower_key: str
    """"namespace/name" of the lower pod."""


class LowerPodBook:
    """The provider's bookkeeping of lower pods: writes in flight, pods that vanished, and
    the capacity ledger of the pods that are not this node's.

    - A create is in flight from `create_sent` (just before the POST) until the informer
      shows a lower pod of ours for that upper UID (`seen`) or its deletion (`gone`), or
      the lower apiserver refused it (`create_refused`). A POST whose outcome is unknown
      (unreachable, 5xx) stays in flight: it may have got through.
    - A delete is in flight from `delete_sent` (just before the DELETE) until the informer
      shows the lower pod gone (`gone`), or the DELETE is answered 404/409
      (`delete_answered_gone`: that pod's deletion, shown later, is still not a vanishing).
      A lower pod of ours that goes otherwise has vanished: someone else deleted it (until
      a new create of it, or until its upper pod is deleted: `forget`).
    - Which lower pod the node made for each upper pod, by the lower pod's UID (`made`):
      the create's answer, or the first pod of ours the informer shows for that upper UID
      (after a start, or when the answer was lost). The marks that say "ours" are labels
      and annotations anyone who may create pods in that namespace can write; a pod that
      carries them at the key after the node's own pod went is not the node's, and its
      status, logs and exec sessions are never taken for the upper pod's.
    - Lower pods that are not ours are counted against the capacity (`free`).
    """

    def __init__(self, *, owner: ownership.NodeIdentity) -> None:
        """`owner` tells this node's lower pods from the others (`ownership.is_owned`)."""
        self._owner = owner
        self._others = capacity.Ledger()
        """Requests of the lower pods that are not this node's (the capacity they take)."""
        self._all = capacity.Ledger()
        """Requests of every lower pod, ours too: what each lower node has left (`rooms`)."""
        self._ports: dict[str, tuple[str, frozenset[fit.HostPort]]] = {}
        """Pod key -> (its node, the host ports it holds there), for pods holding some."""
        self._creates: dict[str, Write] = {}
        """Upper UID -> its create in flight."""
        self._deletes: dict[str, Write] = {}
        """Upper UID -> the delete in flight of its lower pod."""
        self._vanished: set[str] = set()
        """Upper UIDs whose lower pod was deleted by someone else."""
        self._made: dict[str, str] = {}
        """Upper UID -> the UID of the lower pod this node made for it. Kept when that pod
        vanishes (what takes its place is not the node's), dropped when the node deleted
        it or forgets the upper pod."""
        self._answered: dict[str, str] = {}
        """Upper UID -> the lower pod whose DELETE was answered 404/409 (no longer in
        flight) and whose deletion the informer has not shown yet: when it does, that is
        not a vanishing (the upper pod is being deleted; a mark would outlive it)."""

    def ours(self, lower: Mapping[str, Any] | None) -> bool:
        """Tell whether `lower` carries this node's ownership marks (which anyone who can
        write the pod can write: see `made` for the pod the node made)."""
        return lower is not None and ownership.is_owned(lower, owner=self._owner)

    def made(self, lower: Mapping[str, Any] | None) -> bool:
        """Tell whether `lower` is the lower pod this node made for the upper pod its marks
        name: ours by the marks, and of the UID the node recorded for that upper pod (or
        none recorded yet: the informer has not shown it)."""
        if lower is None or not self.ours(lower):
            return False
        recorded = self._made.get(str(ownership.upper_uid_of(lower)))
        return recorded is None or recorded == uid_of(lower)

    def made_for(self, upper_uid: str) -> str | None:
        """The UID of the lower pod recorded as made for `upper_uid` (what `made` compares
        with), or None while none is recorded."""
        return self._made.get(upper_uid)

    # -- the provider's writes -------------------------------------------------------------

    def create_sent(self, *, upper_uid: str, lower_key: str) -> None:
        """Record that the POST of the lower pod `lower_key` for `upper_uid` is being sent."""
        self._creates[upper_uid] = Write(verb="create", upper_uid=upper_uid, lower_key=lower_key)

    def create_refused(self, upper_uid: str) -> None:
        """Record that the lower apiserver answered the create of `upper_uid` with a
        refusal: nothing of it is in flight any more."""
        self._creates.pop(upper_uid, None)

    def created(self, upper_uid: str, *, lower_uid: str | None) -> None:
        """Record that the create of `upper_uid` got through (or had before: `lower_uid`
        None, the informer's first sight of it records it): its lower pod is new, not
        vanished, and of UID `lower_uid`. It stays in flight until the informer shows it."""
        self._vanished.discard(upper_uid)
        if lower_uid:
            self._made[upper_uid] = lower_uid

    def delete_sent(self, *, upper_uid: str, lower_key: str) -> None:
        """Record that the DELETE of lower pod `lower_key` (for `upper_uid`) is being
        sent: when it goes, it did not vanish."""
        self._deletes[upper_uid] = Write(verb="delete", upper_uid=upper_uid, lower_key=lower_key)

    def delete_answered_gone(self, upper_uid: str) -> None:
        """Record that the lower apiserver answered the DELETE for `upper_uid` with 404 or
        409 (gone already, or the name holds another pod now): the informer may already
        have shown the deletion, so nothing of it is in flight any more. If the informer
        shows it later, it did not vanish."""
        write = self._deletes.pop(upper_uid, None)
        if write is not None:
            self._answered[upper_uid] = write.lower_key

    def forget(self, upper_uid: str) -> None:
        """Forget every write and mark of `upper_uid`: its upper pod is deleted and no lower
        pod of it exists (the provider resolved a create in doubt first), so nothing of it
        can still be waited for. (A POST that lands even later shows a lower pod of ours with
        no upper pod: its informer event has it deleted, `K2KProvider.delete_dangling`.)"""
        self._creates.pop(upper_uid, None)
        self._deletes.pop(upper_uid, None)
        self._answered.pop(upper_uid, None)
        self._vanished.discard(upper_uid)
        self._made.pop(upper_uid, None)

    # -- what the informer shows -----------------------------------------------------------

    def seen(self, lower: Obj) -> bool:
        """Take in a lower pod's new state (added or modified). Returns whether the capacity
        moved. A pod of ours ends its create in flight; others' are counted (a malformed
        quantity, which the lower apiserver does not let through, is logged and not)."""
        key = object_key(lower)
        requests = self._count_on_node(key, lower)
        if self.ours(lower):
            uid = str(ownership.upper_uid_of(lower))
            if (write := self._creates.get(uid)) is not None and write.lower_key == key:
                # The create in flight landed: this is the pod it made.
                del self._creates[uid]
                self._made[uid] = uid_of(lower)
            else:
                # First sight after a start (or of a create whose answer was lost); a record
                # already made stays: what replaced the node's pod is not the node's.
                self._made.setdefault(uid, uid_of(lower))
            return self._others.remove(key)
        try:
            return self._others.put(key, lower, requests=requests)
        except ValueError as exc:
            logger.warning("lower pod %s: not counted against the capacity: %s", key, exc)
            return self._others.remove(key)

    def gone(self, lower: Obj) -> bool:
        """Take in a lower pod's deletion. Returns whether the capacity moved. A pod of ours
        ends the writes in flight for its upper UID; without a delete of ours in flight or
        answered gone, it has vanished."""
        key = object_key(lower)
        moved = self._others.remove(key)
        self._all.remove(key)
        self._ports.pop(key, None)
        if self.ours(lower):
            uid = str(ownership.upper_uid_of(lower))
            if (write := self._creates.get(uid)) is not None and write.lower_key == key:
                del self._creates[uid]
            answered = self._answered.get(uid) == key
            if answered:
                del self._answered[uid]
            if self._deletes.pop(uid, None) is None and not answered:
                if self.made(lower):
                    self._vanished.add(uid)
            elif self._made.get(uid) == uid_of(lower):
                del self._made[uid]
        return moved

    # -- questions -------------------------------------------------------------------------

    def vanished(self, upper_uid: str) -> bool:
        """Tell whether the lower pod of `upper_uid` was deleted by someone other than us."""
        return upper_uid in self._vanished

    def in_flight(
        self, *, upper_uid: str | None = None, lower_key: str | None = None
    ) -> Write | None:
        """Return the write in flight for `upper_uid` or for lower pod `lower_key` (a
        delete before a create: it was sent later, for a pod that exists), or None.
        Looking up by `lower_key` reads every write in flight (a patrol's question, not
        the pod path's)."""
        for writes in (self._deletes, self._creates):
            if upper_uid is not None and (write := writes.get(upper_uid)) is not None:
                return write
            if lower_key is not None:
                for write in writes.values():
                    if write.lower_key == lower_key:
                        return write
        return None

    def creating(self, upper_uid: str) -> Write | None:
        """Return the create in flight (or in doubt) for `upper_uid`, or None: the lower pod
        it stands for may exist while the informer does not show it yet."""
        return self._creates.get(upper_uid)

    def writing(self, *, upper_uid: str | None = None, lower_key: str | None = None) -> bool:
        """Tell whether a write is in flight for `upper_uid` or for lower pod `lower_key`."""
        return self.in_flight(upper_uid=upper_uid, lower_key=lower_key) is not None

    def writes(self) -> list[Write]:
        """Every write in flight: deletes, then creates."""
        return [*self._deletes.values(), *self._creates.values()]

    def remembered(self) -> int:
        """How many marks it holds of upper pods (writes in flight, vanished marks, deletes
        answered gone, the lower UIDs it made): each goes with its pod, so this is bounded
        by the pods the node keeps. The capacity ledger is not counted (it follows the
        informer's cache)."""
        return (
            len(self._creates)
            + len(self._deletes)
            + len(self._vanished)
            + len(self._answered)
            + len(self._made)
        )

    def _count_on_node(self, key: str, lower: Obj) -> dict[str, Fraction] | None:
        """Count `lower` on its node; return its requests when it counts (None when it does
        not, or its quantities are malformed), for the other ledger to reuse."""
        counted = capacity.counts(lower)
        requests = None
        try:
            if counted:
                requests = pod_requests(lower)
            self._all.put(key, lower, requests=requests)
        except ValueError:
            requests = None
            self._all.remove(key)  # logged by `seen` when it is another's; ours were admitted
        spec = lower.get("spec") or {}
        ports = fit.host_ports(spec) if counted else frozenset()
        if ports:
            self._ports[key] = (str(spec.get("nodeName")), ports)
        else:
            self._ports.pop(key, None)
        return requests

    def rooms(self, nodes: Iterable[Mapping[str, Any]]) -> list[fit.NodeRoom]:
        """Return each of the lower `nodes` as the scheduler's filters see it, with what
        every lower pod bound to it (ours too) requests and the host ports they hold
        (`fit.node_room`). A node with a malformed quantity is left out (logged)."""
        held: dict[str, set[fit.HostPort]] = {}
        for node_name, ports in self._ports.values():
            held.setdefault(node_name, set()).update(ports)
        rooms = []
        for node in nodes:
            name = name_of(node)
            try:
                rooms.append(
                    fit.node_room(
                        node, requested=self._all.requested(name), held_ports=held.get(name, ())
                    )
                )
            except ValueError as exc:
                logger.warning("lower node %s: left out of the placement summary: %s", name, exc)
        return rooms

    def free(self, nodes: Iterable[Mapping[str, Any]]) -> dict[str, Fraction]:
        """Return what the lower `nodes` can still take once the other pods are counted
        (`capacity.Ledger.free`: resource name -> amount)."""
        return self._others.free(nodes)
