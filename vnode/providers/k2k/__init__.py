"""The Kubernetes-to-Kubernetes provider: forwards pods to a lower cluster.

`assembly.build` builds it and wires it (one place knows how the pieces fit);
`provider.K2KProvider` only uses what it is given, and keeps what it wrote below in one
`lowerpods.LowerPodBook`, the state the patrol reads. Pure beside it: `translate` (pods
between the clusters), `naming` (ownership marks), `podsecurity`, `services`, `volumes`,
`resource_usage`; its mirrors copy what pods need below (`dependencies`, `services`,
`provisioner`).
"""
