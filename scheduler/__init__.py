"""`tensile-scheduler`: a kube-scheduler extender that knows what fits below.

kube-scheduler calls it (filter, prioritize) with a pod and the names of the nodes it
considers; it filters out the virtual nodes whose lower cluster has no single node that
would take the pod, with the reason the pod's FailedScheduling event shows, and scores the
others by best fit. Nodes that are not virtual pass untouched. What each lower cluster looks
like comes from the placement summary its virtual node publishes on its Node
(`tensile.placement.summary`). See docs/scheduler.md.
"""
