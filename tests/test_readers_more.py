"""Readers of issue 20: MovieLens ``tags.dat`` (``ml-tags``), headerless attribute
tables with column names, and Parquet ratings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli
from ordrec.trainer.data.readers import (
    FORMATS,
    detect_format,
    read_attributes,
    read_input,
    read_ratings,
    read_tags,
    split_ml_tag,
)
from tests.data_errors import error_of


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


# ------------------------------------------------------------------ MovieLens tags.dat
ML_TAGS = (
    "15::4973::excellent!::1215184630\n"
    "20::1747::Dustin Hoffman::1188263867\n"
    "20::1747::politics::1188263880\n"
    "25::5952::Lord of the Rings:: The Two Towers::1162160415\n"  # '::' inside the tag
    "25::6:::)::1162160415\n"  # a tag that starts with ':'
    "31::6::foo:::1162160416\n"  # a tag that ends with ':'
    "\n"
    "31::4973::  Excellent! ::1162160417\n"  # case kept, outer spaces stripped
)


def test_ml_tags_keep_double_colons_inside_the_tag(tmp_path):
    t = read_tags(write(tmp_path / "tags.dat", ML_TAGS))
    assert t.users.ids == ["15", "20", "25", "31"]
    assert t.items.ids == ["4973", "1747", "5952", "6"]
    assert t.tags.ids == [
        "excellent!",
        "Dustin Hoffman",
        "politics",
        "Lord of the Rings:: The Two Towers",
        ":)",
        "foo:",
        "Excellent!",
    ]
    assert list(t.tag) == [0, 1, 2, 3, 4, 5, 6] and list(t.user) == [0, 1, 1, 2, 2, 3, 3]
    assert t.tag_names is None and t.skipped_lines == 0


def test_split_ml_tag_fields():
    assert split_ml_tag("1::2::a::b::c::3") == ["1", "2", "a::b::c", "3"]
    assert split_ml_tag("1::2::3") == ["1", "2", "3"]  # too few: the caller reports the count
    assert split_ml_tag("1") == ["1"]


@pytest.mark.parametrize(
    "line,message",
    [
        ("1::2::rock::12x", "timestamp '12x' is not a non-negative integer"),
        ("1::2::rock::-5", "timestamp '-5' is not a non-negative integer"),
        ("1::2::rock", "expected 4 '::'-separated fields, got 3"),
        ("1::2::::5", "empty tag id"),
        ("::2::rock::5", "empty user id"),
        ("1::2::ro\x07ck::5", "contains a line break or control character"),
    ],
)
def test_ml_tags_bad_lines_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "tags.dat", "1::2::pop::5\n" + line + "\n3::4::pop::6\n")
    err = error_of(read_tags, path)
    assert err.path == str(path) and err.line == 2 and message in err.reason
    t = read_tags(path, skip_bad_lines=True)
    assert len(t) == 2 and t.skipped_lines == 1


def test_ml_tags_duplicates_as_for_csv(tmp_path):
    path = write(tmp_path / "tags.dat", "1::2::pop::5\n1::2::rock::6\n1::2::pop::7\n")
    err = error_of(read_tags, path)
    assert err.line == 3 and "already on line 1" in err.reason and "'pop'" in err.reason
    t = read_tags(path, skip_bad_lines=True)
    assert len(t) == 2 and t.skipped_lines == 1
    # Case-sensitive: "Pop" is another tag, not a duplicate.
    assert len(read_tags(write(tmp_path / "c.dat", "1::2::pop::5\n1::2::Pop::6\n"), "ml-tags")) == 2


def test_ml_tags_detection(tmp_path):
    assert "ml-tags" in FORMATS and FORMATS["ml-tags"] == ("tags",)
    named = write(tmp_path / "tags.dat", "1::2::pop::5\n")
    assert detect_format(named, "tags") == "ml-tags"
    other = write(tmp_path / "my_tags.txt", "1::2::pop::5\n")  # no name to go by: the '::' tells
    assert detect_format(other, "tags") == "ml-tags"
    assert len(read_input("tags", other)) == 1
    # A folder with tags.dat reads it; beside user_taggedartists.dat it is Last.fm's names file.
    assert len(read_tags(tmp_path)) == 1
    write(tmp_path / "user_taggedartists.dat", "2\t52\t13\t1\t4\t2009\n")
    t = read_tags(tmp_path)
    assert t.items.ids == ["52"] and t.tag_names == ["13"]  # tags.dat is no tagID<TAB>name file
    err = error_of(read_ratings, named, "ml-tags")
    assert "not ratings" in err.reason


def _train(*args):
    return run_cli(["ordrec.trainer", "train", *args], check=False)


def test_rtf_trains_on_movielens_tags_dat(tmp_path):
    rng = np.random.default_rng(0)
    words = ["funny", "Funny", "sci-fi", "based on a book", "Star Wars:: Episode IV", "dark", "classic"]
    lines = {
        f"{u}::{i}::{words[w]}::{1162160415 + k}"
        for k, (u, i, w) in enumerate(
            zip(rng.integers(1, 30, 600), rng.integers(1, 40, 600), rng.integers(0, 7, 600))
        )
    }
    # Drop repeats of (user, item, tag) that differ only in timestamp.
    seen, unique = set(), []
    for line in sorted(lines):
        key = line.rsplit("::", 1)[0]
        if key not in seen:
            seen.add(key)
            unique.append(line)
    data = tmp_path / "ml-10M100K" / "tags.dat"
    data.parent.mkdir()
    data.write_text("\n".join(unique) + "\n")
    registry = tmp_path / "reg"
    result = _train("rtf", "--data", str(data), "--set", "max_iter=2", "--registry", str(registry))
    assert result.returncode == 0, result.stderr
    assert Registry(registry).models() == ["rtf"]
    bad = write(tmp_path / "tags.dat", "1::2::pop::5\n1::2::rock::yesterday\n")
    result = _train("rtf", "--data", str(bad), "--set", "max_iter=2", "--registry", str(registry))
    assert result.returncode == 2 and f"{bad}:2" in result.stderr and "yesterday" in result.stderr


# ------------------------------------------------------------------ headerless attribute tables
CAR = "vhigh,vhigh,2,2,small,low,unacc\nlow,med,4,more,big,high,vgood\n\nlow,?,4,4,big,high,good\n"
CAR_NAMES = ["buying", "maint", "doors", "persons", "lug_boot", "safety", "class"]


def test_headerless_attributes_with_names_use_line_numbers(tmp_path):
    path = write(tmp_path / "car.data", CAR)
    a = read_attributes(path, column_names=CAR_NAMES)
    assert a.objects.ids == ["1", "2", "4"]  # line numbers: the blank line 3 holds no object
    assert a.attributes == CAR_NAMES and a.labels is None
    maint = a.attribute_index("maint")
    assert a.values[maint] == ["med", "vhigh"] and list(a.codes[:, maint]) == [1, 0, -1]  # '?' is missing
    assert a.values[a.attribute_index("doors")] == ["2", "4"]
    # The same through read_input and as "a,b,c" text (what --columns passes).
    b = read_input("attributes", path, column_names=",".join(CAR_NAMES))
    assert b.objects.ids == a.objects.ids and np.array_equal(a.codes, b.codes)


def test_headerless_attributes_without_names(tmp_path):
    # Without names, line 1 is the header and the first column the id, as before: a UCI
    # table read so fails on its repeated values, with the way out in the message.
    err = error_of(read_attributes, write(tmp_path / "car.data", CAR))
    assert err.line == 1 and "repeated attribute name" in err.reason and "--columns" in err.reason
    a = read_attributes(write(tmp_path / "h.csv", "id,color,size\nx,red,big\ny,blue,big\n"))
    assert a.objects.ids == ["x", "y"] and a.attributes == ["color", "size"]


def test_headerless_attributes_name_count_and_bad_names(tmp_path):
    path = write(tmp_path / "car.data", CAR)
    err = error_of(read_attributes, path, column_names=CAR_NAMES[:-1])
    assert err.path == str(path) and err.line == 1
    assert (
        "expected 6 comma-separated fields (one per column name given" in err.reason and "got 7" in err.reason
    )
    short = write(tmp_path / "short.data", "a,b,c\na,b\na,b,c\n")
    err = error_of(read_attributes, short, column_names=["x", "y", "z"])
    assert err.line == 2 and "got 2" in err.reason
    kept = read_attributes(short, column_names=["x", "y", "z"], skip_bad_lines=True)
    assert kept.objects.ids == ["1", "3"] and kept.skipped_lines == 1
    assert "repeated column name" in error_of(read_attributes, path, column_names=["a", "a"]).reason
    assert "bad column name" in error_of(read_attributes, path, column_names=["a", ""]).reason
    zoo = write(tmp_path / "zoo.data", "frog" + ",0" * 17 + "\n")
    assert "not zoo" in error_of(read_attributes, zoo, column_names=["x"]).reason
    with pytest.raises(ValueError, match="not ratings"):
        read_input("ratings", path, column_names=["x"])


def test_headerless_attributes_tsv(tmp_path):
    a = read_attributes(
        write(tmp_path / "t.tsv", "red\tsmall\nblue\tbig\n"), "tsv", column_names=["color", "size"]
    )
    assert a.objects.ids == ["1", "2"] and a.values == [["blue", "red"], ["big", "small"]]


def test_score_trains_on_a_headerless_table_through_the_cli(tmp_path):
    rng = np.random.default_rng(1)
    rows = [",".join(f"{c}{rng.integers(0, 3)}" for c in "abcd") for _ in range(40)]
    data = write(tmp_path / "objects.data", "\n".join(rows) + "\n")
    registry = tmp_path / "reg"
    args = ("--data", str(data), "--set", "max_iter=2", "--registry", str(registry))
    result = _train("score", *args, "--columns", "w,x,y,z")
    assert result.returncode == 0, result.stderr
    assert Registry(registry).models() == ["score"]
    result = _train("score", *args, "--columns", "w,x,y")
    assert result.returncode == 2 and f"{data}:1" in result.stderr and "got 4" in result.stderr


def test_reproduce_score_takes_columns_too(tmp_path):
    rng = np.random.default_rng(1)
    rows = [",".join(f"{c}{rng.integers(0, 3)}" for c in "abcd") for _ in range(40)]
    data = write(tmp_path / "objects.data", "\n".join(rows) + "\n")
    args = ["ordrec.trainer", "reproduce", "score", "--data", str(data), "--runs", "1", "--quiet"]
    result = run_cli([*args, "--columns", "w,x,y,z"], check=False)
    assert result.returncode == 0 and "aspects=all(4)" in result.stdout, result.stderr
    result = run_cli([*args, "--columns", "w,x"], check=False)
    assert result.returncode == 2 and f"{data}:1" in result.stderr


JOB = """
[job]
name = "nightly"
registry = "reg"

[data.cars]
path = "car.data"
{columns}

[[models]]
name = "score"
kind = "score"
data = "cars"
"""


def test_job_key_columns(tmp_path):
    from ordrec.trainer.job import JobError, load_job

    job = write(tmp_path / "job.toml", JOB.format(columns='columns = ["buying", "maint"]'))
    assert load_job(job).data["cars"].columns == ["buying", "maint"]
    assert load_job(write(tmp_path / "j0.toml", JOB.format(columns=""))).data["cars"].columns is None
    with pytest.raises(JobError) as err:
        load_job(write(tmp_path / "j2.toml", JOB.format(columns="columns = [1, 2]")))
    assert "data.cars.columns: must be a string or a list of strings, got [1, 2]" in str(err.value)


# ------------------------------------------------------------------ Parquet ratings
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def parquet(path: Path, **columns) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_ratings_round_trip_like_csv(tmp_path):
    users, items, ratings = ["u1", "u2", "u1", "u3"], [10, 10, 20, 30], [5, 3, 4, 1]
    path = parquet(tmp_path / "r.parquet", UserId=users, movieId=items, Rating=ratings, ts=[1, 2, 3, 4])
    assert detect_format(path, "ratings") == "parquet" and FORMATS["parquet"] == ("ratings",)
    r = read_ratings(path)
    csv = write(
        tmp_path / "r.csv",
        "user,item,rating\n" + "".join(f"{u},{i},{x}\n" for u, i, x in zip(users, items, ratings)),
    )
    c = read_ratings(csv)
    assert r.users.ids == c.users.ids == ["u1", "u2", "u3"] and r.items.ids == c.items.ids == [
        "10",
        "20",
        "30",
    ]
    assert (
        np.array_equal(r.user, c.user)
        and np.array_equal(r.item, c.item)
        and np.array_equal(r.rating, c.rating)
    )
    assert r.rating.dtype == np.float32 and r.skipped_lines == 0
    # columns= names odd columns; dictionary-encoded strings and large strings read too.
    odd = tmp_path / "odd.parquet"
    pq.write_table(
        pa.table(
            {
                "who": pa.array(users).dictionary_encode(),
                "what": pa.array(["a", "b", "c", "d"], pa.large_string()),
                "x": [1.5, 2, 3, 4],
            }
        ),
        odd,
    )
    r = read_ratings(odd, columns={"user": "who", "item": "what", "rating": "x"})
    assert r.users.ids == ["u1", "u2", "u3"] and r.items.ids == ["a", "b", "c", "d"]
    assert list(r.rating) == [1.5, 2, 3, 4]


def test_parquet_column_and_type_errors(tmp_path):
    err = error_of(read_ratings, parquet(tmp_path / "a.parquet", user=[1], movie=[2], stars_given=[3]))
    assert "no rating column in the Parquet columns" in err.reason and err.line is None
    err = error_of(read_ratings, parquet(tmp_path / "b.parquet", user=[1.5], item=[2], rating=[3]))
    assert "column 'user' (user) is double; user ids must be strings or integers" in err.reason
    err = error_of(read_ratings, parquet(tmp_path / "c.parquet", user=[1], item=[2], rating=["5"]))
    assert "column 'rating' (rating) is string; ratings must be numbers" in err.reason
    err = error_of(
        read_ratings, parquet(tmp_path / "d.parquet", user=[1], item=[2], rating=[3], timestamp=["x"])
    )
    assert "(timestamp) is string" in err.reason
    not_parquet = write(tmp_path / "e.parquet", "user,item,rating\n1,2,3\n")
    assert "not a readable Parquet file" in error_of(read_ratings, not_parquet).reason
    assert "not tags" in error_of(read_tags, not_parquet).reason


@pytest.mark.parametrize(
    "columns,row,message",
    [
        ({"user": ["a", None, "c"]}, 2, "empty user id (null)"),
        ({"item": ["x", "y", ""]}, 3, "empty item id"),
        ({"item": ["x", "y\n", "z"]}, 2, "item id 'y\\n' contains a line break"),
        ({"rating": [4.0, None, 3.0]}, 2, "rating is missing (null)"),
        ({"rating": [4.0, float("nan"), 3.0]}, 2, "rating nan is not a finite number"),
        ({"rating": [4.0, 6.0, 3.0]}, 2, "rating 6 is outside the rating scale 1..5"),
        ({"rating": [4.0, 2.5, 3.0]}, 2, "rating 2.5 is not on the rating scale 1..5"),
        ({"ts": [1, -3, 2]}, 2, "timestamp -3 is not a non-negative integer"),
        ({"item": ["x", "y", "x"]}, 3, "duplicate rating of item 'x' by user 'a', already in row 1"),
    ],
)
def test_parquet_row_errors_name_the_row(tmp_path, columns, row, message):
    table = {"user": ["a", "b", "a"], "item": ["x", "y", "z"], "rating": [4.0, 5.0, 3.0], "ts": [1, 2, 3]}
    path = parquet(tmp_path / "r.parquet", **{**table, **columns})
    err = error_of(read_ratings, path, rating_scale="1..5")
    assert err.row == row and err.line is None and message in err.reason
    assert str(err).startswith(f"{path}: row {row}: ")
    kept = read_ratings(path, rating_scale="1..5", skip_bad_lines=True)
    assert len(kept) == 2 and kept.skipped_lines == 1


def test_parquet_scale_from_the_cli_and_half_steps(tmp_path):
    path = parquet(tmp_path / "r.parquet", user=[1, 2], item=[1, 1], rating=[0.5, 4.5])
    assert list(read_ratings(path, rating_scale="0.5..5:0.5").rating) == [0.5, 4.5]
    assert list(read_ratings(path).rating) == [0.5, 4.5]  # no declared scale: any finite number
    result = _train("dcr", "--data", str(path), "--rating-scale", "1..5", "--registry", str(tmp_path / "reg"))
    assert (
        result.returncode == 2
        and f"{path}: row 1: rating 0.5 is outside the rating scale 1..5" in result.stderr
    )


def test_parquet_without_pyarrow_says_which_extra(tmp_path, monkeypatch):
    path = parquet(tmp_path / "r.parquet", user=[1], item=[2], rating=[3])
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)
    err = error_of(read_ratings, path)
    assert "pip install 'ordrec[parquet]'" in err.reason
