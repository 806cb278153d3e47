"""Controllers of the virtual node: pods down, status up, node status and lease."""
