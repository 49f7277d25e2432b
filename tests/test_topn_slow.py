"""The README's top-N claims on ML-100K, asserted by the README's own command (slow: it fits)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ordrec.trainer.cli import main
from tests.conftest import data_file

# A whole reproduce run (five seeds): minutes on an idle machine, more on a busy one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODELS = ("dcr", "pairwise_dcr", "coe")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """``ordrec-train reproduce topn --data u.data --runs 5 --fold-in 0.1 --references
    popularity,ease`` (the README's; ALS, tuned over its grid, takes longer than the rest)."""
    out = tmp_path_factory.mktemp("topn") / "rows.json"
    argv = ["reproduce", "topn", "--data", str(data_file("ml-100k", "u.data")), "--runs", "5"]
    argv += ["--fold-in", "0.1", "--references", "popularity,ease"]
    assert main([*argv, "--quiet", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def per_run(rows, method, metric) -> np.ndarray:
    """The figure of each of the five seeds (the rows whose setting names a seed)."""
    found = {
        r["setting"]["seed"]: r["mean"]
        for r in rows
        if r["method"] == method and r["metric"] == metric and "seed" in r["setting"]
    }
    assert sorted(found) == [0, 1, 2, 3, 4]
    return np.array([found[s] for s in sorted(found)])


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("metric", ["recall@10", "ndcg@10"])
def test_every_recommender_beats_popularity_on_every_seed(rows, model, metric):
    assert np.all(per_run(rows, model, metric) > per_run(rows, "popularity", metric))


def test_the_best_recommender_reaches_nine_tenths_of_ease(rows):
    ease = per_run(rows, "ease", "recall@10").mean()
    assert max(per_run(rows, m, "recall@10").mean() for m in MODELS) >= 0.9 * ease


@pytest.mark.parametrize("model", MODELS)
def test_new_users_folded_in_beat_popularity_on_every_seed(rows, model):
    popular = per_run(rows, "popularity (new users)", "recall@10")
    for evidence in ("fold-in", "fold-in from interactions"):
        assert np.all(per_run(rows, f"{model} ({evidence}, new users)", "recall@10") > popular)


README_ROWS = {
    "popularity": "popularity",
    "EASE": "ease",
    "DCR": "dcr",
    "Pairwise DCR": "pairwise_dcr",
    "COE": "coe",
}


def test_the_readme_table_is_this_commands_output(rows):
    """The README's top-N rows (recall@10, NDCG@10) are what this command prints: seeded, so a
    stale table fails here (tolerance for BLAS rounding only)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    readme = readme.split("## What Recommend serves")[1].split("\n## ")[0]  # the top-N section
    command = "reproduce topn --data $ORDREC_DATA/ml-100k/u.data --runs 5 --fold-in 0.1 --references popularity,ease"
    assert command in readme
    for label, method in README_ROWS.items():
        cells = re.search(rf"^\| (?:\*\*)?{re.escape(label)}[^|]*\| ([^|]+)\| ([^|]+)\|", readme, re.M)
        assert cells, label
        quoted = [float(c.strip().strip("*")) for c in cells.groups()]
        measured = [per_run(rows, method, m).mean() for m in ("recall@10", "ndcg@10")]
        np.testing.assert_allclose(quoted, measured, atol=0.002, err_msg=label)
