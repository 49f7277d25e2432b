"""Business rules over items: attribute filters and which items a request may return.

One place decides eligibility, so every scoring path (the exact one here, an
approximate index later) applies the same rules: :class:`Eligible` is a
boolean mask over item rows, ``True`` where an item may *not* be returned
(hidden by an operator, or outside the request's filter). Per-request
exclusions (the seen items, ``exclude_item_ids``) stay row lists, as before.

Item attributes travel inside the version (``encode_item_attributes`` packs
them, :class:`ItemAttributes` reads them back): per attribute either a
numeric column (float64, NaN when missing) or categorical values as CSR
(``indptr``, ``codes``) over a value list kept in the manifest's
attributes, so an item may have several values (genres).

The filter language (``docs/service.md``, "Business rules")::

    filter := clause ("and" clause)*
    clause := NAME "in" "(" value ("," value)* ")"
            | NAME "not" "in" "(" value ("," value)* ")"
            | NAME ("=" | "!=" | ">=" | ">" | "<=" | "<") value
            | NAME "between" NUMBER "and" NUMBER
    value  := NUMBER | "double-quoted" | 'single-quoted'

Keywords are case-insensitive; attribute names are not. A clause that cannot
be parsed or does not fit its attribute raises :class:`FilterError` naming
the clause (its number and text).
"""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.idmap import IdMap

ATTRIBUTES_KEY = "item_attributes"  # in Artifact.attributes: [{"name", "type", "values"?}, ...]
MAX_FILTER_CHARS = 4096
MAX_CLAUSES = 32
MAX_LIST_VALUES = 1000
# Below this share of eligible items, score only the eligible rows instead of masking all.
SPARSE_ELIGIBLE_FRACTION = 0.1
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class FilterError(ValueError):
    """A filter that cannot be parsed or applied; the message names the clause."""


# ------------------------------------------------------------------ attributes
def _array_prefix(position: int) -> str:
    return f"itemattr_{position}"


def encode_item_attributes(
    columns: Sequence[Mapping[str, Any]], n_items: int
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Pack attribute columns over item rows into artifact arrays and manifest metadata.

    Parameters
    ----------
    columns : sequence of mappings
        Each has ``name``, ``type`` ("numeric" or "categorical") and
        ``values``: for numeric, a float array of length ``n_items`` (NaN for
        missing); for categorical, a list of ``n_items`` lists of strings.
    n_items : int
        Item rows of the version.

    Returns
    -------
    arrays : dict
        ``itemattr_<i>_num`` or ``itemattr_<i>_indptr`` / ``itemattr_<i>_codes``.
    meta : list of dict
        What goes into ``Artifact.attributes["item_attributes"]``.
    """
    arrays: dict[str, np.ndarray] = {}
    meta: list[dict[str, Any]] = []
    for position, column in enumerate(columns):
        name, kind, values = column["name"], column["type"], column["values"]
        if not _NAME_RE.match(name):
            raise ValueError(f"attribute name {name!r} must match {_NAME_RE.pattern}")
        prefix = _array_prefix(position)
        if kind == "numeric":
            column_array = np.asarray(values, dtype=np.float64)
            if column_array.shape != (n_items,):
                raise ValueError(f"attribute {name!r}: {column_array.shape} values for {n_items} items")
            arrays[f"{prefix}_num"] = column_array
            meta.append({"name": name, "type": "numeric"})
        elif kind == "categorical":
            if len(values) != n_items:
                raise ValueError(f"attribute {name!r}: {len(values)} values for {n_items} items")
            vocabulary = sorted({v for item_values in values for v in item_values})
            code_of = {v: i for i, v in enumerate(vocabulary)}
            indptr = np.zeros(n_items + 1, dtype=np.int64)
            indptr[1:] = np.cumsum([len(set(item_values)) for item_values in values])
            codes = np.array(
                [code_of[v] for item_values in values for v in sorted(set(item_values))], dtype=np.int32
            )
            arrays[f"{prefix}_indptr"], arrays[f"{prefix}_codes"] = indptr, codes
            meta.append({"name": name, "type": "categorical", "values": vocabulary})
        else:
            raise ValueError(f"attribute {name!r}: unknown type {kind!r}")
    return arrays, meta


@dataclass(frozen=True)
class _Numeric:
    values: np.ndarray  # float64 (n_items,), NaN missing


@dataclass(frozen=True)
class _Categorical:
    vocabulary: dict[str, int]
    codes: np.ndarray  # int32, CSR data
    entry_item: np.ndarray  # int64, the item row of every entry of ``codes``

    @functools.cached_property
    def names(self) -> list[str]:
        """The values by code."""
        return list(self.vocabulary)


class ItemAttributes:
    """A version's item attributes and the filters evaluated over them (LRU-cached).

    Built once per loaded version (read-only afterwards); the cache is the
    only mutable part and has its own lock.
    """

    def __init__(self, n_items: int, columns: Mapping[str, _Numeric | _Categorical], cache_size: int = 64):
        self.n_items = n_items
        self.columns = dict(columns)
        self._cache: OrderedDict[str, Eligible] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @classmethod
    def from_artifact(cls, artifact: Artifact, n_items: int) -> ItemAttributes:
        """Read the attributes a version publishes (none: an empty set); ArtifactError on a bad one."""
        meta = artifact.attributes.get(ATTRIBUTES_KEY) or []
        try:
            return cls._from_arrays(meta, artifact.array, n_items)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{artifact.describe()}: bad item attribute: {exc}") from None

    @classmethod
    def from_columns(cls, columns: Sequence[Mapping[str, Any]], n_items: int) -> ItemAttributes:
        """Attributes over ``n_items`` rows from columns as :func:`encode_item_attributes` takes
        them: the server's own rows (fresh items, ``service/live/fresh.py``) filtered like a version's."""
        arrays, meta = encode_item_attributes(columns, n_items)
        return cls._from_arrays(meta, arrays.__getitem__, n_items)

    @classmethod
    def _from_arrays(
        cls, meta: Sequence[Mapping[str, Any]], array: Callable[[str], np.ndarray], n_items: int
    ) -> ItemAttributes:
        """The columns ``meta`` describes, their arrays read by name with ``array``."""
        columns: dict[str, _Numeric | _Categorical] = {}
        for position, column in enumerate(meta):
            name, kind, prefix = str(column["name"]), column["type"], _array_prefix(position)
            if kind == "numeric":
                values = np.asarray(array(f"{prefix}_num"), dtype=np.float64)
                if values.shape != (n_items,):
                    raise ValueError(f"{values.shape} values for {n_items} items")
                columns[name] = _Numeric(values)
            elif kind == "categorical":
                columns[name] = cls._categorical(array, prefix, list(column["values"]), n_items)
            else:
                raise ValueError(f"unknown type {kind!r}")
        return cls(n_items, columns)

    @staticmethod
    def _categorical(
        array: Callable[[str], np.ndarray], prefix: str, vocabulary: list[str], n_items: int
    ) -> _Categorical:
        indptr = np.asarray(array(f"{prefix}_indptr"), dtype=np.int64)
        codes = np.asarray(array(f"{prefix}_codes"), dtype=np.int32)
        if (
            indptr.shape != (n_items + 1,)
            or indptr[0] != 0
            or np.any(np.diff(indptr) < 0)
            or indptr[-1] != codes.size
        ):
            raise ValueError(f"{prefix}: indptr does not match {n_items} items and {codes.size} codes")
        if codes.size and (codes.min() < 0 or codes.max() >= len(vocabulary)):
            raise ValueError(f"{prefix}: codes outside the {len(vocabulary)} values")
        entry_item = np.repeat(np.arange(n_items, dtype=np.int64), np.diff(indptr))
        return _Categorical({v: i for i, v in enumerate(vocabulary)}, codes, entry_item)

    def column_types(self) -> dict[str, str]:
        """Each attribute's type, "numeric" or "categorical" (what :meth:`from_columns` takes)."""
        return {n: "numeric" if isinstance(c, _Numeric) else "categorical" for n, c in self.columns.items()}

    def describe(self) -> str:
        return ", ".join(f"{n} ({kind})" for n, kind in sorted(self.column_types().items())) or "none"

    def allowed(self, text: str) -> np.ndarray:
        """The mask of the items ``text`` lets through, not cached (the server's own one-off
        filters, e.g. ``service/live/fresh.py``, must not push the requests' out of the cache)."""
        allowed = np.ones(self.n_items, dtype=bool)
        for clause in parse_filter(text):
            allowed &= self._evaluate(clause)
        return allowed

    def eligible(self, text: str) -> Eligible:
        """The items ``text`` lets through, cached: a shop sends the same few filters again and again."""
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                return hit
        result = Eligible(~self.allowed(text))
        with self._lock:
            self._cache[text] = result
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result

    def item_values(self, name: str, rows: np.ndarray) -> list[tuple[float | int, ...]]:
        """Each row's values of attribute ``name`` (categorical: the values; numeric: the
        number, none when missing); FilterError when the version has no such attribute. Values,
        not codes, so rows of two sets (a version's items, its fresh items) compare."""
        column = self.columns.get(name)
        if column is None:
            raise FilterError(f"no item attribute {name!r} (this version has: {self.describe()})")
        rows = np.asarray(rows, dtype=np.int64)
        if isinstance(column, _Numeric):
            return [() if np.isnan(x) else (float(x),) for x in column.values[rows].tolist()]
        starts = np.searchsorted(column.entry_item, rows, side="left")
        ends = np.searchsorted(column.entry_item, rows, side="right")
        codes, names = column.codes, column.names
        return [tuple(names[c] for c in codes[a:b].tolist()) for a, b in zip(starts.tolist(), ends.tolist())]

    @functools.cached_property
    def categorical_pairs(self) -> list[tuple[str, str]]:
        """``(attribute, value)`` of every code :meth:`categorical_entries` gives: the values of
        all categorical attributes numbered together, attribute by attribute."""
        return [
            (name, value)
            for name, column in self.columns.items()
            if isinstance(column, _Categorical)
            for value in column.names
        ]

    @functools.cached_property
    def categorical_code(self) -> dict[tuple[str, str], int]:
        """The code of each ``(attribute, value)`` of :attr:`categorical_pairs`."""
        return {pair: code for code, pair in enumerate(self.categorical_pairs)}

    def categorical_entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every categorical value of ``rows`` as (its row's position in ``rows``, its code in
        :attr:`categorical_pairs`), vectorised: what diversity compares items by."""
        rows = np.asarray(rows, dtype=np.int64)
        positions, codes, offset = [], [], 0
        for column in self.columns.values():
            if not isinstance(column, _Categorical):
                continue
            starts = np.searchsorted(column.entry_item, rows, side="left")
            counts = np.searchsorted(column.entry_item, rows, side="right") - starts
            first = np.repeat(starts - (np.cumsum(counts) - counts), counts)
            positions.append(np.repeat(np.arange(rows.size), counts))
            codes.append(column.codes[first + np.arange(first.size)].astype(np.int64) + offset)
            offset += len(column.vocabulary)
        if not positions:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(positions), np.concatenate(codes)

    def _evaluate(self, clause: Clause) -> np.ndarray:
        column = self.columns.get(clause.name)
        if column is None:
            raise FilterError(
                f"{clause.where()}: no item attribute {clause.name!r} (this version has: {self.describe()})"
            )
        if isinstance(column, _Numeric):
            return _numeric_clause(clause, column.values)
        return _categorical_clause(clause, column, self.n_items)


def _numbers(clause: Clause) -> list[float]:
    bad = [v for v in clause.values if not isinstance(v, float)]
    if bad:
        raise FilterError(f"{clause.where()}: {clause.name!r} is numeric, {bad[0]!r} is not a number")
    return list(clause.values)


def _numeric_clause(clause: Clause, values: np.ndarray) -> np.ndarray:
    numbers = _numbers(clause)
    op = clause.op
    with np.errstate(invalid="ignore"):
        if op == "in":
            return np.isin(values, numbers)
        if op == "not in":
            return ~np.isin(values, numbers)
        if op == "between":
            return (values >= numbers[0]) & (values <= numbers[1])
        return _COMPARE[op](values, numbers[0])


_COMPARE: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "=": np.equal,
    "!=": lambda a, b: ~np.equal(a, b),
    ">=": np.greater_equal,
    ">": np.greater,
    "<=": np.less_equal,
    "<": np.less,
}


def _categorical_clause(clause: Clause, column: _Categorical, n_items: int) -> np.ndarray:
    op = clause.op
    if op not in ("in", "not in", "=", "!="):
        raise FilterError(f"{clause.where()}: {clause.name!r} is categorical: use in, not in, = or !=")
    numbers = [v for v in clause.values if isinstance(v, float)]
    if numbers:
        raise FilterError(
            f"{clause.where()}: {clause.name!r} is categorical, quote its values ({numbers[0]:g} is a number)"
        )
    # A value this version does not know matches nothing: it may come with the next version.
    wanted = [column.vocabulary[v] for v in clause.values if v in column.vocabulary]
    hit = np.zeros(n_items, dtype=bool)
    if wanted:
        hit[column.entry_item[np.isin(column.codes, wanted)]] = True
    return hit if op in ("in", "=") else ~hit


# ----------------------------------------------------------------- eligibility
class Eligible:
    """Items a request may not return, as one mask over item rows (``True``: blocked).

    ``rows`` (the eligible ones) is computed on first use and kept, so a
    cached filter pays for it once.
    """

    __slots__ = ("blocked", "_rows", "_blocked_rows", "_bits", "__weakref__")

    def __init__(self, blocked: np.ndarray):
        blocked.setflags(write=False)
        self.blocked = blocked
        self._rows: np.ndarray | None = None
        self._blocked_rows: np.ndarray | None = None
        self._bits: np.ndarray | None = None

    @property
    def allowed_bits(self) -> np.ndarray:
        """The eligible rows as a little-endian bitmap (faiss's ``IDSelectorBitmap``), packed once."""
        if self._bits is None:
            self._bits = np.packbits(~self.blocked, bitorder="little")
        return self._bits

    @property
    def blocked_rows(self) -> np.ndarray:
        """The blocked rows (for searches that take a row list, e.g. Neighbors)."""
        if self._blocked_rows is None:
            self._blocked_rows = np.flatnonzero(self.blocked)
        return self._blocked_rows

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = np.flatnonzero(~self.blocked)
        return self._rows

    @property
    def sparse(self) -> bool:
        """Few enough eligible items that scoring only them beats masking all."""
        return self.rows.size <= SPARSE_ELIGIBLE_FRACTION * self.blocked.size

    def filter_candidates(self, candidates: np.ndarray) -> np.ndarray:
        return candidates[~self.blocked[candidates]]


def combine(*parts: Eligible | None) -> Eligible | None:
    """One :class:`Eligible` blocking what any part blocks (None when no part blocks anything)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    blocked = present[0].blocked.copy()
    for part in present[1:]:
        blocked |= part.blocked
    return Eligible(blocked)


# --------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class Clause:
    number: int  # 1-based, for messages
    text: str
    name: str
    op: str  # "in", "not in", "between", "=", "!=", ">=", ">", "<=", "<"
    values: tuple  # str or float

    def where(self) -> str:
        return f"filter clause {self.number} ({self.text!r})"


_TOKEN_RE = re.compile(
    r"""
    \s*(?:
      (?P<string>"[^"]*"|'[^']*')
    | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
    | (?P<op>!=|>=|<=|=|>|<|\(|\)|,)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Token:
    kind: str  # string, number, op, word, end
    text: str
    start: int
    end: int

    @property
    def keyword(self) -> str:
        return self.text.lower() if self.kind == "word" else ""


def _tokens(text: str) -> list[_Token]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN_RE.match(text, pos)
        if not match:
            # an unreadable character becomes a token the parser refuses in its clause's context
            start = len(text) - len(text[pos:].lstrip())
            out.append(_Token("bad", text[start], start, start + 1))
            pos = start + 1
            continue
        kind = match.lastgroup or "bad"  # every alternative is a named group: never None
        out.append(_Token(kind, match.group(kind), match.start(kind), match.end()))
        pos = match.end()
    out.append(_Token("end", "", len(text), len(text)))
    return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "end":
            self.pos += 1
        return token

    def clause_text(self, start: int) -> str:
        end = self.tokens[max(self.pos - 1, 0)].end
        # to the next "and" (or the end), so a broken clause is shown whole
        rest = self.text[end:]
        cut = re.search(r"\band\b", rest, re.IGNORECASE)
        return (self.text[start:end] + (rest[: cut.start()] if cut else rest)).strip()

    def fail(self, number: int, start: int, why: str) -> FilterError:
        return FilterError(f"filter clause {number} ({self.clause_text(start)!r}): {why}")

    def parse(self) -> list[Clause]:
        clauses: list[Clause] = []
        while True:
            clauses.append(self.clause(len(clauses) + 1))
            if len(clauses) > MAX_CLAUSES:
                raise FilterError(f"filter: more than {MAX_CLAUSES} clauses")
            token = self.take()
            if token.kind == "end":
                return clauses
            if token.keyword != "and":
                raise self.fail(
                    len(clauses),
                    self.tokens[self.pos - 2].start if self.pos >= 2 else 0,
                    f"expected 'and' or the end, found {token.text!r}",
                )

    def clause(self, number: int) -> Clause:
        start = self.peek().start
        name = self.take()
        if name.kind != "word" or name.keyword in ("and", "in", "not", "between"):
            raise self.fail(number, start, f"expected an attribute name, found {name.text or 'the end'!r}")
        op_token = self.take()
        op = op_token.keyword or op_token.text
        if op == "not":
            if self.take().keyword != "in":
                raise self.fail(number, start, "expected 'in' after 'not'")
            op = "not in"
        if op in ("in", "not in"):
            values = self.value_list(number, start)
        elif op == "between":
            low = self.value(number, start)
            if self.take().keyword != "and":
                raise self.fail(number, start, "expected 'between LOW and HIGH'")
            high = self.value(number, start)
            if not (isinstance(low, float) and isinstance(high, float)):
                raise self.fail(number, start, "between takes two numbers")
            if low > high:
                raise self.fail(
                    number, start, f"between {low:g} and {high:g}: the low end is above the high end"
                )
            values = (low, high)
        elif op in _COMPARE:
            values = (self.value(number, start),)
            if op not in ("=", "!=") and not isinstance(values[0], float):
                raise self.fail(number, start, f"{op} takes a number")
        else:
            raise self.fail(
                number,
                start,
                f"expected in, not in, between, =, !=, >=, >, <= or <; found {op_token.text or 'the end'!r}",
            )
        return Clause(number, self.clause_text(start), name.text, op, values)

    def value(self, number: int, start: int) -> str | float:
        token = self.take()
        if token.kind == "number":
            return float(token.text)
        if token.kind == "string":
            return token.text[1:-1]
        raise self.fail(
            number, start, f"expected a number or a quoted value, found {token.text or 'the end'!r}"
        )

    def value_list(self, number: int, start: int) -> tuple:
        if self.take().text != "(":
            raise self.fail(number, start, "expected '(' after in")
        values = [self.value(number, start)]
        while True:
            token = self.take()
            if token.text == ")":
                break
            if token.text != ",":
                raise self.fail(number, start, f"expected ',' or ')', found {token.text or 'the end'!r}")
            values.append(self.value(number, start))
            if len(values) > MAX_LIST_VALUES:
                raise self.fail(number, start, f"more than {MAX_LIST_VALUES} values")
        return tuple(values)


def parse_filter(text: str) -> list[Clause]:
    """Parse a filter string into clauses (FilterError names the bad clause)."""
    if len(text) > MAX_FILTER_CHARS:
        raise FilterError(f"filter: longer than {MAX_FILTER_CHARS} characters")
    if not text.strip():
        raise FilterError("filter: empty")
    return _Parser(text).parse()


# ---------------------------------------------------------------- hidden items
def hidden_mask(items: IdMap, hidden_ids: Sequence[frozenset[str]]) -> Eligible | None:
    """The mask of ``items`` rows whose ids are in any of ``hidden_ids`` (None when none are)."""
    blocked = np.zeros(len(items), dtype=bool)
    for ids in hidden_ids:
        if ids:
            rows = items.rows(list(ids))
            blocked[rows[rows >= 0]] = True
    return Eligible(blocked) if blocked.any() else None
