"""Reads of an encoded store for pods in motion: decoding every read against keeping the last
`HOT` objects decoded (`tensile.kube.store.Store`, `hot=`), in one run.

    .venv/bin/python bench/store_reads.py [--pods 500] [--in-flight 64] [--others 0]

Each pod goes through `--events` states, as a forwarded pod's lower pod does (created,
bound, Running, resized); `--in-flight` pods move at once, as the node's concurrent creates.
Per state the node's work on its store is: the watch event's update, its handlers' read of
the old state, and the status sync's and the backend lookup's reads of the pod. `--others`
pods of another tenant move between each two of ours (their updates only: nothing of the
node reads them), which pushes ours out of a bounded set. Prints the CPU per state for each
form of store and its ratio to the store that decodes every read (the baseline, measured in
the same run).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tensile.kube import store as store_module
from tensile.kube.reflector import Event
from tensile.kube.store import Store


def a_pod(name: str, *, state: int) -> dict[str, Any]:
    """A pod of about 2.5 KB of JSON, as an upper pod bound to a virtual node is."""
    container = {
        "name": "main",
        "image": "nginx:1.27",
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": [
            {"name": "kube-api-access-x", "readOnly": True, "mountPath": "/var/run/secrets"}
        ],
    }
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": "2026-11-28T18:00:01Z"}
        for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "resourceVersion": str(state),
            "labels": {"app": "bench"},
        },
        "spec": {
            "containers": [container],
            "nodeName": "vn",
            "restartPolicy": "Always",
            "tolerations": [
                {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
            ],
            "volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}}],
        },
        "status": {
            "phase": "Running" if state > 1 else "Pending",
            "conditions": conditions[: state + 1],
            "podIP": "10.0.0.2",
            "containerStatuses": [{"name": "main", "ready": state > 1, "restartCount": 0}],
        },
    }


def run(*, hot: int, pods: int, in_flight: int, events: int, others: int) -> float:
    """Return the CPU seconds per state of ours for a store keeping `hot` objects decoded."""
    store = Store(encoded=True, hot=hot)
    states = {
        f"p{i}": [a_pod(f"p{i}", state=s) for s in range(events)] for i in range(pods)
    }  # built before the clock starts: the watch decodes them, not the store
    strangers = [a_pod(f"o{i}", state=i) for i in range(max(others, 1) * 64)]
    reads: list[object] = []
    started = time.process_time()
    stranger = 0
    for first in range(0, pods, in_flight):
        wave = [f"p{i}" for i in range(first, min(first + in_flight, pods))]
        for state in range(events):
            for name in wave:
                _, previous = store.update(states[name][state])
                event = Event(type="MODIFIED", obj=states[name][state], previous=previous)
                reads.append(event.old)
                reads.append(store.get(f"bench/{name}"))
                reads.append(store.get(f"bench/{name}"))
                reads.clear()
                for _ in range(others):
                    store.update(strangers[stranger % len(strangers)])
                    stranger += 1
    return (time.process_time() - started) / (pods * events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--events", type=int, default=4)
    parser.add_argument("--others", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="cheapest of this many")
    args = parser.parse_args()
    shape = {"pods": args.pods, "in_flight": args.in_flight, "events": args.events}
    forms = {"decode every read (hot=0)": 0, f"keep {store_module.HOT} decoded": store_module.HOT}
    best = {
        label: min(run(hot=hot, others=args.others, **shape) for _ in range(args.rounds))
        for label, hot in forms.items()
    }
    print(
        f"encoded store, {args.pods} pods, {args.in_flight} in flight, {args.events} states "
        f"each, {args.others} other tenant's updates between two of ours"
    )
    baseline = best["decode every read (hot=0)"]
    for label, seconds in best.items():
        print(f"  {label:30} {seconds * 1e6:8.1f} us CPU per state   {seconds / baseline:.2f}x")


if __name__ == "__main__":
    main()
