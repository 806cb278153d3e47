"""Where a pod can go below (pure): what a pod requests as kube-scheduler counts it
(`requests`), the placement its lower copy gets (`lower`), whether one lower node fits it
(`fit`), and the compact summary of a lower cluster's nodes that a virtual node publishes and
the scheduler extender reads (`summary`).

Shared by the virtual node (which counts and publishes) and `tensile-scheduler` (which
answers kube-scheduler from the summaries): no I/O, inputs never mutated.
"""
