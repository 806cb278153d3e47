"""The names of the namespace quota slices record: which virtual nodes hold how many slices
of a namespace's ResourceQuota, as written on the upper Namespace by tensile-scheduler's
slice controller (or by an administrator) and read by its extender. The format is read and
written by `scheduler.slices.record`; its description is here, with the names.

Two annotations on the Namespace:

- `SLICES_ANNOTATION`, the record, compact and meant to be read and edited by people::

      vnode-a=4x(500m,1Gi),vnode-b=2x(500m,1Gi)

  each entry `<virtual node>=<count>x(<cpu>,<memory>)`: `count` slices, each worth that
  much of the namespace's requests (Kubernetes quantities: cores, bytes). A `-` in place of
  an amount says the quota does not bound that resource, so neither does the slice.
  `none` is a record holding no slice anywhere (a quota with no room anywhere): the
  namespace's pods are admitted to no virtual node. No annotation: unconstrained.
- `STATUS_ANNOTATION`, the controller's own JSON: who wrote the record and the exact value
  it wrote (`written`), and a condition saying what was decided and why. A record whose
  value differs from `written` (or with no status at all) was set by someone else, an
  administrator, and is respected; removing the record has it computed again.
"""

from __future__ import annotations

from typing import Final

SLICES_ANNOTATION: Final = "tensile.io/quota-slices"
"""On upper Namespaces: the record of the namespace's quota slices (see the module)."""
STATUS_ANNOTATION: Final = "tensile.io/quota-slices-status"
"""On upper Namespaces: the slice controller's JSON status of that record."""
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
