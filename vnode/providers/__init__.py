"""Provider implementations of the virtual node."""
