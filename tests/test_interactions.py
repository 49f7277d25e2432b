"""Interaction logs as training data: clicks, plays and purchases read without a star rating,
repeats folded, timestamps kept, a count named ``rating`` refused before any fit, and a
play-count file trained end to end."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ordrec.service.live.forgotten import user_digest
from ordrec.service.live.redis_state import EVENTS_STREAM
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli
from ordrec.trainer.data.interactions import MAX_RATING_LEVELS, aggregate, ordinal_levels, trainable
from ordrec.trainer.data.readers import read_input, read_ratings
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.events import Event, EventFeed, merge, with_events
from ordrec.trainer.forgetting import drop_forgotten
from ordrec.trainer.job import EXIT_PUBLISHED, run_job
from tests.data_errors import error_of


def write_play_counts(
    path: Path, column: str = "weight", users: int = 300, per_user: int = 20, seed: int = 0
):
    """A Last.fm-shaped log: ``userID<TAB>artistID<TAB><column>``, one row per (user, artist),
    play counts log-normal (median about 250), so thousands of distinct counts."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, 20 * per_user + 1) ** 0.9
    lines = [f"userID\tartistID\t{column}\n"]
    for u in range(users):
        artists = rng.choice(popularity.size, per_user, replace=False, p=popularity / popularity.sum())
        plays = np.maximum(1, rng.lognormal(5.5, 1.6, per_user)).astype(np.int64)
        lines += [f"{u}\t{a}\t{p}\n" for a, p in zip(artists, plays)]
    path.write_text("".join(lines))
    return path


def _train(*args):
    return run_cli(["ordrec.trainer", "train", *args], check=False)


# ------------------------------------------------------------------ the level refusal
def test_play_counts_named_rating_are_refused_naming_file_column_count_and_fix(tmp_path):
    path = write_play_counts(tmp_path / "plays.tsv", column="rating")
    counts = np.loadtxt(path, skiprows=1, usecols=2)
    distinct = np.unique(counts).size
    assert distinct > 1000  # the shape of the problem: thousands of distinct counts
    err = error_of(read_ratings, path)
    assert err.path == str(path)
    assert f"column 'rating' holds {distinct} distinct values" in err.reason
    assert "--feedback implicit" in err.reason and "--rating-scale" in err.reason

    result = _train("dcr", "--data", str(path), "--registry", str(tmp_path / "reg"))
    assert result.returncode == 2 and f"{path}: column 'rating' holds {distinct}" in result.stderr
    assert not (tmp_path / "reg").exists() or Registry(tmp_path / "reg").versions("dcr") == []


def test_a_few_levels_or_a_declared_scale_pass_the_level_check(tmp_path):
    few = tmp_path / "few.csv"
    values = np.arange(MAX_RATING_LEVELS) * 0.5
    few.write_text("user,item,rating\n" + "".join(f"u{k},i{k},{v:g}\n" for k, v in enumerate(values)))
    assert np.unique(read_ratings(few).rating).size == MAX_RATING_LEVELS
    many = tmp_path / "many.csv"
    many.write_text("user,item,rating\n" + "".join(f"u{k},i{k},{k}\n" for k in range(MAX_RATING_LEVELS + 1)))
    assert f"holds {MAX_RATING_LEVELS + 1} distinct values" in error_of(read_ratings, many).reason
    scaled = read_ratings(many, rating_scale=f"0..{MAX_RATING_LEVELS}")
    assert len(scaled) == MAX_RATING_LEVELS + 1


# ------------------------------------------------------------------ reading interactions
def test_a_strength_column_is_recognised_by_name_and_read_as_implicit(tmp_path, caplog):
    path = write_play_counts(tmp_path / "user_artists.dat", users=50)
    with caplog.at_level(logging.INFO, logger="ordrec.trainer.data"):
        data = read_ratings(path, "tsv")
    rows = np.loadtxt(path, skiprows=1, dtype=np.int64)
    assert data.feedback == "implicit" and data.strength == "weight" and len(data) == len(rows)
    got = {
        (data.users.external(u), data.items.external(i)): s
        for u, i, s in zip(data.user, data.item, data.rating)
    }
    assert got == {(str(u), str(a)): float(p) for u, a, p in rows}
    assert "read as implicit feedback" in caplog.text


def test_repeats_fold_into_one_row_counting_records_with_the_latest_time(tmp_path, caplog):
    path = tmp_path / "clicks.csv"
    path.write_text("user_id,item_id,timestamp\nu1,a,30\nu1,b,10\nu2,a,5\nu1,a,20\nu1,a,40\nu2,a,1\n")
    with caplog.at_level(logging.INFO, logger="ordrec.trainer.data"):
        data = read_ratings(path)
    assert data.feedback == "implicit" and data.strength == "rows"
    pairs = [(data.users.external(u), data.items.external(i)) for u, i in zip(data.user, data.item)]
    assert pairs == [("u1", "a"), ("u1", "b"), ("u2", "a")]  # order of first appearance
    assert data.rating.tolist() == [3.0, 1.0, 2.0]
    assert data.time.dtype == np.int64 and data.time.tolist() == [40, 10, 5]
    assert "(the header names no rating column" in caplog.text and "3 repeats folded into 3" in caplog.text


def test_a_declared_strength_is_summed_and_feedback_can_be_forced(tmp_path):
    path = tmp_path / "orders.tsv"
    path.write_text("customer_id\tproduct_id\tunits\tprice\nc1\tp1\t2\t9.5\nc1\tp1\t3\t9.5\nc2\tp1\t1\t9.5\n")
    assert "--feedback implicit" in error_of(read_ratings, path).reason  # an unknown column: not guessed
    data = read_ratings(path, strength="units")
    assert data.implicit and data.strength == "units" and data.rating.tolist() == [5.0, 1.0]
    counted = read_input("ratings", path, feedback="implicit")
    assert counted.strength == "rows" and counted.rating.tolist() == [2.0, 1.0]
    # A count renamed `rating`, declared implicit, is read as the strength.
    plays = write_play_counts(tmp_path / "plays.tsv", column="rating", users=20)
    assert read_ratings(plays, feedback="implicit").strength == "rating"
    assert (
        "no rating column"
        in error_of(read_ratings, write_play_counts(tmp_path / "w.tsv"), feedback="explicit").reason
    )
    with pytest.raises(ValueError, match="feedback and strength are for ratings"):
        read_input("tags", path, feedback="implicit")


def test_implicit_reads_agree_between_the_fast_path_and_the_per_line_parser(tmp_path):
    """A quoted field sends its line to the per-line rules; the result is the same rows."""
    plain = tmp_path / "plain.csv"
    quoted = tmp_path / "quoted.csv"
    body = ["u1,a,2,100", "u2,b,1,7", "u1,a,3,90"]
    plain.write_text("user,item,plays,ts\n" + "\n".join(body) + "\n")
    quoted.write_text("user,item,plays,ts\n" + "\n".join(['"u1",a,2,100', *body[1:]]) + "\n")
    a, b = read_ratings(plain), read_ratings(quoted)
    for x, y in ((a.user, b.user), (a.item, b.item), (a.rating, b.rating), (a.time, b.time)):
        assert np.array_equal(x, y)
    assert a.rating.tolist() == [5.0, 1.0] and a.time.tolist() == [100, 7]


def test_a_negative_strength_is_a_line_error(tmp_path):
    path = tmp_path / "plays.csv"
    path.write_text("user,item,plays\nu,a,3\nu,b,-1\n")
    err = error_of(read_ratings, path)
    assert err.line == 3 and "strength '-1' is below the minimum 0" in err.reason


def test_parquet_interactions_fold_and_keep_their_time(tmp_path):
    path = tmp_path / "clicks.parquet"
    table = pa.table(
        {
            "user": ["u1", "u1", "u2"],
            "item": [7, 7, 7],
            "quantity": [2, 5, 1],
            "timestamp": pa.array([10, 30, 20], pa.timestamp("ms")),
        }
    )
    pq.write_table(table, path)
    data = read_ratings(path)
    assert data.implicit and data.strength == "quantity"
    assert data.rating.tolist() == [7.0, 1.0] and data.time.tolist() == [30, 20]


# ------------------------------------------------------------------ timestamps kept
def test_timestamps_survive_every_reader_and_every_copy_of_the_data(tmp_path):
    ml = tmp_path / "u.data"
    ml.write_text("1\t10\t5\t881250949\n2\t10\t3\t891717742\n1\t20\t4\t9223372036854775807\n")
    data = read_ratings(ml)
    assert data.time.tolist() == [881250949, 891717742, 2**63 - 1]  # exact, beyond 2**53
    csv = tmp_path / "r.csv"
    csv.write_text("user,item,rating,timestamp\n1,10,5,881250949\n2,10,3,891717742\n")
    assert read_ratings(csv).time.tolist() == [881250949, 891717742]
    parquet = tmp_path / "r.parquet"
    pq.write_table(
        pa.table({"user": [1, 2], "item": [10, 10], "rating": [5, 3], "ts": [881250949, 5]}), parquet
    )
    assert read_ratings(parquet).time.tolist() == [881250949, 5]

    assert data.subset(np.array([2, 0])).time.tolist() == [2**63 - 1, 881250949]
    assert data.subset(data.user == data.users.row("1")).compact().time.tolist() == [881250949, 2**63 - 1]
    kept, _ = drop_forgotten(data, frozenset({user_digest("2")}))
    assert kept.time.tolist() == [881250949, 2**63 - 1]


def test_a_timestamp_beyond_int64_is_a_line_error(tmp_path):
    ml = tmp_path / "u.data"
    ml.write_text("1\t10\t5\t1\n1\t20\t4\t9223372036854775808\n")
    err = error_of(read_ratings, ml)
    assert err.line == 2 and "is larger than 9223372036854775807" in err.reason


def test_the_fingerprint_of_explicit_ratings_ignores_time_and_implicit_data_keeps_it(tmp_path):
    ml = tmp_path / "u.data"
    ml.write_text("1\t10\t5\t100\n2\t10\t3\t200\n")
    data = read_ratings(ml)
    before = Ratings(
        data.users, data.items, data.user, data.item, data.rating
    )  # as read before times were kept
    assert data.fingerprint() == before.fingerprint()
    clicks = tmp_path / "clicks.csv"
    clicks.write_text("user,item,ts\n1,10,100\n2,10,200\n")
    implicit = read_ratings(clicks)
    later = Ratings(
        implicit.users,
        implicit.items,
        implicit.user,
        implicit.item,
        implicit.rating,
        time=implicit.time + 1,
        feedback="implicit",
        strength="rows",
    )
    assert implicit.fingerprint() != later.fingerprint() != before.fingerprint()


# ------------------------------------------------------------------ levels for the ordinal models
def test_strengths_become_per_user_quantile_levels():
    user = np.array([0, 0, 0, 0, 0, 1, 1, 2], dtype=np.int32)
    strength = np.array([1, 2, 3, 4, 500, 7, 7, 9], dtype=np.float32)
    folded = aggregate(user, np.arange(8, dtype=np.int32), 3, 8, strength)
    users, items = IdMap([f"u{k}" for k in range(3)]), IdMap([f"i{k}" for k in range(8)])
    data = Ratings(
        users, items, folded.user, folded.item, folded.strength, feedback="implicit", strength="plays"
    )
    levels = ordinal_levels(data)
    assert levels.rating.tolist() == [1, 2, 3, 4, 5, 3, 3, 3]  # ties and a lone interaction: the middle
    assert levels.implicit and levels.strength == "levels of plays"
    explicit = Ratings(users, items, data.user, data.item, data.rating)
    same, note = trainable(explicit)
    assert same is explicit and note is None


@pytest.mark.parametrize("kind", ["dcr", "coe"])
def test_a_play_count_file_trains_end_to_end(kind, tmp_path):
    path = write_play_counts(tmp_path / "plays.tsv")
    registry = tmp_path / "reg"
    small = ["--set", "n_components=4", "--set", "max_iter=3"]
    result = _train(kind, "--data", str(path), "--registry", str(registry), *small)
    assert result.returncode == 0, result.stderr
    assert "implicit feedback" in result.stderr and "'weight' summed" in result.stderr
    assert len(Registry(registry).load(kind).ids["users"]) == 300


# ------------------------------------------------------------------ recorded interactions
def _implicit_job(tmp_path: Path, data: Path, redis_url: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f"""
[job]
name = "plays-job"
registry = "{tmp_path / "registry"}"

[events]
redis = "{redis_url}"
timeout = 1

[data.plays]
path = "{data}"
feedback = "implicit"
strength = "weight"

[[models]]
name = "dcr"
kind = "dcr"
data = "plays"
params = {{ n_components = 4, max_iter = 3 }}

[models.gate]
metric = "ndcg_at_10"
margin = 1.0
popularity_floor = false
"""
    )
    return path


@pytest.mark.redis
def test_interactions_recorded_without_a_value_train_the_model(redis_server, tmp_path, capsys):
    import redis

    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    for item in ("0", "1", "2", "new-artist"):  # clicks: RecordInteractions without a value
        client.xadd(EVENTS_STREAM, {"user": "newcomer", "item": item, "ts": "1700000000.5"})
    data = write_play_counts(tmp_path / "plays.tsv", users=100)
    assert run_job(_implicit_job(tmp_path, data, redis_server.url)) == EXIT_PUBLISHED
    artifact = Registry(tmp_path / "registry").load("dcr")
    assert "newcomer" in artifact.ids["users"] and "new-artist" in artifact.ids["items"]
    log = capsys.readouterr().err
    assert "trained=4 without_value=0" in log and "feedback=implicit" in log
    assert "rating_scale" not in artifact.attributes  # strengths are not checked against a scale


def test_events_add_to_the_strength_of_implicit_data_and_keep_their_time(tmp_path):
    base = tmp_path / "clicks.csv"
    base.write_text("user,item,plays,timestamp\nu1,a,3,100\nu2,a,1,200\n")
    feed = EventFeed(Registry(tmp_path / "registry"), "dcr", client=None)
    merge(
        feed.next.latest,
        [
            Event("5-0", "u1", "a", 300.0),  # a click on a pair already played: +1
            Event("6-0", "u3", "b", 400.0, 2.0),  # a new pair with a strength
            Event("7-0", "u2", "a", 50.0, -1.0),  # a negative strength is off scale
        ],
    )
    data = feed.apply(read_ratings(base), None)
    got = {
        (data.users.external(u), data.items.external(i)): (float(s), int(t))
        for u, i, s, t in zip(data.user, data.item, data.rating, data.time)
    }
    assert got == {("u1", "a"): (4.0, 300), ("u2", "a"): (1.0, 200), ("u3", "b"): (2.0, 400)}
    assert (feed.counts.trained, feed.counts.without_value, feed.counts.off_scale) == (2, 0, 1)


def test_explicit_ratings_merged_with_events_keep_their_times(tmp_path):
    base = tmp_path / "u.data"
    base.write_text("u1\ta\t3\t100\nu2\ta\t1\t200\n")
    merged = with_events(read_ratings(base, "ml-100k"), [Event("5-0", "u1", "a", 300.0, 5.0)])
    rows = {
        (merged.users.external(u), float(r), int(t))
        for u, r, t in zip(merged.user, merged.rating, merged.time)
    }
    assert rows == {("u1", 5.0, 300), ("u2", 1.0, 200)}


def test_recorded_values_that_make_too_many_levels_are_refused(tmp_path):
    """Explicit data without a scale accepts any recorded value; counts recorded as values
    must not turn into thousands of levels in the fit."""
    base = tmp_path / "r.csv"
    base.write_text("user,item,rating\nu1,a,1\nu2,a,2\n")
    feed = EventFeed(Registry(tmp_path / "registry"), "dcr", client=None)
    merge(
        feed.next.latest,
        [Event(f"{n}-0", f"v{n}", "a", 1.0, float(10 + n)) for n in range(MAX_RATING_LEVELS)],
    )
    err = error_of(feed.apply, read_ratings(base), None)
    assert f"column 'rating' holds {MAX_RATING_LEVELS + 2} distinct values" in err.reason
    assert err.path.endswith(f"r.csv + {EVENTS_STREAM}")


def test_feedback_flags_and_job_keys_are_for_ratings_only(tmp_path, capsys):
    from ordrec.trainer.cli import build_parser
    from ordrec.trainer.job import EXIT_USAGE

    args = build_parser().parse_args(
        [
            "train",
            "dcr",
            "--data",
            "x.csv",
            "--registry",
            "r",
            "--feedback",
            "implicit",
            "--strength",
            "plays",
        ]
    )
    assert (args.feedback, args.strength) == ("implicit", "plays")
    tags = tmp_path / "tags.csv"
    tags.write_text("user,item,tag\nu,i,t\n")
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "tags-job"
registry = "{tmp_path / "registry"}"

[data.tags]
path = "{tags}"
strength = "plays"

[[models]]
name = "rtf"
kind = "rtf"
data = "tags"
"""
    )
    assert run_job(job) == EXIT_USAGE
    assert "data.tags.strength: is for ratings data; model 'rtf' (rtf) reads tags" in capsys.readouterr().err
