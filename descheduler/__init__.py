"""`tensile-descheduler`: moves the pods a lower cluster cannot place to another virtual node.

A pod Pending on a virtual node because its lower cluster cannot place it is evicted (a
bare pod: re-created), and the virtual nodes its owner must avoid are written to the
avoidance record (`tensile.contracts.avoidance`), which the webhook applies to the
replacement. `policy` (which pods move, what budgets allow) and `move_objects` (the objects
a move writes) are pure; `mover` carries moves out, `record` keeps the avoidance record,
`loop` runs a round every interval while holding the Lease, and `preflight` checks at start
that the Lease and the record can be written.
"""
