"""The one reader in bounded chunks (issue 34 item 3, issue 35 item 1): chunk boundaries anywhere give
the same arrays as the per-line parser, tampered lines are errors naming the file and line on both
paths, a chunked read's peak stays near its output, and the DCR fit's compact pieces equal the
plain forms they replace."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.storage import idmap
from ordrec.service.storage.idmap import IdMap, PackedIdMap
from ordrec.trainer.data import lines as parsing
from ordrec.trainer.data.lines import Column, parse_records
from ordrec.trainer.data.readers import read_ratings
from ordrec.trainer.data.types import DataError, Ratings
from ordrec.trainer.models import dcr_kernels
from ordrec.trainer.models.dcr import DCR
from ordrec.trainer.models.dcr_kernels import (
    UnratedSampler,
    normal_rows,
    rating_levels,
    user_csr,
    with_unrated,
)

COLUMNS = [
    Column(0, "user", space=0),
    Column(1, "item", space=1),
    Column(2, "rating", kind="float", dtype="float32"),
    Column(3, "timestamp", kind="timestamp"),
]

ids = st.one_of(st.integers(0, 30).map(str), st.sampled_from(["u1", " u2", "07", "é", "x y"]))
rows = st.tuples(ids, ids, st.sampled_from(["1", "2.5", "4", "5", "3.0"]), st.integers(0, 10**6).map(str))
lines = st.one_of(
    rows.map(lambda r: "\t".join(r)),
    st.just(""),  # blank lines carry no data
    rows.map(lambda r: "\t".join(r) + "\r"),  # CRLF endings
)


def same(a, b) -> bool:
    return (
        a.spaces == b.spaces
        and all(np.array_equal(x, y) for x, y in zip(a.ids + a.numbers, b.ids + b.numbers))
        and [a.line(k) for k in range(len(a.ids[0]))] == [b.line(k) for k in range(len(b.ids[0]))]
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(lines, min_size=1, max_size=40), st.integers(1, 120), st.booleans())
def test_chunk_boundaries_anywhere_give_the_per_line_arrays(tmp_path_factory, body, chunk, packed):
    """Packed or not (a packed map from the first id: as a read of 10^5 ids or more is), the
    fast path's ids and arrays are the per-line parser's."""
    path = tmp_path_factory.mktemp("c") / "r.tsv"
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    try:
        slow = parse_records(str(path), "\t", 4, COLUMNS, 2, fast=False)
    except DataError as exc:  # only blank lines (or a user rating an item twice is fine here)
        with pytest.raises(DataError) as info:
            parse_records(str(path), "\t", 4, COLUMNS, 2)
        assert (info.value.line, info.value.reason) == (exc.line, exc.reason)
        return
    old = parsing.CHUNK_BYTES, idmap.PACKED_MIN_IDS
    parsing.CHUNK_BYTES = chunk
    idmap.PACKED_MIN_IDS = 1 if packed else old[1]
    try:
        fast = parse_records(str(path), "\t", 4, COLUMNS, 2)
    finally:
        parsing.CHUNK_BYTES, idmap.PACKED_MIN_IDS = old
    assert fast.fast and same(fast, slow)
    assert all(isinstance(m, PackedIdMap) == packed for m in fast.spaces)
    assert fast.numbers[0].dtype == np.float32 and all(x.dtype == np.int32 for x in fast.ids)


TAMPERED = [
    ("7\t8\t3", "expected 4 tab-separated fields, got 3"),
    ("7\t8\tfive\t0", "rating 'five' is not a number"),
    ("7\t8\t3\t-1", "timestamp '-1' is not a non-negative integer of at most 20 digits"),
    ("7\t\t3\t0", "empty item id"),
    ("7\x01\t8\t3\t0", "user id '7\\x01' contains a line break or control character"),
    ("7\t8\tnan\t0", "rating 'nan' is not a finite number"),
    ('7\t8\t3\t0\t"', "expected 4 tab-separated fields, got 5"),
    ("\x00\xff\x10garbage", "expected 4 tab-separated fields, got 1"),
]


@pytest.mark.parametrize(
    "body, encoding, bad_line",
    [
        ("u1\ti1\t4\t9\nu\u00e9\ti2\t5\t9\n", "latin-1", None),  # ids decoded from latin-1, kept UTF-8
        ("u1\ti1\t4\t9\nx\u2028y\ti2\t5\t9\n", "utf-8", 2),  # a line separator inside an id
        ("u1\ti1\t4\t9\nu2\ti\x852\t5\t9\n", "utf-8", 2),  # a C1 control inside an id
    ],
)
def test_packed_read_ids_decode_and_refuse_controls_as_the_per_line_parser(
    tmp_path, monkeypatch, body, encoding, bad_line
):
    monkeypatch.setattr(idmap, "PACKED_MIN_IDS", 1)
    path = tmp_path / "r.tsv"
    path.write_bytes(body.encode(encoding))
    if bad_line is not None:
        with pytest.raises(DataError) as info:
            parse_records(str(path), "\t", 4, COLUMNS, 2)
        assert info.value.line == bad_line and "control character" in info.value.reason
        return
    fast = parse_records(str(path), "\t", 4, COLUMNS, 2)
    slow = parse_records(str(path), "\t", 4, COLUMNS, 2, fast=False)
    assert isinstance(fast.spaces[0], PackedIdMap) and same(fast, slow)
    assert (
        fast.spaces[0].row("u\u00e9") == 1 and bytes(fast.spaces[0].joined_utf8()) == "u1\nu\u00e9".encode()
    )


@pytest.mark.parametrize("bad,reason", TAMPERED)
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("where", [1, 37, 200])
def test_a_tampered_line_is_an_error_naming_file_and_line(tmp_path, bad, reason, fast, where):
    good = [f"{u % 50}\t{u}\t{1 + u % 5}\t{u}" for u in range(200)]
    good[where - 1] = bad
    path = tmp_path / "r.tsv"
    path.write_bytes(("\n".join(good) + "\n").encode("latin-1"))
    old = parsing.CHUNK_BYTES
    parsing.CHUNK_BYTES = 100  # the bad line may straddle a chunk boundary
    try:
        with pytest.raises(DataError) as info:
            parse_records(str(path), "\t", 4, COLUMNS, 2, fast=fast)
    finally:
        parsing.CHUNK_BYTES = old
    assert info.value.line == where and info.value.reason == reason
    assert str(info.value).startswith(f"{path}:{where}: ")


def test_a_chunked_read_peaks_near_its_output(tmp_path, monkeypatch):
    """16 chunks of ratings: the read holds the 12-byte output rows, one chunk and its
    per-chunk kernel buffers, never the file or a second copy of a column."""
    monkeypatch.setattr(parsing, "CHUNK_BYTES", 1 << 16)
    rng = np.random.default_rng(0)
    n = 80_000
    user, item = rng.integers(0, 5000, n), rng.integers(0, 10**6, n)
    keep = np.unique(user * 10**6 + item, return_index=True)[1]
    user, item, n = user[np.sort(keep)], item[np.sort(keep)], keep.size
    text = "".join(f"{u}\t{i}\t{1 + k % 5}\t{k}\n" for k, (u, i) in enumerate(zip(user, item)))
    path = tmp_path / "u.data"
    path.write_text(text)
    assert path.stat().st_size > 16 * parsing.CHUNK_BYTES
    read_ratings(path)  # compile and cache the kernels outside the measurement
    tracemalloc.start()
    try:
        ratings = read_ratings(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(ratings) == n
    output = ratings.user.nbytes + ratings.item.nbytes + ratings.rating.nbytes
    ids = 200 * (ratings.n_users + ratings.n_items)  # the id maps' strings and dicts
    assert peak < 1.6 * output + ids + 48 * parsing.CHUNK_BYTES, (peak, output)


# ------------------------------------------------------------------ the DCR fit's compact pieces
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9)), min_size=1, max_size=80),
    st.sampled_from([np.int32, np.int64]),
)
def test_user_csr_by_counting_sorts_equals_lexsort(pairs, dtype):
    user = np.array([u for u, _ in pairs], dtype=dtype)
    item = np.array([i for _, i in pairs], dtype=dtype)
    level = np.arange(len(pairs), dtype=np.int8)  # ties keep their input order
    indptr, items, levels = user_csr(7, user, item, level)
    order = np.lexsort((item, user))
    assert np.array_equal(items, item[order]) and np.array_equal(levels, level[order])
    assert indptr.tolist() == np.r_[0, np.cumsum(np.bincount(user, minlength=7))].tolist()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.floats(0.0, 3.0), st.integers(0, 2**31 - 2))
def test_unrated_draws_into_buffers_equal_the_allocating_sampler(sizes, share, seed):
    rng = np.random.default_rng(seed)
    n_items = 20
    segments = [np.sort(rng.choice(n_items, s, replace=False)) for s in sizes]
    indptr = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    items = np.concatenate(segments).astype(np.int32)
    levels = rng.integers(1, 6, items.size).astype(np.int8)
    want = share * np.diff(indptr).astype(np.float64)
    cdf = np.cumsum(rng.random(n_items))
    sampler = UnratedSampler(indptr, items, levels, want, cdf)
    for draw_seed in (seed, seed + 1):  # the buffers are reused: the second draw is fresh too
        got = sampler.draw(draw_seed)
        expected = with_unrated(indptr, items, levels, want, cdf, draw_seed)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_levels_by_chunks_equal_one_pass(monkeypatch):
    rng = np.random.default_rng(1)
    rating = rng.integers(1, 11, 10_001).astype(np.float32) / 2
    values, whole = rating_levels(rating)
    monkeypatch.setattr(dcr_kernels, "LEVEL_CHUNK", 333)
    values_chunked, chunked = rating_levels(rating)
    assert np.array_equal(values, values_chunked) and np.array_equal(whole, chunked)
    assert chunked.dtype == np.int8 and np.array_equal(values[chunked], rating)
    rating[5000] = 2.7
    with pytest.raises(DataError, match="rating 2.7"):
        rating_levels(rating, values)


def test_factor_rows_drawn_in_blocks_equal_one_draw(monkeypatch):
    monkeypatch.setattr(dcr_kernels, "ROW_BLOCK", 7)
    rows = np.array([0, 3, 4, 9, 10, 11, 15, 17, 18, 19, 20, 25])
    blocked = np.zeros((30, 3, 4), dtype=np.float32)
    normal_rows(blocked, rows, np.random.default_rng(5), 0.1)
    whole = np.zeros_like(blocked)
    whole[rows] = np.random.default_rng(5).normal(0.0, 0.1, size=(rows.size, 3, 4))
    assert np.array_equal(blocked, whole)


def planted_ratings(n_users: int, n_items: int, n: int, seed: int) -> Ratings:
    """About ``n`` distinct (user, item) pairs rated 1..5 by a rank-3 preference."""
    rng = np.random.default_rng(seed)
    key = np.unique(rng.integers(0, n_users * n_items, int(n * 1.1)))[:n]
    rng.shuffle(key)
    user, item = (key // n_items).astype(np.int32), (key % n_items).astype(np.int32)
    A, B = rng.normal(size=(n_users, 3)), rng.normal(size=(n_items, 3))
    x = np.einsum("nk,nk->n", A[user], B[item])
    rating = (np.digitize(x, np.quantile(x, [0.1, 0.25, 0.5, 0.8])) + 1).astype(np.float32)
    return Ratings(
        IdMap([str(u) for u in range(n_users)]), IdMap([str(i) for i in range(n_items)]), user, item, rating
    )


def test_a_planted_fit_stays_within_40_bytes_per_rating_plus_factors(monkeypatch):
    """A one-epoch top-N DCR fit of a planted 200,000-rating set: what Python allocates above
    the ratings, at its peak, less the factors (numba's own arrays are per user or per item),
    with the per-step blocks small so that what is left grows with the ratings."""
    monkeypatch.setattr(dcr_kernels, "LEVEL_CHUNK", 1 << 12)
    monkeypatch.setattr(dcr_kernels, "ROW_BLOCK", 1 << 8)
    data = planted_ratings(4000, 1500, 200_000, seed=3)
    DCR(max_iter=1, n_components=8).fit(planted_ratings(300, 100, 3000, seed=1))  # compile first
    tracemalloc.start()
    try:
        model = DCR(max_iter=1, n_components=8).fit(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    factors = model.U_.nbytes + model.V_.nbytes
    assert (peak - factors) / len(data) < 40, (peak, factors)


def test_large_read_id_spaces_stay_packed_and_unindexed_through_a_fit(tmp_path, monkeypatch):
    """From PACKED_MIN_IDS ids on, a read's id maps are packed and a fit never asks them a
    lookup (so their hash index, 16 bytes an id, is never built); the fit's data fingerprint
    is the one of the same data with plain maps."""
    monkeypatch.setattr(idmap, "PACKED_MIN_IDS", 50)
    data = planted_ratings(300, 100, 3000, seed=1)
    path = tmp_path / "r.tsv"
    rows = zip(data.user.tolist(), data.item.tolist(), data.rating.astype(int).tolist())
    path.write_text("user\titem\trating\n" + "".join(f"u{u}\ti{i}\t{r}\n" for u, i, r in rows))
    read = read_ratings(str(path), "tsv")
    assert isinstance(read.users, PackedIdMap) and isinstance(read.items, PackedIdMap)
    model = DCR(max_iter=1, n_components=4).fit(read)
    assert not read.users.indexed and not read.items.indexed
    plain = Ratings(
        IdMap(list(read.users.ids)), IdMap(list(read.items.ids)), read.user, read.item, read.rating
    )
    assert model.data_fingerprint_ == plain.fingerprint()
    assert read.users.row("u7") == list(read.users.ids).index("u7")  # asked, it answers
