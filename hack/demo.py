"""`make demo` / `make demo-down`: two local clusters with a virtual node between them.

`up` starts the pair, runs `virtual-node` between the clusters, deploys 5 pods (using a
ConfigMap and a Secret) in the upper cluster, waits for them to run, and shows both sides.
`down` stops the virtual node and the pair and removes their state.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from vnode.testing import devcluster, processes
from vnode.testing.pair import ENV_FILE, ClusterPair
from vnode.testing.vnodes import VirtualNodeProcess

NODE = "tensile-demo"
NODE_STATE = "virtual-node.json"
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
  replicas: 5
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
    code = devcluster.main(["up", "--dir", str(directory)])
    if code != 0:
        return code
    pair = ClusterPair.attach(directory)
    node = VirtualNodeProcess(pair, name=NODE, log_dir=directory / "logs")
    print(f"\nstarting virtual-node {NODE} (log: {node.log}) ...")
    node.start(detach=True)
    assert node.process is not None
    ref = node.process.ref
    (directory / NODE_STATE).write_text(json.dumps({"pid": ref.pid, "start": ref.start}))
    pair.upper.kubectl("apply", "-f", "-", input=MANIFEST)
    pair.upper.kubectl("rollout", "status", "deployment/web", "--timeout=120s")
    for title, cluster, args in (
        ("upper cluster: nodes", pair.upper, ["get", "nodes", "-o", "wide"]),
        ("upper cluster: pods on the virtual node", pair.upper, ["get", "pods", "-o", "wide"]),
        ("lower cluster: the same pods, on kwok nodes", pair.lower, ["get", "pods", "-o", "wide"]),
        ("lower cluster: copies of the ConfigMap and Secret", pair.lower,
         ["get", "configmap/web-config", "secret/web-secret"]),
    ):  # fmt: skip
        print(f"\n== {title}\n$ kubectl {' '.join(args)}")
        result = cluster.kubectl(*args)
        print(result.stdout + result.stderr, end="")
    env_file = shlex.quote(str(directory / ENV_FILE))
    print(
        f"""
Try it (KUBECONFIG points at the upper cluster):
  source {env_file}
  kubectl get pods -o wide
  kubectl scale deployment web --replicas=8      # more pods forwarded below
  kubectl --kubeconfig "$TENSILE_LOWER_KUBECONFIG" get pods -o wide
  POD=$(kubectl get pods -l app=web -o name | head -1)   # same name in both clusters
  kubectl logs $POD --tail=3                     # through the virtual node's kubelet API
  kubectl exec $POD -- sh -c 'echo hello; exit 3'; echo "exit code $?"
  echo hi | kubectl exec -i $POD -- cat
  kubectl exec -it $POD -- sh -c 'stty size'    # a terminal, sized like yours
  kubectl port-forward $POD 8080:80 & sleep 2; curl -s localhost:8080; kill %1
Stop everything and remove its state:
  make demo-down"""
    )
    return 0


def down(directory: Path) -> int:
    state = directory / NODE_STATE
    if state.exists():
        recorded = json.loads(state.read_text())
        processes.stop_recorded(processes.ProcessRef(pid=recorded["pid"], start=recorded["start"]))
        state.unlink()
        print(f"virtual-node {NODE} stopped")
    for log in (directory / "logs").glob("virtual-node-*.log"):
        log.unlink()
    return devcluster.main(["down", "--dir", str(directory)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("up", "down"), nargs="?", default="up")
    parser.add_argument("--dir", type=Path, default=Path(".demo"), help="state directory")
    args = parser.parse_args()
    directory = args.dir.resolve()
    started = time.monotonic()
    code = up(directory) if args.command == "up" else down(directory)
    if args.command == "up" and code == 0:
        print(f"\n(demo ready in {time.monotonic() - started:.0f}s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
