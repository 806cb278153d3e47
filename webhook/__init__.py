"""`tensile-webhook`: a mutating admission webhook that moves the placement a pod means for
the lower cluster into its `clusterSelector` annotation.

What a created pod asks of the lower cluster's nodes (nodeSelector, node affinity,
tolerations) goes into the annotation (`tensile.contracts.clusterselector`), which the
virtual node restores on the lower pod; upstairs the pod tolerates the virtual nodes'
taint, is pinned to its volume's node, and keeps off the virtual nodes the descheduler's
avoidance record names for its owner. `mutation` decides (pure), `review` reads and answers
the AdmissionReview (pure), `server` serves `POST /mutate`, and `service` runs a process:
its informers (`caches`), its serving certificate (`tls`, `cabundle`) and the server.
"""
