"""Hidden-item storage: the HIDDEN files an operator writes, in the same format for every registry backend."""

from __future__ import annotations

from collections.abc import Iterable

HIDDEN_FILE = "HIDDEN"  # item ids an operator hid: <registry>/HIDDEN (all models), <registry>/<model>/HIDDEN
ALL_MODELS = "*"  # the scope of <registry>/HIDDEN


def hidden_ids(data: bytes) -> frozenset[str]:
    """The item ids of a HIDDEN file: one a line, blank lines ignored."""
    return frozenset(line for line in data.decode("utf-8").splitlines() if line)


def hidden_file(ids: Iterable[str]) -> bytes:
    """A HIDDEN file's bytes for ``ids``: sorted, one a line."""
    return "".join(f"{i}\n" for i in sorted(ids)).encode("utf-8")
