"""`make demo`: bring up the local upper + lower pair and show both clusters' nodes.

Leaves the pair running; `make demo-down` (tensile-devcluster down) stops it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from vnode.testing import devcluster
from vnode.testing.pair import ENV_FILE, ClusterPair


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path(".demo"), help="state directory")
    args = parser.parse_args()
    directory = args.dir.resolve()
    code = devcluster.main(["up", "--dir", str(directory)])
    if code != 0:
        return code
    pair = ClusterPair.attach(directory)
    for cluster in (pair.upper, pair.lower):
        print(f"\n$ kubectl --kubeconfig {cluster.kubeconfig} get nodes -o wide")
        result = cluster.kubectl("get", "nodes", "-o", "wide")
        print(result.stdout + result.stderr, end="")
    env_file = directory / ENV_FILE
    quoted = shlex.quote(str(directory))
    print(
        f"""
The pair is running. To use it:
  source {shlex.quote(str(env_file))}        # KUBECONFIG=upper, TENSILE_LOWER_KUBECONFIG, ...
  kubectl get nodes                                   # the upper cluster
  kubectl --kubeconfig "$TENSILE_LOWER_KUBECONFIG" get nodes
To stop it and remove its state:
  make demo-down    (or: .venv/bin/tensile-devcluster down --dir {quoted})"""
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
