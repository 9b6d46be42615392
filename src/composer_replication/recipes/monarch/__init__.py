"""Monarch recipe: actors for rollouts, teacher replay and training (``actors``), and a CPU example (``example``)."""
