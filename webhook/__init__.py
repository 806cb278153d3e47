"""Mutating admission webhook that moves lower-cluster placement into `clusterSelector`."""
