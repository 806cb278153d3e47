"""Copies of what forwarded pods need in the lower cluster: ConfigMaps, Secrets, ServiceAccounts.

Three on-request mirrors (`tensile.kube.mirror`) in the node's tenancy, one per kind, upper ->
lower:

- Before a pod is created below, every object it references is copied from the upper
  cluster (created, or brought up to date); a missing mandatory one is an error, not a pod
  that starts without it (tensile-kube's fire-and-forget copies were a defect).
- Later changes of an upper object reach its lower copy (event-driven); a copy a lower
  pod (or a pod creation of ours on its way below) uses is made again when it is deleted
  below, by someone else or by the sibling node that made it.
- A copy no lower pod references any more is deleted; copies a pod creation in flight
  needs stay until the lower pod shows in the cache (the in-flight create race).
- Only copies this virtual node made are ever updated or deleted; a same-named lower
  object that is not ours is never touched, and a pod needing it is refused with a reason.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tensile.contracts import ownership
from tensile.contracts.objects import Obj, annotations_of, meta_of, name_of, namespace_of
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.informer import Handlers, Informer
from tensile.kube.informer_factory import InformerFactory
from tensile.kube.mirror.engine import EnsureResult, Mirror, NameTakenError
from tensile.kube.mirror.spec import Change, KindSpec, Patch, Replace
from tensile.kube.resources import CONFIG_MAPS, SECRETS, SERVICE_ACCOUNTS, Resource
from vnode import provider_errors
from vnode.provider import PodEvent
from vnode.providers.k2k import boundtokens, missing, naming, slim, translate

logger = logging.getLogger(__name__)

KINDS: dict[str, Resource] = {
    "ConfigMap": CONFIG_MAPS,
    "Secret": SECRETS,
    "ServiceAccount": SERVICE_ACCOUNTS,
}
# The token controller of the lower cluster owns these; a copy would be deleted or, worse,
# carry upper-cluster credentials with a lower-cluster meaning.
_SKIPPED_SECRET_TYPES = frozenset({"kubernetes.io/service-account-token"})
_COPIED_FIELDS = {
    "ConfigMap": ("data", "binaryData", "immutable"),
    "Secret": ("data", "type", "immutable"),
    "ServiceAccount": ("automountServiceAccountToken",),
}
REFS_INDEX = "tensile.io/refs"
"""Index of the lower pod store: "namespace/kind/name" of each object a pod references."""


def copy_of(
    upper: Mapping[str, Any], *, kind: str, namespace: str, owner: ownership.NodeIdentity
) -> Obj:
    """Return the lower copy of an upper ConfigMap, Secret or ServiceAccount (pure)."""
    meta = meta_of(upper)
    labels, annotations = ownership.owner_marks(owner)
    copy: Obj = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": meta.get("name"),
            "namespace": namespace,
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": {
                **annotations,
                ownership.UPPER_NAMESPACE_ANNOTATION: str(meta.get("namespace")),
            },
        },
    }
    for f in _COPIED_FIELDS[kind]:
        if f in upper:
            copy[f] = upper[f]
    return copy


def needs_update(lower: Mapping[str, Any], desired: Mapping[str, Any], *, kind: str) -> bool:
    """Tell whether the lower copy's content differs from the desired copy (pure)."""
    return any(lower.get(f) != desired.get(f) for f in _COPIED_FIELDS[kind] if f != "immutable")


def compare_copy(lower: Mapping[str, Any], desired: Mapping[str, Any], *, kind: str) -> Change:
    """Return how to bring a lower copy to `desired` (pure): nothing, a merge patch of the
    copied fields, or a replacement when the copy is immutable (pods already running keep
    the old content, exactly as with an immutable object upstairs)."""
    if not needs_update(lower, desired, kind=kind):
        return None
    if lower.get("immutable"):
        return Replace("the copy is immutable")
    return Patch({f: desired.get(f) for f in _COPIED_FIELDS[kind]})


def copyable(upper: Mapping[str, Any], *, kind: str) -> bool:
    """Tell whether an upper object may be copied below at all (pure): ServiceAccount
    token Secrets never are, nor Secrets named like the virtual nodes' own token Secrets
    below (`boundtokens.SECRET_PREFIX`): a lower pod that mounts its token Secret would
    otherwise have it "in use" and the copy made in its place once it is gone."""
    if kind != "Secret":
        return True
    return upper.get("type") not in _SKIPPED_SECRET_TYPES and not name_of(upper).startswith(
        boundtokens.SECRET_PREFIX
    )


def copy_spec(*, kind: str, tenancy: naming.NodeTenancy) -> KindSpec:
    """Return the on-request mirror of one dependency kind, upper -> lower (pure).

    Copies are made when a pod needs them (`Mirror.ensure`), follow their upper object,
    and are garbage once nothing uses them (the mirror's `in_use`), even while their upper
    object still exists. A copy another virtual node of the same upper cluster made serves
    as ours and is kept up to date like ours (in its name: that node may be gone while our
    pods use the copy); its collection stays with its owner.
    """
    resource = KINDS[kind]
    owner, prefix = tenancy.owner, tenancy.prefix

    def translate_one(upper: Obj) -> Obj:
        namespace = naming.lower_namespace(namespace_of(upper), prefix=prefix)
        return copy_of(upper, kind=kind, namespace=namespace, owner=owner)

    def compare(lower: Obj, desired: Obj) -> Change:
        return compare_copy(lower, desired, kind=kind)

    return KindSpec(
        name=f"{resource.plural}_to_lower",
        kind=kind,
        source=resource,
        target=resource,
        selects=lambda upper: copyable(upper, kind=kind),
        translate=translate_one,
        compare=compare,
        collectable=lambda _lower, _upper: True,
        creation="on_request",
        keeps_siblings=lambda _key, _lower: True,
    )


def _refs_of(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    precomputed = pod.get(slim.REFS)
    if precomputed is not None:  # a slimmed cached pod (see slim.py)
        return {(kind, name) for kind, name in precomputed}
    deps = translate.dependencies(pod)
    refs = {("ConfigMap", n) for n in deps.config_maps}
    refs |= {("Secret", n) for n in deps.secrets}
    if deps.service_account:
        refs.add(("ServiceAccount", deps.service_account))
    return refs


def _ref_index(pod: Obj) -> list[str]:
    namespace = namespace_of(pod)
    return [f"{namespace}/{kind}/{name}" for kind, name in _refs_of(pod)]


@dataclass(frozen=True, kw_only=True)
class Ensured:
    """What `DependencySync.ensure` did for a pod."""

    created: list[tuple[str, str, str]]
    """Copies created (kind, lower namespace, name), to roll back if the pod is refused."""
    events: list[PodEvent]
    """Events to record about the pod (optional references it starts without)."""
    absent: frozenset[tuple[str, str]] = frozenset()
    """(kind, name) of the ConfigMaps and Secrets the pod references but that are not
    copied below: the lower pod must not reference them (`translate.lower_pod`)."""


@dataclass
class _Creation:
    """A pod creation in flight or not yet seen in the lower pod cache."""

    lower_namespace: str
    refs: set[tuple[str, str]]


class DependencySync:
    """Keeps the lower copies of pods' dependencies; see the module docstring."""

    def __init__(
        self,
        *,
        upper: ApiClient,
        lower: ApiClient,
        tenancy: naming.NodeTenancy,
        upper_namespace: str | None,
        enable_service_account: bool,
        lower_pods: Informer,
        informers: InformerFactory,
        on_resolved: Callable[[str], None],
        workers: int = 4,
    ) -> None:
        """`lower_pods` is the cache of every lower pod (slimmed, see `slim`), shared with
        the provider; `on_resolved(upper pod key)` is called (non-blocking) when an object
        a waiting pod needed is added or changed upstairs, so its creation is retried at
        once."""
        self._on_resolved = on_resolved
        self._waiting: dict[tuple[str, str, str], set[str]] = {}
        """(kind, upper namespace, name) -> upper pods whose creation waits for it."""
        owner = tenancy.owner
        self._owner = owner
        self._prefix = tenancy.prefix
        self._enable_sa = enable_service_account
        self._lower_pods = lower_pods
        self._creations: dict[str, _Creation] = {}
        """Upper pod key -> its creation, from `creating` until the lower pod is cached."""
        lower_pods.store.add_indexer(REFS_INDEX, _ref_index)
        lower_pods.add_handlers(
            Handlers(
                on_add=self._lower_pod_seen,
                on_modify=self._lower_pod_seen,
                on_delete=self._lower_pod_gone,
            )
        )
        self._other_uses: dict[str, list[Callable[[str], bool]]] = {}
        """Kind -> what else than pods tells whether a copy is in use (`add_use`)."""
        self.mirrors: dict[str, Mirror] = {}
        for kind, resource in KINDS.items():
            source = informers.informer(
                upper,
                resource,
                name=f"upper-{resource.plural}",
                namespace=upper_namespace,
                encoded=True,  # every ConfigMap and Secret upstairs; read when a pod needs one
            )
            # Every copy of this upper cluster's (ours and sibling nodes'), so a copy our
            # pods use is kept up to date even when the node that made it is gone.
            target = informers.informer(
                lower,
                resource,
                name=f"lower-copies-{resource.plural}",
                label_selector=ownership.cluster_selector(owner),
                namespaces=tenancy.watched,
            )
            self.mirrors[kind] = Mirror(
                spec=copy_spec(kind=kind, tenancy=tenancy),
                tenancy=tenancy,
                source=source,
                target=target,
                source_client=upper,
                target_client=lower,
                workers=workers,
                in_use=self._in_use_checker(kind),
            )
            source.add_handlers(self._handlers_for(kind))

    def _handlers_for(self, kind: str) -> Handlers:
        def changed(obj: Obj) -> None:
            meta = meta_of(obj)
            for pod_key in self._waiting.pop(
                (kind, str(meta.get("namespace")), str(meta.get("name"))), ()
            ):
                self._on_resolved(pod_key)

        return Handlers(on_add=changed, on_modify=changed)

    def components(self) -> list[Mirror]:
        """The three mirrors, to run as components of the node."""
        return list(self.mirrors.values())

    # -- what is in use ------------------------------------------------------------------

    def _in_use_checker(self, kind: str) -> Callable[[str], bool]:
        def in_use(copy_key: str) -> bool:
            # Asked of a copy present or gone: a gone one in use is made again.
            namespace, _, name = copy_key.partition("/")
            if kind == "ServiceAccount" and name == "default":
                # Never copied (`ensure` skips it): every lower namespace has its own, and
                # a copy "in use" would be a create that meets it, reported as a conflict.
                return False
            if any(use(copy_key) for use in self._other_uses.get(kind, ())):
                return True
            # Keys only: nothing of the (encoded) lower pod cache is decoded to answer.
            if self._lower_pods.store.index_keys(REFS_INDEX, f"{namespace}/{kind}/{name}"):
                return True
            return any(
                c.lower_namespace == namespace and (kind, name) in c.refs
                for c in self._creations.values()
            )

        return in_use

    def add_use(self, kind: str, in_use: Callable[[str], bool]) -> None:
        """Keep the copies of `kind` that `in_use(lower key)` says something besides pods
        needs (e.g. the TLS Secrets of copied Ingresses): they are made when absent as soon
        as `self.mirrors[kind].revisit` is asked for their upper key, and kept while it says
        so."""
        self._other_uses.setdefault(kind, []).append(in_use)

    def _lower_pod_seen(self, pod: Obj) -> None:
        for key in _upper_keys(pod):
            self._creations.pop(key, None)

    def _lower_pod_gone(self, pod: Obj) -> None:
        if not ownership.is_owned(pod, owner=self._owner):
            return
        upper = naming.upper_key_of(pod, prefix=self._prefix)
        if upper is None:
            return
        upper_ns = upper.partition("/")[0]
        for kind, name in _refs_of(pod):
            self.mirrors[kind].schedule_collection([f"{upper_ns}/{name}"])

    # -- before a pod is created ---------------------------------------------------------

    @contextlib.contextmanager
    def creating(self, pod: Mapping[str, Any]) -> Iterator[None]:
        """Mark `pod`'s creation while it runs and until its lower pod is cached, so the
        copies it needs are not collected in between. A creation that fails has its copies
        looked at again (they may be unused now)."""
        meta = meta_of(pod)
        key = f"{meta['namespace']}/{meta['name']}"
        lower_ns = naming.lower_namespace(str(meta["namespace"]), prefix=self._prefix)
        refs = _refs_of(pod)
        self._creations[key] = _Creation(lower_namespace=lower_ns, refs=refs)
        try:
            yield
        except BaseException:
            self._creations.pop(key, None)
            for kind, name in refs:
                self.mirrors[kind].schedule_collection([f"{meta['namespace']}/{name}"])
            raise

    async def ensure(self, pod: Mapping[str, Any]) -> Ensured:
        """Create or update the lower copies `pod` needs.

        Returns the copies created and the events about optional references skipped.
        Raises MissingDependency for a mandatory object or key missing upstairs (the pod is
        then announced to `on_resolved` once that object is added or changed), InvalidPod
        for a same-named lower object that is not ours or a copy the lower cluster refuses
        (the copies made so far are removed again), and kube errors for API failures.
        """
        upper_ns = namespace_of(pod)
        pod_key = f"{upper_ns}/{name_of(pod)}"
        lower_ns = naming.lower_namespace(upper_ns, prefix=self._prefix)
        deps = translate.dependencies(pod)

        def lookup(kind: str, name: str) -> Obj | None:
            return self.mirrors[kind].source.store.get(f"{upper_ns}/{name}")

        gaps = missing.unresolved(pod, lookup=lookup)
        self.forget_waiting(pod_key)
        error = missing.first_mandatory(gaps, namespace=upper_ns)
        account = deps.service_account
        if self._enable_sa and account and account != "default":
            if error is None and lookup("ServiceAccount", account) is None:
                error = provider_errors.MissingDependency(
                    f'serviceaccount "{account}" not found',
                    kind="ServiceAccount",
                    namespace=upper_ns,
                    name=account,
                )
        else:
            account = None
        if error is not None:
            self._waiting.setdefault((error.kind, upper_ns, error.name), set()).add(pod_key)
            raise error
        wanted = [("ConfigMap", n) for n in sorted(deps.config_maps)]
        wanted += [("Secret", n) for n in sorted(deps.secrets)]
        if account:
            wanted.append(("ServiceAccount", account))
        created: list[tuple[str, str, str]] = []
        absent: set[tuple[str, str]] = set()
        optional = translate.optional_references(pod)
        for kind, name in wanted:
            source = lookup(kind, name)
            if source is None:
                absent.add((kind, name))  # optional and missing: the pod starts without it
                continue
            if not copyable(source, kind=kind):
                if (kind, name) not in optional:
                    raise provider_errors.InvalidPod(
                        f"Secret {upper_ns}/{name} holds a ServiceAccount token of the upper "
                        "cluster; tensile does not copy upper credentials below, and a lower "
                        "Secret of that name would be someone else's: refusing the pod"
                    )
                absent.add((kind, name))
                continue
            result = await self._copy(pod, kind=kind, name=name, created=created)
            if result is None:
                absent.add((kind, name))  # deleted upstairs this very moment
            elif result == "created":
                created.append((kind, lower_ns, name))
        return Ensured(
            created=created,
            events=missing.skipped_events(gaps, namespace=upper_ns),
            absent=frozenset(absent),
        )

    async def _copy(
        self, pod: Mapping[str, Any], *, kind: str, name: str, created: list[tuple[str, str, str]]
    ) -> EnsureResult | None:
        """Make or update the lower copy of `kind` `name` (in `pod`'s namespace) for `pod`;
        return the mirror's result, None when the object was deleted upstairs just now.
        Raises InvalidPod when a same-named lower object is not ours or the lower cluster
        refuses the copy (then the copies in `created`, made for `pod` so far, go again)."""
        upper_ns = namespace_of(pod)
        lower_ns = naming.lower_namespace(upper_ns, prefix=self._prefix)
        try:
            return await self.mirrors[kind].ensure(f"{upper_ns}/{name}")
        except KeyError:
            return None
        except NameTakenError as exc:
            raise provider_errors.InvalidPod(
                f"{kind} {lower_ns}/{name} exists in the lower cluster and is "
                f"{ownership.owner_of(exc.target)}; refusing to use or overwrite it (the pod "
                "would run with another tenant's object)"
            ) from exc
        except (errors.Invalid, errors.Forbidden, errors.BadRequest) as exc:
            # The lower cluster refuses the copy (a quota, an admission policy): the pod
            # cannot start as things are. (A namespace being deleted is waited out by the
            # mirror, never seen here.)
            await self.rollback(pod, created)
            raise provider_errors.InvalidPod(
                f"lower cluster refused the copy of {kind} {upper_ns}/{name} "
                f"({lower_ns}/{name} below): {exc.message}"
            ) from exc

    def forget_waiting(self, pod_key: str) -> None:
        """Stop announcing upper pod `pod_key` (namespace/name) when a dependency appears,
        and stop holding copies for a creation of it that was never seen below."""
        for what in [w for w, pods in self._waiting.items() if pod_key in pods]:
            self._waiting[what].discard(pod_key)
            if not self._waiting[what]:
                del self._waiting[what]

    def pod_deleted(self, pod_key: str) -> None:
        """The upper pod `pod_key` is being deleted: forget it entirely."""
        self.forget_waiting(pod_key)
        creation = self._creations.pop(pod_key, None)
        if creation is not None:
            upper_ns = pod_key.partition("/")[0]
            for kind, name in creation.refs:
                self.mirrors[kind].schedule_collection([f"{upper_ns}/{name}"])

    async def rollback(
        self, pod: Mapping[str, Any], created: Iterable[tuple[str, str, str]]
    ) -> None:
        """Delete the copies made for `pod`, which the lower cluster refused, unless another
        pod uses them (at once: the refusal is reported only after this)."""
        meta = meta_of(pod)
        self._creations.pop(f"{meta['namespace']}/{meta['name']}", None)
        for kind, _namespace, name in created:
            await self.mirrors[kind].collect(f"{meta['namespace']}/{name}")


def _upper_keys(lower_pod: Obj) -> list[str]:
    annotations = annotations_of(lower_pod)
    namespace = annotations.get(ownership.UPPER_NAMESPACE_ANNOTATION)
    return [f"{namespace}/{name_of(lower_pod)}"] if namespace else []
