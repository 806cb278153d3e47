"""The Kubernetes client plumbing every program shares, as client-go is kubelet's and the
controllers': where a cluster is and how to reach it (`config`), the asyncio client
(`client`) and the API's errors, reflector, store and informers (list+watch, shared by
`informer_factory`), the keyed work queue with backoff, leader election on a Lease, Events,
quantities and timestamps, and the mirror engine (`mirror`). It knows nothing of the
programs nor of how they serve (`tensile.serving`)."""
