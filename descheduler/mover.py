"""Carrying decisions out against the upper cluster: evictions, bare-pod re-creations, and the
Events that tell users what happened.

Owned pods (a controller will replace them): the owners' avoidances are written to the
record first, in one write for the whole round, then -- after `settle` seconds, time for
the webhook's watch of the record to deliver it (usually milliseconds; a watch promises no
bound: a replacement admitted without the avoidance is moved again at a later round, its
node being in the record) -- each pod is
evicted through policy/v1 Evictions, preconditioned on the UID and resourceVersion the
decision was made on, and once the eviction is accepted its `sigs.k8s.io/deschedule-count`
is incremented (a merge patch of that annotation alone): the count counts moves, not
attempts. A 429 is reported (Event) and that pod waits its Retry-After.

Bare pods: the replacement (see `move_objects`) is created behind a scheduling gate; the old pod is
deleted with UID and resourceVersion preconditions (if it changed -- scheduled after all --
the replacement is deleted instead and nothing moved); once the old pod is gone the gate is
lifted. A crash anywhere leaves a state `recover` finishes at the next round: a gated
replacement whose old pod is gone is released, one whose old pod is still there (not being
deleted) is removed. So a bare pod is never lost and never runs twice.

Pods with no virtual node left for good are marked so (a merge patch of one annotation,
`move_objects.left_alone_patch`) before their Event, which then may say they are left alone: the
policy never judges a marked pod again.

With `dry_run` nothing is written at all (no record, no patch, no eviction, no Event): the
decisions are logged and counted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from descheduler import metrics, move_objects
from descheduler.policy import Decision
from descheduler.record import AvoidanceRecord, RecordConflict
from tensile.contracts import descheduling
from tensile.contracts.objects import deletion_timestamp_of, meta_of, name_of, uid_of
from tensile.kube import errors
from tensile.kube.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.resources import PODS
from tensile.kube.timestamps import rfc3339

logger = logging.getLogger(__name__)

Outcome = Literal[
    "moved", "dry_run", "blocked", "refused", "exhausted", "conflict", "gone", "rate_limited",
    "record_full", "failed",
]  # fmt: skip
REPORT_EVERY = 300.0
"""Seconds before the same Warning about the same pod is recorded again (a pod blocked for
an hour gets a dozen Event updates, not one per round)."""
DEFAULT_RETRY_AFTER = 10.0
"""Seconds a refused eviction waits when the apiserver did not say (its own suggestion)."""


class NotLeading(Exception):
    """The Lease was lost in the middle of a round: stop writing at once."""


@dataclass(frozen=True, kw_only=True)
class MoveSettings:
    """How moves are carried out; durations in seconds."""

    dry_run: bool = False
    """Log and count what would be done; write nothing."""
    avoid_ttl: float = 300.0
    """How long an owner avoids the virtual node its pod was evicted from."""
    settle: float = 1.0
    """Pause between writing the record and the first eviction of a round, for the
    webhook's watch to deliver the record (no guarantee; see the module docstring)."""
    gone_timeout: float = 10.0
    """How long a bare pod's move waits for the old pod to go before leaving the
    replacement's release to the next round."""


class Mover:
    """Carries out `policy.Decision`s; see the module docstring."""

    def __init__(
        self,
        *,
        client: ApiClient,
        recorder: EventRecorder,
        record: AvoidanceRecord,
        settings: MoveSettings,
        may_act: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`may_act` is asked before every write (the leader elector's is_leader)."""
        self._client = client
        self._recorder = recorder
        self._record = record
        self._settings = settings
        self._may_act = may_act
        self._clock = clock
        self._not_before: dict[str, float] = {}
        self._reported: dict[tuple[str, str, str], float] = {}

    def waiting(self, decision: Decision) -> bool:
        """Tell whether this pod's last eviction was refused and its Retry-After has not
        passed."""
        uid = uid_of(decision.pod)
        until = self._not_before.get(uid)
        if until is not None and self._clock() >= until:
            del self._not_before[uid]  # served its wait: forget it (bounded memory)
            return False
        return until is not None

    async def report(self, decision: Decision, *, now: dt.datetime) -> Outcome:
        """Report a pod that does not move (blocked, exhausted): log, count, Event.

        A pod with no virtual node left for good (`decision.for_good`) is first marked so,
        at `now` (`move_objects.left_alone_patch`), then its Event says where it waits and how to
        have it tried again. A mark that cannot be written is a DeschedulingFailed Warning
        (outcome failed; the pod is judged again next round); a pod gone or replaced
        meanwhile is outcome gone, with no Event. Raises NotLeading.
        """
        kind = _kind(decision)
        if decision.action == "blocked":
            metrics.BLOCKED_BY_PDB.inc()
            outcome: Outcome = "blocked"
            reason = "DeschedulingBlocked"
            text = (
                f"Not moved off virtual node {decision.node} ({decision.reason}): "
                f"{decision.message}; tried again every round"
            )
        else:
            outcome, reason = "exhausted", "NoVirtualNodeLeft"
            text = (
                f"The lower cluster behind virtual node {decision.node} cannot place it "
                f"({decision.reason}), and {decision.message}"
            )
            if decision.for_good:
                outcome = await self._leave_alone(decision, now=now)
                if outcome != "exhausted":
                    metrics.MOVES.labels(kind, outcome).inc()
                    return outcome
                text += _left_alone_text(decision)
        metrics.MOVES.labels(kind, outcome).inc()
        await self._warn_once(decision.pod, reason=reason, message=text)
        return outcome

    async def _leave_alone(self, decision: Decision, *, now: dt.datetime) -> Outcome:
        """Mark the pod of `decision` as left alone (one merge patch); return exhausted
        when it is (or, in a dry run, would be), gone or failed otherwise."""
        pod = decision.pod
        if self._settings.dry_run:
            logger.info("dry run: would mark %s as left alone (no virtual node left)", _name(pod))
            return "exhausted"
        meta = meta_of(pod)
        self._check_leading()
        try:
            await self._client.request(
                "PATCH",
                PODS.path(namespace=str(meta.get("namespace")), name=str(meta.get("name"))),
                body=move_objects.left_alone_patch(pod, now=now),
                content_type=MERGE_PATCH,
            )
        except (errors.NotFound, errors.Conflict, errors.Invalid) as exc:
            # Gone, or another pod of that name: nothing to mark; no Event on a stranger.
            logger.debug("%s: not marked as left alone: %s", _name(pod), exc)
            return "gone"
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            return await self._failed(
                decision,
                f"no virtual node is left for it, but it could not be marked so ({exc}); "
                "judged again next round",
            )
        return "exhausted"

    async def prepare(self, decisions: Sequence[Decision], *, now: dt.datetime) -> list[Decision]:
        """Write the avoidances of the owned pods about to be evicted (one record write),
        then wait `settle`. Returns the decisions that may go ahead: all of them, less those
        whose owner the record had no room for (reported here). Raises NotLeading."""
        owned = [d for d in decisions if d.owner is not None]
        if not owned or self._settings.dry_run:
            return list(decisions)
        self._check_leading()
        until = now + dt.timedelta(seconds=self._settings.avoid_ttl)
        try:
            refused = await self._record.avoid(
                [(d.owner, d.node) for d in owned if d.owner is not None], until=until, now=now
            )
        except (RecordConflict, errors.ApiError, errors.ApiUnavailable) as exc:
            for decision in owned:
                metrics.MOVES.labels("evict", "failed").inc()
                await self._failed(decision, f"cannot write the avoidance record: {exc}")
            return [d for d in decisions if d.owner is None]
        ready = []
        for decision in decisions:
            if decision.owner is not None and decision.owner.uid in refused:
                metrics.MOVES.labels("evict", "record_full").inc()
                await self._warn_once(
                    decision.pod,
                    reason="DeschedulingFailed",
                    message=f"Not moved off virtual node {decision.node}: the avoidance record "
                    f"{self._record.namespace}/{self._record.name} is full; the move waits for "
                    "older entries to expire",
                )
            else:
                ready.append(decision)
        if len(ready) > len([d for d in ready if d.owner is None]):
            await asyncio.sleep(self._settings.settle)
        return ready

    async def move(self, decision: Decision, *, now: dt.datetime) -> Outcome:
        """Evict an owned pod or re-create a bare one (after `prepare`). Raises NotLeading."""
        kind = _kind(decision)
        if self._settings.dry_run:
            logger.info(
                "dry run: would %s %s off virtual node %s (%s); avoiding %s",
                kind,
                _name(decision.pod),
                decision.node,
                decision.reason,
                ", ".join(sorted(decision.avoid)),
            )
            outcome: Outcome = "dry_run"
        else:
            try:
                if decision.owner is not None:
                    outcome = await self._evict(decision, now=now)
                else:
                    outcome = await self._recreate(decision)
            except (errors.ApiError, errors.ApiUnavailable) as exc:
                outcome = await self._failed(decision, str(exc))
        metrics.MOVES.labels(kind, outcome).inc()
        return outcome

    async def recover(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Finish or undo bare-pod moves a crash or a slow deletion left half done: a gated
        replacement whose old pod is gone is released; one whose old pod is still there and
        not being deleted is removed. Raises NotLeading."""
        for pod in pods:
            replaced = descheduling.replaces(pod)
            if not descheduling.is_gated(pod) or replaced is None or self._settings.dry_run:
                continue
            self._check_leading()
            meta = meta_of(pod)
            try:
                old = await self._current(str(meta.get("namespace")), replaced[0])
                if old is None or uid_of(old) != replaced[1]:
                    await self._release(pod, old_name=replaced[0])
                elif not deletion_timestamp_of(old):
                    logger.info(
                        "%s: its move was interrupted before %s was deleted; removing it",
                        _name(pod),
                        replaced[0],
                    )
                    await self._delete(pod)
            except (errors.ApiError, errors.ApiUnavailable) as exc:
                # Left as it is for the next round; the other moves still finish.
                logger.warning("%s: could not finish its move: %s", _name(pod), exc)

    # -- owned pods ---------------------------------------------------------------------

    async def _evict(self, decision: Decision, *, now: dt.datetime) -> Outcome:
        pod = decision.pod
        meta = meta_of(pod)
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        self._check_leading()
        try:
            await self._client.request(
                "POST",
                PODS.path(namespace=namespace, name=name, subresource="eviction"),
                body=move_objects.eviction(pod),
                retry_throttled=False,
            )
        except errors.TooManyRequests as exc:
            return await self._refused(decision, exc)
        except errors.Conflict:
            logger.info("%s changed since it was judged; it is judged again", _name(pod))
            return "conflict"
        except errors.NotFound:
            return "gone"
        metrics.PODS_EVICTED.inc()
        await self._count(pod)
        owner = decision.owner
        assert owner is not None
        until = rfc3339(now + dt.timedelta(seconds=self._settings.avoid_ttl))
        text = (
            f"Evicted from virtual node {decision.node}: the lower cluster could not place it "
            f"({decision.reason}); the pods of {owner.kind} {owner.name} avoid "
            f"{', '.join(sorted(decision.avoid))} until {until}"
        )
        logger.info("%s: %s", _name(pod), text)
        await self._recorder.record(pod, type="Normal", reason="Descheduled", message=text)
        return "moved"

    async def _count(self, pod: Mapping[str, Any]) -> None:
        """Increment the deschedule count of `pod`, evicted just now: after the eviction,
        so it counts moves, not attempts (a 429 leaves it as it was). A pod already gone
        (or a new one of the same name: the patch names the UID) keeps no count; the move
        is told by its Event and metrics all the same."""
        meta = meta_of(pod)
        try:
            await self._client.request(
                "PATCH",
                PODS.path(namespace=str(meta.get("namespace")), name=str(meta.get("name"))),
                body=move_objects.count_patch(pod),
                content_type=MERGE_PATCH,
            )
        except (errors.NotFound, errors.Conflict, errors.Invalid) as exc:
            logger.debug("%s: deschedule count not written: %s", _name(pod), exc)
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("%s: deschedule count not written: %s", _name(pod), exc)

    async def _refused(self, decision: Decision, exc: errors.TooManyRequests) -> Outcome:
        wait = exc.retry_after or DEFAULT_RETRY_AFTER
        now = self._clock()
        self._not_before[uid_of(decision.pod)] = now + wait
        if len(self._not_before) > 4096:  # pods that went away while waiting: forget them
            self._not_before = {k: t for k, t in self._not_before.items() if t > now}
        causes = "; ".join(str(c.get("message")) for c in exc.causes if c.get("message"))
        if "disruption budget" in exc.message:
            metrics.BLOCKED_BY_PDB.inc()
        text = (
            f"Eviction from virtual node {decision.node} refused: {exc.message}"
            f"{f' ({causes})' if causes else ''}; trying again in {wait:.0f}s"
        )
        logger.info("%s: %s", _name(decision.pod), text)
        await self._recorder.record(
            decision.pod, type="Warning", reason="EvictionRefused", message=text
        )
        return "refused"

    # -- bare pods ----------------------------------------------------------------------

    async def _recreate(self, decision: Decision) -> Outcome:
        old = decision.pod
        meta = meta_of(old)
        namespace = str(meta.get("namespace"))
        wanted = move_objects.replacement(old, avoid=decision.avoid)
        name = name_of(wanted)
        self._check_leading()
        try:
            made = await self._client.request("POST", PODS.path(namespace=namespace), body=wanted)
        except errors.AlreadyExists:
            made = await self._current(namespace, name) or {}
            if descheduling.replaces(made) != (meta.get("name"), uid_of(old)):
                return await self._failed(decision, f"a pod named {name} exists already")
        self._check_leading()
        try:
            await self._delete(old, resource_version=str(meta.get("resourceVersion") or ""))
        except errors.Conflict:
            logger.info("%s changed since it was judged; its replacement goes", _name(old))
            await self._delete(made)
            return "conflict"
        except errors.NotFound:
            pass
        reason_text = (
            f"the lower cluster behind virtual node {decision.node} could not place it "
            f"({decision.reason})"
        )
        await self._recorder.record(
            old,
            type="Normal",
            reason="Rescheduled",
            message=f"Re-created as {name}: {reason_text}",
        )
        await self._recorder.record(
            made,
            type="Normal",
            reason="Rescheduled",
            message=f"Replaces {meta.get('name')}: {reason_text}; avoids "
            f"{', '.join(sorted(decision.avoid))}",
        )
        metrics.PODS_RECREATED.inc()
        # The move has happened (the old pod is going): whatever fails from here on only
        # delays lifting the gate, which the next round's recovery does.
        deadline = self._clock() + self._settings.gone_timeout
        try:
            while self._clock() < deadline:
                current = await self._current(namespace, str(meta.get("name")))
                if current is None or uid_of(current) != uid_of(old):
                    await self._release(made, old_name=str(meta.get("name")))
                    return "moved"
                await asyncio.sleep(0.25)
            logger.info("%s: still going; %s is released at a later round", _name(old), name)
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("%s: %s is released at a later round: %s", _name(old), name, exc)
        return "moved"

    async def _release(self, pod: Mapping[str, Any], *, old_name: str) -> None:
        self._check_leading()
        meta = meta_of(pod)
        try:
            await self._client.request(
                "PATCH",
                PODS.path(namespace=str(meta.get("namespace")), name=str(meta.get("name"))),
                body=move_objects.ungate_patch(),
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except errors.NotFound:
            logger.warning("%s, replacing %s, was deleted by someone", _name(pod), old_name)
            return
        logger.info("%s released: %s is gone", _name(pod), old_name)

    async def _delete(self, pod: Mapping[str, Any], *, resource_version: str = "") -> None:
        meta = meta_of(pod)
        preconditions = {"uid": meta.get("uid")}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        await self._client.request(
            "DELETE",
            PODS.path(namespace=str(meta.get("namespace")), name=str(meta.get("name"))),
            body={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions},
        )

    async def _current(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._client.request("GET", PODS.path(namespace=namespace, name=name))
        except errors.NotFound:
            return None

    # -- reporting ------------------------------------------------------------------------

    async def _failed(self, decision: Decision, why: str) -> Outcome:
        text = f"Not moved off virtual node {decision.node}: {why}"
        await self._warn_once(decision.pod, reason="DeschedulingFailed", message=text)
        return "failed"

    async def _warn_once(self, pod: Mapping[str, Any], *, reason: str, message: str) -> None:
        """Log and record a Warning about `pod`; the same one again only after
        REPORT_EVERY (a debug line meanwhile). With dry_run, only the log line."""
        key = (uid_of(pod), reason, message)
        last = self._reported.get(key)
        now = self._clock()
        if last is not None and now - last < REPORT_EVERY:
            logger.debug("%s: %s (again)", _name(pod), message)
            return
        logger.warning("%s: %s", _name(pod), message)
        self._reported[key] = now
        if len(self._reported) > 4096:  # forget the oldest: bounded memory
            for stale in sorted(self._reported, key=self._reported.__getitem__)[:1024]:
                del self._reported[stale]
        if not self._settings.dry_run:
            await self._recorder.record(pod, type="Warning", reason=reason, message=message)

    def _check_leading(self) -> None:
        if not self._may_act():
            raise NotLeading("the leader-election Lease was lost")


def _name(pod: Mapping[str, Any]) -> str:
    meta = meta_of(pod)
    return f"pod {meta.get('namespace')}/{meta.get('name')}"


def _left_alone_text(decision: Decision) -> str:
    """What the Event of a pod left alone adds: where it waits, and how to have it tried
    again (a new pod from its controller; for a bare pod, removing the mark)."""
    text = (
        f" (annotation {descheduling.LEFT_ALONE_ANNOTATION}),"
        " Pending until that lower cluster has room."
    )
    owner = decision.owner
    if owner is None:
        return f"{text} Removing the annotation has it judged again."
    avoided = sorted(decision.avoid - {decision.node})
    later = (
        f" ({', '.join(avoided)} once {'its' if len(avoided) == 1 else 'their'} avoidance expires)"
        if avoided
        else ""
    )
    return (
        f"{text} Deleting it lets {owner.kind} {owner.name} try the virtual nodes again "
        f"with a new pod{later}."
    )


def _kind(decision: Decision) -> str:
    return "evict" if decision.owner is not None else "recreate"
