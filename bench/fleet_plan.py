"""What the fleet benchmark builds, as pure values: the lower clusters' kwok Nodes and the
filler pods that fragment their free capacity, the workload mix of each configuration, and
the report (table and ratios). No I/O here; `fleet.py` carries it out.

The fleet is made so that summed free capacity misleads: every other lower cluster
("fragmented") has each of its Nodes filled up to FRAGMENTED_FREE, so its virtual node
offers plenty of CPU in total while no single lower Node takes a LARGE pod; the others
("roomy") keep holes of HOLE_FREE on every other Node. The upper scheduler, which sees
each lower cluster as one Node, spreads LARGE pods over all virtual nodes in proportion
to their sums; a fit-aware extender keeps them off the fragmented ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensile.contracts.quotaslices import SLICES_ANNOTATION

BENCH_LABEL = "tensile.io/fleet-bench"
"""On every namespace and pod the benchmark makes upstairs; its value is the configuration."""
DISK_TAINT_KEY = "tensile.io/bench-disk"
"""Tainted (NoSchedule) and labelled on the lower Nodes that hold the StatefulSet's local
volumes: only the StatefulSet's pods go there, so their holes stay free for them."""
UPPER_STORAGE_CLASS = "tensile-fleet-bench"
LOWER_STORAGE_CLASS = "fleet-bench-local"
FILLER_NAMESPACE = "fleet-bench-fillers"
VIRTUAL_TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists"}

SHAPES = (("4", 16), ("8", 32), ("16", 64), ("32", 128))
"""(cpu cores, memory GiB) of lower Nodes, in turn: mixed sizes."""
FRAGMENTED_FREE = (1000, 4096)
"""(millicores, MiB) left free on every Node of a fragmented cluster."""
HOLE_FREE = (4000, 16384)
"""(millicores, MiB) left free on every other Node of a roomy cluster (and its disk Nodes)."""
SLIVER_FREE = (500, 2048)
"""(millicores, MiB) left free on the other Nodes of a roomy cluster."""
SMALL = (50, 64)
"""(millicores, MiB) a small pod requests."""
LARGE = (2000, 4096)
"""(millicores, MiB) a large pod requests: more than any Node of a fragmented cluster has."""
PODS_PER_NODE = 110
SMALL_PER_DEPLOYMENT = 100
LARGE_PER_DEPLOYMENT = 50
QUOTA_NAMESPACES = 2
QUOTA_HEADROOM = 1.5
"""A quota'd namespace's quota over what its pods request: room for a replacement pod."""


@dataclass(frozen=True, kw_only=True)
class Scale:
    """How big the benchmark is (its flags)."""

    lower_clusters: int
    nodes_per_cluster: int
    pods: int
    """Workload pods upstairs in each configuration (fillers not counted)."""


def fragmented(cluster_index: int) -> bool:
    """Every other lower cluster (the second, fourth, ...) is fragmented."""
    return cluster_index % 2 == 1


@dataclass(frozen=True, kw_only=True)
class NodePlan:
    """One kwok Node of a lower cluster and the filler pod that leaves `free` of it."""

    name: str
    cpu: str
    memory_gib: int
    free: tuple[int, int]
    """(millicores, MiB) left free by the filler."""
    disk: bool
    """Tainted and labelled for the StatefulSet's volumes."""

    @property
    def filler(self) -> tuple[int, int]:
        """(millicores, MiB) the filler requests (0, 0: no filler)."""
        return (int(self.cpu) * 1000 - self.free[0], self.memory_gib * 1024 - self.free[1])


@dataclass(frozen=True, kw_only=True)
class Mix:
    """The workload of one configuration, counted in pods."""

    statefulset: int
    bare: int
    bare_large: int
    large: int
    """Pods of the large Deployments."""
    quota: int
    """Small pods in each quota'd namespace."""
    small: int
    """Pods of the small Deployments (unquota'd)."""

    @property
    def total(self) -> int:
        return (
            self.statefulset + self.bare + self.large + QUOTA_NAMESPACES * self.quota + self.small
        )

    @property
    def large_pods(self) -> int:
        return self.statefulset + self.bare_large + self.large


def mix(pods: int) -> Mix:
    """Divide `pods` into the workload mix: 2 % StatefulSet (at least 2), 5 % bare pods (a
    quarter large), 5 % large Deployment pods, 10 % in each quota'd namespace, the rest
    small Deployment pods. Raises ValueError below 50 pods."""
    if pods < 50:
        raise ValueError(f"--pods must be at least 50 (the mix needs a few of each), got {pods}")
    statefulset = max(2, pods // 500)
    bare = max(2, pods // 20)
    large = max(2, pods // 20)
    quota = pods // 10
    small = pods - statefulset - bare - large - QUOTA_NAMESPACES * quota
    return Mix(
        statefulset=statefulset,
        bare=bare,
        bare_large=max(1, bare // 4),
        large=large,
        quota=quota,
        small=small,
    )


def lower_nodes(cluster: str, cluster_index: int, *, count: int, disks: int) -> list[NodePlan]:
    """The kwok Nodes of lower cluster `cluster` (the `cluster_index`-th): shapes in turn;
    the first `disks` hold a StatefulSet volume each."""
    nodes = []
    for j in range(count):
        cpu, memory = SHAPES[j % len(SHAPES)]
        disk = j < disks
        if fragmented(cluster_index):
            free = FRAGMENTED_FREE
        elif disk or j % 2 == 0:
            free = HOLE_FREE
        else:
            free = SLIVER_FREE
        nodes.append(
            NodePlan(name=f"{cluster}-n{j}", cpu=cpu, memory_gib=memory, free=free, disk=disk)
        )
    return nodes


def check_fits(scale: Scale) -> None:
    """Raise ValueError (naming the flag to change) unless the roomy clusters alone can run
    the whole mix: the target is that nothing need be stranded."""
    if scale.lower_clusters < 2:
        raise ValueError(
            f"--lower-clusters must be at least 2 (a roomy and a fragmented one), "
            f"got {scale.lower_clusters}"
        )
    m = mix(scale.pods)
    roomy = [i for i in range(scale.lower_clusters) if not fragmented(i)]
    if m.statefulset > scale.nodes_per_cluster:
        raise ValueError(
            f"--nodes-per-cluster must be at least {m.statefulset} (one Node per StatefulSet "
            f"volume) for --pods {scale.pods}, got {scale.nodes_per_cluster}"
        )
    plans = [lower_nodes("c", i, count=scale.nodes_per_cluster, disks=m.statefulset) for i in roomy]
    per_hole = HOLE_FREE[0] // LARGE[0]
    large_slots = sum(
        per_hole for nodes in plans for n in nodes if n.free == HOLE_FREE and not n.disk
    )
    needed_nodes = math.ceil(
        scale.nodes_per_cluster * (m.large + m.bare_large) / max(1, large_slots)
    )
    if m.large + m.bare_large > large_slots:
        raise ValueError(
            f"the roomy clusters have room for {large_slots} large pods, the mix has "
            f"{m.large + m.bare_large}: raise --nodes-per-cluster to {needed_nodes} or "
            f"--lower-clusters, or lower --pods"
        )
    small_pods = m.total - m.large_pods
    pod_slots = sum(PODS_PER_NODE - 1 for nodes in plans for n in nodes if not n.disk)
    if small_pods + m.large + m.bare_large > pod_slots:
        raise ValueError(
            f"the roomy clusters have {pod_slots} pod slots for {small_pods} small pods: "
            f"raise --nodes-per-cluster or --lower-clusters, or lower --pods"
        )


# -- manifests ---------------------------------------------------------------------------------


def _resources(amount: tuple[int, int]) -> dict[str, Any]:
    return {"requests": {"cpu": f"{amount[0]}m", "memory": f"{amount[1]}Mi"}}


def filler_pod(node: NodePlan) -> dict[str, Any]:
    """A pod bound to `node` below (no scheduler) that takes all but `node.free` of it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"filler-{node.name}", "labels": {"app": "filler"}},
        "spec": {
            "nodeName": node.name,
            "tolerations": [{"key": DISK_TAINT_KEY, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "fill", "image": "filler", "resources": _resources(node.filler)}
            ],
        },
    }


def pod_spec(amount: tuple[int, int], *, disk: bool = False) -> dict[str, Any]:
    """The spec of a workload pod requesting `amount`; `disk`: it goes to the lower Nodes
    with the StatefulSet's volumes (constraints the webhook moves below)."""
    spec: dict[str, Any] = {
        "tolerations": [dict(VIRTUAL_TOLERATION)],
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "nginx:1.27", "resources": _resources(amount)}],
    }
    if disk:
        spec["tolerations"].append({"key": DISK_TAINT_KEY, "operator": "Exists"})
        spec["nodeSelector"] = {DISK_TAINT_KEY: "true"}
    return spec


def _labels(config: str, app: str) -> dict[str, str]:
    return {"app": app, "virtual-pod": "true", BENCH_LABEL: config}


def deployment(name: str, *, config: str, replicas: int, amount: tuple[int, int]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": _labels(config, name)}, "spec": pod_spec(amount)},
        },
    }


def statefulset(name: str, *, config: str, replicas: int) -> dict[str, Any]:
    """Large pods, each with a claim of the virtual nodes' StorageClass, made in parallel
    (not one after the other: the bench starts its scheduler once every pod exists)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": _labels(config, name)},
                "spec": pod_spec(LARGE, disk=True)
                | {"containers": [_with_mount(pod_spec(LARGE)["containers"][0])]},
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": UPPER_STORAGE_CLASS,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


def _with_mount(container: Mapping[str, Any]) -> dict[str, Any]:
    return {**container, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}


def bare_pod(name: str, *, config: str, amount: tuple[int, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": _labels(config, "bare")},
        "spec": pod_spec(amount),
    }


def resource_quota(pods: int) -> dict[str, Any]:
    """A quota on cpu and memory requests: QUOTA_HEADROOM times what `pods` small pods ask."""
    cpu = math.ceil(pods * SMALL[0] * QUOTA_HEADROOM)
    memory = math.ceil(pods * SMALL[1] * QUOTA_HEADROOM)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "compute"},
        "spec": {
            "hard": {
                "requests.cpu": f"{cpu}m",
                "requests.memory": f"{memory}Mi",
            }
        },
    }


def local_volume(name: str, *, node: str) -> dict[str, Any]:
    """A lower PersistentVolume on `node` (kwok mounts nothing; the scheduler honours its
    node affinity)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": LOWER_STORAGE_CLASS,
            "local": {"path": f"/mnt/{name}"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one configuration creates upstairs: namespaces (and their quotas) and objects."""

    namespaces: dict[str, dict[str, Any] | None]
    """Namespace -> its ResourceQuota (None: unquota'd), with the quota slices record an
    administrator sets on it where the namespace is exempted (`exempt_record`)."""
    objects: list[tuple[str, str, dict[str, Any]]]
    """(namespace, collection path below /apis or /api, object)."""
    pods: int


def workload(config: str, m: Mix, *, exempt_on: Sequence[str] = ()) -> Workload:
    """The objects of configuration `config` ("a", "b", "c") for mix `m`; `exempt_on`: the
    virtual nodes over which the quota'd namespaces are exempted from quota slices
    (`exempt_record`)."""
    apps = f"fleet-{config}-apps"
    namespaces: dict[str, dict[str, Any] | None] = {apps: None}
    objects: list[tuple[str, str, dict[str, Any]]] = []
    deployments = "/apis/apps/v1/namespaces/{ns}/deployments"
    for i, replicas in enumerate(_chunks(m.small, SMALL_PER_DEPLOYMENT)):
        objects.append(
            (
                apps,
                deployments,
                deployment(f"small-{i}", config=config, replicas=replicas, amount=SMALL),
            )
        )
    for i, replicas in enumerate(_chunks(m.large, LARGE_PER_DEPLOYMENT)):
        objects.append(
            (
                apps,
                deployments,
                deployment(f"large-{i}", config=config, replicas=replicas, amount=LARGE),
            )
        )
    objects.append(
        (
            apps,
            "/apis/apps/v1/namespaces/{ns}/statefulsets",
            statefulset("db", config=config, replicas=m.statefulset),
        )
    )
    for i in range(m.bare):
        amount = LARGE if i < m.bare_large else SMALL
        objects.append(
            (
                apps,
                "/api/v1/namespaces/{ns}/pods",
                bare_pod(f"bare-{i}", config=config, amount=amount),
            )
        )
    for q in range(QUOTA_NAMESPACES):
        namespace = f"fleet-{config}-quota-{q}"
        quota = resource_quota(m.quota)
        if exempt_on:
            quota["metadata"]["annotations"] = {SLICES_ANNOTATION: exempt_record(exempt_on, quota)}
        namespaces[namespace] = quota
        for i, replicas in enumerate(_chunks(m.quota, SMALL_PER_DEPLOYMENT)):
            objects.append(
                (
                    namespace,
                    deployments,
                    deployment(f"team-{i}", config=config, replicas=replicas, amount=SMALL),
                )
            )
    return Workload(namespaces=namespaces, objects=objects, pods=m.total)


def exempt_record(virtual_nodes: Sequence[str], quota: Mapping[str, Any]) -> str:
    """A quota slices record, as an administrator writes it on the namespace's `quota`, that
    gives every one of `virtual_nodes` one slice as large as the whole quota: the namespace
    may use each virtual node as if it had no slices (its ResourceQuota still bounds its
    total). The slice controller keeps a record it did not write (docs/slices.md)."""
    hard = quota["spec"]["hard"]
    slice_ = f"1x({hard['requests.cpu']},{hard['requests.memory']})"
    return ",".join(f"{node}={slice_}" for node in virtual_nodes)


def _chunks(total: int, size: int) -> Iterator[int]:
    while total > 0:
        yield min(size, total)
        total -= size


# -- the report --------------------------------------------------------------------------------


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Return quantile `q` (0..1) of a Prometheus histogram given as cumulative counts by
    upper bound `le` (+Inf included), interpolating linearly inside the bucket, as
    PromQL's histogram_quantile does; None when it counted nothing. A quantile in the +Inf
    bucket is the largest finite bound."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def bind_rate(binds: Sequence[float], *, share: float = 0.9) -> float | None:
    """Pods bound per second: the first `share` of the binds (monotonic seconds) over the
    time from the first bind to the last of them. From the first bind, so the scheduler's
    own start is left out; up to a share, so a few pods that wait (a retry's backoff) do
    not make the rate of thousands. None for fewer than two binds."""
    if len(binds) < 2:
        return None
    ordered = sorted(binds)
    last = max(1, math.ceil(share * len(ordered)) - 1)
    return (last + 1) / max(1e-3, ordered[last] - ordered[0])


def ratio(value: float | None, base: float | None) -> str:
    """`value / base` as "0.95x"; "-" when either is missing or the base is 0 (and so is
    the value: "=")."""
    if value is None or base is None:
        return "-"
    if base == 0:
        return "=" if value == 0 else "new"
    return f"{value / base:.2f}x"


def table(
    rows: Sequence[tuple[str, Sequence[float | None], str]], configs: Sequence[str]
) -> list[str]:
    """Format rows of (label, value per configuration, printf format) with ratio columns
    against the first configuration."""
    head = ["", *configs, *(f"{c}/{configs[0]}" for c in configs[1:])]
    lines = [head]
    for label, values, fmt in rows:
        cells = [label]
        cells += ["-" if v is None else format(v, fmt) for v in values]
        cells += [ratio(v, values[0]) for v in values[1:]]
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return [
        "  ".join(
            cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        )
        for row in lines
    ]


GROUPS = (
    "etcd",
    "upper apiserver",
    "upper controller-manager",
    "upper scheduler",
    "lower apiservers",
    "lower controller-managers",
    "lower schedulers",
    "kwok",
    "virtual nodes",
    "webhook",
    "descheduler",
    "extender",
)
"""The component groups CPU and memory are reported for, in order."""


def component_group(name: str) -> str | None:
    """The group of process `name`: a fleet component ("etcd", "lower-3-apiserver", ...)
    or one the benchmark runs ("virtual node vn-lower", "webhook", "descheduler",
    "extender", "upper scheduler"); None for what is not counted (the fleet's own upper
    scheduler and helpers, idle during the benchmark)."""
    if name in GROUPS:
        return name
    if name.startswith("virtual node "):
        return "virtual nodes"
    if name.endswith("-kwok"):
        return "kwok"
    role, _, component = name.partition("-")
    while component and component[0].isdigit():  # lower-3-apiserver
        component = component.partition("-")[2]
    if role == "upper" and component in ("apiserver", "controller-manager"):
        return f"upper {component}"
    if role == "lower" and component in ("apiserver", "controller-manager", "scheduler"):
        return f"lower {component}s"
    return None
