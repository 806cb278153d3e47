"""The Kubernetes-to-Kubernetes provider: forwards pods to a lower cluster."""
