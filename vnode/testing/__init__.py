"""What users of the library test with: a local fleet of upper and lower clusters.

`vnode.testing.fleet.Fleet` starts real etcd, kube-apiservers, schedulers, controller
managers, kwok nodes and metrics-server, in a private network namespace where possible
(`vnode.testing.netns`); `vnode.testing.fixtures` exposes them as pytest fixtures; the
`tensile-devcluster` command (`vnode.testing.devcluster`) runs them for people.
"""
