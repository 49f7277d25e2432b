"""The SCORE reproduce protocol: the CLI end to end on a small generated
table, and (slow) the paper's Zoo figures on the real data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ordrec.trainer.cli import main as cli_main
from tests.conftest import data_file


def write_table(path: Path, n: int = 40, m: int = 4, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, size=(n, m))
    lines = ["id," + ",".join(f"att{t}" for t in range(m))]
    lines += [f"obj{i}," + ",".join(str(c) for c in row) for i, row in enumerate(codes)]
    path.write_text("\n".join(lines) + "\n")


def test_reproduce_writes_the_three_methods(tmp_path, capsys):
    data = tmp_path / "small" / "table.csv"
    data.parent.mkdir()
    write_table(data)
    out = tmp_path / "rows.json"
    code = cli_main(
        [
            "reproduce",
            "score",
            "--data",
            str(data),
            "--format",
            "csv",
            "--runs",
            "2",
            "--max-iter",
            "2",
            "--ratio",
            "1,0.5",
            "--quiet",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    methods = {r["method"] for r in rows}
    assert methods == {"SCORE (multi-map)", "single map", "disjoint maps"}
    by = {(r["method"], r["setting"]["r"], r["metric"]): r for r in rows}
    for method in methods:
        assert (method, 1.0, "preservation") in by and (method, 0.5, "preservation_hidden") in by
        assert (method, 1.0, "preservation_hidden") not in by  # nothing is hidden at r = 1
    assert ("SCORE (multi-map)", 0.5, "relatedness_median") in by
    for r in rows:
        assert r["runs"] == 2 and r["setting"]["data"] == "small"
        if r["metric"].startswith("preservation"):
            assert 0.0 <= r["mean"] <= 1.0
    assert "SCORE (multi-map)" in capsys.readouterr().out


def test_unknown_aspect_is_a_usage_error(tmp_path, capsys):
    data = tmp_path / "table.csv"
    write_table(data)
    code = cli_main(
        [
            "reproduce",
            "score",
            "--data",
            str(data),
            "--format",
            "csv",
            "--runs",
            "1",
            "--aspects",
            "att0,nope",
            "--quiet",
        ]
    )
    assert code == 2 and "nope" in capsys.readouterr().err


# ------------------------------------------------------------------ real data
def _zoo() -> Path:
    return data_file("zoo", "zoo.data")


@pytest.mark.slow
def test_zoo_table1_multiple_maps_beat_one_map(tmp_path):
    out = tmp_path / "t1.json"
    assert (
        cli_main(
            [
                "reproduce",
                "score",
                "--data",
                str(_zoo()),
                "--aspects",
                "type,legs,predator",
                "--ratio",
                "1",
                "--runs",
                "2",
                "--modes",
                "multi,single",
                "--quiet",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = {r["method"]: r["mean"] for r in json.loads(out.read_text()) if r["metric"] == "preservation"}
    assert rows["SCORE (multi-map)"] >= 0.98  # paper Table 1: 0.98
    assert rows["single map"] < 0.9  # paper: 0.82


@pytest.mark.slow
def test_zoo_all_aspects_half_split_score_wins(tmp_path):
    out = tmp_path / "all.json"
    assert (
        cli_main(
            [
                "reproduce",
                "score",
                "--data",
                str(_zoo()),
                "--ratio",
                "0.5",
                "--runs",
                "2",
                "--quiet",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())
    pres = {r["method"]: r["mean"] for r in rows if r["metric"] == "preservation"}
    assert pres["SCORE (multi-map)"] > max(pres["single map"], pres["disjoint maps"])
    related = [r["mean"] for r in rows if r["metric"] == "relatedness_median"]
    assert related and related[0] > 0
