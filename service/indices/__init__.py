"""Indices: the serving index of each kind, top-k kernels, the item index, rules masks."""
