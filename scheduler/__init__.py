"""tensile-scheduler: a kube-scheduler extender and the namespace quota slices."""
