"""The lower node pool a virtual node stands for (--lower-node-selector).

A virtual node may stand for some of the lower cluster's nodes only, a pool chosen by a
label selector (a GPU pool, a zone). The lower nodes informer then watches the pool's nodes
only (the selector goes to the API server as the watch's `labelSelector`), so the capacity,
the placement summary and the metrics are the pool's; the lower pods are confined to the
pool by node affinity (`placement.lower.pool_term`).

A lower node that stops matching leaves the watch at once: the API server sends a watch
that filters by labels a DELETED event when an object stops matching (its cacher's
`convertToWatchEvent`), so the capacity drops the node with the next status. The pods of
this virtual node that run there are not touched (a label changed, not the pods' fate: a
node relabelled by mistake must not cost its pods) but reported: `PoolWatch` writes a
Warning Event `LowerNodeLeftPool` on each of their upper pods.

`shared_labels` is what --lower-node-labels-to-copy puts on the virtual Node: the values all
the pool's nodes share, so upper nodeSelectors on them keep working.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tensile.contracts import ownership, selectors
from tensile.contracts.objects import labels_of, name_of
from tensile.kube import errors
from tensile.kube.client import ApiClient
from tensile.kube.events import EventRecorder
from tensile.kube.informer import Handlers, Informer
from tensile.kube.resources import NODES
from tensile.kube.workqueue import WorkQueue
from vnode.providers.k2k import resource_usage

logger = logging.getLogger(__name__)

LEFT_POOL_REASON = "LowerNodeLeftPool"
"""Reason of the Warning Event on an upper pod whose lower node left the pool."""


def shared_labels(nodes: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, str]:
    """Return, for each of `keys`, the value every one of `nodes` carries for it; a key some
    node lacks, or that the nodes disagree on, is left out, and so is every key when there
    is no node (nothing is shared by no node). Pure; a new dict in the order of `keys`."""
    listed = [labels_of(node) for node in nodes]
    if not listed:
        return {}
    shared: dict[str, str] = {}
    for key in keys:
        values = {labels.get(key) for labels in listed}
        if len(values) == 1 and (value := values.pop()) is not None:
            shared[key] = value
    return shared


async def pool_labels(
    lower: ApiClient, *, pool: selectors.Selector, keys: Sequence[str]
) -> dict[str, str]:
    """Return the labels of `keys` that every lower node of `pool` shares (`shared_labels`),
    read with one list of the pool's nodes (unpaged: a list without `limit` is answered
    whole); {} without keys (no request then). Raises the lower API server's errors."""
    if not keys:
        return {}
    query = {"labelSelector": selectors.render(pool)} if pool.requirements else None
    found = await lower.request("GET", NODES.path(), params=query)
    listed = [item for item in found.get("items") or [] if isinstance(item, dict)]
    return shared_labels(listed, keys)


def left_pool(node: Mapping[str, Any] | None, pool: selectors.Selector) -> bool:
    """Tell whether the lower node `node`, as read now (None: it is gone), is outside the
    pool: it exists and `pool` does not select its labels. A deleted node is not "left":
    its pods are the pod garbage collector's to remove, and their deletion flows up."""
    return node is not None and not pool.matches(labels_of(node))


def left_pool_message(*, node: str, pool: selectors.Selector) -> str:
    """The Event message on an upper pod whose lower node `node` left `pool`."""
    return (
        f"lower node {node} no longer matches --lower-node-selector {selectors.render(pool)}: "
        "the pod keeps running there, but the node's room no longer counts for this virtual "
        "node; delete the pod to have it placed in the pool again"
    )


class PoolWatch:
    """Reports the pods of this virtual node whose lower node left the pool.

    Each node the pool's informer drops is read again: when it still exists and no longer
    matches, every pod of this node bound to it gets a Warning Event (`LEFT_POOL_REASON`)
    on its upper pod. Nothing is deleted or evicted. At start, the nodes outside the pool
    that this node's pods are on are checked the same way."""

    name = "lower-node-pool"

    def __init__(
        self,
        *,
        lower: ApiClient,
        upper_events: ApiClient,
        owner: ownership.NodeIdentity,
        made: Callable[[Mapping[str, Any]], bool],
        pool: selectors.Selector,
        nodes: Informer,
        pods: Informer,
    ) -> None:
        """`nodes` is the lower nodes informer filtered by `pool` (its deletions are what
        is checked); `pods` the lower pods informer, of which `made` tells the pods this
        node made (`LowerPodBook.made`: only their upper pods are told); Events go through
        `upper_events`, as `owner`'s."""
        self._lower = lower
        self._made = made
        self._pool = pool
        self._nodes = nodes
        self._pods = pods
        self._recorder = EventRecorder(
            upper_events, component=f"{owner.node_name}/lower-node-pool", host=owner.node_name
        )
        self.queue = WorkQueue(name="lower_node_pool")
        self._running = False
        nodes.add_handlers(Handlers(on_delete=self.node_dropped))

    def informers(self) -> Sequence[Informer]:
        """The pool's nodes and the lower pods."""
        return [self._nodes, self._pods]

    async def start(self) -> None:
        """Nothing to do before the informers run."""

    def ready(self) -> bool:
        """Whether it has begun checking."""
        return self._running

    async def run(self) -> None:
        """Check dropped nodes until `shut_down()`; first, the nodes outside the pool that
        pods of this node were on when it started (they left while it was not running)."""
        self._running = True
        for name in self.outside_nodes():
            self.queue.add(name)
        await self.queue.run(workers=1, handler=self.check)

    def outside_nodes(self) -> list[str]:
        """The lower nodes this node's pods are bound to that are not in the pool's cache
        (left the pool, or deleted), sorted."""
        owned = resource_usage.owned_pods(self._pods.store, made=self._made)
        return sorted({p.node for p in owned.values() if self._nodes.store.get(p.node) is None})

    async def shut_down(self) -> None:
        """Stop after the check in flight."""
        await self.queue.shut_down()

    def node_dropped(self, node: Mapping[str, Any]) -> None:
        """The nodes informer's delete handler: check the node again."""
        if name := name_of(node):
            self.queue.add(name)

    async def check(self, name: str) -> None:
        """Report this node's pods on the lower node `name` if it left the pool. Raises the
        lower API server's errors but NotFound (the queue retries them)."""
        try:
            node: dict[str, Any] | None = await self._lower.request("GET", NODES.path(name=name))
        except errors.NotFound:
            node = None
        if not left_pool(node, self._pool):
            return
        owned = resource_usage.owned_pods(self._pods.store, made=self._made)
        on_node = [pod for pod in owned.values() if pod.node == name]
        logger.warning(
            "lower node %s left the pool (%s); %d pods of this node run there",
            name,
            selectors.render(self._pool),
            len(on_node),
        )
        message = left_pool_message(node=name, pool=self._pool)
        for pod in on_node:
            upper = {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}}
            await self._recorder.record(
                upper, type="Warning", reason=LEFT_POOL_REASON, message=message, kind="Pod"
            )
