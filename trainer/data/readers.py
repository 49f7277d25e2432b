"""Readers: one per input shape, producing the dataclasses of :mod:`trainer.data.types`.

=====================  ==============  ==============================================
format                 shape           file
=====================  ==============  ==============================================
``ml-100k``            ratings         MovieLens 100K ``u.data``: tab, ``user item rating timestamp``
``ml-1m`` / ``ml-10m`` ratings         MovieLens 1M/10M ``ratings.dat``: ``user::item::rating::timestamp``
``csv`` / ``tsv``      every shape     header row naming the columns
``lastfm-tags``        tags            HetRec Last.fm ``user_taggedartists.dat`` (+ ``tags.dat``)
``ml-tags``            tags            MovieLens 10M ``tags.dat``: ``user::item::tag::timestamp``
``zoo``                attributes      UCI ``zoo.data``: name + 17 categorical attributes
``neighbors``          neighbors       ``source,neighbor,rank`` (comma or tab, header optional)
``parquet``            ratings         ``*.parquet`` (pyarrow, the ``parquet`` extra): columns named as in csv
=====================  ==============  ==============================================

Every reader takes ``fmt="auto"`` (detect from the file name, then from the
content), ``skip_bad_lines`` (skip malformed lines and report how many in
``skipped_lines`` instead of failing) and raises :class:`DataError` naming the
file, the 1-based line and what was wrong. External ids become dense int32
rows in order of first appearance. Ratings must lie on the format's declared
:data:`RATING_SCALES` (or the ``rating_scale`` given); MovieLens timestamps
must be non-negative integers. Attribute tables without a header or id
column take ``column_names`` (ids are then line numbers, as for ``zoo``).
Parquet has rows, not lines: its errors name the 1-based row
(:mod:`trainer.data.parquet`). Ratings files may instead be interaction
logs (clicks, plays, purchases: ``feedback="implicit"``), whose repeats fold
into a strength (:mod:`trainer.data.interactions`). See ``docs/data.md``.
"""

from __future__ import annotations

import logging
import math
import os
import re
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordrec.service.storage.idmap import IdMap, has_control
from ordrec.trainer.data.interactions import aggregate, check_levels
from ordrec.trainer.data.lines import (
    Column,
    IdSpace,
    Problems,
    Records,
    check_fields,
    check_path,
    find_duplicates,
    iter_lines,
    no_data_lines,
    parse_records,
    peek_lines,
    splitter,
)
from ordrec.trainer.data.types import (
    FEEDBACK,
    AttributeTable,
    DataError,
    NeighborLists,
    Ratings,
    RatingScale,
    TagAssignments,
    excerpt,
)

SHAPES = ("ratings", "tags", "attributes", "neighbors")
log = logging.getLogger("ordrec.trainer.data")

#: Every format name and the input shapes it can hold.
FORMATS: dict[str, tuple[str, ...]] = {
    "ml-100k": ("ratings",),
    "ml-1m": ("ratings",),
    "ml-10m": ("ratings",),
    "csv": SHAPES,
    "tsv": SHAPES,
    "lastfm-tags": ("tags",),
    "ml-tags": ("tags",),
    "zoo": ("attributes",),
    "neighbors": ("neighbors",),
    "parquet": ("ratings",),
    # Explicit judgements, read by their own modules (never detected: name them):
    "triples": ("ratings",),  # COE: "A u i j" / "B u v i" lines (trainer.data.triples)
    "triplets": ("attributes",),  # SCORE: "aspect,i,j,k" lines (trainer.data.triplets)
}

#: The ratings each MovieLens format may hold; csv/tsv declare none (any
#: finite number) unless given ``rating_scale``.
RATING_SCALES: dict[str, RatingScale] = {
    "ml-100k": RatingScale(1, 5),
    "ml-1m": RatingScale(1, 5),
    "ml-10m": RatingScale(0.5, 5, 0.5),
}

# Well-known file names, checked before the content.
_FILE_NAMES = [
    (re.compile(r"u\d?\.data|u\d\.(base|test)|u[ab]\.(base|test)"), "ml-100k"),
    (re.compile(r"ratings\.dat"), "ml-1m"),
    (re.compile(r"user_taggedartists\.dat"), "lastfm-tags"),
    (re.compile(r"tags\.dat"), "ml-tags"),
    (re.compile(r"zoo\.data"), "zoo"),
]
# What to look for when --data is a folder.
_FOLDER_FILES = {
    "ratings": ("u.data", "ratings.dat"),
    "tags": ("user_taggedartists.dat", "tags.dat"),
    "attributes": ("zoo.data",),
    "neighbors": (),
}

# Header names accepted for each column, compared after lower-casing and
# dropping "_", "-" and spaces (so user_id, userId and "User ID" all match).
_COLUMN_NAMES = {
    "user": {"user", "userid", "uid", "users", "username", "customerid", "reviewerid"},
    "item": {
        "item",
        "itemid",
        "iid",
        "items",
        "movie",
        "movieid",
        "artist",
        "artistid",
        "product",
        "productid",
        "asin",
        "song",
        "songid",
        "book",
        "bookid",
        "isbn",
        "resource",
        "resourceid",
    },
    "rating": {"rating", "ratings", "score", "stars", "value", "overall"},
    # Implicit feedback: how strong an interaction is (a count, an amount or a duration).
    "strength": {
        "strength",
        "plays",
        "playcount",
        "count",
        "counts",
        "listens",
        "listencount",
        "views",
        "viewcount",
        "clicks",
        "clickcount",
        "quantity",
        "qty",
        "purchases",
        "amount",
        "duration",
        "seconds",
        "watchtime",
        "weight",
        "frequency",
    },
    "tag": {"tag", "tagid", "tags", "tagname", "tagvalue"},
    "source": {"source", "sourceid", "src", "from", "vertex", "query", "node"},
    "neighbor": {"neighbor", "neighbour", "neighborid", "neighbourid", "nbr", "to", "target", "dst"},
    "rank": {"rank", "position", "order"},
}
# csv/tsv columns validated as timestamps when present (same normalisation).
_TIMESTAMP_NAMES = {"timestamp", "ts", "unixtime", "unixtimestamp", "epoch"}
_ZOO_ATTRIBUTES = [
    "hair",
    "feathers",
    "eggs",
    "milk",
    "airborne",
    "aquatic",
    "predator",
    "toothed",
    "backbone",
    "breathes",
    "venomous",
    "fins",
    "legs",
    "tail",
    "domestic",
    "catsize",
    "type",
]
_LASTFM_HEADER = ["userid", "artistid", "tagid", "day", "month", "year"]
_MISSING = {"", "?"}


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).lower()


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------ detection
def _resolve(path, shape: str) -> str:
    """The file to read: ``path`` itself, or the one well-known file inside a folder."""
    path = os.fspath(path)
    if os.path.isdir(path):
        found = [os.path.join(path, n) for n in _FOLDER_FILES[shape] if os.path.isfile(os.path.join(path, n))]
        if shape == "tags" and len(found) == 2:
            found = found[:1]  # beside user_taggedartists.dat, tags.dat is Last.fm's tag names, not data
        if len(found) != 1:
            wanted = ", ".join(_FOLDER_FILES[shape]) or "no well-known file name"
            raise DataError(
                path,
                None,
                f"is a folder; for {shape} it must hold exactly one of: {wanted} (or pass the file itself)",
            )
        path = found[0]
    return check_path(path)


def _choices(shape: str) -> str:
    return ", ".join(f for f, shapes in FORMATS.items() if shape in shapes)


def _separator(lines: list[str]) -> str | None:
    first = lines[0]
    if "::" in first:
        return "::"
    if "\t" in first:
        return "\t"
    if "," in first:
        return ","
    return None


def _looks_like_header(fields: list[str], shape: str) -> bool:
    known = {
        "ratings": ("user", "item", "rating"),
        "tags": ("user", "item", "tag"),
        "neighbors": ("source", "neighbor", "rank"),
    }[shape]
    if any(_norm(f) in _COLUMN_NAMES[k] for f in fields for k in known):
        return True
    return shape != "tags" and not any(_is_number(f) for f in fields)


def detect_format(path, shape: str) -> str:
    """The format of ``path`` for ``shape``: from the file name, then from the content.

    Raises :class:`DataError` listing the ``--format`` choices when the file
    does not make it clear.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown input shape {shape!r}; expected one of {', '.join(SHAPES)}")
    path = _resolve(path, shape)
    name = os.path.basename(path).lower()
    if name.endswith(".parquet"):
        if shape in FORMATS["parquet"]:
            return "parquet"
        raise DataError(path, None, f"Parquet files are read as ratings, not {shape}")
    for pattern, fmt in _FILE_NAMES:
        if pattern.fullmatch(name) and shape in FORMATS[fmt]:
            return fmt
    lines = peek_lines(path)
    if not lines:
        raise DataError(path, None, "empty file (only blank lines)")
    sep = _separator(lines)
    found = _FORMAT_BY_CONTENT[shape](sep, splitter(sep)(lines[0])) if sep else None
    if found is None:
        raise DataError(
            path,
            None,
            f"cannot tell the format of this {shape} file; choose one with --format: {_choices(shape)}",
        )
    return found


def _delimited(sep: str) -> str:
    return "csv" if sep == "," else "tsv"


def _ratings_format(sep: str, fields: list[str]) -> str | None:
    if sep == "::":
        return "ml-1m"
    if _looks_like_header(fields, "ratings"):
        return _delimited(sep)
    return "ml-100k" if sep == "\t" and len(fields) == 4 else None


def _tags_format(sep: str, fields: list[str]) -> str | None:
    if sep == "::":
        return "ml-tags"
    if sep == "\t" and [_norm(f) for f in fields] == _LASTFM_HEADER:
        return "lastfm-tags"
    return _delimited(sep) if sep in ",\t" and _looks_like_header(fields, "tags") else None


def _attributes_format(sep: str, fields: list[str]) -> str | None:
    if sep == "," and len(fields) == 18 and all(_is_int(f) for f in fields[1:]):
        return "zoo"
    return _delimited(sep) if sep in ",\t" and len(fields) >= 2 else None


def _neighbors_format(sep: str, fields: list[str]) -> str | None:
    return _delimited(sep) if sep in ",\t" else None


# The format a file's separator and first line show, per shape (None: cannot tell).
_FORMAT_BY_CONTENT = {
    "ratings": _ratings_format,
    "tags": _tags_format,
    "attributes": _attributes_format,
    "neighbors": _neighbors_format,
}


def _choose(path: str, shape: str, fmt: str | None) -> str:
    if fmt in (None, "", "auto"):
        return detect_format(path, shape)
    if fmt not in FORMATS:
        raise DataError(path, None, f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if shape not in FORMATS[fmt]:
        raise DataError(
            path,
            None,
            f"format {fmt!r} holds {', '.join(FORMATS[fmt])}, not {shape}; choose one of: {_choices(shape)}",
        )
    return fmt


def _first_line(path: str) -> str:
    for _, text in iter_lines(path):
        return text
    raise DataError(path, None, "empty file")


def _header_columns(
    path: str, sep: str, wanted: list[str], overrides: Mapping[str, str] | None
) -> tuple[list[str], list[int]]:
    """Header names of line 1 and the field index of each wanted column."""
    line = _first_line(path)
    header = splitter(sep)(line)
    if not any(header):
        raise DataError(path, 1, "expected a header line naming the columns, got a blank line")
    return header, _match_columns(path, 1, header, f"header {excerpt(line)}", wanted, overrides)


def _match_columns(
    path: str,
    line: int | None,
    header: list[str],
    shown: str,
    wanted: list[str],
    overrides: Mapping[str, str] | None,
) -> list[int]:
    """The index in ``header`` of each wanted column, by the common names or ``overrides``.

    ``shown`` is how messages name the header (``header 'a,b'``, or a Parquet file's columns).
    """
    normalised = [_norm(h) for h in header]
    found = []
    for want in wanted:
        if overrides and want in overrides:
            name = overrides[want]
            matches = [i for i, h in enumerate(header) if h == name] or [
                i for i, h in enumerate(normalised) if h == _norm(name)
            ]
            if not matches:
                raise DataError(path, line, f"no column {excerpt(name)} (given for {want}) in {shown}")
        else:
            matches = [i for i, h in enumerate(normalised) if h in _COLUMN_NAMES[want]]
            if not matches:
                raise DataError(
                    path,
                    line,
                    f"no {want} column in {shown}; expected one of "
                    f"{sorted(_COLUMN_NAMES[want])} or columns={{{want!r}: ...}}",
                )
        if len(matches) > 1:
            raise DataError(
                path,
                line,
                f"several {want} columns in {shown}: "
                f"{', '.join(excerpt(header[i]) for i in matches)}; pick one with columns=",
            )
        found.append(matches[0])
    if len(set(found)) != len(found):
        raise DataError(path, line, f"the same column is used twice among {wanted} in {shown}")
    return found


def _drop_duplicates(
    records, group, n_groups, value, n_values, path, skip: bool, describe, unit: str = "line"
) -> int:
    """Raise on the first repeated (group, value) pair, naming both lines, or drop the repeats.

    ``unit="row"``: the records are Parquet rows, named as such. Returns how
    many records were dropped.
    """
    pairs = find_duplicates(group, n_groups, value, n_values)
    if pairs.shape[0] == 0:
        return 0
    if not skip:
        later, earlier = (int(x) for x in pairs[0])
        if unit == "row":
            raise DataError(
                path,
                None,
                f"duplicate {describe(later)}, already in row {records.line(earlier)}",
                row=records.line(later),
            )
        raise DataError(
            path, records.line(later), f"duplicate {describe(later)}, already on line {records.line(earlier)}"
        )
    mask = np.ones(group.size, dtype=bool)
    mask[pairs[:, 0]] = False
    records.keep(mask)
    return int(pairs.shape[0])


# ------------------------------------------------------------------ ratings
def declared_scale(fmt: str, detected: bool = False) -> RatingScale | None:
    """The rating scale format ``fmt`` declares (None for csv/tsv: any finite number).

    ``detected``: the format was told from the file, not named. ML-1M and
    ML-10M share the name ``ratings.dat`` and the layout, so a detected
    ``ml-1m`` gets the 10M scale (halves), which holds both.
    """
    if detected and fmt == "ml-1m":
        return RATING_SCALES["ml-10m"]
    return RATING_SCALES.get(fmt)


def ratings_scale(
    path, fmt: str = "auto", rating_scale: RatingScale | str | None = None
) -> RatingScale | None:
    """The scale :func:`read_ratings` checks ``path``'s ratings against (None: any finite number)."""
    detected = fmt in (None, "", "auto")
    fmt = _choose(_resolve(path, "ratings"), "ratings", fmt)
    if isinstance(rating_scale, str):
        rating_scale = RatingScale.parse(rating_scale)
    return rating_scale or declared_scale(fmt, detected)


def _timestamp_columns(header: list[str], taken: list[int], keep: bool = False) -> list[Column]:
    """Every timestamp-named column not in ``taken``, checked; the first one kept when ``keep``."""
    found = [i for i, name in enumerate(header) if i not in taken and _norm(name) in _TIMESTAMP_NAMES]
    return [Column(i, "timestamp", kind="timestamp", keep=keep and k == 0) for k, i in enumerate(found)]


@dataclass
class _RatingLayout:
    """Which columns of a ratings file hold what, and how it is read."""

    feedback: str  # "explicit" or "implicit"
    fields: list[int]  # user, item, then the value column (rating or strength) when there is one
    value: str | None  # the value column's header name; None: implicit, counting rows
    automatic: bool = False  # implicit because the header names no rating column (a warning says so)


def _rating_layout(
    path: str,
    line: int | None,
    header: list[str],
    shown: str,
    columns: Mapping[str, str] | None,
    feedback: str,
) -> _RatingLayout:
    """Decide explicit or implicit from ``feedback`` and the header, and find the columns.

    Explicit: a rating column (by name or ``columns["rating"]``). Implicit: the strength
    column (``columns["strength"]``, a strength name such as ``plays``, else a rating-named
    column), or none (each record counts 1). ``auto``: explicit when a rating column is
    named, implicit with a strength-named column, or implicit counting records when the
    header names only user, item and timestamp columns.
    """
    ids = _match_columns(path, line, header, shown, ["user", "item"], columns)
    overrides = dict(columns or {})
    if feedback == "explicit" and "strength" in overrides:
        raise DataError(path, line, "a strength column is for implicit feedback, not explicit ratings")
    automatic = feedback == "auto"
    if automatic:
        feedback = _implied_feedback(path, line, header, shown, ids, overrides)
    if feedback == "explicit":
        rating = _match_columns(path, line, header, shown, ["rating"], columns)
        return _RatingLayout("explicit", ids + rating, header[rating[0]])
    for role in ("strength", "rating"):
        if role in overrides or _named(header, ids, role):
            value = _match_columns(path, line, header, shown, [role], overrides)
            if value[0] in ids:
                raise DataError(
                    path, line, f"the same column is used twice among user, item, {role} in {shown}"
                )
            return _RatingLayout("implicit", ids + value, header[value[0]], automatic)
    return _RatingLayout("implicit", ids, None, automatic)


def _named(header: list[str], taken: list[int], role: str) -> bool:
    return any(i not in taken and _norm(h) in _COLUMN_NAMES[role] for i, h in enumerate(header))


def _implied_feedback(
    path: str, line: int | None, header: list[str], shown: str, ids: list[int], overrides: dict
) -> str:
    """``auto`` decided from the header (see :func:`_rating_layout`)."""
    if "rating" in overrides or _named(header, ids, "rating"):
        return "explicit"
    if "strength" in overrides or _named(header, ids, "strength"):
        return "implicit"
    others = [h for i, h in enumerate(header) if i not in ids and _norm(h) not in _TIMESTAMP_NAMES]
    if not others:
        return "implicit"
    raise DataError(
        path,
        line,
        f"no rating column in {shown}; expected one of {sorted(_COLUMN_NAMES['rating'])} or"
        " columns={'rating': ...}. For interactions without a rating (clicks, plays, purchases)"
        " say --feedback implicit, with --strength COLUMN for a count such as plays"
        f" (strength names recognised: {sorted(_COLUMN_NAMES['strength'])})",
    )


def read_ratings(
    path,
    fmt: str = "auto",
    *,
    skip_bad_lines: bool = False,
    columns: Mapping[str, str] | None = None,
    rating_scale: RatingScale | str | None = None,
    feedback: str = "auto",
    strength: str | None = None,
) -> Ratings:
    """Read explicit ratings, or implicit interactions (clicks, plays, purchases).

    Parameters
    ----------
    path : str or Path
        The file (or a folder holding ``u.data`` or ``ratings.dat``).
    fmt : {"auto", "ml-100k", "ml-1m", "ml-10m", "csv", "tsv", "parquet"}
        ``parquet`` (detected by the ``.parquet`` suffix) needs pyarrow (the
        ``parquet`` extra): columns are found as in csv, ids must be strings
        or integers and ratings numbers, and errors name the 1-based row.
    skip_bad_lines : bool
        Skip malformed lines (and later duplicates) and count them in
        ``skipped_lines`` instead of raising.
    columns : dict, optional
        For csv/tsv/parquet: header (column) names of the ``"user"``, ``"item"``,
        ``"rating"`` and ``"strength"`` columns when they are not among the common names.
    rating_scale : RatingScale or str, optional
        The ratings allowed (``"1..5"``, ``"0.5..5:0.5"``); replaces the
        format's declared scale (:func:`declared_scale`).
    feedback : {"auto", "explicit", "implicit"}
        ``implicit``: records are interactions; a repeated (user, item) is a
        repeat, folded into one row whose strength is the number of records or
        the sum of the strength column, and whose time is the latest. ``auto``
        (csv/tsv/parquet): implicit when the header names a strength column
        (``plays``, ``count``, ``quantity``, ``weight`` ...) and no rating, or
        only user, item and timestamp columns; MovieLens files are explicit.
    strength : str, optional
        The strength column's header name (implies ``feedback="implicit"``).

    A rating off the scale, a MovieLens timestamp that is not a non-negative
    integer of at most 20 digits (likewise a csv/tsv column named like
    ``timestamp``), a line over ``MAX_LINE_BYTES`` and, for explicit ratings, a
    repeated (user, item) pair (naming both lines) are errors; so is an
    explicit rating column of more than :data:`MAX_RATING_LEVELS` distinct
    values without a declared scale. The first timestamp column is kept in
    ``Ratings.time`` (int64).
    """
    path = _resolve(path, "ratings")
    feedback = _feedback(path, feedback, strength, rating_scale)
    if strength is not None:
        columns = {**(columns or {}), "strength": strength}
    scale = ratings_scale(path, fmt, rating_scale)
    fmt = _choose(path, "ratings", fmt)
    if fmt == "parquet":
        return _read_parquet_ratings(path, columns, scale, skip_bad_lines, feedback)
    if fmt in RATING_SCALES:
        sep, n_fields, header_lines = "\t" if fmt == "ml-100k" else "::", 4, 0
        layout = _RatingLayout("explicit" if feedback == "auto" else feedback, [0, 1, 2], "rating")
        checked = [Column(3, "timestamp", kind="timestamp", keep=True)]
    else:
        sep = "," if fmt == "csv" else "\t"
        line = _first_line(path)
        header = splitter(sep)(line)
        if not any(header):
            raise DataError(path, 1, "expected a header line naming the columns, got a blank line")
        layout = _rating_layout(path, 1, header, f"header {excerpt(line)}", columns, feedback)
        n_fields, header_lines = len(header), 1
        checked = _timestamp_columns(header, layout.fields, keep=True)
    records = parse_records(
        path,
        sep,
        n_fields,
        [
            Column(layout.fields[0], "user", space=0),
            Column(layout.fields[1], "item", space=1),
            *_value_column(layout, scale),
            *checked,
        ],
        n_spaces=2,
        header_lines=header_lines,
        skip_bad_lines=skip_bad_lines,
    )
    return _ratings_of(records, path, layout, scale, skip_bad_lines)


def _feedback(path: str, feedback: str, strength: str | None, rating_scale) -> str:
    """``feedback`` checked against the other arguments (a strength implies implicit)."""
    if feedback not in ("auto", *FEEDBACK):
        raise ValueError(f"feedback must be auto, explicit or implicit, got {feedback!r}")
    if strength is not None:
        if feedback == "explicit":
            raise DataError(path, None, "a strength column is for implicit feedback, not explicit ratings")
        feedback = "implicit"
    if feedback == "implicit" and rating_scale is not None:
        raise DataError(path, None, "a rating scale is for explicit ratings, not implicit feedback")
    return feedback


def _value_column(layout: _RatingLayout, scale: RatingScale | None) -> list[Column]:
    """The rating (on ``scale``) or strength (a number >= 0) column to parse, if any."""
    if layout.value is None:
        return []
    if layout.feedback == "implicit":
        return [Column(layout.fields[2], "strength", kind="float", minimum=0.0)]
    return [Column(layout.fields[2], "rating", kind="float", scale=scale, dtype="float32")]


def _ratings_of(
    records: Records,
    path: str,
    layout: _RatingLayout,
    scale: RatingScale | None,
    skip: bool,
    unit: str = "line",
) -> Ratings:
    """Parsed records as :class:`Ratings`: repeats folded (implicit) or refused (explicit)."""
    users, items = records.spaces
    values = records.numbers[: len(layout.fields) - 2]
    stamps = records.numbers[len(values) :]
    time = stamps[0] if stamps else None
    if layout.feedback == "implicit":
        strength = values[0] if values else None
        folded = aggregate(
            records.ids[0], records.ids[1], len(users), len(items), strength=strength, time=time
        )
        log.log(
            logging.WARNING if layout.automatic else logging.INFO,
            "%s: read as implicit feedback%s: %d records, %d repeats folded into %d (user, item) rows",
            path,
            " (the header names no rating column; --feedback explicit to refuse that)"
            if layout.automatic
            else "",
            len(records.ids[0]),
            folded.repeats,
            folded.user.size,
        )
        return Ratings(
            users,
            items,
            folded.user,
            folded.item,
            folded.strength,
            source=path,
            skipped_lines=records.skipped,
            time=folded.time,
            feedback="implicit",
            strength=layout.value or "rows",
        )

    def describe(r):
        return (
            f"rating of item {excerpt(items.external(int(records.ids[1][r])))} "
            f"by user {excerpt(users.external(int(records.ids[0][r])))}"
        )

    skipped = records.skipped + _drop_duplicates(
        records, records.ids[0], len(users), records.ids[1], len(items), path, skip, describe, unit=unit
    )
    rating = records.numbers[0].astype(np.float32, copy=False)
    if scale is None:
        check_levels(rating, path, layout.value or "rating")
    return Ratings(
        users,
        items,
        records.ids[0],
        records.ids[1],
        rating,
        source=path,
        skipped_lines=skipped,
        time=records.numbers[1] if len(records.numbers) > 1 else None,
    )


def _read_parquet_ratings(
    path: str,
    columns: Mapping[str, str] | None,
    scale: RatingScale | None,
    skip_bad_lines: bool,
    feedback: str,
) -> Ratings:
    """Ratings of a Parquet file: columns by the csv rules, rows checked, repeats as for csv."""
    from ordrec.trainer.data import parquet

    header = parquet.parquet_columns(path)
    shown = f"the Parquet columns {excerpt(', '.join(header))}"
    layout = _rating_layout(path, None, header, shown, columns, feedback)
    stamps = [header[c.field] for c in _timestamp_columns(header, layout.fields)]
    records = parquet.read_parquet_records(
        path,
        [header[i] for i in layout.fields],
        stamps,
        scale,
        skip_bad_lines,
        implicit=layout.feedback == "implicit",
    )
    return _ratings_of(records, path, layout, scale, skip_bad_lines, unit="row")


# ------------------------------------------------------------------ tags
def _read_tag_names(path: str) -> dict[str, str]:
    """``tagID -> tagValue`` from a Last.fm ``tags.dat`` (tab, header, latin-1)."""
    path = check_path(path)
    names: dict[str, str] = {}
    for number, text in iter_lines(path, "latin-1"):
        if not text.strip():
            continue
        tag, sep, value = text.partition("\t")
        if number == 1 and not _is_int(tag.strip()):
            continue  # header "tagID	tagValue"
        if not sep:
            raise DataError(path, number, "expected 2 tab-separated fields (tagID, tagValue), got 1")
        names[tag.strip()] = value
    return names


def read_tags(
    path,
    fmt: str = "auto",
    *,
    skip_bad_lines: bool = False,
    tag_names: str | os.PathLike | Mapping[str, str] | bool | None = None,
) -> TagAssignments:
    """Read tag assignments (user, item, tag).

    Parameters
    ----------
    path : str or Path
        The file (or a folder holding ``user_taggedartists.dat`` or a
        MovieLens ``tags.dat``).
    fmt : {"auto", "lastfm-tags", "ml-tags", "csv", "tsv"}
        ``ml-tags``: MovieLens ``user::item::tag::timestamp``. The tag is the
        text between the second ``::`` and the last one, so tags holding
        ``::`` (44 lines of ML-10M) survive; it is kept as written (case and
        inner spaces), stripped of surrounding spaces and tabs, and is its
        own name. The timestamp is checked as for ratings.
    skip_bad_lines : bool
        Skip malformed lines (and later duplicates), counting them.
    tag_names : None, False, path or mapping
        Display names of tags, stored in ``TagAssignments.tag_names``. None
        (default): for ``lastfm-tags``, load ``tags.dat`` from beside the file
        when it exists. False: none. A path: a ``tags.dat``-style file
        (``tagID<TAB>tagValue``). A mapping: tag id -> name. Tags without a
        name keep their id as name.

    A repeated (user, item, tag) triple is an error naming both lines.
    """
    path = _resolve(path, "tags")
    fmt = _choose(path, "tags", fmt)
    if fmt == "ml-tags":
        records = _parse_ml_tags(path, skip_bad_lines)
    else:
        records = _parse_tag_columns(path, fmt, skip_bad_lines)
    users, items, tags = records.spaces
    user, item, tag = records.ids

    def describe(r):
        return (
            f"tag {excerpt(tags.external(int(records.ids[2][r])))} on item "
            f"{excerpt(items.external(int(records.ids[1][r])))} by user "
            f"{excerpt(users.external(int(records.ids[0][r])))}"
        )

    post = item.astype(np.int64) * max(len(tags), 1) + tag  # (item, tag) within a user
    skipped = records.skipped + _drop_duplicates(
        records, user, len(users), post, len(items) * max(len(tags), 1), path, skip_bad_lines, describe
    )

    names = None
    if tag_names is None and fmt == "lastfm-tags":
        beside = os.path.join(os.path.dirname(path), "tags.dat")
        tag_names = beside if os.path.isfile(beside) else False
    if isinstance(tag_names, (str, os.PathLike, Mapping)):
        mapping = tag_names if isinstance(tag_names, Mapping) else _read_tag_names(os.fspath(tag_names))
        names = [mapping.get(t, t) for t in tags.ids]
    return TagAssignments(
        users,
        items,
        tags,
        records.ids[0],
        records.ids[1],
        records.ids[2],
        source=path,
        skipped_lines=skipped,
        tag_names=names,
    )


#: The fields of a MovieLens tags line, checked by the per-line parser's own rules.
_ML_TAG_COLUMNS = [
    Column(0, "user", space=0),
    Column(1, "item", space=1),
    Column(2, "tag", space=2),
    Column(3, "timestamp", kind="timestamp"),
]


def split_ml_tag(text: str) -> list[str]:
    """``[user, item, tag, timestamp]`` of one MovieLens tags line (fewer fields when it has too few ``::``).

    The tag is everything between the second ``::`` and the last, so a tag
    holding ``::`` (or ending in ``:``, as in ``foo:::1234``) stays whole.
    """
    user, sep1, rest = text.partition("::")
    item, sep2, rest = rest.partition("::")
    tag, sep3, stamp = rest.rpartition("::")
    fields = [user, item, tag, stamp] if sep3 else [user, item, rest][: 1 + bool(sep1) + bool(sep2)]
    return [f.strip(" \t") for f in fields]


def _parse_ml_tags(path: str, skip_bad_lines: bool) -> Records:
    """Records (user, item, tag) of a MovieLens ``tags.dat``, line by line.

    The numba kernels split on every separator, which a tag holding ``::``
    defeats; ML-10M has 95,580 tag lines, so the per-line parser is quick enough.
    """
    problems = Problems(path, skip_bad_lines)
    spaces = [IdSpace() for _ in range(3)]
    known = [space.index for space in spaces]
    rows: list[array] = [array("i") for _ in range(3)]
    lines = array("q")
    for number, text in iter_lines(path, problems=problems):
        if not text.strip():
            continue
        fields = split_ml_tag(text)
        problem, _ = check_fields(fields, 4, "::", _ML_TAG_COLUMNS, None, known)
        if problem is not None:
            problems.bad(number, problem)
            continue
        for out, space, value in zip(rows, spaces, fields):
            out.append(space.add(value))
        lines.append(number)
    if not lines:
        raise no_data_lines(path, problems.skipped)
    return Records(
        spaces=[s.idmap() for s in spaces],
        ids=[np.frombuffer(a, dtype=np.int32).copy() for a in rows],
        numbers=[],
        first_line=int(lines[0]),
        lines=np.frombuffer(lines, dtype=np.int64).copy(),
        skipped=problems.skipped,
    )


def _parse_tag_columns(path: str, fmt: str, skip_bad_lines: bool) -> Records:
    """Records (user, item, tag) of a Last.fm or csv/tsv tags file."""
    if fmt == "lastfm-tags":
        sep, n_fields, idx = "\t", 6, [0, 1, 2]
        line = _first_line(path)
        first = splitter(sep)(line)
        header_lines = 0 if all(_is_int(f) for f in first) else 1
        if header_lines and [_norm(f) for f in first] != _LASTFM_HEADER:
            raise DataError(
                path, 1, f"expected the header 'userID artistID tagID day month year', got {excerpt(line)}"
            )
    else:
        sep = "," if fmt == "csv" else "\t"
        header, idx = _header_columns(path, sep, ["user", "item", "tag"], None)
        n_fields, header_lines = len(header), 1
    records = parse_records(
        path,
        sep,
        n_fields,
        [Column(idx[0], "user", space=0), Column(idx[1], "item", space=1), Column(idx[2], "tag", space=2)],
        n_spaces=3,
        header_lines=header_lines,
        skip_bad_lines=skip_bad_lines,
    )
    return records


# ------------------------------------------------------------------ attributes
def _value_order(values: set[str]) -> list[str]:
    """Values of one attribute in a fixed order: numerically when all are numbers, else as text."""
    if values and all(_is_number(v) for v in values):
        return sorted(values, key=lambda v: (float(v), v))
    return sorted(values)


def read_attributes(
    path, fmt: str = "auto", *, skip_bad_lines: bool = False, column_names: Sequence[str] | None = None
) -> AttributeTable:
    """Read an object-attribute table (categorical attributes).

    ``zoo``: UCI ``zoo.data``, no header, 18 comma-separated fields. The
    animal name is not unique ("frog" twice), so the object id is the 1-based
    line number as a string and the names go to ``labels``; the 17 other
    fields (including ``type``) are the attributes, values kept as strings.

    ``csv`` / ``tsv``: a header whose first column is the object id and the
    rest attribute names; an empty cell or ``?`` is a missing value (code -1).

    ``column_names`` (csv/tsv only): the file has no header and no id column
    (UCI style); every field is an attribute, named in order by
    ``column_names``, and the object id is the 1-based line number as a
    string, as for ``zoo`` (so skipping a bad line renumbers nothing). A line
    whose field count differs from the names is an error naming the line.

    Each attribute's values are listed in sorted order (numerically when they
    are all numbers), and ``codes`` index into them.
    """
    path = _resolve(path, "attributes")
    fmt = _choose(path, "attributes", fmt)
    problems = Problems(path, skip_bad_lines)
    headerless = column_names is not None
    if column_names is not None:
        sep, attributes, header_lines = _named_columns(path, fmt, column_names)
    else:
        sep, attributes, header_lines = _attribute_header(path, fmt)
    first_value = 0 if headerless else 1  # field of the first attribute
    n_fields = len(attributes) + first_value
    split = splitter(sep)
    ids: list[str] = []
    labels: list[str] = []
    cells: list[list[str]] = []
    first_line_of: dict[str, int] = {}
    for number, text in iter_lines(path, problems=problems):
        if number <= header_lines or not text.strip():
            continue
        fields = split(text)
        if len(fields) != n_fields:
            what = "comma" if sep == "," else "tab"
            given = f" (one per column name given, {excerpt(','.join(attributes))})" if headerless else ""
            problems.bad(number, f"expected {n_fields} {what}-separated fields{given}, got {len(fields)}")
            continue
        external, label, problem = _attribute_row(number, fields, fmt, first_line_of, headerless)
        if problem:
            problems.bad(number, problem)
            continue
        first_line_of[external] = number
        ids.append(external)
        if label is not None:
            labels.append(label)
        cells.append(fields[first_value:])
    if not ids:
        raise DataError(path, None, "no data lines")
    codes, values = _encode_columns(np.array(cells, dtype=object).reshape(len(ids), len(attributes)))
    return AttributeTable(
        IdMap(ids),
        list(attributes),
        codes,
        values,
        source=path,
        skipped_lines=problems.skipped,
        labels=labels if fmt == "zoo" else None,
    )


# A headerless table (UCI style) read without names trips the header checks; say what to do.
_NO_HEADER_HINT = "; a table without a header line needs its column names (column_names=, --columns)"


def _attribute_header(path: str, fmt: str) -> tuple[str, list[str], int]:
    """``(separator, attribute names, header lines)`` of an attribute file."""
    if fmt == "zoo":
        return ",", list(_ZOO_ATTRIBUTES), 0
    sep = "," if fmt == "csv" else "\t"
    line = _first_line(path)
    header = splitter(sep)(line)
    if len(header) < 2:
        raise DataError(
            path, 1, f"expected a header 'id,<attribute>,...' with at least 2 columns, got {len(header)}"
        )
    attributes = header[1:]
    for name in attributes:
        if not name or has_control(name):
            raise DataError(path, 1, f"bad attribute name {excerpt(name)} in the header")
    if len(set(attributes)) != len(attributes):
        raise DataError(path, 1, f"repeated attribute name in the header {excerpt(line)}{_NO_HEADER_HINT}")
    return sep, attributes, 1


def _named_columns(path: str, fmt: str, names: Sequence[str]) -> tuple[str, list[str], int]:
    """``(separator, attribute names, header lines)`` of a headerless table named by ``column_names``."""
    if isinstance(names, str):
        names = names.split(",")  # "a,b,c", as --columns takes it
    names = [n.strip() for n in names]
    if fmt not in ("csv", "tsv"):
        raise DataError(path, None, f"column names are for headerless csv/tsv tables, not {fmt}")
    if not names:
        raise DataError(path, None, "no column names given")
    for name in names:
        if not name or has_control(name):
            raise DataError(path, None, f"bad column name {excerpt(name)} among the names given")
    if len(set(names)) != len(names):
        raise DataError(path, None, f"repeated column name among the names given: {excerpt(','.join(names))}")
    return ("," if fmt == "csv" else "\t"), names, 0


def _attribute_row(
    number: int, fields: list[str], fmt: str, first_line_of: dict[str, int], headerless: bool = False
) -> tuple[str, str | None, str | None]:
    """``(object id, label, problem)`` of one data line (``problem`` None when it is good)."""
    values = fields if headerless else fields[1:]
    if headerless:
        external, label = str(number), None
    elif fmt == "zoo":
        external, label = str(number), fields[0]
        if not label or has_control(label):
            return external, label, f"bad animal name {excerpt(label)}"
    else:
        external, label = fields[0], None
        if not external:
            return external, label, "empty object id"
        if has_control(external):
            return (
                external,
                label,
                f"object id {excerpt(external)} contains a line break or control character",
            )
        if external in first_line_of:
            return (
                external,
                label,
                (f"duplicate object id {excerpt(external)}, already on line {first_line_of[external]}"),
            )
    bad = next((v for v in values if has_control(v)), None)
    if bad is not None:
        return external, label, f"value {excerpt(bad)} contains a line break or control character"
    return external, label, None


def _encode_columns(table: np.ndarray) -> tuple[np.ndarray, list[list[str]]]:
    """Per column: its values in order (``_value_order``) and every cell's code (-1: missing)."""
    codes = np.empty(table.shape, dtype=np.int32)
    values: list[list[str]] = []
    for a in range(table.shape[1]):
        column = table[:, a]
        order = _value_order({v for v in column if v not in _MISSING})
        index = {v: k for k, v in enumerate(order)}
        codes[:, a] = [index.get(v, -1) for v in column]
        values.append(order)
    return codes, values


# ------------------------------------------------------------------ neighbours
def read_neighbors(path, fmt: str = "auto", *, skip_bad_lines: bool = False) -> NeighborLists:
    """Read ranked neighbour lists: ``source, neighbor, rank`` per line.

    Comma or tab separated; a header naming the columns is optional (a first
    line naming a known column, or holding no number at all, is the header). Ranks are
    integers >= 1 (1 = nearest); a source's ranks and its neighbours must be
    distinct; a vertex listing itself is an error. Sources and neighbours
    share one id space, numbered in order of first appearance reading each
    line's source then its neighbour.
    """
    path = _resolve(path, "neighbors")
    fmt = _choose(path, "neighbors", fmt)
    if fmt == "neighbors":
        lines = peek_lines(path, 1)
        sep = "\t" if lines and "\t" in lines[0] else ","
    else:
        sep = "," if fmt == "csv" else "\t"
    first = splitter(sep)(_first_line(path))
    if not _looks_like_header(first, "neighbors"):
        header_lines, idx, n_fields = 0, [0, 1, 2], 3
    else:
        header, idx = _header_columns(path, sep, ["source", "neighbor", "rank"], None)
        header_lines, n_fields = 1, len(header)
    records = parse_records(
        path,
        sep,
        n_fields,
        [
            Column(idx[0], "source", space=0),
            Column(idx[1], "neighbor", space=0),
            Column(idx[2], "rank", kind="int", minimum=1),
        ],
        n_spaces=1,
        header_lines=header_lines,
        skip_bad_lines=skip_bad_lines,
        distinct=(0, 1),
    )
    vertices = records.spaces[0]
    n = max(len(vertices), 1)
    skipped = records.skipped
    rank = records.numbers[0]
    if rank.size and rank.max() >= 2**31:
        big = int(np.argmax(rank >= 2**31))
        raise DataError(path, records.line(big), f"rank {int(rank[big])} is too large")

    def by_rank(r):
        return (
            f"rank {int(records.numbers[0][r])} for source "
            f"{excerpt(vertices.external(int(records.ids[0][r])))}"
        )

    def by_neighbor(r):
        return (
            f"neighbor {excerpt(vertices.external(int(records.ids[1][r])))} for source "
            f"{excerpt(vertices.external(int(records.ids[0][r])))}"
        )

    ranks = records.numbers[0].astype(np.int64)
    skipped += _drop_duplicates(
        records,
        records.ids[0],
        n,
        ranks,
        int(ranks.max()) + 1 if ranks.size else 1,
        path,
        skip_bad_lines,
        by_rank,
    )
    skipped += _drop_duplicates(
        records, records.ids[0], n, records.ids[1], n, path, skip_bad_lines, by_neighbor
    )
    return NeighborLists(
        vertices,
        records.ids[0],
        records.ids[1],
        records.numbers[0].astype(np.int32),
        path=path,
        skipped_lines=skipped,
    )


# ------------------------------------------------------------------ dispatch
_READERS: dict[str, Callable[..., Any]] = {
    "ratings": read_ratings,
    "tags": read_tags,
    "attributes": read_attributes,
    "neighbors": read_neighbors,
}


def read_input(
    shape: str,
    path,
    fmt: str = "auto",
    skip_bad_lines: bool = False,
    rating_scale: RatingScale | str | None = None,
    column_names: Sequence[str] | None = None,
    feedback: str = "auto",
    strength: str | None = None,
):
    """Read ``path`` as input ``shape`` ("ratings", "tags", "attributes" or "neighbors").

    ``rating_scale``, ``feedback`` and ``strength`` are for ratings files (see
    :func:`read_ratings`) and ``column_names`` for headerless attribute tables
    (see :func:`read_attributes`); given for any other input any of them is a
    ValueError rather than silently ignored.
    """
    try:
        reader = _READERS[shape]
    except KeyError:
        raise ValueError(f"unknown input shape {shape!r}; expected one of {', '.join(SHAPES)}") from None
    if rating_scale is not None and (shape != "ratings" or fmt == "triples"):
        what = "triples" if shape == "ratings" else shape
        raise ValueError(f"a rating scale is for ratings files, not {what}")
    if (feedback != "auto" or strength is not None) and (shape != "ratings" or fmt == "triples"):
        what = "triples" if shape == "ratings" else shape
        raise ValueError(f"feedback and strength are for ratings files, not {what}")
    if column_names is not None and (shape != "attributes" or fmt == "triplets"):
        what = "triplets" if shape == "attributes" else shape
        raise ValueError(f"column names are for headerless attribute tables, not {what}")
    if fmt in ("triples", "triplets"):
        if shape not in FORMATS[fmt]:
            raise ValueError(f"format {fmt!r} holds {FORMATS[fmt][0]} judgements, not {shape}")
        if fmt == "triples":
            from ordrec.trainer.data.triples import read_triples

            return read_triples(path, skip_bad_lines=skip_bad_lines)
        from ordrec.trainer.data.triplets import read_triplets

        return read_triplets(path, skip_bad_lines=skip_bad_lines)
    if shape == "ratings":
        return read_ratings(
            path,
            fmt,
            skip_bad_lines=skip_bad_lines,
            rating_scale=rating_scale,
            feedback=feedback,
            strength=strength,
        )
    if column_names is not None:
        return read_attributes(path, fmt, skip_bad_lines=skip_bad_lines, column_names=column_names)
    return reader(path, fmt, skip_bad_lines=skip_bad_lines)
