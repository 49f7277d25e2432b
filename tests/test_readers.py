"""Readers: every format, detection, every error kind (file + line), skipping,
CRLF, latin-1, duplicates, the fast path against the per-line parser, and a
round-trip property test. Real files under $ORDREC_DATA in the slow tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordrec.trainer.data import lines as parsing
from ordrec.trainer.data.lines import Column, parse_records
from ordrec.trainer.data.readers import (
    FORMATS,
    SHAPES,
    declared_scale,
    detect_format,
    read_attributes,
    read_input,
    read_neighbors,
    read_ratings,
    read_tags,
)
from ordrec.trainer.data.types import (
    EXCERPT_CHARS,
    AttributeTable,
    DataError,
    NeighborLists,
    Ratings,
    RatingScale,
    TagAssignments,
    excerpt,
)
from tests.conftest import data_file
from tests.data_errors import error_of


def write(path: Path, text: str, encoding: str = "utf-8", newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode(encoding))
    return path


def triples(r: Ratings) -> list[tuple[str, str, float]]:
    return [(r.users.external(u), r.items.external(i), float(x)) for u, i, x in zip(r.user, r.item, r.rating)]


# ------------------------------------------------------------------ ratings formats
def test_ml100k_tab_format(tmp_path):
    path = write(
        tmp_path / "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n196\t377\t1\t878887116\n"
    )
    r = read_ratings(path)
    assert isinstance(r, Ratings)
    assert triples(r) == [("196", "242", 3.0), ("186", "302", 3.0), ("196", "377", 1.0)]
    assert r.users.ids == ["196", "186"] and r.items.ids == ["242", "302", "377"]
    assert r.user.dtype == np.int32 and r.item.dtype == np.int32 and r.rating.dtype == np.float32
    assert r.source == str(path) and r.skipped_lines == 0


def test_ml1m_double_colon_format_with_half_stars(tmp_path):
    path = write(tmp_path / "ratings.dat", "1::1193::5::978300760\n1::661::3.5::978302109\n2::1193::0.5::1\n")
    r = read_ratings(path)
    assert triples(r) == [("1", "1193", 5.0), ("1", "661", 3.5), ("2", "1193", 0.5)]


@pytest.mark.parametrize(
    "header,sep",
    [
        ("userId,movieId,rating,timestamp", ","),
        ("user_id,item_id,score,ts", ","),
        ("User ID\tItem\tRating", "\t"),
    ],
)
def test_csv_tsv_common_header_names(tmp_path, header, sep):
    n = len(header.split(sep))
    rows = [["a", "x", "4.5", "9"], ["b", "x", "2", "9"], ["a", "y", "1", "9"]]
    text = header + "\n" + "".join(sep.join(row[:n]) + "\n" for row in rows)
    path = write(tmp_path / ("r.csv" if sep == "," else "r.tsv"), text)
    r = read_ratings(path)
    assert triples(r) == [("a", "x", 4.5), ("b", "x", 2.0), ("a", "y", 1.0)]


def test_csv_columns_override_and_column_order(tmp_path):
    path = write(tmp_path / "r.csv", "stars,who,what\n5,alice,film1\n3,bob,film1\n")
    r = read_ratings(path, columns={"user": "who", "item": "what", "rating": "stars"})
    assert triples(r) == [("alice", "film1", 5.0), ("bob", "film1", 3.0)]
    err = error_of(read_ratings, write(tmp_path / "s.csv", "who,what,stars\nalice,f,5\n"))
    assert err.line == 1 and "no user column" in str(err)


def test_csv_quoted_fields(tmp_path):
    path = write(tmp_path / "r.csv", 'user,item,rating\n"smith, j","The Film, part 2",4\n')
    assert triples(read_ratings(path)) == [("smith, j", "The Film, part 2", 4.0)]


def test_string_ids_keep_their_exact_text(tmp_path):
    # "007" and "7" are different external ids; the fast path must not turn one into the other.
    path = write(tmp_path / "u.data", "007\t1\t3\t0\n7\t1\t4\t0\n")
    r = read_ratings(path)
    assert r.users.ids == ["007", "7"]


def test_crlf_line_endings(tmp_path):
    path = write(tmp_path / "u.data", "1\t2\t3\t4\n5\t6\t1\t4\n", newline="\r\n")
    assert triples(read_ratings(path)) == [("1", "2", 3.0), ("5", "6", 1.0)]
    path = write(tmp_path / "r.csv", "user,item,rating\nä,b,1\n", newline="\r\n")
    assert triples(read_ratings(path)) == [("ä", "b", 1.0)]


def test_latin1_file_is_decoded(tmp_path):
    path = write(tmp_path / "r.csv", "user,item,rating\nRené,Misérables,5\n", encoding="latin-1")
    assert triples(read_ratings(path)) == [("René", "Misérables", 5.0)]


def test_utf8_bom_is_not_part_of_the_header(tmp_path):
    path = tmp_path / "r.csv"
    path.write_bytes(b"\xef\xbb\xbfuser,item,rating\nu,i,2\n")
    assert triples(read_ratings(path)) == [("u", "i", 2.0)]


def test_blank_lines_and_missing_final_newline(tmp_path):
    path = write(tmp_path / "u.data", "1\t2\t3\t4\n\n5\t6\t1\t4")
    r = read_ratings(path)
    assert triples(r) == [("1", "2", 3.0), ("5", "6", 1.0)]
    assert r.skipped_lines == 0


def test_folder_with_a_well_known_file(tmp_path):
    write(tmp_path / "u.data", "1\t2\t3\t4\n")
    assert len(read_ratings(tmp_path)) == 1
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    assert "u.data" in str(error_of(read_ratings, empty))


# ------------------------------------------------------------------ errors (file + line + what)
@pytest.mark.parametrize(
    "name,text,line,message",
    [
        ("u.data", "1\t2\t3\t4\n1\t2\t3\n", 2, "expected 4 tab-separated fields, got 3"),
        ("u.data", "1\t2\t3\t4\n1\t3\tx\t4\n", 2, "rating 'x' is not a number"),
        ("u.data", "1\t2\t3\t4\n1\t3\tnan\t4\n", 2, "rating 'nan' is not a finite number"),
        ("u.data", "1\t2\t3\t4\n1\t5\t3\t4\n\t5\t3\t4\n", 3, "empty user id"),
        ("u.data", "1\t\t3\t4\n", 1, "empty item id"),
        ("ratings.dat", "1::2::3::4\n1::2::3\n", 2, "expected 4 '::'-separated fields, got 3"),
        ("r.csv", "user,item,rating\na,b,1\na,c\n", 3, "expected 3 comma-separated fields, got 2"),
        ("u.data", "1\t2\t3\t4\nbad\x01id\t2\t3\t4\n", 2, "contains a line break or control character"),
        ("u.data", "1\t2\t3\t4\n1\tx\ry\t3\t4\n", 2, "contains a line break or control character"),
    ],
)
def test_rating_errors_name_file_line_and_problem(tmp_path, name, text, line, message):
    path = write(tmp_path / name, text)
    err = error_of(read_ratings, path)
    assert err.path == str(path) and err.line == line and message in err.reason
    assert f"{path}:{line}: " in str(err)


def test_duplicate_rating_names_both_lines(tmp_path):
    path = write(tmp_path / "u.data", "1\t2\t3\t0\n4\t5\t3\t0\n1\t2\t5\t0\n")
    err = error_of(read_ratings, path)
    assert err.line == 3 and "already on line 1" in err.reason and "'2'" in err.reason and "'1'" in err.reason
    # Same through the per-line parser (string ids take that path).
    path = write(tmp_path / "r.csv", "user,item,rating\na,b,1\nc,d,2\ne,f,3\na,b,4\n")
    err = error_of(read_ratings, path)
    assert err.line == 5 and "already on line 2" in err.reason


def test_empty_and_header_only_and_missing_files(tmp_path):
    assert "empty file" in str(error_of(read_ratings, write(tmp_path / "u.data", "")))
    assert "no data lines" in str(error_of(read_ratings, write(tmp_path / "r.csv", "user,item,rating\n")))
    assert "no such file" in str(error_of(read_ratings, tmp_path / "absent.csv"))
    assert "empty" in str(error_of(read_ratings, write(tmp_path / "blank.tsv", "\n\n")))


def test_skip_bad_lines_counts_them(tmp_path):
    text = (
        "1\t2\t3\t4\n"
        "1\t2\n"  # too few fields
        "1\t3\tx\t4\n"  # not a number
        "\t3\t3\t4\n"  # empty id
        "1\t2\t5\t4\n"  # duplicate of line 1
        "2\t2\t1\t4\n"
    )
    path = write(tmp_path / "u.data", text)
    with pytest.raises(DataError):
        read_ratings(path)
    r = read_ratings(path, skip_bad_lines=True)
    assert r.skipped_lines == 4
    assert triples(r) == [("1", "2", 3.0), ("2", "2", 1.0)]


# ------------------------------------------------------------------ detection
@pytest.mark.parametrize(
    "name,text,shape,expected",
    [
        ("u.data", "1\t2\t3\t4\n", "ratings", "ml-100k"),
        ("u1.base", "1\t2\t3\t4\n", "ratings", "ml-100k"),
        ("ratings.dat", "1::2::3::4\n", "ratings", "ml-1m"),
        ("x.txt", "1\t2\t3\t4\n", "ratings", "ml-100k"),
        ("x.txt", "1::2::3::4\n", "ratings", "ml-1m"),
        ("x.txt", "userId,movieId,rating\n1,2,3\n", "ratings", "csv"),
        ("x.txt", "user\titem\trating\n1\t2\t3\n", "ratings", "tsv"),
        (
            "user_taggedartists.dat",
            "userID\tartistID\ttagID\tday\tmonth\tyear\n2\t52\t13\t1\t4\t2009\n",
            "tags",
            "lastfm-tags",
        ),
        (
            "t.txt",
            "userID\tartistID\ttagID\tday\tmonth\tyear\n2\t52\t13\t1\t4\t2009\n",
            "tags",
            "lastfm-tags",
        ),
        ("t.txt", "user,item,tag\na,b,c\n", "tags", "csv"),
        ("zoo.data", "frog,0,0,1,0,0,1,1,1,1,1,0,0,4,0,0,0,5\n", "attributes", "zoo"),
        ("a.txt", "frog,0,0,1,0,0,1,1,1,1,1,0,0,4,0,0,0,5\n", "attributes", "zoo"),
        ("a.txt", "id,colour,size\nx,red,big\n", "attributes", "csv"),
        ("n.txt", "a\tb\t1\n", "neighbors", "tsv"),
        ("n.txt", "source,neighbor,rank\na,b,1\n", "neighbors", "csv"),
    ],
)
def test_detection(tmp_path, name, text, shape, expected):
    assert detect_format(write(tmp_path / name, text), shape) == expected


@pytest.mark.parametrize(
    "text,shape",
    [
        ("1,2,3,4\n", "ratings"),  # comma without a header: columns unknown
        ("1 2 3 4\n", "ratings"),  # no separator we know
        ("a,b\n", "tags"),  # no header naming user/item/tag
        ("1\t2\t3\n", "ratings"),  # 3 tab fields without header
    ],
)
def test_ambiguous_detection_lists_the_choices(tmp_path, text, shape):
    err = error_of(detect_format, write(tmp_path / "data.txt", text), shape)
    assert "--format" in err.reason
    for fmt, shapes in FORMATS.items():
        assert (fmt in err.reason) == (shape in shapes)


def test_explicit_format_overrides_name_and_is_checked(tmp_path):
    path = write(tmp_path / "u.data", "user,item,rating\na,b,1\n")
    assert triples(read_ratings(path, "csv")) == [("a", "b", 1.0)]
    assert "not ratings" in str(error_of(read_ratings, path, "zoo"))
    assert "unknown format" in str(error_of(read_ratings, path, "avro"))
    # A named format is taken, then the file is checked against it.
    assert "not a readable Parquet file" in str(error_of(read_ratings, path, "parquet"))


def test_read_input_dispatches_by_shape(tmp_path):
    assert set(SHAPES) == {s for shapes in FORMATS.values() for s in shapes}
    assert isinstance(read_input("ratings", write(tmp_path / "u.data", "1\t2\t3\t4\n")), Ratings)
    assert isinstance(read_input("tags", write(tmp_path / "t.csv", "user,item,tag\na,b,c\n")), TagAssignments)
    assert isinstance(read_input("attributes", write(tmp_path / "a.csv", "id,c\nx,1\n")), AttributeTable)
    assert isinstance(read_input("neighbors", write(tmp_path / "n.csv", "a,b,1\n")), NeighborLists)
    with pytest.raises(ValueError):
        read_input("pictures", tmp_path / "u.data")


# ------------------------------------------------------------------ tags
LASTFM = (
    "userID\tartistID\ttagID\tday\tmonth\tyear\n"
    "2\t52\t13\t1\t4\t2009\n2\t52\t15\t1\t4\t2009\n3\t60\t13\t1\t5\t2010\n"
)


def test_lastfm_tags_crlf_with_latin1_tag_names(tmp_path):
    write(tmp_path / "user_taggedartists.dat", LASTFM, newline="\r\n")
    write(
        tmp_path / "tags.dat",
        "tagID\ttagValue\n13\tchillout\n15\tmüsica 80's\n99\tunused\n",
        encoding="latin-1",
        newline="\r\n",
    )
    t = read_tags(tmp_path / "user_taggedartists.dat")
    assert t.users.ids == ["2", "3"] and t.items.ids == ["52", "60"] and t.tags.ids == ["13", "15"]
    assert t.tag_names == ["chillout", "müsica 80's"]
    assert list(t.tag) == [0, 1, 0]
    assert read_tags(tmp_path / "user_taggedartists.dat", tag_names=False).tag_names is None
    assert read_tags(tmp_path, tag_names={"13": "x"}).tag_names == ["x", "15"]


def test_lastfm_tags_without_names_file_and_bad_header(tmp_path):
    t = read_tags(write(tmp_path / "user_taggedartists.dat", LASTFM))
    assert t.tag_names is None and len(t) == 3
    bad = write(tmp_path / "other.dat", "user\titem\ttag\tday\tmonth\tyear\n1\t2\t3\t1\t1\t2000\n")
    err = error_of(read_tags, bad, "lastfm-tags")
    assert err.line == 1 and "header" in err.reason


def test_tags_csv_duplicates_and_errors(tmp_path):
    t = read_tags(write(tmp_path / "t.csv", "user,item,tag\nu1,i1,rock\nu1,i1,pop\nu2,i1,rock\n"))
    assert (t.users.ids, t.items.ids, t.tags.ids) == (["u1", "u2"], ["i1"], ["rock", "pop"])
    err = error_of(read_tags, write(tmp_path / "d.csv", "user,item,tag\nu1,i1,rock\nu2,i1,pop\nu1,i1,rock\n"))
    assert err.line == 4 and "already on line 2" in err.reason and "'rock'" in err.reason
    err = error_of(read_tags, write(tmp_path / "e.csv", "user,item,tag\nu1,i1,\n"))
    assert err.line == 2 and "empty tag id" in err.reason
    t = read_tags(tmp_path / "d.csv", skip_bad_lines=True)
    assert len(t) == 2 and t.skipped_lines == 1


# ------------------------------------------------------------------ attributes
ZOO = (
    "aardvark,1,0,0,1,0,0,1,1,1,1,0,0,4,0,0,1,1\n"
    "frog,0,0,1,0,0,1,1,1,1,1,0,0,4,0,0,0,5\n"
    "frog,0,0,1,0,0,1,1,1,1,1,1,0,4,0,0,0,5\n"
    "octopus,0,0,1,0,0,1,1,0,0,0,0,0,8,0,0,1,7\n"
)


def test_zoo_ids_are_line_numbers_and_names_are_labels(tmp_path):
    a = read_attributes(write(tmp_path / "zoo.data", ZOO))
    assert a.objects.ids == ["1", "2", "3", "4"]
    assert a.labels == ["aardvark", "frog", "frog", "octopus"]
    assert len(a.attributes) == 17 and a.attributes[0] == "hair" and a.attributes[-1] == "type"
    legs = a.attribute_index("legs")
    assert a.values[legs] == ["4", "8"] and list(a.codes[:, legs]) == [0, 0, 0, 1]
    assert a.codes.dtype == np.int32 and a.codes.shape == (4, 17)
    err = error_of(read_attributes, write(tmp_path / "z2.data", ZOO + "cat,1,0\n"), "zoo")
    assert err.line == 5 and "expected 18 comma-separated fields, got 3" in err.reason


def test_attribute_csv_missing_values_and_duplicate_ids(tmp_path):
    a = read_attributes(write(tmp_path / "a.csv", "id,colour,size\nx,red,10\ny,?,2\nz,blue,\n"))
    assert a.objects.ids == ["x", "y", "z"] and a.attributes == ["colour", "size"]
    assert a.values == [["blue", "red"], ["2", "10"]]  # numbers in numeric order
    assert a.codes.tolist() == [[1, 1], [-1, 0], [0, -1]]
    assert a.labels is None
    path = write(tmp_path / "d.csv", "id,colour\nx,red\ny,blue\nx,green\n")
    err = error_of(read_attributes, path)
    assert err.line == 4 and "duplicate object id 'x', already on line 2" in err.reason
    a = read_attributes(path, skip_bad_lines=True)
    assert a.objects.ids == ["x", "y"] and a.skipped_lines == 1


# ------------------------------------------------------------------ neighbours
def test_neighbors_with_and_without_header(tmp_path):
    n = read_neighbors(write(tmp_path / "n.csv", "a,b,1\na,c,2\nb,a,1\n"))
    assert n.vertices.ids == ["a", "b", "c"]
    assert list(n.source) == [0, 0, 1] and list(n.neighbor) == [1, 2, 0] and list(n.rank) == [1, 2, 1]
    m = read_neighbors(write(tmp_path / "n.tsv", "source\tneighbor\trank\na\tb\t1\na\tc\t2\nb\ta\t1\n"))
    assert m.vertices == n.vertices and (m.rank == n.rank).all() and (m.neighbor == n.neighbor).all()
    assert m.rank.dtype == np.int32


@pytest.mark.parametrize(
    "text,line,message",
    [
        ("a,b,1\na,a,2\n", 2, "self-edge"),
        ("a,b,1\na,c,0\n", 2, "rank '0' is below the minimum 1"),
        ("a,b,1\na,c,1.5\n", 2, "rank '1.5' is not an integer"),
        ("a,b,1\na,c,1\n", 2, "duplicate rank 1 for source 'a', already on line 1"),
        ("a,b,1\na,b,2\n", 2, "duplicate neighbor 'b' for source 'a', already on line 1"),
        ("1,2,1\n1,1,2\n", 2, "self-edge"),  # numeric ids (fast path) give the same errors
        ("1,2,1\n1,3,1\n", 2, "duplicate rank 1 for source '1'"),
        ("1,2,1\n1,3,2.0\n", 2, "rank '2.0' is not an integer"),
        ("a,b,1\na,c,2.0\n", 2, "rank '2.0' is not an integer"),
        ("a,b,1\nc,d\n", 2, "expected 3 comma-separated fields, got 2"),
        ("a\tb\t1\nc\td\tfirst\n", 2, "rank 'first' is not an integer"),
    ],
)
def test_neighbor_errors(tmp_path, text, line, message):
    err = error_of(read_neighbors, write(tmp_path / "n.csv", text))
    assert err.line == line and message in err.reason
    assert read_neighbors(tmp_path / "n.csv", skip_bad_lines=True).skipped_lines == 1


# ------------------------------------------------------------------ fast path == per-line parser
def _both_paths(path, sep, n_fields, columns, n_spaces, header_lines=0):
    fast = parse_records(path, sep, n_fields, columns, n_spaces, header_lines=header_lines)
    slow = parse_records(path, sep, n_fields, columns, n_spaces, header_lines=header_lines, fast=False)
    return fast, slow


def test_fast_path_equals_per_line_parser_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 64)  # many chunk boundaries, including mid-line
    rng = np.random.default_rng(3)
    n = 500
    users, items = rng.integers(0, 40, n), rng.integers(0, 10**12, n)
    ratings = rng.integers(1, 11, n) / 2
    text = "".join(f"{u}::{i}::{r:g}::{k}\r\n" for k, (u, i, r) in enumerate(zip(users, items, ratings)))
    path = write(tmp_path / "ratings.dat", text)
    cols = [Column(0, "user", space=0), Column(1, "item", space=1), Column(2, "rating", kind="float")]
    fast, slow = _both_paths(str(path), "::", 4, cols, 2)
    assert fast.fast and not slow.fast
    assert fast.spaces == slow.spaces
    for a, b in zip(fast.ids + fast.numbers, slow.ids + slow.numbers):
        assert np.array_equal(a, b)
    assert [fast.line(k) for k in (0, n - 1)] == [slow.line(k) for k in (0, n - 1)] == [1, n]


def same_records(a, b) -> bool:
    return (
        a.spaces == b.spaces
        and all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids))
        and all(np.array_equal(x, y) for x, y in zip(a.numbers, b.numbers))
    )


@pytest.mark.parametrize(
    "body,engine",
    [
        ("1\t2\t3\t4\n", "text-ids"),  # one fast path for integer and text ids
        ("1\t2\t3\t4\n 1\t2 \t3\t4\n", "text-ids"),  # spaces around ids are stripped by every parser
        ("01\t2\t3\t4\n1\t2\t3\t4\n", "text-ids"),  # "01" is not the integer 1
        ("u1\ti1\t3\t4\r\nu2\ti1\t5\t4\r\n", "text-ids"),
        ("1\t2\t3.\t4\n", "text-ids"),  # numbers other than [-]d+[.d+]: that line in Python
        ("1\t2\t1e3\t4\n2\t2\t3\t4\n", "text-ids"),
        ("1\t2\t3\t4\n\n2\t2\t3\t4\n", "text-ids"),  # blank line
        ("\ufeff1\t2\t3\t4\n", "per-line"),  # byte-order mark
    ],
)
def test_numba_parsers_agree_with_per_line_parser(tmp_path, body, engine):
    cols = [Column(0, "user", space=0), Column(1, "item", space=1), Column(2, "rating", kind="float")]
    path = str(write(tmp_path / "u.data", body))
    fast, slow = _both_paths(path, "\t", 4, cols, 2)
    assert fast.engine == engine and slow.engine == "per-line"
    assert same_records(fast, slow)


def test_text_ids_across_chunks_with_a_shared_space(tmp_path, monkeypatch):
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 50)
    rng = np.random.default_rng(5)
    names = [f"w{k}é" for k in range(300)] + ["x y", "tab\tinside"]  # latin-1 é, inner space and tab
    lines = []
    for k in range(800):
        a, b = rng.choice(len(names) - 1, 2, replace=False)
        lines.append(f"{names[a]},{names[b]},{k + 1}\n")
    path = str(write(tmp_path / "n.csv", "".join(lines), encoding="latin-1"))
    cols = [
        Column(0, "source", space=0),
        Column(1, "neighbor", space=0),
        Column(2, "rank", kind="int", minimum=1),
    ]
    fast = parse_records(path, ",", 3, cols, 1, distinct=(0, 1))
    slow = parse_records(path, ",", 3, cols, 1, distinct=(0, 1), fast=False)
    assert fast.engine == "text-ids" and same_records(fast, slow)
    assert "w0é" in fast.spaces[0] or "w1é" in fast.spaces[0]


@pytest.mark.parametrize(
    "text,engine",
    [
        ('user,item,rating\n"a",b,1\nc,"d,e",2\n', "text-ids"),  # quoted lines go through csv rules
        ("user,item,rating\na,b\u0085c,1\n", "per-line"),  # C1 control: the per-line parser reports it
        ("user,item,rating\na,b\u0085c,1\nx,y,bad\n", "per-line"),  # ... before the later bad line
        ("user,item,rating\na,tab\tin,1\n", "per-line"),  # ASCII control byte inside an id
        ("user,item,rating\nä,ö,1\n", "text-ids"),
    ],
)
def test_text_id_path_gives_up_where_it_must(tmp_path, text, engine):
    cols = [Column(0, "user", space=0), Column(1, "item", space=1), Column(2, "rating", kind="float")]
    path = str(write(tmp_path / "r.csv", text))
    try:
        slow = parse_records(path, ",", 3, cols, 2, header_lines=1, fast=False)
    except DataError as exc:
        slow = None
        expected = (exc.line, exc.reason)
    if slow is None:
        with pytest.raises(DataError) as info:
            parse_records(path, ",", 3, cols, 2, header_lines=1)
        assert (info.value.line, info.value.reason) == expected
        assert engine == "per-line"
    else:
        fast = parse_records(path, ",", 3, cols, 2, header_lines=1)
        assert fast.engine == engine and same_records(fast, slow)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), min_size=1, max_size=60), st.booleans())
def test_find_duplicates_matches_brute_force(pairs, sorted_path):
    group = np.array([g for g, _ in pairs], dtype=np.int32)
    value = np.array([v for _, v in pairs], dtype=np.int64)
    if sorted_path:  # force the sort-based branch used for huge value ranges
        old, parsing.DENSE_LIMIT = parsing.DENSE_LIMIT, -(10**9)
    try:
        found = parsing.find_duplicates(group, 6, value, 8)
    finally:
        if sorted_path:
            parsing.DENSE_LIMIT = old
    first: dict = {}
    expected = []
    for k, pair in enumerate(pairs):
        if pair in first:
            expected.append([k, first[pair]])
        else:
            first[pair] = k
    assert found.tolist() == expected


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 6)), min_size=1, max_size=40))
def test_fast_number_parsing_equals_python_float(tmp_path, numbers):
    # Ratings with up to 6 decimals: the kernel's value must be exactly float(text).
    texts = [f"{m / 10**d:.{d}f}" for m, d in numbers]
    path = write(tmp_path / "u.data", "".join(f"{k}\t1\t{t}\t0\n" for k, t in enumerate(texts)))
    cols = [Column(0, "user", space=0), Column(1, "item", space=1), Column(2, "rating", kind="float")]
    fast = parse_records(str(path), "\t", 4, cols, 2)
    assert fast.fast
    assert fast.numbers[0].tolist() == [float(t) for t in texts]


_piece = st.sampled_from(
    [
        "1",
        "2",
        "17",
        "007",
        "u1",
        "ä",
        " 3",
        "3 ",
        "",
        "x y",
        '"q"',
        "é",
        "\u0085",
        "-1",
        "2.5",
        "3.",
        "1e3",
        "nan",
        "\x01",
        "\u2028",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.one_of(st.lists(_piece, min_size=3, max_size=5), st.just([])), min_size=1, max_size=12),
    sep=st.sampled_from(["\t", ",", "::"]),
    crlf=st.booleans(),
    skip=st.booleans(),
)
def test_fast_routes_match_the_per_line_parser_on_messy_files(tmp_path, monkeypatch, lines, sep, crlf, skip):
    """Differential fuzz: read_ratings with the numba parsers == read_ratings with only the per-line parser."""
    import ordrec.trainer.data.readers as readers

    name = {"\t": "u.data", ",": "r.csv", "::": "ratings.dat"}[sep]
    header = "user,item,rating,t\n" if sep == "," else ""
    body = "".join(sep.join(fields) + "\n" for fields in lines)
    path = tmp_path / name
    path.write_bytes((header + body).replace("\n", "\r\n" if crlf else "\n").encode("utf-8"))

    def outcome():
        try:
            r = read_ratings(path, skip_bad_lines=skip)
        except DataError as exc:
            return ("error", exc.line, exc.reason)
        return ("ok", triples(r), r.users.ids, r.items.ids, r.skipped_lines)

    fast = outcome()
    real = readers.parse_records
    monkeypatch.setattr(readers, "parse_records", lambda *a, **k: real(*a, **{**k, "fast": False}))
    assert outcome() == fast


# ------------------------------------------------------------------ round trip property
_id_text = (
    st.text(
        alphabet=st.characters(
            blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters=',"\u0085'
        ),
        min_size=1,
        max_size=6,
    )
    .map(str.strip)
    .filter(bool)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(
        st.tuples(_id_text, _id_text, st.integers(1, 10).map(lambda x: x / 2)),
        min_size=1,
        max_size=30,
        unique_by=lambda t: (t[0], t[1]),
    ),
    sep=st.sampled_from([",", "\t"]),
)
def test_round_trip_property(tmp_path, data, sep):
    if sep == "\t":
        data = [t for t in data if "\t" not in t[0] + t[1]] or [("a", "b", 1.0)]
    path = tmp_path / ("r.csv" if sep == "," else "r.tsv")
    write(
        path, "user" + sep + "item" + sep + "rating\n" + "".join(f"{u}{sep}{i}{sep}{r}\n" for u, i, r in data)
    )
    r = read_ratings(path)
    assert triples(r) == [(u, i, float(x)) for u, i, x in data]
    # Numbering is first appearance, hence deterministic.
    assert r.users.ids == list(dict.fromkeys(u for u, _, _ in data))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 5)),
        min_size=1,
        max_size=40,
        unique_by=lambda t: (t[0], t[1]),
    )
)
def test_round_trip_numeric_ml100k(tmp_path, data):
    path = write(tmp_path / "u.data", "".join(f"{u}\t{i}\t{r}\t0\n" for u, i, r in data))
    assert triples(read_ratings(path)) == [(str(u), str(i), float(r)) for u, i, r in data]


# ------------------------------------------------------------------ real data
def real(*parts) -> Path:
    return data_file(*parts)


@pytest.mark.slow
def test_real_movielens_100k():
    r = read_ratings(real("ml-100k", "u.data"))
    assert (r.n_users, r.n_items, len(r)) == (943, 1682, 100_000)
    assert np.bincount(r.rating.astype(int), minlength=6)[1:].tolist() == [6110, 11370, 27145, 34174, 21201]


@pytest.mark.slow
def test_real_lastfm_tags():
    t = read_tags(real("lastfm-tags", "user_taggedartists.dat"))
    assert (len(t), len(t.users), len(t.items), len(t.tags)) == (186_479, 1_892, 12_523, 9_749)
    assert t.tag_names is not None and all(t.tag_names)
    assert "80's" in t.tag_names  # apostrophes kept (latin-1 original)


@pytest.mark.slow
def test_real_zoo():
    a = read_attributes(real("zoo", "zoo.data"))
    assert (len(a.objects), len(a.attributes)) == (101, 17)
    assert a.labels.count("frog") == 2
    counts = np.bincount(a.codes[:, a.attribute_index("type")])
    assert counts.tolist() == [41, 20, 5, 13, 4, 8, 10]


# ------------------------------------------------------------------ rating scales, timestamps, line bound
@pytest.mark.parametrize(
    "text,expected",
    [
        ("1..5", RatingScale(1, 5, 1)),
        ("0.5..5:0.5", RatingScale(0.5, 5, 0.5)),
        (" 1 .. 10 : 1 ", RatingScale(1, 10, 1)),
        ("-2..2", RatingScale(-2, 2, 1)),
    ],
)
def test_rating_scale_parses_and_prints(text, expected):
    scale = RatingScale.parse(text)
    assert scale == expected and RatingScale.parse(str(scale)) == scale


@pytest.mark.parametrize(
    "text,words",
    [
        ("1..", "is not LOW..HIGH"),
        ("1-5", "is not LOW..HIGH"),
        ("a..b", "must be numbers"),
        ("5..1", "empty"),
        ("1..5:0", "step must be positive"),
        ("1..5:-1", "step must be positive"),
        ("1..4.5", "whole number of steps"),
        ("nan..5", "finite"),
        ("1..inf", "finite"),
        ("1..5:0.5:1", "numbers"),
    ],
)
def test_rating_scale_rejects_nonsense(text, words):
    with pytest.raises(ValueError, match=words):
        RatingScale.parse(text)


def test_rating_scale_problem_names_range_and_step():
    halves = RatingScale(0.5, 5, 0.5)
    assert [halves.problem(x) for x in (0.5, 3.5, 5.0)] == [None, None, None]
    assert "not on the rating scale 0.5..5:0.5" in halves.problem(3.25)
    for outside in (0.0, 5.5, 99.0, -1.0, float("nan")):
        assert "outside the rating scale" in halves.problem(outside)


MOVIELENS_COLUMNS = [
    Column(0, "user", space=0),
    Column(1, "item", space=1),
    Column(2, "rating", kind="float", scale=RatingScale(1, 5)),
    Column(3, "timestamp", kind="timestamp"),
]


@pytest.fixture(params=["numba", "per-line"])
def parser(request, monkeypatch):
    """``parse_records`` on one path only: "numba" fails the test if it hands the file to the per-line parser."""
    if request.param == "numba":

        def no_fallback(*args, **kwargs):
            raise AssertionError("the numba path fell back to the per-line parser")

        monkeypatch.setattr(parsing, "parse_lines", no_fallback)
        return lambda *a, **k: parse_records(*a, **k)
    return lambda *a, **k: parse_records(*a, **k, fast=False)


@pytest.mark.parametrize(
    "bad,message",
    [
        ("9\t9\t99\t5", "rating '99' is outside the rating scale 1..5"),
        ("9\t9\t-1\t5", "rating '-1' is outside the rating scale 1..5"),
        ("9\t9\t0\t5", "rating '0' is outside the rating scale 1..5"),
        ("9\t9\t3.5\t5", "rating '3.5' is not on the rating scale 1..5"),
        ("9\t9\t3\tnot-a-time", "timestamp 'not-a-time' is not a non-negative integer of at most 20 digits"),
        ("9\t9\t3\t-5", "timestamp '-5' is not a non-negative integer"),
        ("9\t9\t3\t1.5", "timestamp '1.5' is not a non-negative integer"),
        ("9\t9\t3\t" + "9" * 21, "is not a non-negative integer of at most 20 digits"),
        ("9\t9\t3\t", "timestamp '' is not"),
    ],
)
def test_scale_and_timestamp_are_enforced_on_both_paths(tmp_path, parser, bad, message):
    path = str(write(tmp_path / "u.data", f"1\t1\t5\t{'9' * 20}\n{bad}\n2\t1\t1\t0\n"))
    with pytest.raises(DataError) as info:
        parser(path, "\t", 4, MOVIELENS_COLUMNS, 2)
    assert (info.value.line, info.value.path) == (2, path) and message in info.value.reason
    kept = parser(path, "\t", 4, MOVIELENS_COLUMNS, 2, skip_bad_lines=True)
    assert kept.skipped == 1 and kept.numbers[0].tolist() == [5.0, 1.0]
    assert [kept.line(k) for k in range(2)] == [1, 3] and kept.spaces[0].ids == ["1", "2"]


def test_half_star_scale_on_both_paths(tmp_path, parser):
    cols = [
        Column(0, "user", space=0),
        Column(1, "item", space=1),
        Column(2, "rating", kind="float", scale=RatingScale(0.5, 5, 0.5)),
    ]
    path = str(write(tmp_path / "ratings.dat", "1::1::0.5::1\n1::2::4.5::1\n2::1::3.25::1\n2::2::5.5::1\n"))
    with pytest.raises(DataError) as info:
        parser(path, "::", 4, cols, 2)
    assert info.value.line == 3 and "'3.25' is not on the rating scale 0.5..5:0.5" in info.value.reason
    kept = parser(path, "::", 4, cols, 2, skip_bad_lines=True)
    assert kept.skipped == 2 and kept.numbers[0].tolist() == [0.5, 4.5]


def test_the_issue_file_is_rejected_or_trimmed_to_levels_1_to_5(tmp_path):
    path = write(tmp_path / "u.data", "1\t1\t5\t100\n1\t2\t99\t100\n2\t1\t-1\t100\n2\t2\t3\t100\n")
    err = error_of(read_ratings, path)
    assert f"{path}:2: rating '99' is outside the rating scale 1..5" == str(err)
    r = read_ratings(path, skip_bad_lines=True)
    assert r.skipped_lines == 2 and sorted(set(r.rating.tolist())) == [3.0, 5.0]


def test_declared_scales_per_format(tmp_path):
    assert declared_scale("ml-100k") == declared_scale("ml-1m") == RatingScale(1, 5)
    assert declared_scale("ml-10m") == RatingScale(0.5, 5, 0.5)
    assert declared_scale("csv") is None and declared_scale("tsv") is None
    halves = write(tmp_path / "ratings.dat", "1::1::3.5::1\n1::2::5::1\n")
    assert "'3.5' is not on the rating scale 1..5" in error_of(read_ratings, halves, "ml-1m").reason
    assert len(read_ratings(halves, "ml-10m")) == 2
    assert len(read_ratings(halves)) == 2  # detected: ML-1M or ML-10M, so halves are allowed
    assert "3.25" in error_of(read_ratings, write(tmp_path / "x.dat", "1::1::3.25::1\n"), "ml-10m").reason


def test_csv_takes_any_number_unless_given_a_scale(tmp_path):
    path = write(tmp_path / "r.csv", "user,item,rating\na,x,99\nb,x,-1.25\n")
    assert [x for _, _, x in triples(read_ratings(path))] == [99.0, -1.25]
    err = error_of(read_ratings, path, rating_scale="1..5")
    assert err.line == 2 and "'99' is outside the rating scale 1..5" in err.reason
    assert read_ratings(path, rating_scale=RatingScale(-2, 100, 0.25)).rating.tolist() == [99.0, -1.25]
    tsv = write(tmp_path / "r.tsv", "user\titem\trating\na\tx\t7\n")
    assert "outside" in error_of(read_input, "ratings", tsv, rating_scale="1..5").reason


def test_a_given_scale_replaces_the_declared_one(tmp_path):
    path = write(tmp_path / "u.data", "1\t1\t7\t0\n1\t2\t10\t0\n")
    assert "outside the rating scale 1..5" in error_of(read_ratings, path).reason
    assert read_ratings(path, rating_scale="1..10").rating.tolist() == [7.0, 10.0]


def test_rating_scale_only_for_ratings(tmp_path):
    with pytest.raises(ValueError, match="not tags"):
        read_input("tags", write(tmp_path / "t.csv", "user,item,tag\na,b,c\n"), rating_scale="1..5")


@pytest.mark.parametrize(
    "header", ["user,item,rating,timestamp", "user,item,rating,ts", "ts,user,item,rating"]
)
def test_csv_timestamp_column_is_checked_when_present(tmp_path, header):
    order = header.split(",")
    row = {"user": "a", "item": "b", "rating": "1"}
    good = ",".join(row.get(c, "1600000000") for c in order)
    bad = ",".join(row.get(c, "2020-01-01") for c in order).replace("a,", "c,", 1)
    path = write(tmp_path / "r.csv", f"{header}\n{good}\n{bad}\n")
    err = error_of(read_ratings, path)
    assert err.line == 3 and "timestamp '2020-01-01' is not a non-negative integer" in err.reason
    assert read_ratings(path, skip_bad_lines=True).skipped_lines == 1
    assert len(read_ratings(write(tmp_path / "s.csv", "user,item,rating,when\na,b,1,2020-01-01\n"))) == 1


@pytest.fixture
def small_line_bound(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_LINE_BYTES", 64)
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 100)  # a long line spans chunks


@pytest.mark.parametrize("name,line", [("u.data", "1\t{pad}\t3\t0"), ("r.csv", "u,{pad},3")])
def test_line_length_bound_on_both_paths(tmp_path, small_line_bound, parser, name, line):
    sep, n = ("\t", 4) if name == "u.data" else (",", 3)
    cols = MOVIELENS_COLUMNS[:n]
    at_bound = line.format(pad="x" * (64 - len(line.format(pad=""))))
    over = line.format(pad="y" * (65 - len(line.format(pad=""))))
    far_over = line.format(pad="z" * 5000)
    assert (len(at_bound), len(over)) == (64, 65)
    path = str(write(tmp_path / name, f"{at_bound}\n{over}\n{far_over}\n{at_bound.replace('1', '2', 1)}\n"))
    with pytest.raises(DataError) as info:
        parser(path, sep, n, cols, 2)
    assert info.value.line == 2 and "line longer than 64 bytes" in info.value.reason
    kept = parser(path, sep, n, cols, 2, skip_bad_lines=True)
    assert kept.skipped == 2 and [kept.line(k) for k in range(2)] == [1, 4]
    assert kept.spaces[1].ids == ["x" * len(at_bound.split(sep)[1])]


def test_readers_report_long_lines_with_file_and_line(tmp_path, small_line_bound):
    long_header = "id," + ",".join(f"a{k}" for k in range(40))
    assert error_of(read_attributes, write(tmp_path / "a.csv", long_header + "\n")).line == 1
    tags = write(tmp_path / "t.csv", "user,item,tag\na,b,c\na,b," + "d" * 100 + "\n")
    assert error_of(read_tags, tags).line == 3 and read_tags(tags, skip_bad_lines=True).skipped_lines == 1
    from ordrec.trainer.data.triples import read_triples
    from ordrec.trainer.data.triplets import read_triplets

    triples_file = write(tmp_path / "coe.txt", "A u i j\nA u i " + "j" * 100 + "\n")
    assert "line longer than 64 bytes" in error_of(read_triples, triples_file).reason
    assert read_triples(triples_file, skip_bad_lines=True).skipped_lines == 1
    triplets_file = write(tmp_path / "score.csv", "x,a,b,c\n" + "y" * 100 + ",a,b,c\n")
    assert error_of(read_triplets, triplets_file).line == 2


def test_a_long_line_is_never_held_whole(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(parsing, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 4096)
    path = tmp_path / "r.csv"
    with open(path, "wb") as f:
        f.write(b"user,item,rating\na,b,1\nc,")
        for _ in range(40):
            f.write(b"d" * (1 << 20))  # one 40 MiB line
        f.write(b",2\ne,f,3\n")
    cols = MOVIELENS_COLUMNS[:3]
    for fast in (True, False):
        tracemalloc.start()
        try:
            kept = parse_records(str(path), ",", 3, cols, 2, header_lines=1, skip_bad_lines=True, fast=fast)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert kept.skipped == 1 and [kept.line(k) for k in range(2)] == [2, 4]
        assert peak < 4 << 20, f"fast={fast}: peak {peak} bytes"


# ------------------------------------------------------------------ short escaped excerpts
def test_excerpt_is_short_escaped_and_marks_the_cut():
    assert excerpt("x") == "'x'" and excerpt("tab\there") == "'tab\\there'"
    binary = "\x00\x01\x9f" * 400
    shown = excerpt(binary)
    assert len(shown) <= EXCERPT_CHARS + 30 and shown.startswith("'\\x00\\x01\\x9f")
    assert shown.endswith("... (1200 characters)")
    assert not any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in shown)
    assert excerpt("a" * EXCERPT_CHARS).endswith("characters)") and excerpt("a" * 78) == repr("a" * 78)


@pytest.mark.parametrize(
    "name,line",
    [
        ("u.data", "1\t{junk}\t3\t0"),  # control bytes in an id
        ("u.data", "1\t2\t{junk}\t0"),  # not a number
        ("u.data", "1\t2\t3\t{junk}"),  # not a timestamp
        ("r.csv", "u,{junk},3"),
    ],
)
def test_messages_quote_binary_input_as_a_short_excerpt(tmp_path, parser, name, line):
    junk = "\x01\x02binary\x7f" * 120
    sep, n = ("\t", 4) if name == "u.data" else (",", 3)
    first = "1\t1\t1\t0\n" if name == "u.data" else "1,1,1\n"
    path = str(write(tmp_path / name, first + line.format(junk=junk) + "\n"))
    with pytest.raises(DataError) as info:
        parser(path, sep, n, MOVIELENS_COLUMNS[:n], 2)
    message = str(info.value)
    assert info.value.line == 2 and len(message) < len(path) + 200, message
    assert "\\x01\\x02binary\\x7f" in message and "characters)" in message and "\x01" not in message


def test_a_huge_timestamp_hits_the_real_line_bound(tmp_path, parser):
    assert parsing.MAX_LINE_BYTES == 1 << 20
    path = str(write(tmp_path / "u.data", "1\t1\t5\t0\n2\t1\t4\t" + "7" * (2 << 20) + "\n3\t1\t3\t0\n"))
    with pytest.raises(DataError) as info:
        parser(path, "\t", 4, MOVIELENS_COLUMNS, 2)
    assert (
        info.value.line == 2 and info.value.reason == "line longer than 1048576 bytes (the line length limit)"
    )
    assert parser(path, "\t", 4, MOVIELENS_COLUMNS, 2, skip_bad_lines=True).numbers[0].tolist() == [5.0, 3.0]
