"""Protocols the node runtime calls on a provider (pod lifecycle, node status, streams)."""
