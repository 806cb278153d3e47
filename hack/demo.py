"""`make demo` / `make demo-down`: an upper cluster joined to two lower clusters.

`up` starts a fleet (one upper cluster with metrics-server, two lower clusters of different
sizes, in a private network namespace when run as root), runs one `virtual-node` per lower
cluster (labelled clusterID=<lower cluster>) and `tensile-webhook`, deploys 6 pods (using a
ConfigMap and a Secret) in the upper cluster, waits for them to run, and shows both sides:
the pods spread over the lower clusters, `kubectl logs` and `exec` through a virtual node,
`kubectl top` through metrics-server, and one pod that asks for clusterID=lower-2 and
disk=ssd, converted by the webhook, landing on the one lower node labelled disk=ssd. Then
placement that knows the fleet: the upper kube-scheduler asks `tensile-scheduler` (its
extender), so a pod that lower-2 cannot place (no node of it is big enough, though its
virtual node's total is) goes at once to the lower cluster that has room for it; the
descheduler runs as the safety net. Last, a GPU pool: lower-2 gets a kwok node labelled
pool=gpu with 4 nvidia.com/gpu, behind a virtual node of its own (--lower-node-selector
pool=gpu, copying the GPU product label upstairs) while lower-2's first virtual node stands
for the rest (pool notin (gpu)); a pod selecting the GPU product upstairs runs on the GPU
node. `down` stops the virtual nodes, the webhook, the extender, the descheduler and the
fleet, and removes their state.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devcluster import __main__ as devcluster
from devcluster import netns, processes, webhooks
from devcluster.cluster import Cluster
from devcluster.deschedulers import DeschedulerProcess
from devcluster.fleet import ENV_FILE, Fleet
from devcluster.kwok import FakeNode
from devcluster.schedulers import SchedulerExtenderProcess
from devcluster.vnodes import VirtualNodeProcess
from devcluster.webhooks import WebhookProcess
from tensile.contracts.labels import VIRTUAL_NODE_SELECTOR
from tensile.contracts.objects import annotations_of, name_of
from tensile.placement import summary

NODE = "tensile"
FLEET = [
    "--lowers", "2", "--lower-nodes", "lower-2=2",
    "--node-capacity", "lower-2:cpu=8,memory=32Gi,pods=50",
    "--node-label", "lower-2:1:disk=ssd",
    "--scheduler-extender",
]  # fmt: skip
WEBHOOK = "tensile-webhook"
PLACED = """
apiVersion: v1
kind: Pod
metadata:
  name: fast
  labels: {app: fast, virtual-pod: "true"}
spec:
  # clusterID targets a virtual node: it stays for the upper scheduler. disk=ssd targets a
  # lower node: the webhook moves it into the clusterSelector annotation, and adds the
  # toleration of the virtual nodes' taint.
  nodeSelector: {clusterID: lower-2, disk: ssd}
  containers:
  - {name: main, image: nginx:1.27}
"""
NODE_STATE = "virtual-node.json"
GPU_PRODUCT = "NVIDIA-A100-SXM4-40GB"
# 8 CPU, as lower-2's other nodes: the 12-CPU pod below fits no node of lower-2 either way.
GPU_NODE = FakeNode(
    name="lower-2-gpu-0",
    cpu="8",
    memory="32Gi",
    labels={"pool": "gpu", "nvidia.com/gpu.product": GPU_PRODUCT},
    extended={"nvidia.com/gpu": "4"},
)
POOLS = {
    # lower-2's virtual node stands for its nodes but the GPU pool, which has its own.
    "lower-2": ["--lower-node-selector=pool notin (gpu)"],
    "lower-2-gpu": ["--lower-node-selector=pool=gpu",
                    "--lower-node-labels-to-copy=nvidia.com/gpu.product,pool"],
}  # fmt: skip
TRAINER = f"""
apiVersion: v1
kind: Pod
metadata: {{name: trainer, labels: {{app: trainer}}}}
spec:
  # The GPU product label, copied from the pool's nodes onto its virtual node.
  nodeSelector: {{nvidia.com/gpu.product: {GPU_PRODUCT}}}
  tolerations: [{{key: virtual-kubelet.io/provider, operator: Exists}}]
  containers:
  - name: train
    image: nginx:1.27
    resources: {{requests: {{cpu: "1"}}, limits: {{nvidia.com/gpu: "1"}}}}
"""
DESCHEDULER_RBAC = Path(__file__).resolve().parents[1] / "manifests" / "descheduler" / "rbac.yaml"
# 12 CPU: lower-2's virtual node offers 16 (two nodes of 8) and the pod prefers it, but no
# node of lower-2 has 12 CPU: tensile-scheduler filters lower-2's virtual node out, so the
# upper scheduler binds the pod at once to the first lower cluster's (nodes of 32 CPU).
# Without the extender it would wait below, Unschedulable, until the descheduler moved it.
BIG = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: big}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: big}}}}
  template:
    metadata: {{labels: {{app: big, virtual-pod: "true"}}}}
    spec:
      nodeSelector: {{type: virtual-kubelet}}
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference:
              matchExpressions:
              - {{key: kubernetes.io/hostname, operator: In, values: [{NODE}-lower-2]}}
      containers:
      - name: big
        image: nginx:1.27
        resources: {{requests: {{cpu: "12"}}}}
"""
MANIFEST = """
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data: {greeting: "hello from the upper cluster"}
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret}
stringData: {token: s3cret}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {type: virtual-kubelet}
      tolerations: [{key: virtual-kubelet.io/provider, operator: Exists}]
      containers:
      - name: web
        image: nginx:1.27
        resources: {requests: {cpu: 100m, memory: 64Mi}}
        env:
        - {name: GREETING, valueFrom: {configMapKeyRef: {name: web-config, key: greeting}}}
        volumeMounts: [{name: secret, mountPath: /etc/web-secret}]
      volumes:
      - {name: secret, secret: {secretName: web-secret}}
"""


def up(directory: Path) -> int:
    code = devcluster.main(["up", "--dir", str(directory), *FLEET])
    if code != 0:
        return code
    # `up` moved this process into the fleet's network namespace (when it has one), so the
    # virtual nodes started here publish the routable node address, and kubectl works.
    fleet = Fleet.attach(directory)
    refs = _start_virtual_nodes(fleet, directory)
    hook = WebhookProcess(
        fleet, name=WEBHOOK, log_dir=directory / "logs", secret_namespace="default",  # noqa: S106
        configuration=WEBHOOK,
    )  # fmt: skip
    # Called for pods labelled virtual-pod=true in namespace default only.
    webhooks.register(
        fleet.upper, webhooks.configuration(WEBHOOK, url=hook.url, namespace="default")
    )
    print(f"\nstarting tensile-webhook (log: {hook.log}) ...")
    hook.start(detach=True)
    assert hook.process is not None
    refs.append({"pid": hook.process.ref.pid, "start": hook.process.ref.start})
    fleet.upper.kubectl("apply", "-f", str(DESCHEDULER_RBAC))
    descheduler = DeschedulerProcess(
        fleet,
        log_dir=directory / "logs",
        name="descheduler",
        args=["--unschedulable-timeout=10s", "--descheduling-interval=2s"],
    )
    print(f"starting tensile-descheduler (log: {descheduler.log}) ...")
    descheduler.start(detach=True)
    assert descheduler.process is not None
    refs.append({"pid": descheduler.process.ref.pid, "start": descheduler.process.ref.start})
    extender = SchedulerExtenderProcess(fleet, log_dir=directory / "logs")
    print(
        f"starting tensile-scheduler, the upper kube-scheduler's extender (log: {extender.log}) ..."
    )
    extender.start(detach=True)
    assert extender.process is not None
    refs.append({"pid": extender.process.ref.pid, "start": extender.process.ref.start})
    (directory / NODE_STATE).write_text(json.dumps(refs))
    webhooks.wait_admitting(fleet.upper, namespace="default")
    fleet.upper.kubectl("apply", "-f", "-", input=MANIFEST)
    fleet.upper.kubectl("rollout", "status", "deployment/web", "--timeout=120s")
    pod = fleet.upper.kubectl(
        "get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout
    steps: list[tuple[str, Cluster, list[str]]] = [
        ("upper cluster: one virtual node per lower cluster, and one for lower-2's GPU pool",
         fleet.upper,
         ["get", "nodes", "-l", VIRTUAL_NODE_SELECTOR, "-o",
          "custom-columns=NODE:.metadata.name,ADDRESS:.status.addresses[0].address,"
          "CPU:.status.capacity.cpu,MEMORY:.status.capacity.memory,PODS:.status.capacity.pods"]),
        ("upper cluster: the pods, spread over the virtual nodes", fleet.upper,
         ["get", "pods", "-o", "wide"]),
        *(
            (f"{lower.name}: its share of the pods, on kwok nodes", lower,
             ["get", "pods", "-o", "wide"])
            for lower in fleet.lowers
        ),
        ("lower cluster: copies of the ConfigMap and Secret", fleet.lower,
         ["get", "configmap/web-config", "secret/web-secret"]),
        ("logs through the virtual node's kubelet API", fleet.upper, ["logs", pod, "--tail=2"]),
        ("exec through it", fleet.upper, ["exec", pod, "--", "echo", "hello from below"]),
    ]  # fmt: skip
    for title, cluster, args in steps:
        _show(title, cluster, args)
    fleet.upper.kubectl("apply", "-f", "-", input=PLACED)
    fleet.upper.kubectl("wait", "pod/fast", "--for=condition=Ready", "--timeout=60s")
    lower_2 = fleet.cluster("lower-2")
    ssd = lower_2.kubectl(
        "get", "nodes", "-l", "disk=ssd", "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout.split()
    _wait_kubectl(lower_2, ["get", "pod", "fast", "-o", "jsonpath={.spec.nodeName}"],
                  until=lambda out: out.strip() in ssd, timeout=10)  # fmt: skip
    placement = (
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,"
        "NODE-SELECTOR:.spec.nodeSelector,CLUSTER-SELECTOR:.metadata.annotations.clusterSelector"
    )
    steps = [
        ("the webhook: a pod asking for clusterID=lower-2 (a virtual node) and disk=ssd (a "
         "lower node), as the upper cluster keeps it", fleet.upper,
         ["get", "pod", "fast", "-o", placement]),
        ("lower-2: the pod, on the node labelled disk=ssd", fleet.cluster("lower-2"),
         ["get", "pod", "fast", "-o",
          "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,NODE-SELECTOR:.spec.nodeSelector"]),
        ("lower-2: its nodes", fleet.cluster("lower-2"), ["get", "nodes", "-L", "disk"]),
    ]  # fmt: skip
    for title, cluster, args in steps:
        _show(title, cluster, args)
    print("\n== kubectl top, through metrics-server scraping the virtual nodes (<= 60 s) ...")
    for args in (["top", "node", "-l", VIRTUAL_NODE_SELECTOR], ["top", "pod"]):
        _show_when_ready(fleet.upper, args)
    _placement_scenario(fleet)
    _gpu_pool_scenario(fleet)
    directory_arg = shlex.quote(str(directory))
    enter = (
        f"tensile-devcluster shell --dir {directory_arg}"
        if fleet.network.private
        else f"source {shlex.quote(str(directory / ENV_FILE))}"
    )
    print(
        f"""
Try it ({netns.describe(fleet.network)}):
  {enter}      # KUBECONFIG points at the upper cluster
  kubectl get pods -o wide
  kubectl scale deployment web --replicas=10     # more pods, over both lower clusters
  kubectl --kubeconfig "$TENSILE_LOWER_2_KUBECONFIG" get pods -o wide
  POD=$(kubectl get pods -l app=web -o name | head -1)   # same name in both clusters
  kubectl logs $POD --tail=3                     # through the virtual node's kubelet API
  kubectl exec $POD -- sh -c 'echo hello; exit 3'; echo "exit code $?"
  echo hi | kubectl exec -i $POD -- cat
  kubectl exec -it $POD -- sh -c 'stty size'    # a terminal, sized like yours
  kubectl top pod; kubectl top node              # metrics-server, scraping the virtual nodes
  kubectl get --raw /api/v1/nodes/{NODE}-lower/proxy/pods | head -c 300
  kubectl port-forward $POD 8080:80 & sleep 2; curl -s localhost:8080; kill %1
  kubectl get events --field-selector source=tensile-descheduler   # what it moved, and why
  kubectl run ssd --image=nginx -l virtual-pod=true \\
    --overrides='{{"spec":{{"nodeSelector":{{"clusterID":"lower-2","disk":"ssd"}}}}}}'
  kubectl get pod ssd -o jsonpath='{{.metadata.annotations.clusterSelector}}'; echo
  kubectl --kubeconfig "$TENSILE_LOWER_2_KUBECONFIG" label node {GPU_NODE.name} pool=retired
  kubectl get node {NODE}-lower-2-gpu -o jsonpath='{{.status.capacity}}'; echo   # pool empty
  kubectl get events --field-selector reason=LowerNodeLeftPool   # the trainer reported
Stop everything and remove its state:
  make demo-down"""
    )
    return 0


def _start_virtual_nodes(fleet: Fleet, directory: Path) -> list[dict[str, int]]:
    """Add the GPU pool's node to lower-2, start one virtual node per lower cluster and one
    for the GPU pool; return their process records."""
    print(f"\nadding {GPU_NODE.name} to lower-2: a GPU pool of one node ...")
    fleet.add_lower_node(GPU_NODE, cluster="lower-2")
    refs = []
    pools = [(lower.name, lower.name) for lower in fleet.lowers] + [("lower-2-gpu", "lower-2")]
    for pool, lower_name in pools:
        node = VirtualNodeProcess(
            fleet,
            name=f"{NODE}-{pool}",
            log_dir=directory / "logs",
            lower=lower_name,
            # The GPU pool's node has no clusterID: pods asking for lower-2 go to the other.
            env={"VKUBELET_NODE_LABEL": f"clusterID:{pool}"} if pool == lower_name else {},
            args=POOLS.get(pool, []),
        )
        print(f"\nstarting virtual-node {node.name} for {pool} (log: {node.log}) ...")
        node.start(detach=True)
        assert node.process is not None
        refs.append({"pid": node.process.ref.pid, "start": node.process.ref.start})
    return refs


def _placement_scenario(fleet: Fleet) -> None:
    print(
        f"\n== placement that knows the fleet: a 12-CPU pod preferring {NODE}-lower-2, where "
        "no node has 12 CPU"
    )
    started = time.monotonic()
    fleet.upper.kubectl("apply", "-f", "-", input=BIG)
    _wait_kubectl(fleet.upper, ["get", "pods", "-l", "app=big", "-o",
                                "jsonpath={.items[*].status.phase}"],
                  until=lambda out: out.strip() == "Running", timeout=60)  # fmt: skip
    _show(f"upper cluster: bound at once to {NODE}-lower, Running after "
          f"{time.monotonic() - started:.1f}s (no eviction, no move)", fleet.upper,
          ["get", "pods", "-l", "app=big", "-o", "wide"])  # fmt: skip
    print(
        "\n== what tensile-scheduler reads: each lower cluster's placement summary, on its "
        "virtual Node (annotation tensile.io/placement-summary)"
    )
    nodes = fleet.upper.rest().request(
        "GET", "/api/v1/nodes", query={"labelSelector": VIRTUAL_NODE_SELECTOR}
    )
    print(f"{'NODE':<16} {'CPU (sum)':>10} {'LOWER NODES':>12} {'LARGEST FREE CPU':>17}")
    for node in nodes.get("items") or []:
        text = annotations_of(node).get(summary.ANNOTATION, "")
        lower = summary.parse(text) if text else None
        largest = max((r.free.get("cpu", 0) for r in lower.rows()), default=0) if lower else 0
        print(f"{name_of(node):<16} {node['status']['capacity']['cpu']:>10} "
              f"{lower.node_count if lower else 0:>12} {largest / 1000:>16g}")  # fmt: skip
    _show("the upper scheduler's Scheduled events: where each pod was bound",
          fleet.upper, ["get", "events", "--field-selector", "reason=Scheduled", "-o",
                        "custom-columns=POD:.involvedObject.name,MESSAGE:.message"])  # fmt: skip
    print()


def _gpu_pool_scenario(fleet: Fleet) -> None:
    print(
        "\n== a virtual node per lower node pool: lower-2's GPU node behind a virtual node "
        "of its own"
    )
    columns = (
        "custom-columns=NODE:.metadata.name,CPU:.status.capacity.cpu,"
        r"GPU:.status.capacity.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product"
    )
    _show("upper cluster: the virtual nodes, each offering its pool", fleet.upper,
          ["get", "nodes", "-l", VIRTUAL_NODE_SELECTOR, "-o", columns])  # fmt: skip
    fleet.upper.kubectl("apply", "-f", "-", input=TRAINER)
    fleet.upper.kubectl("wait", "pod/trainer", "--for=condition=Ready", "--timeout=60s")
    affinity = (
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,REQUIRED-NODE-AFFINITY:"
        ".spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[*].matchExpressions"
    )
    steps = [
        ("upper cluster: a pod selecting the GPU product, bound to the GPU pool's virtual "
         "node", fleet.upper, ["get", "pod", "trainer", "-o", "wide"]),
        ("lower-2: the pod, confined to the pool by node affinity", fleet.cluster("lower-2"),
         ["get", "pod", "trainer", "-o", affinity]),
    ]  # fmt: skip
    for title, cluster, args in steps:
        _show(title, cluster, args)


def _wait_kubectl(
    cluster: Cluster, args: list[str], *, until: Callable[[str], bool], timeout: float = 60.0
) -> None:
    """Wait until `kubectl args` prints what `until` accepts; raise DemoFailed after
    `timeout` seconds (a demo that goes on regardless would show a broken step as if it
    worked)."""
    deadline = time.monotonic() + timeout
    while not until(out := cluster.kubectl(*args, check=False).stdout):
        if time.monotonic() > deadline:
            raise DemoFailed(
                f"not what the demo waits for after {timeout:.0f}s: kubectl "
                f"{shlex.join(args)} prints {out.strip()!r}; logs in the demo directory's logs/"
            )
        time.sleep(1)


class DemoFailed(Exception):
    """A step of the demo did not show what it should."""


def _show(title: str, cluster: Cluster, args: list[str]) -> None:
    print(f"\n== {title}\n$ kubectl {shlex.join(args)}")
    result = cluster.kubectl(*args, check=False)
    print(result.stdout + result.stderr, end="")


def _show_when_ready(cluster: Cluster, args: list[str], *, timeout: float = 60.0) -> None:
    # metrics-server has nothing to show until its first scrapes (every 10 s here).
    deadline = time.monotonic() + timeout
    while True:
        result = cluster.kubectl(*args, check=False)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(3)
    print(f"$ kubectl {shlex.join(args)}\n{result.stdout}{result.stderr}", end="")


def down(directory: Path) -> int:
    state = directory / NODE_STATE
    if state.exists():
        for recorded in json.loads(state.read_text()):
            processes.stop_recorded(
                processes.ProcessRef(pid=recorded["pid"], start=recorded["start"])
            )
        state.unlink()
        print("virtual nodes, webhook, descheduler and tensile-scheduler stopped")
    for pattern in (
        "virtual-node-*.log",
        "webhook-*.log",
        "descheduler.log",
        "tensile-scheduler.log",
    ):
        for log in (directory / "logs").glob(pattern):
            log.unlink()
    return devcluster.main(["down", "--dir", str(directory)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("up", "down"), nargs="?", default="up")
    parser.add_argument("--dir", type=Path, default=Path(".demo"), help="state directory")
    args = parser.parse_args()
    directory = args.dir.resolve()
    started = time.monotonic()
    try:
        code = up(directory) if args.command == "up" else down(directory)
    except DemoFailed as exc:
        print(f"\ndemo failed: {exc}\n(`make demo-down` stops what it started)", file=sys.stderr)
        return 1
    if args.command == "up" and code == 0:
        print(f"\n(demo ready in {time.monotonic() - started:.0f}s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
