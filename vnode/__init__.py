"""tensile's virtual node: a Node in an upper cluster that stands for a whole lower cluster."""
