"""Mirrors: objects of one cluster kept equal to a translation of objects of another.

A mirror has a direction (a source cluster's informer, a target cluster's informer and
client), a `KindSpec` saying which source objects of one kind are mirrored, how one is
translated, how a target is compared with its translation and when a target is garbage,
and a `Tenancy` saying which targets are the writer's own and which a sibling's (the same
for every kind one writer mirrors, built once from its identity). The parts:

- `spec`: `KindSpec`, `Tenancy` and what `compare` answers (pure);
- `siblings`: `SiblingPolicy`, the rules for a sibling's copy (pure), and the waits it
  asks for;
- `decide`: `decide`, what one key needs, as an `Action` (pure);
- `engine`: `Mirror`, the project's one pipeline (informer -> store -> key work queue ->
  worker), as client-go controllers and VirtualCluster's syncers are built: it reads the
  caches and its own writes in flight, calls `decide` and performs the action.

The rules, which `decide` states case by case:

- source and target events only enqueue the *source* key ("namespace/name"); one worker
  at a time handles a key, comparing the translation of the source object with the target
  object, then creating, patching, replacing or deleting the target; failures come back
  with per-key backoff;
- a target that is neither the writer's own nor a sibling's copy the kind keeps is never
  changed or deleted: a mirror that finds one holding its copy's name reports the name
  taken (`NameTaken`, `on_problem`) and leaves it alone;
- a sibling's copy (made by another writer of the same copies, e.g. another virtual node
  of the same upper cluster over the same lower cluster) serves as the copy and is kept
  like an owned one, in its owner's name (also when it is replaced or made again):
  compared, patched or replaced, and, by a mirror with `creation="always"`, deleted when
  its source goes. So a copy whose maker died is still kept up to date. The worker gives
  the maker the first go: every sibling sees the same change at the same moment, so it
  writes a sibling's copy only once the copy has differed, unchanged, for `SIBLING_GRACE`
  seconds (a live maker has updated it by then, and one change costs one write, not one
  per sibling); siblings that translate a little differently (a rolling upgrade) thus
  write a copy at most once per grace each instead of back and forth without pause.
  `ensure` does not wait: a pod being made needs its copy current. On-request copies of a
  sibling are updated but left to their owner to collect (its pods are what use them). A
  sibling's copy the kind's `sibling_conflict` objects to (written under settings other
  than this writer's, which would make the two undo each other's writes for good) is not
  written at all: reported (`NameTaken`) and left to its maker, though still collected
  when its source goes;
- targets changed or deleted by someone else are repaired (their events enqueue the key);
- `creation="always"` mirrors every selected source object; `creation="on_request"` only
  creates a target when `ensure` asks (the ConfigMaps a pod needs) or when one `in_use`
  says is needed is gone (deleted below, or collected by the sibling that made it while
  our pod on its way needs it: its deletion event brings the key back), keeps existing
  ones up to date, and collects them once the spec allows it and `in_use` says nothing
  needs them;
- a create or delete whose effect the target informer has not shown yet is remembered, so
  a worker never acts on a stale cache (a copy deleted a moment ago is made again, not
  taken as present; one just made is deleted by its UID if its source goes at once); it
  is forgotten as soon as the informer shows the object or its deletion, so a copy made
  and then deleted by someone else is not taken as present.

`ensure` runs outside the queue (a pod creation waits for it) and takes the same per-key
lock as the worker, so an ensure and a collection of one object never interleave.
"""
