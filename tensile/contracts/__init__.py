"""The agreements between tensile's programs, as pure code: annotation and label
names, their JSON shapes, and the records one program writes for another to read (the
webhook writes `clusterSelector`, the virtual node reads it; the descheduler records which
virtual nodes an owner must avoid, the webhook applies it), and what they must read alike:
label selectors (the webhook's --pod-selector is the descheduler's too) and the scheduler's
rules (which nodes a node-affinity term selects, which taints a pod tolerates). Nothing
here does I/O or imports another part of the project."""
