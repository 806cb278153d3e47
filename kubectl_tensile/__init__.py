"""`kubectl tensile`: a kubectl plugin showing the virtual nodes (`status`) and where a pod
runs or why it does not (`why POD`). `gather` reads the clusters; `status`, `why` and
`render` are pure."""
