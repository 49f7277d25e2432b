"""Typed ``key=value`` settings from the command line (``--set``, sweep and reference settings)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any


def parse_value(text: str) -> Any:
    """A command-line value: a JSON scalar or list (``20``, ``0.05``, ``true``, ``[3,5]``), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(pairs: Sequence[str]) -> dict[str, Any]:
    """``["n_components=20", "learning_rate=0.05", "name=x"]`` -> typed dict (JSON scalars, else strings)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--set expects key=value, got {pair!r}")
        params[key] = parse_value(text)
    return params
