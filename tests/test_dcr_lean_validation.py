"""Pairwise DCR's validation at scale (issue 35): the lean hold-outs and fold fits give exactly
what the straightforward ones give (seeded results unchanged), and share no factor memory
they should not."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import DataError, Ratings
from ordrec.trainer.models.dcr import (
    DCR,
    PAPER_PARAMS,
    DCRVariants,
    PairwiseDCR,
    ValidatedRefinement,
    holdouts,
    lazy_zeros,
    refinement_scores,
    scored_users,
)
from ordrec.trainer.models.dcr_kernels import held_out_rows
from ordrec.trainer.models.ranking import served_recall_values
from ordrec.trainer.models.selection import stream
from tests.test_dcr_eval import ratings as planted

ROOT = Path(__file__).resolve().parents[1]


def lexsort_hold_out(user, n_users, rng, fraction, minimum):
    """The hold-out as first written: a lexsort by (user, random key), the first
    ``max(minimum, fraction * n_u)`` of each user held out."""
    counts = np.bincount(user, minlength=n_users)
    held = np.maximum(minimum, np.floor(fraction * counts)).astype(np.int64)
    order = np.lexsort((rng.random(user.size), user))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    owner = user[order]
    is_held = np.arange(user.size) - starts[owner] < held[owner]
    return np.sort(order[~is_held]), np.sort(order[is_held])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(0, 600),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.1, 0.25, 0.5, 0.9]),
    st.integers(0, 3),
)
def test_hold_out_rows_are_the_lexsort_ones(n_users, n, seed, fraction, minimum):
    user = np.random.default_rng(seed).integers(0, n_users, n).astype(np.int32)
    kept, held = held_out_rows(user, n_users, np.random.default_rng(seed + 1), fraction, minimum)
    want_kept, want_held = lexsort_hold_out(user, n_users, np.random.default_rng(seed + 1), fraction, minimum)
    np.testing.assert_array_equal(kept, want_kept)
    np.testing.assert_array_equal(held, want_held)
    assert kept.dtype == held.dtype == np.int32


def test_hold_out_rows_leave_the_stream_where_the_lexsort_left_it():
    """The next fold draws on from the same place (folds are drawn in turn from one stream)."""
    user = np.random.default_rng(0).integers(0, 30, 500).astype(np.int32)
    ours, theirs = np.random.default_rng(5), np.random.default_rng(5)
    held_out_rows(user, 30, ours, 0.25, 2)
    lexsort_hold_out(user, 30, theirs, 0.25, 2)
    assert ours.random() == theirs.random()


@pytest.mark.parametrize("paper", [False, True])
def test_refinement_scores_are_those_of_copied_folds_and_copied_refinements(paper):
    """Each fold's ratings held once and its fit refined in place score exactly what the fold's
    own Ratings, a fresh fit and ``PairwiseDCR.refined`` (a copy) score."""
    data = planted(1)
    params = dict(n_components=4, max_iter=2, random_state=3)
    model = DCR(**(dict(params, **PAPER_PARAMS) if paper else params)).fit(data)
    refinement = PairwiseDCR(model, learning_rate=0.05, max_iter=2)
    point, refined = refinement_scores(model, data, 2, 0.25, refinement)
    assert_copied_folds_score(point, refined, model, data, refinement, None)
    assert not np.array_equal(point, refined)  # the refinement moved something


def assert_copied_folds_score(point, refined, model, data, refinement, chosen) -> bool:
    """``point`` and ``refined`` are what two copied folds of ``data`` (seed 3), fresh fits and
    copied refinements score on the held-out ratings of the ``chosen`` users (None: all);
    True when both folds scored the same users (then averaged per user)."""
    want_point, want_refined = [], []
    for fit, val in holdouts(data, stream(3, "pairwise_validation"), 2):
        fold = DCR(**model.get_params()).fit(fit)
        if chosen is not None:
            val = val.subset(np.flatnonzero(chosen[val.user]))
        want_point.append(fold.validation_values(val))
        want_refined.append(refinement.refined(fold).validation_values(val))
    # Folds holding out the same users are averaged per user, others paired within folds.
    same = len({v.size for v in want_point}) == 1
    combine = (lambda values: np.mean(values, axis=0)) if same else np.concatenate
    np.testing.assert_array_equal(point, combine(want_point))
    np.testing.assert_array_equal(refined, combine(want_refined))
    return same


def test_validation_scores_the_model_without_changing_or_copying_it():
    """``validation_values`` scores through the model's own arrays: the values of a packed copy,
    and the factors untouched; a packed artifact still owns its arrays."""
    data = planted(2)
    (fit, val), *_ = holdouts(data, np.random.default_rng(0), 1)
    model = DCR(n_components=4, max_iter=2).fit(fit)
    U, V = model.U_.copy(), model.V_.copy()
    got = model.validation_values(val)
    artifact = model.to_artifact(ann_min_items=10**9)
    want = served_recall_values(DCRIndex.from_artifact(artifact), val, float(model.levels_[-2]))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.U_, U)
    np.testing.assert_array_equal(model.V_, V)
    for name, own in [
        ("user_factors", model.U_),
        ("item_factors", model.V_),
        ("seen_indices", model.seen_indices_),
    ]:
        assert not np.shares_memory(artifact.array(name), own), name


@pytest.mark.parametrize("step", [1, 3])
def test_fingerprint_hashes_the_bytes_of_each_column(step):
    """The fingerprint reads each column's buffer in place: the hash of its bytes, as before,
    for contiguous and strided columns alike."""
    data = planted(3)
    part = Ratings(data.users, data.items, data.user[::step], data.item[::step], data.rating[::step])
    digest = hashlib.sha256()
    for piece in (part.users, part.items, part.user, part.item, part.rating):
        text = "\n".join(piece.ids).encode("utf-8") if isinstance(piece, IdMap) else piece.copy().tobytes()
        digest.update(text)
        digest.update(b"\0")
    assert part.fingerprint() == digest.hexdigest()


@pytest.mark.slow
def test_the_memory_benchmark_reads_its_file_and_removes_it(tmp_path):
    """``benchmarks/mem_dcr.py`` end to end on the small shape: a read row (the file written,
    read by the reader, deleted), a refine row and an in-place one, as JSON lines."""
    out = tmp_path / "rows.jsonl"
    before = set(Path("/tmp").glob("mem_dcr_*.tsv"))
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mem_dcr.py"), "--shape", "small", "--ratings", "1e5"]
        + ["--models", "read,refine,inplace", "--data-dir", str(tmp_path / "data"), "--json", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    read, refine, inplace = (json.loads(line) for line in out.read_text().splitlines())
    assert read["model"] == "read" and read["ratings"] == 100_000 and read["peak_b"] > 0
    assert set(Path("/tmp").glob("mem_dcr_*.tsv")) == before
    assert refine["pair_epoch_s"] > 0 and refine["epoch_s"] is not None
    # Refined in place: one set of factors where the refined copy holds two.
    assert inplace["pair_epoch_s"] > 0 and inplace["rated_users"] == refine["rated_users"] > 0
    assert inplace["factors_allocated_mb"] * 2 == pytest.approx(refine["factors_allocated_mb"], abs=1)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        f"small_100000_0_{c}.npy" for c in ("item", "rating", "user")
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(0, 400), st.integers(0, 2**31 - 1), st.integers(1, 70))
def test_scored_users_are_a_seeded_sample_of_the_users_with_ratings(n_users, n, seed, max_users):
    """None (every user) while the users with ratings fit in ``max_users``; else exactly
    ``max_users`` of them, the same for the same seed."""
    user = np.random.default_rng(seed).integers(0, n_users, n).astype(np.int32)
    data = Ratings(
        IdMap([f"u{i}" for i in range(n_users)]),
        IdMap(["i0"]),
        user,
        np.zeros(n, np.int32),
        np.ones(n, np.float32),
    )
    rated = np.bincount(user, minlength=n_users) > 0
    chosen = scored_users(data, seed, max_users)
    assert scored_users(data, seed, None) is None
    if rated.sum() <= max_users:
        assert chosen is None
        return
    assert chosen.dtype == np.bool_ and chosen.shape == (n_users,)
    assert chosen.sum() == max_users and not np.any(chosen & ~rated)
    np.testing.assert_array_equal(chosen, scored_users(data, seed, max_users))


def test_a_bounded_sample_scores_only_its_users_and_the_same_folds():
    """With ``max_users`` below the rated users, each fold scores the held-out ratings of the
    sampled users only: the values of the unbounded folds restricted to those users."""
    data = planted(1, n_users=60)
    model = DCR(n_components=4, max_iter=2, random_state=3).fit(data)
    refinement = PairwiseDCR(model, learning_rate=0.05, max_iter=2)
    point, refined = refinement_scores(model, data, 2, 0.25, refinement, max_users=20)
    chosen = scored_users(data, 3, 20)
    assert chosen is not None and chosen.sum() == 20
    same = assert_copied_folds_score(point, refined, model, data, refinement, chosen)
    assert 0 < point.size <= (20 if same else 40)
    unbounded, _ = refinement_scores(model, data, 2, 0.25, refinement)
    assert unbounded.size > point.size


@pytest.mark.parametrize("paper", [False, True])
@pytest.mark.parametrize("margin", [0.0, 1.0])
@pytest.mark.parametrize("epochs", [None, "2,1,2,1"])
def test_the_validated_fit_is_the_fit_then_the_decision(paper, margin, epochs):
    """``ValidatedRefinement.fit`` runs the hold-outs before the full fit (so the two sets of
    factors are never held at once); the result is that of the fit first, then ``decide`` on
    it, then the refinement in place when it wins, kept or not (margin 1 never keeps it)."""
    data = planted(4)
    params = dict(PAPER_PARAMS if paper else {}, n_components=4, max_iter=2, random_state=5)
    if epochs is not None and not paper:
        epochs += ",1"  # one more learned level: "not rated"
    variants = DCRVariants(level_epochs=epochs)
    validated = ValidatedRefinement(PairwiseDCR(DCR(**params), max_iter=2), folds=2, margin=margin)
    got = validated.fit(data, variants=variants)
    want = DCR(**params).fit(data, variants=variants)
    gain, scores = validated.decide(want, data)
    assert got.kept_ is gain.kept and (margin == 0.0 or not gain.kept)
    assert got.val_scores_ == scores
    decided = ValidatedRefinement(PairwiseDCR(DCR(**params), max_iter=2), folds=2, margin=margin)
    decided.kept_, decided.val_scores_ = gain.kept, scores
    decided.best_estimator_ = decided.estimator.refine_fitted(want) if gain.kept else want
    mine, theirs = got.to_artifact(ann_min_items=10**9), decided.to_artifact(ann_min_items=10**9)
    for name in ("user_factors", "item_factors", "seen_indptr", "seen_indices", "item_popularity"):
        np.testing.assert_array_equal(mine.array(name), theirs.array(name))
    assert mine.metrics == theirs.metrics and mine.hyperparameters == theirs.hyperparameters


def test_the_validated_fit_of_no_ratings_is_refused_as_the_fit_refuses_it():
    empty = planted(0).subset(np.zeros(0, np.int32))
    validated = ValidatedRefinement(PairwiseDCR(DCR(n_components=2, max_iter=1)), folds=1)
    with pytest.raises(DataError, match="no ratings to train on"):
        validated.fit(empty)
    with pytest.raises(ValueError, match="n_components"):
        ValidatedRefinement(PairwiseDCR(DCR(n_components=0)), folds=1).fit(planted(0))


def resident_bytes() -> int:
    """This process's resident bytes now (Linux)."""
    status = Path(f"/proc/{os.getpid()}/status").read_text().splitlines()
    return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


def test_lazy_factors_cost_only_the_pages_written_and_reading_costs_nothing():
    """The user factors' pages become resident only where rows are written: a pass that reads
    every row (the serving index's mean, when a validation scores the model) adds nothing."""
    rows, width = 1 << 16, 256  # 64 MiB of float32
    factors = lazy_zeros((rows, width), np.float32)
    before = resident_bytes()
    assert float(factors.sum()) == 0.0
    assert resident_bytes() - before < (8 << 20)
    factors[:: rows // 16] = 1.0  # 16 rows, 16 pages
    assert resident_bytes() - before < (8 << 20)
    assert float(factors.sum()) == 16 * width
