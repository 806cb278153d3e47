"""Composes informers, controllers and the kubelet API of one virtual node."""
