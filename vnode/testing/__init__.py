"""What users of the library test with: the local upper + lower control-plane pair.

`vnode.testing.cluster.ClusterPair` starts real etcd, kube-apiservers, schedulers, controller
managers and kwok nodes; `vnode.testing.fixtures` exposes them as pytest fixtures; the
`tensile-devcluster` command (`vnode.testing.devcluster`) runs them for people.
"""
