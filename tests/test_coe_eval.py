"""COE protocol through the CLI on a small generated ratings file (u.data layout)."""
from __future__ import annotations

import json

import numpy as np

from trainer.cli import main


def test_reproduce_cli_writes_the_contract_rows(tmp_path):
    rng = np.random.default_rng(0)
    # planted: users and items on a line, rating falls with distance, so COE must beat the floor
    xu, yi = rng.uniform(-1, 1, 60), rng.uniform(-1, 1, 50)
    lines = []
    for u in range(60):
        for i in rng.choice(50, 25, replace=False):
            rating = int(np.clip(5 - np.floor(abs(xu[u] - yi[i]) * 2.5), 1, 5))
            lines.append(f"{u + 1}\t{i + 1}\t{rating}\t0")
    data = tmp_path / "u.data"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "rows.json"
    code = main(["reproduce", "coe", "--data", str(data), "--format", "ml-100k", "--runs", "2",
                 "--json", str(out), "--quiet", "--epochs", "10"])
    assert code == 0
    rows = json.loads(out.read_text())
    by = {(r["method"], r["metric"]): r for r in rows}
    for method in ("COE-S", "COE-G", "random", "popularity"):
        for metric in ("preservation_a", "preservation_b", "preservation_h", "prediction_a",
                       "prediction_b", "prediction_h", "knn1_h", "knn5_h"):
            assert by[(method, metric)]["runs"] == 2
    assert abs(by[("random", "preservation_h")]["mean"] - 0.5) < 0.1
    for method in ("COE-S", "COE-G"):
        assert by[(method, "preservation_h")]["mean"] > by[("random", "preservation_h")]["mean"] + 0.1
        assert by[(method, "prediction_a")]["mean"] > 0.6
