"""The implicit top-N table (docs/dcr.md, the README) asserted by its own command on seed 0
(slow: it fits ML-100K with the ratings dropped, every rating one interaction)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ordrec.trainer.cli import main
from tests.conftest import data_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
LABELS = {
    "popularity": "popularity",
    "EASE": "ease",
    "DCR": "dcr",
    "Pairwise DCR": "pairwise_dcr",
    "COE": "coe",
}


@pytest.fixture(scope="module")
def seed0(tmp_path_factory) -> dict[str, float]:
    """Seed 0 of the random split: ``reproduce topn --feedback implicit --runs 1 --seed 0``
    (the references tuned slowest, ALS and BPR, left out), recall@10 per method."""
    folder = tmp_path_factory.mktemp("implicit")
    log = folder / "ml100k-interactions.tsv"
    lines = data_file("ml-100k", "u.data").read_text().splitlines()
    log.write_text(
        "user\titem\ttimestamp\n" + "".join(f"{u}\t{i}\t{t}\n" for u, i, _, t in map(str.split, lines))
    )
    out = folder / "rows.json"
    argv = ["reproduce", "topn", "--data", str(log), "--format", "tsv", "--feedback", "implicit"]
    argv += ["--runs", "1", "--seed", "0", "--split", "random", "--references", "popularity,ease"]
    assert main([*argv, "--quiet", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    return {
        r["method"]: r["mean"]
        for r in rows
        if r["metric"] == "recall@10" and r["setting"].get("seed") == 0 and r["method"] in LABELS.values()
    }


def random_split_table() -> dict[str, list[str]]:
    """docs/dcr.md's random-split table on interactions: each method's cells."""
    page = (ROOT / "docs" / "dcr.md").read_text().split("### Top-N on interaction logs")[1]
    table = page.split("| method |")[1].split("\n\n")[0]
    return {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:])
    }


def test_the_seed_0_column_is_this_commands_output(seed0):
    table = random_split_table()
    for label, method in LABELS.items():
        quoted = float(table[label][4])  # recall@10, NDCG@10, recall@20, coverage@10, seed 0
        np.testing.assert_allclose(quoted, seed0[method], atol=0.002, err_msg=label)


def test_every_kind_beats_popularity_on_seed_0(seed0):
    assert min(seed0[m] for m in ("dcr", "pairwise_dcr", "coe")) > seed0["popularity"]


def test_the_readme_quotes_the_pages_means():
    table = random_split_table()
    readme = (ROOT / "README.md").read_text()
    row = re.search(r"^\| ML-100K, random split \|(.+)\|$", readme, re.M)
    assert row, "the README's implicit table"
    cells = [c.strip() for c in row.group(1).split("|")]
    order = [
        "popularity",
        "EASE",
        "implicit ALS (tuned)",
        "implicit BPR (tuned)",
        "DCR",
        "Pairwise DCR",
        "COE",
    ]
    assert cells == [f"{table[label][0]} / {table[label][1]}" for label in order]
