"""Pairwise DCR's validation at scale (issue 35): the lean hold-outs and fold fits give exactly
what the straightforward ones give (seeded results unchanged), and share no factor memory
they should not."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.dcr import DCR, PAPER_PARAMS, PairwiseDCR, holdouts, refinement_scores
from ordrec.trainer.models.dcr_kernels import held_out_rows
from ordrec.trainer.models.ranking import served_recall_values
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
    want_point, want_refined = [], []
    for fit, val in holdouts(data, np.random.default_rng([3, 3]), 2):
        fold = DCR(**model.get_params()).fit(fit)
        want_point.append(fold.validation_values(val))
        want_refined.append(refinement.refined(fold).validation_values(val))
    # Folds holding out the same users are averaged per user, others paired within folds.
    same = len({v.size for v in want_point}) == 1
    combine = (lambda values: np.mean(values, axis=0)) if same else np.concatenate
    np.testing.assert_array_equal(point, combine(want_point))
    np.testing.assert_array_equal(refined, combine(want_refined))
    assert not np.array_equal(point, refined)  # the refinement moved something


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
    read by the reader, deleted) and a refine row, as JSON lines."""
    out = tmp_path / "rows.jsonl"
    before = set(Path("/tmp").glob("mem_dcr_*.tsv"))
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mem_dcr.py"), "--shape", "small", "--ratings", "1e5"]
        + ["--models", "read,refine", "--data-dir", str(tmp_path / "data"), "--json", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    read, refine = (json.loads(line) for line in out.read_text().splitlines())
    assert read["model"] == "read" and read["ratings"] == 100_000 and read["peak_b"] > 0
    assert set(Path("/tmp").glob("mem_dcr_*.tsv")) == before
    assert refine["pair_epoch_s"] > 0 and refine["epoch_s"] is not None
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        f"small_100000_0_{c}.npy" for c in ("item", "rating", "user")
    ]
