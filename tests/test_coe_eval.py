"""COE protocol through the CLI on a small generated ratings file (u.data layout)."""

from __future__ import annotations

import json

import numpy as np

from ordrec.trainer.cli import main


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
    code = main(
        [
            "reproduce",
            "coe",
            "--data",
            str(data),
            "--format",
            "ml-100k",
            "--runs",
            "2",
            "--json",
            str(out),
            "--quiet",
            "--max-iter",
            "10",
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    by = {(r["method"], r["metric"]): r for r in rows}
    for method in ("COE-S", "COE-G", "random", "popularity"):
        for metric in (
            "preservation_a",
            "preservation_b",
            "preservation_h",
            "prediction_a",
            "prediction_b",
            "prediction_h",
            "knn1_h",
            "knn5_h",
        ):
            assert by[(method, metric)]["runs"] == 2
    assert abs(by[("random", "preservation_h")]["mean"] - 0.5) < 0.1
    for method in ("COE-S", "COE-G"):
        assert by[(method, "preservation_h")]["mean"] > by[("random", "preservation_h")]["mean"] + 0.1
        assert by[(method, "prediction_a")]["mean"] > 0.6
        assert by[(method, "fit_cpu_seconds")]["runs"] == 2  # each method's own runs, not the last fit's


def test_tune_per_split_uses_observed_ratings_only(tmp_path, capsys, monkeypatch):
    from ordrec.trainer.reproduce import coe as protocol

    rng = np.random.default_rng(1)
    lines = [
        f"{u + 1}\t{i + 1}\t{int(rng.integers(1, 6))}\t0"
        for u in range(40)
        for i in rng.choice(30, 22, replace=False)
    ]
    data = tmp_path / "u.data"
    data.write_text("\n".join(lines) + "\n")
    seen_sizes = []
    real_tune = protocol.tune

    def spy(function, base, ratings, observed, rng, log):
        seen_sizes.append((len(ratings), int(observed.sum())))
        return real_tune(function, base, ratings, observed, rng, log)

    fitted_on = []
    real_fit = protocol.fit_and_evaluate

    def fit_spy(params, ratings, values, observed):
        fitted_on.append(len(ratings))
        return real_fit(params, ratings, values, observed)

    monkeypatch.setattr(protocol, "tune", spy)
    monkeypatch.setattr(protocol, "fit_and_evaluate", fit_spy)
    monkeypatch.setattr(
        protocol, "GRID", {"lam": [1.0, 4.0], "alpha": [1.0], "reg": [0.0], "group_power": [1.0, 0.0]}
    )
    assert (
        main(
            [
                "reproduce",
                "coe",
                "--data",
                str(data),
                "--format",
                "ml-100k",
                "--runs",
                "2",
                "--quiet",
                "--max-iter",
                "3",
                "--function",
                "sigmoid",
                "--tune",
                "--no-references",
            ]
        )
        == 0
    )
    assert "tuned per split" in capsys.readouterr().out
    # one tuning per split, each given the full data and that split's observed mask (80 %)
    assert len(seen_sizes) == 2
    for n, n_observed in seen_sizes:
        assert n == 880 and n_observed == round(0.8 * 22) * 40
    # tuning fits see only the split's observed ratings (18 of 22 per user); the split's model
    # gets all 880 (hidden ones only as evaluation targets): 4 grid points + 1 final fit per split
    assert sorted(fitted_on) == [18 * 40] * 8 + [880] * 2
