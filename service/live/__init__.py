"""Live state: hidden and seen items, interactions, online evaluation, Redis, trending."""
