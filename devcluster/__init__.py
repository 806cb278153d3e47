"""The local fleet: upper and lower Kubernetes clusters on one machine, for tests, benchmarks,
the demo and people (`tensile-devcluster up|down|env|shell --dir DIR`, see `__main__`).

`devcluster.fleet.Fleet` starts real etcd, kube-apiservers, schedulers, controller managers,
kwok nodes and metrics-server (`devcluster.startup`), in a private network namespace where
possible (`devcluster.netns`), from control-plane pieces sized like controller-runtime's
envtest: `binaries` (where the binaries come from: `$KUBEBUILDER_ASSETS`, the build cache,
a build), `components` (their command lines and the kube-scheduler's configuration; pure),
`processes` (start, watch and stop them), `ports`, `pki` (CAs and certificates as PEM
files) and `kubeconfig`. `devcluster.vnodes`, `devcluster.webhooks`,
`devcluster.deschedulers` and `devcluster.schedulers` run the programs against it, and
`devcluster.podrun` runs a deployed pod's container as a local process. The pytest fixtures
over it live with the tests (`tests/fixtures.py`).

It may import anything of the project; nothing of the project imports it. It runs the
programs through their entry points (`python -m <program>`; `devcluster.missed_events` runs
`vnode.__main__` in-process with a fault switched on).
"""
