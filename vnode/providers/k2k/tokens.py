"""The lower pods' upper ServiceAccount tokens (`boundtokens`), asked for and renewed.

`UpperTokens` keeps one entry per lower pod that mounts its token Secret: when to ask the
upper TokenRequest API next. `issue` (called by the provider right after it created a lower
pod) records the pod as due now and wakes the worker, so a token whose request fails (the
upper apiserver away) is asked again until it lands: the entry is the write in flight. The
worker asks when an entry is due, writes the lower Secret (created owned by the lower pod,
or its tokens replaced) and records the next time (`boundtokens.refresh_at`); a failure is
retried after `RETRY` seconds. An entry ends when the upper pod or the lower pod is gone, or
the upper pod has finished (`boundtokens.renewal_ends`; its tokens are bound to the upper
pod; the lower garbage collector removes the Secret with the lower pod). At start, every
lower pod of this node that mounts such a Secret is due at once (the node may have stopped
between a pod and its Secret, or past a renewal).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from tensile.contracts import ownership
from tensile.contracts.objects import (
    Obj,
    annotations_of,
    as_mapping,
    dicts_in,
    meta_of,
    name_of,
    namespace_of,
    uid_of,
)
from tensile.kube import errors, timestamps
from tensile.kube.client import MERGE_PATCH, ApiClient
from tensile.kube.informer import Informer
from tensile.kube.resources import CONFIG_MAPS, PODS, SECRETS, object_key
from vnode.providers.k2k import boundtokens, slim

logger = logging.getLogger(__name__)

RETRY = 5.0
"""Seconds before a failed token request or Secret write is tried again."""
TOKEN_REQUESTS = Counter(
    "tensile_serviceaccount_token_requests",
    "TokenRequests made upstairs for lower pods, by result (issued, refreshed, failed).",
    ["result"],
)


@dataclass(kw_only=True)
class _Entry:
    upper_key: str
    """"namespace/name" of the upper pod."""
    upper_uid: str
    """The upper pod's UID: another pod of that name later is not this one (its tokens
    would be bound to it, in the old lower pod)."""
    lower: Obj
    """The lower pod's metadata (name, namespace, uid)."""
    due: float
    issued: bool = False


class UpperTokens:
    """Asks for and renews the lower pods' upper tokens (see the module docstring)."""

    name = "serviceaccount-tokens"

    def __init__(
        self,
        *,
        upper: ApiClient,
        lower: ApiClient,
        owner: ownership.NodeIdentity,
        lower_pods: Informer,
        refresh_fraction: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`lower_pods` is the provider's informer (its store names the pods to take over
        at start); `refresh_fraction` of a token's life passes before it is asked again."""
        self._upper = upper
        self._lower = lower
        self._owner = owner
        self._pods = lower_pods
        self._fraction = refresh_fraction
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
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

    def issue(self, upper_pod: Mapping[str, Any], lower_pod: Mapping[str, Any]) -> None:
        """Have the tokens of `lower_pod` (just created for `upper_pod`; without a UID when
        the create found it made already, then it is read) asked for now."""
        if not boundtokens.asks(upper_pod):
            return
        upper_uid = uid_of(upper_pod)
        self._due_now(object_key(upper_pod), upper_uid, lower_pod)

    def _due_now(self, upper_key: str, upper_uid: str, lower_pod: Mapping[str, Any]) -> None:
        meta = meta_of(lower_pod)
        lower = {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}}
        self._entries[upper_key] = _Entry(
            upper_key=upper_key, upper_uid=upper_uid, lower=lower, due=self._clock()
        )
        self._wake.set()

    async def run(self) -> None:
        """Renew until `shut_down`."""
        for lower in self._pods.store:
            if ownership.is_owned(lower, owner=self._owner) and _mounts_token(lower):
                annotations = annotations_of(lower)
                namespace = annotations.get(ownership.UPPER_NAMESPACE_ANNOTATION)
                upper_uid = ownership.upper_uid_of(lower)
                if namespace and upper_uid:
                    key = f"{namespace}/{name_of(lower)}"
                    self._due_now(key, str(upper_uid), lower)
        self._started = True
        while not self._stopping:
            now = self._clock()
            for entry in [e for e in self._entries.values() if e.due <= now]:
                await self._renew(entry)
            upcoming = [e.due for e in self._entries.values()]
            delay = max(0.0, min(upcoming) - self._clock()) if upcoming else 3600.0
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def shut_down(self) -> None:
        """Stop renewing."""
        self._stopping = True
        self._wake.set()

    async def _renew(self, entry: _Entry) -> None:
        namespace, _, name = entry.upper_key.partition("/")
        try:
            upper_pod = await self._upper.request("GET", PODS.path(namespace=namespace, name=name))
            ends = boundtokens.renewal_ends(
                upper_pod, upper_uid=entry.upper_uid, lower_pod_there=self._lower_pod_there(entry)
            )
            if ends is not None:
                raise errors.NotFound(code=404, status={"message": ends})
            await self._learn_lower_uid(entry)
            expires_at = await self._write(entry, upper_pod)
        except errors.NotFound as exc:
            # The upper pod (its tokens are bound to it) or the lower pod is gone.
            logger.info("no more tokens for %s: %s", entry.upper_key, exc.message)
            if self._entries.get(entry.upper_key) is entry:  # not a newer pod's, issued since
                del self._entries[entry.upper_key]
            return
        except (errors.ApiError, errors.ApiUnavailable) as exc:
            TOKEN_REQUESTS.labels(result="failed").inc()
            logger.warning("token for %s: %s; again in %gs", entry.upper_key, exc, RETRY)
            entry.due = self._clock() + RETRY
            return
        TOKEN_REQUESTS.labels(result="refreshed" if entry.issued else "issued").inc()
        now = self._clock()
        entry.due = boundtokens.refresh_at(issued=now, expires=expires_at, fraction=self._fraction)
        entry.issued = True
        logger.info("tokens of %s written below, next in %.0fs", entry.upper_key, entry.due - now)

    async def _learn_lower_uid(self, entry: _Entry) -> None:
        """Fill in the lower pod's UID (the Secret's owner) when `issue` was not given it (a
        create that had got through before: AlreadyExists), from the lower pod of that
        name, which must be this node's and the upper pod's. Raises NotFound otherwise."""
        meta = entry.lower["metadata"]
        if meta.get("uid"):
            return
        found = await self._lower.request(
            "GET", PODS.path(namespace=str(meta["namespace"]), name=str(meta["name"]))
        )
        if (
            not ownership.is_owned(found, owner=self._owner)
            or ownership.upper_uid_of(found) != entry.upper_uid
        ):
            raise errors.NotFound(
                code=404, status={"message": "the lower pod of that name is not this pod's"}
            )
        meta["uid"] = uid_of(found)

    def _lower_pod_there(self, entry: _Entry) -> bool:
        """Whether the entry's lower pod is in the informer's store (same UID); a pod just
        created may not be there yet, so only a renewal (`issued`) may find it gone."""
        if not entry.issued:
            return True
        meta = entry.lower["metadata"]
        found = self._pods.store.get(f"{meta['namespace']}/{meta['name']}")
        if found is None:
            return False
        uid = uid_of(found)
        return meta.get("uid") is None or uid == meta.get("uid")

    async def _write(self, entry: _Entry, upper_pod: Obj) -> float:
        """Ask for the tokens and write the lower Secret; return their earliest expiry
        (seconds, the clock's)."""
        namespace = namespace_of(upper_pod)
        account = boundtokens.service_account(upper_pod)
        tokens: dict[str, str] = {}
        expiry = float("inf")
        now = self._clock()
        for ask in boundtokens.asks(upper_pod):
            answer = await self._upper.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                body=boundtokens.token_request(ask, pod=upper_pod),
            )
            status = as_mapping(answer.get("status"))
            tokens[ask.key] = str(status.get("token") or "")
            expiry = min(expiry, _seconds(status.get("expirationTimestamp"), now=now, ask=ask))
        root = await self._upper.request(
            "GET", CONFIG_MAPS.path(namespace=namespace, name="kube-root-ca.crt")
        )
        ca = str(as_mapping(root.get("data")).get(boundtokens.CA_KEY) or "")
        # The owner's annotations say whose it is; not its labels, which the copies' mirrors
        # select on: this Secret is no copy of an upper one (the lower pod owns it).
        _, annotations = ownership.owner_marks(self._owner)
        lower_meta = entry.lower["metadata"]
        body = boundtokens.secret(
            name=boundtokens.secret_name(str(lower_meta["name"])),
            namespace=str(lower_meta["namespace"]),
            tokens=tokens,
            expires=timestamps.rfc3339(dt.datetime.fromtimestamp(expiry, dt.UTC)),
            ca=ca,
            upper_namespace=namespace,
            labels={},
            annotations={**annotations, ownership.UPPER_NAMESPACE_ANNOTATION: namespace},
            owner=lower_meta,
        )
        path = SECRETS.path(namespace=str(lower_meta["namespace"]))
        try:
            await self._lower.request("POST", path, body=body)
        except errors.AlreadyExists:
            # Ours (a renewal, or a Secret left by an earlier pod of the same name): its
            # tokens replaced, for this pod. Anyone else's Secret of that name is not touched.
            secret_path = SECRETS.path(namespace=str(lower_meta["namespace"]), name=name_of(body))
            found = await self._lower.request("GET", secret_path)
            if not boundtokens.is_token_secret(found, cluster_id=self._owner.cluster_id):
                raise errors.Conflict(
                    code=409,
                    status={
                        "message": f"the lower Secret {object_key(found)} is not a token "
                        f"Secret of this cluster's virtual nodes ({ownership.owner_of(found)}); "
                        "left as it is"
                    },
                ) from None
            meta = meta_of(body)
            patch = {
                "metadata": {
                    "uid": uid_of(found),
                    **{k: meta[k] for k in ("annotations", "ownerReferences")},
                },
                "stringData": body["stringData"],
            }
            await self._lower.request("PATCH", secret_path, body=patch, content_type=MERGE_PATCH)
        return expiry


def _mounts_token(lower: Mapping[str, Any]) -> bool:
    """Whether lower pod `lower` mounts its token Secret: as the informer caches it (slim:
    no volumes, its references under `slim.REFS`), or whole."""
    name = boundtokens.secret_name(name_of(lower))
    if ["Secret", name] in (lower.get(slim.REFS) or []):
        return True
    for volume in dicts_in(as_mapping(lower.get("spec")).get("volumes")):
        for source in dicts_in(as_mapping(volume.get("projected")).get("sources")):
            if as_mapping(source.get("secret")).get("name") == name:
                return True
    return False


def _seconds(timestamp: object, *, now: float, ask: boundtokens.TokenAsk) -> float:
    """The clock's seconds of an RFC 3339 `timestamp` (the asked life when unreadable)."""
    parsed = timestamps.parse_rfc3339(timestamp)
    return now + ask.expiration if parsed is None else parsed.timestamp()
