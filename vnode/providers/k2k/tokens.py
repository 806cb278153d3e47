"""The lower pods' upper ServiceAccount tokens (`boundtokens`), asked for and renewed.

Before the provider creates a lower pod that mounts upper tokens, `prepare` makes its token
Secret below, empty: the name is then the node's before any pod mounts it, and a Secret of
that name that is not the node's refuses the pod rather than being mounted
(`boundtokens.token_secret_problem`). `issue` (called right after the lower pod was
created) records the pod as due now and wakes the worker, so a token whose request fails
(the upper apiserver away) is asked again until it lands: the entry is the write in
flight. The worker asks when an entry is due, several entries at once (at most
`CONCURRENCY`), writes the tokens into the Secret (owned by the lower pod from then on) and
records the next time from the life the token states (`boundtokens.refresh_after`, on the
monotonic clock); a failure is retried after `RETRY` seconds.

Tokens go only to the lower pod this node made for an upper pod bound to it, checked at
every renewal (`boundtokens.renewal_ends`, `boundtokens.lower_pod_problem`): the upper pod
(read upstairs) is bound to this node and is the UID the entry was made for; the lower pod
is at the key that upper pod maps to (its namespace mapped, its name), carries this node's
marks, and has the UID the node recorded, the lower apiserver's answer to its create. After
a restart (or a takeover by a standby) nothing was recorded: each lower pod of this node
at the key of an upper pod, mounting that pod's token Secret, is taken as it is found then
(docs/serviceaccount.md says what that leaves to the administrator). An entry ends when
the upper pod or the lower pod is gone or no longer qualifies, or the upper pod has
finished; the lower garbage collector removes the Secret with the lower pod.

With --upper-token-kubeconfig the tokens are asked for with the node's own identity
(`system:node:<name>`): the upper Node authorizer and NodeRestriction admission then refuse
any token not bound to a pod bound to this node, whatever the node is told.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from tensile.contracts import ownership
from tensile.contracts.objects import (
    Obj,
    as_mapping,
    deletion_timestamp_of,
    dicts_in,
    name_of,
    namespace_of,
    uid_of,
)
from tensile.kube import errors, retry, timestamps
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.informer import Informer
from tensile.kube.resources import CONFIG_MAPS, PODS, SECRETS, object_key
from tensile.serving.lifecycle import StartupError
from vnode import provider_errors
from vnode.providers.k2k import boundtokens, naming, slim

logger = logging.getLogger(__name__)

RETRY = 5.0
"""Seconds before a failed token request or Secret write is tried again."""
CONCURRENCY = 8
"""Renewals in flight at once (each a TokenRequest per token, a read and a write)."""
IDLE = 3600.0
"""Seconds the worker sleeps with nothing due (it is woken by `issue`)."""
TOKEN_REQUESTS = Counter(
    "tensile_serviceaccount_token_requests",
    "TokenRequests made upstairs for lower pods, by result (issued, refreshed, failed).",
    ["result"],
)
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


class _Ended(Exception):
    """The entry's tokens are asked for no more (the message says why)."""


@dataclass(kw_only=True)
class _Entry:
    upper_key: str
    """"namespace/name" of the upper pod."""
    upper_uid: str
    """The upper pod's UID: another pod of that name later is not this one (its tokens
    would be bound to it, in the old lower pod)."""
    lower_key: str
    """"namespace/name" of the lower pod: the key the upper pod maps to."""
    lower_uid: str | None
    """The lower pod's UID as the node recorded it (None: not known yet, read below)."""
    due: float
    """When to ask next, on the worker's monotonic clock."""
    issued: bool = False

    @property
    def secret(self) -> str:
        return boundtokens.secret_name(self.lower_key.partition("/")[2], self.upper_uid)


class UpperTokens:
    """Asks for and renews the lower pods' upper tokens (see the module docstring)."""

    name = "serviceaccount-tokens"

    def __init__(
        self,
        *,
        upper: ApiClient,
        lower: ApiClient,
        owner: ownership.NodeIdentity,
        prefix: str,
        lower_pods: Informer,
        refresh_fraction: float,
        minter: ApiClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`upper` reads the upper pods and CA; `minter` asks for the tokens (the node's
        own identity, --upper-token-kubeconfig; None: `upper`); `prefix` is
        --namespace-prefix (how upper keys map below); `lower_pods` is the provider's
        informer (its store names the pods to take over at start); `refresh_fraction` of a
        token's life passes before it is asked again; `clock` is monotonic (seconds)."""
        self._upper = upper
        self._minter = minter or upper
        self._lower = lower
        self._owner = owner
        self._prefix = prefix
        self._pods = lower_pods
        self._fraction = refresh_fraction
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._renewing: dict[str, asyncio.Task[None]] = {}
        """Upper key -> its renewal in flight."""
        self._wake = asyncio.Event()
        self._stopping = False
        self._started = False

    def informers(self) -> Sequence[Informer]:
        """The lower pods (shared with the provider)."""
        return [self._pods]

    async def start(self) -> None:
        """Nothing before the caches."""

    def ready(self) -> bool:
        """Whether the worker runs."""
        return self._started

    # -- the provider's calls ------------------------------------------------------------

    async def prepare(self, upper_pod: Mapping[str, Any]) -> None:
        """Make the (empty) token Secret of the lower pod about to be created for
        `upper_pod`, when it asks for tokens, or find it made already for that pod by this
        node. Raises InvalidPod when a Secret of that name below is not the node's (it is
        left as it is), kube errors otherwise (NotFound: the lower namespace is gone)."""
        if not boundtokens.asks(upper_pod):
            return
        body = self._secret(upper_pod, tokens={}, expires=None, ca=None, lower_pod=None)
        namespace = namespace_of(body)
        try:
            await self._lower.request("POST", SECRETS.path(namespace=namespace), body=body)
            return
        except errors.AlreadyExists:
            pass
        found = await self._lower.request(
            "GET", SECRETS.path(namespace=namespace, name=name_of(body))
        )
        problem = boundtokens.token_secret_problem(
            found, owner=self._owner, upper_uid=uid_of(upper_pod), pod_name=name_of(upper_pod)
        )
        if problem is not None:
            raise provider_errors.InvalidPod(
                f"Secret {object_key(found)} exists in the lower cluster and is not this "
                f"node's token Secret for the pod ({problem}); refusing to mount or "
                "overwrite it"
            )

    async def discard(self, upper_pod: Mapping[str, Any]) -> None:
        """Delete the token Secret `prepare` made for `upper_pod` when no lower pod owns it
        (the pod was refused below, or deleted before it got there); one owned by a lower
        pod goes with it. A failure is logged: the Secret left behind holds no token."""
        if not boundtokens.asks(upper_pod):
            return
        try:
            await self._discard(upper_pod)
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            logger.warning("the empty token Secret of %s is left: %s", object_key(upper_pod), exc)

    async def _discard(self, upper_pod: Mapping[str, Any]) -> None:
        body = self._secret(upper_pod, tokens={}, expires=None, ca=None, lower_pod=None)
        path = SECRETS.path(namespace=namespace_of(body), name=name_of(body))
        try:
            found = await self._lower.request("GET", path)
        except errors.NotFound:
            return
        problem = boundtokens.token_secret_problem(
            found, owner=self._owner, upper_uid=uid_of(upper_pod), pod_name=name_of(upper_pod)
        )
        if problem is not None or as_mapping(found.get("metadata")).get("ownerReferences"):
            return
        uid = uid_of(found)
        delete = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await self._lower.request("DELETE", path, body=delete)
        except (errors.NotFound, errors.Conflict):
            pass  # gone, or another Secret of that name now

    def issue(self, upper_pod: Mapping[str, Any], lower_pod: Mapping[str, Any]) -> None:
        """Have the tokens of `lower_pod` (just created for `upper_pod`: the lower
        apiserver's answer, whose UID the node records; without a UID when the create found
        it made already, then it is read) asked for now."""
        if not boundtokens.asks(upper_pod):
            return
        upper_key = object_key(upper_pod)
        uid = uid_of(lower_pod)
        self._due_now(
            upper_key=upper_key,
            upper_uid=uid_of(upper_pod),
            lower_key=naming.lower_key(upper_key, prefix=self._prefix),
            lower_uid=uid or None,
        )

    def _due_now(
        self, *, upper_key: str, upper_uid: str, lower_key: str, lower_uid: str | None
    ) -> None:
        self._entries[upper_key] = _Entry(
            upper_key=upper_key,
            upper_uid=upper_uid,
            lower_key=lower_key,
            lower_uid=lower_uid,
            due=self._clock(),
        )
        self._wake.set()

    # -- the worker ----------------------------------------------------------------------

    def _take_over(self) -> None:
        """Make every cached lower pod of this node due now that stands at the key of the
        upper pod its marks name and mounts that pod's token Secret (the node may have
        stopped between a pod and its tokens, or past a renewal). A pod elsewhere (another
        namespace than the upper pod's maps to) is not this node's, whatever its marks."""
        for lower in self._pods.store:
            if not ownership.is_owned(lower, owner=self._owner) or deletion_timestamp_of(lower):
                continue
            upper_key = naming.upper_key_of(lower, prefix=self._prefix)
            upper_uid = ownership.upper_uid_of(lower)
            if upper_key is None or upper_uid is None:
                continue
            lower_key = naming.lower_key(upper_key, prefix=self._prefix)
            if lower_key != object_key(lower):
                logger.warning(
                    "lower pod %s carries this node's marks for upper pod %s, which maps to "
                    "%s: no tokens for it",
                    object_key(lower),
                    upper_key,
                    lower_key,
                )
                continue
            if _mounts(lower, boundtokens.secret_name(name_of(lower), upper_uid)):
                self._due_now(
                    upper_key=upper_key,
                    upper_uid=upper_uid,
                    lower_key=lower_key,
                    lower_uid=uid_of(lower) or None,
                )

    async def run(self) -> None:
        """Renew until `shut_down`."""
        self._take_over()
        self._started = True
        try:
            while not self._stopping:
                self._start_due()
                now = self._clock()
                upcoming = [e.due for k, e in self._entries.items() if k not in self._renewing]
                if upcoming and len(self._renewing) < CONCURRENCY:
                    delay = max(0.0, min(upcoming) - now)
                else:
                    delay = IDLE  # nothing to do, or no room: a renewal that ends wakes it
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                except TimeoutError:
                    pass
        finally:
            tasks = list(self._renewing.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _start_due(self) -> None:
        """Start the renewals due (at most `CONCURRENCY` in flight; one per upper pod)."""
        now = self._clock()
        due = sorted(
            (e for k, e in self._entries.items() if e.due <= now and k not in self._renewing),
            key=lambda e: e.due,
        )
        for entry in due[: max(0, CONCURRENCY - len(self._renewing))]:
            task = asyncio.create_task(self._renew(entry), name=f"token-{entry.upper_key}")
            self._renewing[entry.upper_key] = task
            task.add_done_callback(functools.partial(self._renewed, entry))

    def _renewed(self, entry: _Entry, task: asyncio.Task[None]) -> None:
        """The renewal of `entry` is over: the next may start. One that failed unforeseen
        (a defect: every API failure is handled in `_renew`) is logged and tried again."""
        if self._renewing.get(entry.upper_key) is task:
            del self._renewing[entry.upper_key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("token for %s failed", entry.upper_key, exc_info=exc)
            entry.due = self._clock() + RETRY
        self._wake.set()

    async def shut_down(self) -> None:
        """Stop renewing (renewals in flight are cancelled by `run`)."""
        self._stopping = True
        self._wake.set()

    async def _renew(self, entry: _Entry) -> None:
        namespace, _, name = entry.upper_key.partition("/")
        try:
            upper_pod = await self._upper.request("GET", PODS.path(namespace=namespace, name=name))
            ends = boundtokens.renewal_ends(
                upper_pod,
                upper_uid=entry.upper_uid,
                node_name=self._owner.node_name,
                lower_pod_problem=self._lower_pod_problem(entry),
            )
            if ends is not None:
                raise _Ended(ends)
            await self._learn_lower_uid(entry)
            life = await self._write(entry, upper_pod)
        except (_Ended, errors.NotFound) as exc:
            # The upper pod (its tokens are bound to it) or the lower pod is gone, or is
            # not one this node may give tokens to.
            why = exc.message if isinstance(exc, errors.NotFound) else str(exc)
            logger.info("no more tokens for %s: %s", entry.upper_key, why)
            if self._entries.get(entry.upper_key) is entry:  # not a newer pod's, issued since
                del self._entries[entry.upper_key]
            return
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            TOKEN_REQUESTS.labels(result="failed").inc()
            logger.warning("token for %s: %s; again in %gs", entry.upper_key, exc, RETRY)
            entry.due = self._clock() + RETRY
            return
        TOKEN_REQUESTS.labels(result="refreshed" if entry.issued else "issued").inc()
        after = boundtokens.refresh_after(life=life, fraction=self._fraction)
        entry.due = self._clock() + after
        entry.issued = True
        logger.info(
            "tokens of %s (%.0fs of life) written below, next in %.0fs",
            entry.upper_key,
            life,
            after,
        )

    def _lower_pod_problem(self, entry: _Entry) -> str | None:
        """What is wrong with the cached lower pod at the entry's key (None: it may have
        tokens)."""
        return boundtokens.lower_pod_problem(
            self._pods.store.get(entry.lower_key),
            owner=self._owner,
            upper_uid=entry.upper_uid,
            lower_uid=entry.lower_uid,
            issued=entry.issued,
        )

    async def _learn_lower_uid(self, entry: _Entry) -> None:
        """Fill in the lower pod's UID (the Secret's owner) when `issue` was not given it (a
        create that had got through before: AlreadyExists), from the lower pod at the
        entry's key, which must be this node's and the upper pod's. Raises _Ended
        otherwise, NotFound when there is none."""
        if entry.lower_uid is not None:
            return
        namespace, _, name = entry.lower_key.partition("/")
        found = await self._lower.request("GET", PODS.path(namespace=namespace, name=name))
        problem = boundtokens.lower_pod_problem(
            found, owner=self._owner, upper_uid=entry.upper_uid, lower_uid=None, issued=True
        )
        if problem is not None:
            raise _Ended(problem)
        entry.lower_uid = uid_of(found)

    async def _write(self, entry: _Entry, upper_pod: Obj) -> float:
        """Ask for the tokens and write them into the lower Secret; return the shortest
        life (seconds) the tokens state."""
        namespace = namespace_of(upper_pod)
        account = boundtokens.service_account(upper_pod)
        tokens: dict[str, str] = {}
        lives: list[float] = []
        expiries: list[float] = []
        for ask in boundtokens.asks(upper_pod):
            answer = await self._minter.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                body=boundtokens.token_request(ask, pod=upper_pod),
            )
            status = as_mapping(answer.get("status"))
            token = str(status.get("token") or "")
            tokens[ask.key] = token
            life, expires = _life(token, status.get("expirationTimestamp"), ask=ask)
            lives.append(life)
            expiries.append(expires)
        root = await self._upper.request(
            "GET", CONFIG_MAPS.path(namespace=namespace, name=boundtokens.ROOT_CA)
        )
        lower_namespace, _, lower_name = entry.lower_key.partition("/")
        body = self._secret(
            upper_pod,
            tokens=tokens,
            expires=timestamps.rfc3339(dt.datetime.fromtimestamp(min(expiries), dt.UTC)),
            ca=str(as_mapping(root.get("data")).get(boundtokens.CA_KEY) or ""),
            lower_pod={"metadata": {"name": lower_name, "uid": entry.lower_uid}},
        )
        secret_path = SECRETS.path(namespace=lower_namespace, name=entry.secret)
        try:
            found = await self._lower.request("GET", secret_path)
        except errors.NotFound:
            # Deleted since `prepare` (or never made: a pod of an earlier version).
            await self._lower.request("POST", SECRETS.path(namespace=lower_namespace), body=body)
            return min(lives)
        problem = boundtokens.token_secret_problem(
            found, owner=self._owner, upper_uid=entry.upper_uid, pod_name=lower_name
        )
        if problem is not None:
            raise errors.Conflict(
                code=409,
                status={
                    "message": f"the lower Secret {object_key(found)} is not this node's "
                    f"token Secret for the pod ({problem}); left as it is"
                },
            )
        meta = as_mapping(body["metadata"])
        patch = {
            # The UID makes the patch apply to the Secret just checked only.
            "metadata": {
                "uid": uid_of(found),
                "annotations": meta["annotations"],
                "ownerReferences": meta["ownerReferences"],
            },
            "stringData": body["stringData"],
        }
        await self._lower.request("PATCH", secret_path, body=patch, content_type=MERGE_PATCH)
        return min(lives)

    def _secret(
        self,
        upper_pod: Mapping[str, Any],
        *,
        tokens: Mapping[str, str],
        expires: str | None,
        ca: str | None,
        lower_pod: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        upper_key = object_key(upper_pod)
        lower_namespace, _, lower_name = naming.lower_key(upper_key, prefix=self._prefix).partition(
            "/"
        )
        return boundtokens.secret(
            name=boundtokens.secret_name(lower_name, uid_of(upper_pod)),
            namespace=lower_namespace,
            upper_uid=uid_of(upper_pod),
            upper_namespace=namespace_of(upper_pod),
            owner=self._owner,
            tokens=tokens,
            expires=expires,
            ca=ca,
            lower_pod=lower_pod,
        )


async def check_identity(minter: ApiClient, *, node_name: str) -> None:
    """Check that `minter` (--upper-token-kubeconfig) authenticates upstairs as node
    `node_name` (`boundtokens.node_identity_problem`), asking the upper apiserver who it is
    (a SelfSubjectReview, which every authenticated user may make). A transient failure is
    retried with backoff (`retry.until_done`). Raises StartupError naming the identity
    found, ApiError when the apiserver refuses the review."""
    review = await retry.until_done(
        "checking the identity of --upper-token-kubeconfig",
        lambda: minter.request(
            "POST",
            SELF_SUBJECT_REVIEWS,
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        ),
        retried=errors.TRANSIENT,
    )
    problem = boundtokens.node_identity_problem(review, node_name=node_name)
    if problem is not None:
        raise StartupError(problem)


def _mounts(lower: Mapping[str, Any], secret: str) -> bool:
    """Whether lower pod `lower` mounts the token Secret `secret`: as the informer caches it
    (slim: no volumes, its references under `slim.REFS`), or whole."""
    if ["Secret", secret] in (lower.get(slim.REFS) or []):
        return True
    for volume in dicts_in(as_mapping(lower.get("spec")).get("volumes")):
        for source in dicts_in(as_mapping(volume.get("projected")).get("sources")):
            if as_mapping(source.get("secret")).get("name") == secret:
                return True
    return False


def _life(token: str, expiration: object, *, ask: boundtokens.TokenAsk) -> tuple[float, float]:
    """(Seconds of life, expiry in seconds since the epoch) of `token`: as its claims say
    (`boundtokens.token_times`); else from the answer's `expiration` timestamp; else the
    life asked for."""
    now = time.time()
    claims = boundtokens.token_times(token)
    if claims is not None:
        issued, expires = claims
        return expires - issued, expires
    parsed = timestamps.parse_rfc3339(expiration)
    if parsed is not None:
        return parsed.timestamp() - now, parsed.timestamp()
    return float(ask.expiration), now + ask.expiration
