"""Empirical models fitted from a profile: collective and compression costs, cluster
configs, and what a strategy costs a group of tensors (the timeline's inputs)."""
