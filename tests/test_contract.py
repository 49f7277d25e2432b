"""The contract every model passes, through the same generic path the CLI uses:
estimator conventions, determinism, a registry round trip into the serving
index, and recovery of a planted structure whose right answer is known."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
from scipy.stats import kendalltau

from ordrec.service.indices.models import build_index, kinds
from ordrec.service.storage.registry import Registry
from ordrec.trainer import sample
from ordrec.trainer.models import estimator_class
from ordrec.trainer.models.coe import COESolver
from ordrec.trainer.models.dcr import PAPER_PARAMS
from ordrec.trainer.models.pipeline import accepted_params


def concordance(predicted: np.ndarray, truth: np.ndarray) -> float:
    """(Kendall's tau-b + 1) / 2: 0.5 is chance, 1 a perfect order."""
    tau = kendalltau(predicted, truth).statistic
    return (tau + 1) / 2


def users_concordance(index, truth_scores: np.ndarray, n_users: int = 60) -> float:
    """Mean concordance of each user's served item scores with the planted ones."""
    items = np.arange(truth_scores.shape[1])
    return float(np.mean([concordance(index.score_items(u, items), truth_scores[u]) for u in range(n_users)]))


def rtf_concordance(index, data, truth, n_posts: int = 60) -> float:
    posts = np.unique(np.stack([data.user, data.item], 1), axis=0)[:n_posts]
    values = []
    for u, i in posts:
        rows, scores, fallback = index.tags(int(u), int(i), len(data.tags))
        assert fallback == "none"
        served = np.empty(len(data.tags))
        served[rows] = scores
        values.append(concordance(served, truth.scores(int(u), int(i))))
    return float(np.mean(values))


def score_map_agreement(index, data, truth) -> float:
    """Each aspect's map carries that aspect: how much more often an object's nearest
    neighbour on the map shares its value than a random object does (mean over aspects)."""
    lift = []
    for a, aspect in enumerate(data.attributes):
        points = index.maps[aspect]["objects"]
        codes = data.codes[:, a]
        _, nearest = points.tree.query(points.coords, k=2)
        chance = np.sum((np.bincount(codes) / codes.size) ** 2)
        lift.append(np.mean(codes[nearest[:, 1]] == codes) - chance)
    return float(np.mean(lift))


def knnscal_order(index, data, points) -> float:
    """Recall@10 of the planted true 10-NN lists in the served map (chance: 10/199;
    the planted points themselves: 1)."""
    served = index.maps[""]["objects"]
    _, near = served.tree.query(served.coords, k=11)
    hits = [
        len(set(near[s, 1:]) & set(data.neighbor[data.source == s])) / 10 for s in range(len(data.vertices))
    ]
    return float(np.mean(hits))


def _dcr():
    # the rating order is the paper's objective; the defaults' top-N objective has its planted
    # test in tests/test_topn.py
    data, truth = sample.planted_ratings_with_truth(seed=1)
    params = {**PAPER_PARAMS, "max_iter": 15}
    return data, params, lambda index: users_concordance(index, truth.latent()), 0.7


def _coe():
    # the rating order is the paper's objective; the defaults' top-N objective (which items a
    # user picks at all) has its planted test in tests/test_coe_topn.py
    data, truth = sample.planted_ratings_with_truth(seed=1)
    params = {"max_iter": 10, "n_components": 2, "unrated_share": 0.0, "solver": COESolver(type_a_share=None)}
    return data, params, lambda index: users_concordance(index, truth.latent()), 0.6


def _rtf():
    data, truth = sample.planted_tags_with_truth(seed=1)
    params = {"n_components": 8, "max_iter": 30, "verbose": False}
    return data, params, lambda index: rtf_concordance(index, data, truth), 0.65


def _score():
    data, truth = sample.planted_attributes_with_truth(seed=1)
    return data, {"max_iter": 5}, lambda index: score_map_agreement(index, data, truth), 0.2


def _knnscal():
    data, points = sample.planted_neighbors(n=200, seed=1)
    return data, {"max_iter": 200}, lambda index: knnscal_order(index, data, points), 0.5


CASES = {"dcr": _dcr, "coe": _coe, "rtf": _rtf, "score": _score, "knnscal": _knnscal}


def test_every_kind_has_a_contract_case():
    assert set(CASES) == set(kinds.names())


@pytest.fixture(scope="module", params=kinds.names())
def fitted(request):
    kind = request.param
    data, params, quality, threshold = CASES[kind]()
    estimator = estimator_class(kind)(random_state=3, **params)
    assert estimator.fit(data) is estimator
    return kind, data, params, estimator, quality, threshold


def test_estimator_conventions(fitted):
    kind, _, params, estimator, _, _ = fitted
    cls = type(estimator)
    assert cls.kind == kind and cls.input_shape in ("ratings", "tags", "attributes", "neighbors")
    got = estimator.get_params()
    assert set(got) == set(cls.param_names()) and "random_state" in got
    assert cls(**got).get_params() == got  # hyperparameters only, stored as given
    for key, value in params.items():
        assert got[key] == value


def test_same_seed_same_artifact(fitted):
    kind, data, params, estimator, _, _ = fitted
    again = estimator_class(kind)(random_state=3, **params).fit(data).to_artifact()
    first = estimator.to_artifact()
    assert set(first.arrays) == set(again.arrays)
    for key in first.arrays:
        np.testing.assert_array_equal(first.arrays[key], again.arrays[key], err_msg=f"{kind}: {key}")


def test_artifact_round_trip_serves_the_same(fitted, tmp_path):
    kind, _, _, estimator, quality, _ = fitted
    artifact = estimator.to_artifact()
    for key, array in artifact.arrays.items():
        if np.issubdtype(np.asarray(array).dtype, np.floating):
            assert np.all(np.isfinite(array)), f"{kind}: {key} is not finite"
    registry = Registry(tmp_path)
    registry.publish(kind, artifact)
    loaded = registry.load(kind)
    assert loaded.kind == kind
    # The manifest records the settings under the names a job table writes: the estimator's
    # parameters, DCR's and COE's solver fields flat beside them, DCR's refinement and selection.
    params = estimator.get_params()
    if kind in ("dcr", "coe"):
        params.update(asdict(estimator.solver_settings()))
    assert set(loaded.hyperparameters) <= set(accepted_params(kind))
    for key, value in loaded.hyperparameters.items():
        if params.get(key) is not None and not isinstance(params[key], (list, tuple)):
            assert value == params[key], key
    in_memory, served = build_index(artifact), build_index(loaded)
    assert quality(in_memory) == pytest.approx(quality(served), abs=1e-5)


def test_recovers_the_planted_structure(fitted):
    kind, _, _, estimator, quality, threshold = fitted
    value = quality(build_index(estimator.to_artifact()))
    assert value > threshold, f"{kind}: planted-structure score {value:.3f} <= {threshold}"
