"""The kubelet-compatible HTTPS API of the virtual node."""
