"""Namespace quota slices: a namespace's ResourceQuota cut into slices of a fixed size and
spread over the virtual nodes, within which the extender admits the namespace's pods.

The decisions are pure (no I/O below the slice controller): `placement` (where the slices
go), `decide` (what the controller writes for one namespace), `admission` and `filter`
(the extender's question and its answer in the filter), `record` (the record and its
status, read and written), `pods` (what the bound pods request). `controller` keeps the
records from the upper cluster's caches; `flags`, `settings` and `metrics` are its command
line, its frozen settings and its Prometheus metrics.
"""
