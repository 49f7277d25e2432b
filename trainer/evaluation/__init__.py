"""Evaluation protocols, one module per paper, and the shared reporting contract."""
