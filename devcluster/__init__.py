"""The local fleet: upper and lower Kubernetes clusters on one machine, for tests, benchmarks,
the demo and people (`tensile-devcluster up|down|env|shell --dir DIR`, see `__main__`).

`devcluster.fleet.Fleet` starts real etcd, kube-apiservers, schedulers, controller managers,
kwok nodes and metrics-server (`devcluster.startup`), in a private network namespace where
possible (`devcluster.netns`), from the control-plane pieces of `vnode.testing`;
`devcluster.vnodes`, `devcluster.webhooks`, `devcluster.deschedulers` and
`devcluster.schedulers` run the programs against it as child processes, and
`devcluster.podrun` runs a deployed pod's container as a local process. The pytest fixtures
over it live with the tests (`tests/fixtures.py`).

It may import the programs; they never import it.
"""
