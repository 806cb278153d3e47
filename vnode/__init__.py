"""`virtual-node`: a Node in an upper cluster that stands for a whole lower cluster.

The upper pods bound to the Node are run by a provider: `providers/k2k` forwards them to the
lower cluster, `providers/mock` only pretends. `node` (`VirtualNode`) is the node's
components in start order, run by one `tensile.serving.lifecycle.Runner`: the provider and
its mirrors, the pod and node controllers and the patrol (`controllers`), and the kubelet
HTTPS API (`api`). `provider` holds the Protocols the node calls, one per role (pods, node
status, logs, exec/attach, port-forward, usage), with units and invariants, and
`provider_errors` what a provider raises and the pod controller turns into status. A
library user tests with `testing` (FakeApi, FakeProvider).
"""
