"""Replay storage: the ring buffers of transitions (uniform, prioritized, n-step) and the sum tree
of proportional priorities."""
