"""tensile's shared library: what every program imports and no program owns.

`kube` (the client plumbing: configuration, the async client, reflector, store, informer,
work queue, leader election, the mirror engine), `serving` (one program assembly, one HTTPS
server over one TLS source, metrics and health, the lifecycle of components), `contracts`
(the agreements between programs as pure code: annotations, labels, ownership marks,
records, object accessors) and `placement` (whether a pod fits below, pure). The programs
(`vnode`, `webhook`, `descheduler`, `scheduler`, `kubectl_tensile`) and the local fleet
(`devcluster`) import this package; it imports none of them.
"""
