"""DCR protocol: splits, NDCG@10, the reproduce command, and (slow) ML-100K."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.cli import main
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.reproduce.dcr import (
    PAPER_DCR,
    fixed_scorer,
    item_means,
    ndcg_at_k,
    per_user_split,
    validation_split,
)
from tests.conftest import data_file


def ratings(seed=0, n_users=50, n_items=40):
    rng = np.random.default_rng(seed)
    counts = rng.integers(5, 30, size=n_users)
    user = np.repeat(np.arange(n_users), counts)
    item = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts])
    quality = rng.normal(size=n_items)
    rating = np.clip(np.round(3 + quality[item] + 0.5 * rng.normal(size=user.size)), 1, 5)
    return Ratings(
        IdMap([f"u{i}" for i in range(n_users)]),
        IdMap([f"i{i}" for i in range(n_items)]),
        user.astype(np.int32),
        item.astype(np.int32),
        rating.astype(np.float32),
    )


def test_per_user_split_takes_n_and_drops_short_users():
    data = ratings()
    train, test = per_user_split(data, 10, np.random.default_rng(0))
    counts = np.bincount(data.user, minlength=data.n_users)
    tr = np.bincount(train.user, minlength=data.n_users)
    te = np.bincount(test.user, minlength=data.n_users)
    kept = counts >= 20
    assert np.all(tr[kept] == 10) and np.all(te[kept] == counts[kept] - 10)
    assert np.all(tr[~kept] == 0) and np.all(te[~kept] == 0)
    pairs = set(zip(train.user.tolist(), train.item.tolist()))
    assert not pairs & set(zip(test.user.tolist(), test.item.tolist()))
    # a different seed draws different training ratings
    other, _ = per_user_split(data, 10, np.random.default_rng(1))
    assert pairs != set(zip(other.user.tolist(), other.item.tolist()))


def test_validation_split_is_carved_from_training_only():
    data = ratings(1)
    train, _ = per_user_split(data, 10, np.random.default_rng(0))
    fit, val = validation_split(train, np.random.default_rng(0))
    assert len(fit) + len(val) == len(train)
    got = set(zip(fit.user.tolist(), fit.item.tolist())) | set(zip(val.user.tolist(), val.item.tolist()))
    assert got == set(zip(train.user.tolist(), train.item.tolist()))
    per = np.bincount(val.user, minlength=data.n_users)
    assert set(per[per > 0].tolist()) == {2}  # a quarter of 10, at least two


def test_ndcg_is_one_for_the_ideal_order_and_matches_a_hand_computation():
    users = IdMap(["a"])
    items = IdMap([str(i) for i in range(4)])
    test = Ratings(
        users, items, np.zeros(4, np.int32), np.arange(4, dtype=np.int32), np.array([3, 5, 1, 4], np.float32)
    )
    assert ndcg_at_k(fixed_scorer(np.array([3.0, 5, 1, 4])), test) == pytest.approx(1.0)
    worst = ndcg_at_k(fixed_scorer(np.array([4.0, 1, 5, 2])), test)  # order 2, 0, 3, 1
    gains = np.exp2([1, 3, 4, 5]) - 1
    disc = 1 / np.log2(np.arange(2, 6))
    assert worst == pytest.approx(gains @ disc / (np.sort(gains)[::-1] @ disc))


def test_damped_mean_moves_toward_the_global_mean():
    data = ratings(2)
    raw, damped = item_means(data, 0.0), item_means(data, 50.0)
    mu = data.rating.mean()
    rated = np.bincount(data.item, minlength=data.n_items) > 0
    assert np.all(np.abs(damped - mu)[rated] <= np.abs(raw - mu)[rated] + 1e-9)


def write_udata(directory: Path, data: Ratings) -> Path:
    """``data`` as ``directory/u.data`` (MovieLens 100K lines); returns the path."""
    path = directory / "u.data"
    with open(path, "w") as fh:
        for u, i, r in zip(data.user, data.item, data.rating):
            fh.write(f"{u + 1}\t{i + 1}\t{int(r)}\t881250949\n")
    return path


def test_reproduce_command_writes_rows(tmp_path, capsys):
    path = write_udata(tmp_path, ratings(3, n_users=40))
    out = tmp_path / "rows.json"
    code = main(
        [
            "reproduce",
            "dcr",
            "--data",
            str(path),
            "--n-train",
            "5",
            "--runs",
            "2",
            "--pairwise",
            "--variants",
            "shrunk",
            "--n-components",
            "3",
            "--max-iter",
            "3",
            "--pairwise-max-iter",
            "2",
            "--json",
            str(out),
            "--quiet",
            "--dataset",
            "tiny",
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    methods = {r["method"] for r in rows}
    assert {
        "DCR",
        "Pairwise DCR",
        "DCR-shrunk",
        "Pairwise DCR-shrunk",
        "Random",
        "Item mean",
        "Damped item mean",
    } <= methods
    for r in rows:
        assert r["setting"] == {"N": 5} and r["metric"] == "ndcg@10" and r["runs"] == 2
        assert 0 < r["mean"] <= 1
    assert "DCR protocol on tiny" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fit", [["--init", "random", "--stop", "tol"], ["--init", "marginal", "--stop", "validation"]]
)
def test_reproduce_grid_on_test_is_a_separate_diagnostic_row(tmp_path, fit):
    path = write_udata(tmp_path, ratings(4, n_users=30))
    out, plain = tmp_path / "rows.json", tmp_path / "plain.json"
    common = [
        "reproduce",
        "dcr",
        "--data",
        str(path),
        "--n-train",
        "5",
        "--runs",
        "1",
        "--n-components",
        "2",
        "--max-iter",
        "3",
        "--quiet",
        "--dataset",
        "tiny",
        "--no-references",
        *fit,
    ]
    assert main(common + ["--grid-on-test", "--json", str(out)]) == 0
    assert main(common + ["--json", str(plain)]) == 0
    rows = {r["method"]: r["mean"] for r in json.loads(out.read_text())}
    assert set(rows) == {"DCR", "DCR (grid best on test)"}
    # the diagnostic chooses nothing else: the DCR row is the one of a run without it
    assert rows["DCR"] == {r["method"]: r["mean"] for r in json.loads(plain.read_text())}["DCR"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole reproduce run: minutes on an idle machine, more on a busy one
def test_ml100k_dcr_meets_table_2_with_the_readmes_command(tmp_path):
    """README: `reproduce dcr --data u.data --n-train 10,20,50 --runs 5 --pairwise` (seed 0) puts
    DCR at or above Table 2 at every N and Pairwise DCR above DCR at every N."""
    path = data_file("ml-100k", "u.data")
    out = tmp_path / "rows.json"
    argv = ["reproduce", "dcr", "--data", str(path), "--n-train", "10,20,50", "--runs", "5", "--pairwise"]
    assert main([*argv, "--json", str(out), "--quiet"]) == 0
    got = {(r["method"], r["setting"]["N"]): r["mean"] for r in json.loads(out.read_text())}
    for n, paper in PAPER_DCR["ml-100k"].items():
        assert got[("DCR", n)] >= paper, (n, got[("DCR", n)], paper)
        assert got[("Pairwise DCR (always refined)", n)] > got[("DCR", n)]
        # kept only where it wins on validation: never below the pointwise model it started from
        assert got[("Pairwise DCR", n)] >= got[("DCR", n)]
        assert got[("DCR", n)] > got[("Damped item mean", n)] > got[("Random", n)] + 0.05


def test_select_takes_the_best_or_the_one_standard_error_candidate():
    from ordrec.trainer.reproduce.dcr import fit_stopped, ndcg_values, select, validation_split

    data = ratings(5, n_users=40)
    base = dict(n_components=2, max_iter=4, learning_rate=0.05, random_state=1)
    choices = [
        dict(init="marginal", init_std=0.02, n_components=2),
        dict(init="random", init_std=0.3, n_components=3),
        dict(init="random", init_std=0.1, n_components=4),
    ]
    chosen = select(base, choices, data, np.random.default_rng(7), 2, lambda msg: None, "one-se")
    top = select(base, choices, data, np.random.default_rng(7), 2, lambda msg: None, "best")
    rng = np.random.default_rng(7)
    splits = [validation_split(data, rng) for _ in range(2)]
    values, epochs = [], []
    for choice in choices:
        fits = [fit_stopped(dict(base, **choice), f, v)[0] for f, v in splits]
        values.append(
            np.concatenate(
                [
                    ndcg_values(DCRIndex.from_artifact(m.to_artifact()).score_items, v)
                    for m, (_, v) in zip(fits, splits)
                ]
            )
        )
        epochs.append(np.median([m.best_epochs_ for m in fits], axis=0).round().astype(int).tolist())
    best = int(np.argmax([v.mean() for v in values]))
    within = [
        j
        for j in range(3)
        if (values[best] - values[j]).mean()
        <= (values[best] - values[j]).std(ddof=1) / np.sqrt(values[j].size)
    ]
    assert (chosen["init"], chosen["n_components"]) == (
        choices[within[0]]["init"],
        choices[within[0]]["n_components"],
    )
    assert chosen["level_epochs"] == epochs[within[0]]
    assert (top["init"], top["n_components"], top["level_epochs"]) == (
        choices[best]["init"],
        choices[best]["n_components"],
        epochs[best],
    )


def test_select_prefers_the_first_candidate_unless_another_wins_clearly():
    from ordrec.trainer.reproduce.dcr import select

    data = ratings(5, n_users=40)
    same = dict(init="marginal", init_std=0.02, n_components=2)
    # identical candidates tie exactly: the first (simplest) is kept
    chosen = select(
        dict(max_iter=3, random_state=1),
        [dict(same), dict(same, verbose=False)],
        data,
        np.random.default_rng(0),
        2,
        lambda msg: None,
    )
    assert "verbose" not in chosen and len(chosen["level_epochs"]) == 4


def test_reproduce_chooses_start_and_rank_only_with_ten_held_out_ratings(tmp_path, capsys):
    from ordrec.trainer.reproduce.dcr import held_out

    assert [held_out(n) for n in (10, 20, 39, 40, 50)] == [2, 5, 9, 10, 12]
    rng = np.random.default_rng(6)
    n_users, n_items, per_user = 12, 70, 55
    user = np.repeat(np.arange(n_users), per_user)
    item = np.concatenate([rng.choice(n_items, per_user, replace=False) for _ in range(n_users)])
    rating = np.clip(np.round(3 + rng.normal(size=n_items)[item] + 0.5 * rng.normal(size=user.size)), 1, 5)
    path = write_udata(
        tmp_path,
        Ratings(
            IdMap([f"u{i}" for i in range(n_users)]),
            IdMap([f"i{i}" for i in range(n_items)]),
            user.astype(np.int32),
            item.astype(np.int32),
            rating.astype(np.float32),
        ),
    )
    common = [
        "reproduce",
        "dcr",
        "--data",
        str(path),
        "--runs",
        "1",
        "--max-iter",
        "2",
        "--init-grid",
        "marginal,random",
        "--rank-grid",
        "2,3",
        "--select-folds",
        "2",
        "--val-tol",
        "0.001",
        "--no-references",
        "--dataset",
        "tiny",
    ]
    assert main(common + ["--n-train", "40"]) == 0
    assert capsys.readouterr().err.count("    select ") == 4
    assert main(common + ["--n-train", "10"]) == 0
    log = capsys.readouterr().err
    assert "    select " not in log and "init=marginal" in log and "n_components=2" in log


def test_protocol_fit_is_the_item_marginal_start_below_ten_held_out_ratings_and_random_rank_320_above():
    from ordrec.trainer.reproduce.dcr import LARGE_N_FIT, SMALL_N_FIT, protocol_fit

    for n in (10, 20, 39):
        assert {k: v for k, v in protocol_fit(n).items() if k != "pairwise_learning_rate"} == SMALL_N_FIT
        assert protocol_fit(n)["init"] == "marginal"
    for n in (40, 50, 100):
        assert {k: v for k, v in protocol_fit(n).items() if k != "pairwise_learning_rate"} == LARGE_N_FIT
        assert (protocol_fit(n)["init"], protocol_fit(n)["n_components"]) == ("random", 320)
    # the pairwise learning rate of the nearest swept N
    assert [protocol_fit(n)["pairwise_learning_rate"] for n in (5, 10, 14, 16, 20, 34, 36, 50, 200)] == [
        0.005,
        0.005,
        0.005,
        0.01,
        0.01,
        0.01,
        0.02,
        0.02,
        0.02,
    ]
    protocol_fit(50)["n_components"] = 1  # a copy: the constants are not changed through it
    assert LARGE_N_FIT["n_components"] == 320


def test_median_epochs_is_the_per_level_median_over_the_same_hold_outs():
    from ordrec.trainer.reproduce.dcr import fit_stopped, median_epochs

    data = ratings(8, n_users=40)
    params = dict(
        n_components=3,
        max_iter=12,
        learning_rate=0.05,
        init="random",
        init_std=0.1,
        random_state=2,
        patience=3,
    )
    got = median_epochs(params, data, np.random.default_rng(5), 3)
    rng = np.random.default_rng(5)
    epochs = [fit_stopped(params, *validation_split(data, rng))[0].best_epochs_ for _ in range(3)]
    assert got["level_epochs"] == [int(e) for e in np.median(np.array(epochs), axis=0).round()]
    assert {k: v for k, v in got.items() if k != "level_epochs"} == params


def test_sweep_scores_only_held_out_training_ratings(tmp_path, monkeypatch):
    import ordrec.trainer.reproduce.dcr as protocol

    path = write_udata(tmp_path, ratings(9, n_users=40))
    scored = []
    real = protocol.ndcg_values

    def spy(score_items, test, k=10):
        scored.append(set(zip(test.user.tolist(), test.item.tolist())))
        return real(score_items, test, k)

    monkeypatch.setattr(protocol, "ndcg_values", spy)
    out = tmp_path / "sweep.json"
    assert (
        main(
            [
                "reproduce",
                "dcr",
                "--data",
                str(path),
                "--n-train",
                "8",
                "--runs",
                "2",
                "--sweep",
                "--init-grid",
                "marginal,random",
                "--rank-grid",
                "2",
                "--sweep-lr",
                "0.05",
                "--sweep-pairwise-lr",
                "0.01",
                "--pairwise-max-iter",
                "2",
                "--select-folds",
                "2",
                "--max-iter",
                "3",
                "--quiet",
                "--dataset",
                "tiny",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())
    fits = {
        "DCR init=marginal n_components=2 learning_rate=0.05 init_std=0.05",
        "DCR init=random n_components=2 learning_rate=0.05 init_std=0.1",
    }
    assert {r["method"] for r in rows} == fits | {f"Pairwise {m} pairwise_learning_rate=0.01" for m in fits}
    assert all(r["metric"] == "val_ndcg@10" and r["runs"] == 2 for r in rows)
    # every scored list is a hold-out of the run's training ratings, never its test ratings
    per_run = 2 * 2 * 2  # candidates x folds x (fit, refined)
    assert len(scored) == 2 * per_run
    for run_index in range(2):
        train, test = per_user_split(
            protocol.load_ratings(type("A", (), dict(data=str(path), format="auto", skip_bad_lines=False))()),
            8,
            np.random.default_rng([0, 8, run_index]),
        )
        train_pairs = set(zip(train.user.tolist(), train.item.tolist()))
        for pairs in scored[run_index * per_run : (run_index + 1) * per_run]:
            assert pairs and pairs <= train_pairs


def test_sweep_set_adds_a_parameter_to_every_candidate(tmp_path, monkeypatch):
    import ordrec.trainer.reproduce.dcr as protocol

    path = write_udata(tmp_path, ratings(9, n_users=30))
    fitted = []
    real = protocol.fit_stopped

    def spy(params, fit, val):
        fitted.append((params["order"], params["prob_floor"], params["pairwise"]))
        return real(params, fit, val)

    monkeypatch.setattr(protocol, "fit_stopped", spy)
    out = tmp_path / "sweep.json"
    assert (
        main(
            [
                "reproduce",
                "dcr",
                "--data",
                str(path),
                "--n-train",
                "8",
                "--runs",
                "1",
                "--sweep",
                "--rank-grid",
                "2",
                "--sweep-set",
                "order=user,random",
                "--sweep-set",
                "prob_floor=0.01",
                "--sweep-set",
                "pairwise=false",
                "--select-folds",
                "1",
                "--max-iter",
                "2",
                "--quiet",
                "--dataset",
                "tiny",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    # values read as --set reads them: "false" is the boolean, not a (truthy) string
    assert sorted(fitted) == [("random", 0.01, False), ("user", 0.01, False)]
    methods = {r["method"] for r in json.loads(out.read_text())}
    assert {" ".join(m.split()[-3:]) for m in methods} == {
        "order=user prob_floor=0.01 pairwise=False",
        "order=random prob_floor=0.01 pairwise=False",
    }


@pytest.mark.parametrize("bad", ["order", "nonsense=1,2", "order="])
def test_sweep_set_refuses_what_is_not_a_dcr_parameter_list(tmp_path, bad):
    path = write_udata(tmp_path, ratings(9, n_users=30))
    with pytest.raises(SystemExit, match="--sweep-set"):
        main(
            [
                "reproduce",
                "dcr",
                "--data",
                str(path),
                "--n-train",
                "8",
                "--runs",
                "1",
                "--sweep",
                "--sweep-set",
                bad,
                "--quiet",
            ]
        )


def test_one_standard_error_choice_fits_every_candidate_on_the_same_hold_outs():
    from ordrec.trainer.models.protocol_selection import OneStandardErrorChoice
    from ordrec.trainer.reproduce.dcr import fit_stopped

    data = ratings(5, n_users=40)
    seen = []

    def fit(params, rest, held_out):
        seen.append((params["n_components"], rest.fingerprint(), held_out.fingerprint()))
        return fit_stopped(params, rest, held_out)[0]

    def per_user_rating(model, held_out):  # a stand-in score: the same for every candidate
        return np.bincount(held_out.user, weights=held_out.rating)[np.unique(held_out.user)]

    choice = OneStandardErrorChoice(
        fit,
        [dict(n_components=2), dict(n_components=3)],
        per_user_rating,
        folds=2,
        rule="one-se",
        random_state=np.random.default_rng(3),
    ).fit(data, dict(max_iter=3, random_state=1))
    assert [rank for rank, _, _ in seen] == [2, 2, 3, 3]
    assert [folds for _, *folds in seen[:2]] == [folds for _, *folds in seen[2:]]
    splits = [validation_split(data, rng) for rng in [np.random.default_rng(3)] for _ in range(2)]
    assert [f.fingerprint() for f, _ in splits] == [rest for _, rest, _ in seen[:2]]
    # equal scores: the first (simplest) candidate, with its per-level median epochs
    assert choice.best_index_ == 0 and choice.best_params_ == choice.cv_results_[0]["params"]
    assert choice.best_params_["n_components"] == 2 and len(choice.best_params_["level_epochs"]) == 4
    assert [r["mean_score"] for r in choice.cv_results_] == [choice.cv_results_[0]["mean_score"]] * 2
    with pytest.raises(ValueError, match="rule"):
        OneStandardErrorChoice(
            fit, [{}], per_user_rating, rule="worst", random_state=np.random.default_rng()
        ).fit(data)


def test_one_standard_error_choice_scores_by_every_scorer_and_the_first_chooses():
    from ordrec.trainer.models.protocol_selection import OneStandardErrorChoice
    from ordrec.trainer.reproduce.dcr import stopped_model

    data = ratings(6, n_users=30)

    def rank(sign):  # per-user values that prefer the smaller (sign -1) or the larger rank
        return lambda model, held_out: np.full(
            np.unique(held_out.user).size, sign * model.n_components, float
        )

    def chosen(scoring):
        return OneStandardErrorChoice(
            stopped_model,
            [dict(n_components=2), dict(n_components=3)],
            scoring,
            folds=2,
            random_state=np.random.default_rng(0),
        ).fit(data, dict(max_iter=2, random_state=0))

    smaller_first = chosen({"smaller": rank(-1), "larger": rank(1)})
    assert smaller_first.best_params_["n_components"] == 2
    assert [r["mean_scores"] for r in smaller_first.cv_results_] == [
        {"smaller": -2.0, "larger": 2.0},
        {"smaller": -3.0, "larger": 3.0},
    ]
    assert chosen({"larger": rank(1), "smaller": rank(-1)}).best_params_["n_components"] == 3
