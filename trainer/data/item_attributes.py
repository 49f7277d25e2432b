"""Item metadata the service filters on: genres, years, prices, brands.

Three formats, detected from the file name unless given:

- ``ml-100k``: MovieLens ``u.item`` (``|``-separated, latin-1): ``genre``
  (multi-valued, from the 19 genre flags) and ``year`` (from the release
  date ``01-Jan-1995``);
- ``ml-1m``: MovieLens ``movies.dat`` (``::``-separated): ``genre`` (``A|B``)
  and ``year`` (from the title's ``(1995)``);
- ``csv``: a header naming the columns, the first being the item id. A
  column whose every non-empty value is a number is numeric; any other is
  categorical, and ``|`` separates several values of one item.

The columns are packed over the version's item rows by
``ordrec.service.indices.rules.encode_item_attributes`` (the format lives with the
code that reads it back); items the file does not list have no values.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ordrec.service.indices.rules import ATTRIBUTES_KEY, encode_item_attributes
from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap

ML100K_GENRES = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]
FORMATS = ("auto", "ml-100k", "ml-1m", "csv")
_YEAR_IN_TITLE = re.compile(r"\((\d{4})\)\s*$")
_NAME_CLEAN = re.compile(r"[^A-Za-z0-9_]")


class ItemAttributeError(ValueError):
    """A malformed metadata file; the message names the file and line."""


@dataclass
class ItemAttributeTable:
    """Per attribute: ``{item id: float}`` (numeric) or ``{item id: [values]}`` (categorical)."""

    numeric: dict[str, dict[str, float]] = field(default_factory=dict)
    categorical: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return list(self.numeric) + list(self.categorical)

    def to_artifact_parts(self, items: IdMap) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """Arrays over ``items`` rows and the manifest metadata (see ``service/indices/rules.py``)."""
        ids = items.ids
        columns: list[dict[str, Any]] = []
        for name, by_item in self.numeric.items():
            columns.append(
                {
                    "name": name,
                    "type": "numeric",
                    "values": np.array([by_item.get(i, np.nan) for i in ids], dtype=np.float64),
                }
            )
        for name, by_item in self.categorical.items():
            columns.append({"name": name, "type": "categorical", "values": [by_item.get(i, []) for i in ids]})
        return encode_item_attributes(columns, len(ids))


def detect_format(path: str | os.PathLike) -> str:
    name = Path(path).name.lower()
    if name == "u.item":
        return "ml-100k"
    if name == "movies.dat":
        return "ml-1m"
    return "csv"


def read_item_attributes(path: str | os.PathLike, fmt: str = "auto") -> ItemAttributeTable:
    """Read an item metadata file (see the module docstring for the formats)."""
    if fmt not in FORMATS:
        raise ItemAttributeError(f"unknown item attribute format {fmt!r} (known: {', '.join(FORMATS)})")
    fmt = detect_format(path) if fmt == "auto" else fmt
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # MovieLens files are latin-1; latin-1 decodes any bytes
    reader = {"ml-100k": _read_ml100k, "ml-1m": _read_ml1m, "csv": _read_csv}[fmt]
    return reader(text, str(path))


def _read_ml100k(text: str, path: str) -> ItemAttributeTable:
    table = ItemAttributeTable(numeric={"year": {}}, categorical={"genre": {}})
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 5 + len(ML100K_GENRES):
            raise ItemAttributeError(
                f"{path}:{number}: expected {5 + len(ML100K_GENRES)} '|'-separated fields,"
                f" found {len(fields)}"
            )
        item, date, flags = fields[0], fields[2], fields[5:]
        if date.strip():
            year = date.strip()[-4:]
            if not year.isdigit():
                raise ItemAttributeError(f"{path}:{number}: release date {date!r} does not end in a year")
            table.numeric["year"][item] = float(year)
        if any(f not in ("0", "1") for f in flags):
            raise ItemAttributeError(f"{path}:{number}: genre flags must be 0 or 1")
        table.categorical["genre"][item] = [g for g, f in zip(ML100K_GENRES, flags) if f == "1"]
    return table


def _read_ml1m(text: str, path: str) -> ItemAttributeTable:
    table = ItemAttributeTable(numeric={"year": {}}, categorical={"genre": {}})
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("::")
        if len(fields) != 3:
            raise ItemAttributeError(
                f"{path}:{number}: expected 'id::title::genres', found {len(fields)} fields"
            )
        item, title, genres = fields
        match = _YEAR_IN_TITLE.search(title)
        if match:
            table.numeric["year"][item] = float(match.group(1))
        table.categorical["genre"][item] = [g for g in genres.strip().split("|") if g]
    return table


def _is_number(value: str) -> bool:
    try:
        return np.isfinite(float(value))
    except ValueError:
        return False


def _read_csv(text: str, path: str) -> ItemAttributeTable:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or len(rows[0]) < 2:
        raise ItemAttributeError(f"{path}:1: expected a header 'id,<attribute>,...'")
    header = [h.strip() for h in rows[0]]
    names = [_NAME_CLEAN.sub("_", h) for h in header[1:]]
    if len(set(names)) != len(names) or any(not n or n[0].isdigit() for n in names):
        raise ItemAttributeError(
            f"{path}:1: attribute names must be distinct and start with a letter: {names}"
        )
    cells: dict[str, dict[str, str]] = {n: {} for n in names}
    for number, row in enumerate(rows[1:], 2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ItemAttributeError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
        item = row[0].strip()
        for name, cell in zip(names, row[1:]):
            if cell.strip():
                cells[name][item] = cell.strip()
    table = ItemAttributeTable()
    for name, by_item in cells.items():
        if by_item and all(_is_number(v) for v in by_item.values()):
            table.numeric[name] = {i: float(v) for i, v in by_item.items()}
        else:
            table.categorical[name] = {
                i: [p.strip() for p in v.split("|") if p.strip()] for i, v in by_item.items()
            }
    return table


def attach_item_attributes(artifact: Artifact, path: str | os.PathLike, fmt: str = "auto") -> None:
    """Publish a metadata file's attributes inside the version (the service filters on them)."""
    if "items" not in artifact.ids:
        raise ItemAttributeError(f"item attributes: a {artifact.kind} model has no items to describe")
    arrays, meta = read_item_attributes(path, fmt).to_artifact_parts(artifact.ids["items"])
    artifact.arrays = {**artifact.arrays, **arrays}
    artifact.attributes[ATTRIBUTES_KEY] = meta
