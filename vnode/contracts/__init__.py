"""The agreements between tensile's three programs, as pure code: annotation and label
names, their JSON shapes, and the records one program writes for another to read (the
webhook writes `clusterSelector`, the virtual node reads it; the descheduler records which
virtual nodes an owner must avoid, the webhook applies it), and the scheduler's rules they
must read alike (which nodes a node-affinity term selects). Nothing here does I/O or
imports another part of the project."""
