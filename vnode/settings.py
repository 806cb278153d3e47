"""Frozen settings dataclasses, built once from flags and environment."""
