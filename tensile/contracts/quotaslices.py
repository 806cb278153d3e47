"""The names of the namespace quota slices record: which virtual nodes hold how many slices
of a namespace's ResourceQuota, as written by tensile-scheduler's slice controller (or by an
administrator) on one of the namespace's ResourceQuotas, and read by its extender and by the
virtual nodes. The format is read and written by `tensile.placement.slices`; its description
is here, with the names.

The record lives on a ResourceQuota because that is an object tenants cannot write (the
built-in `admin`, `edit` and `view` roles only read quotas) and whoever can write it already
sets the namespace's bound; a Namespace's annotations can be written by anyone granted
`patch` on it, which a RoleBinding in that very namespace grants. Two annotations, on the
same ResourceQuota:

- `SLICES_ANNOTATION`, the record, compact and meant to be read and edited by people::

      vnode-a=4x(500m,1Gi),vnode-b=2x(500m,1Gi)

  each entry `<virtual node>=<count>x(<cpu>,<memory>)`: `count` slices, each worth that
  much of the namespace's requests (Kubernetes quantities: cores, bytes). A `-` in place of
  an amount says the quota does not bound that resource, so neither does the slice.
  `none` is a record holding no slice anywhere (a quota with no room anywhere): the
  namespace's pods are admitted to no virtual node. No record: unconstrained. What a node
  holds counts at most as much as the namespace's quota (the record is capped at it), and a
  record on the quotas of a namespace no quota bounds is not read.
- `STATUS_ANNOTATION`, the controller's own JSON: who wrote the record and the exact value
  it wrote (`written`), and a condition saying what was decided and why. A record whose
  value differs from `written` (or with no status at all) was set by someone else, an
  administrator, and is respected; removing the record has it computed again.
"""

from __future__ import annotations

from typing import Final

SLICES_ANNOTATION: Final = "tensile.io/quota-slices"
"""On an upper ResourceQuota: the record of its namespace's quota slices (see the module)."""
STATUS_ANNOTATION: Final = "tensile.io/quota-slices-status"
"""On that ResourceQuota: the slice controller's JSON status of the record."""
WRITER: Final = "tensile-scheduler"
"""The `writer` of a record the slice controller computed."""
NONE: Final = "none"
"""The record of a namespace holding no slice on any virtual node."""
UNBOUNDED: Final = "-"
"""An amount the quota (and so the slice) does not bound."""

# Conditions of the status (what the last decision was).
PLACED: Final = "Placed"
UNPLACEABLE: Final = "Unplaceable"
ADMINISTRATOR: Final = "SetByAdministrator"
INVALID: Final = "Invalid"
IGNORED: Final = "Ignored"
"""A record on the quotas of a namespace no quota bounds: not read."""
