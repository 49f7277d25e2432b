"""KNNSCAL's neighbour-embedding start and local term (``knnscal_local``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ordrec.trainer.models import knnscal_local as L
from ordrec.trainer.models.knnscal import KnnScal, knn_lists, neighbor_csr
from ordrec.trainer.models.knnscal_selection import KnnScalStartSelection, PolishedMap, embed, served
from ordrec.trainer.models.pipeline import configure
from tests.gradient_check import assert_gradient

ROOT = Path(__file__).resolve().parents[1]


def fitted(data, **flat) -> PolishedMap:
    """KNNSCAL as a job table configures it from flat settings (the estimator, its validated
    iterations, the start selection and the polish), fitted on ``data``."""
    return configure("knnscal", flat).fit(data, check_memory=False).estimator


def start_selection(data, **flat) -> KnnScalStartSelection:
    """The fitted start selection of :func:`fitted` (its ``estimator_``: the validated fit kept)."""
    return fitted(data, **flat).estimator_


def fit_knnscal(data, **flat) -> KnnScal:
    """The served map of :func:`fitted`."""
    return fitted(data, **flat).best_estimator_


def clusters(n_per=40, n_clusters=4, dim=8, k=6, seed=0):
    """Planted clusters in `dim` dimensions, far apart, and their exact k-NN lists."""
    rng = np.random.default_rng(seed)
    centres = 6.0 * rng.standard_normal((n_clusters, dim))
    points = np.concatenate([c + rng.standard_normal((n_per, dim)) for c in centres])
    labels = np.repeat(np.arange(n_clusters), n_per)
    return points, knn_lists(points, k, labels=labels)


def affinities(graph, decay=2.0):
    indptr, col, rnk = neighbor_csr(graph)
    n = len(graph.vertices)
    return L.rank_affinities(indptr, col, rnk, n, decay)


def test_rank_affinities_are_symmetric_sum_to_one_on_the_symmetrised_graph():
    _, graph = clusters(n_per=10, n_clusters=2)
    P = affinities(graph, decay=2.0)
    assert abs(P.sum() - 1.0) < 1e-12
    assert abs(P - P.T).max() < 1e-15
    indptr, col, _ = neighbor_csr(graph)
    src = np.repeat(np.arange(20), np.diff(indptr))
    support = {(int(a), int(b)) for a, b in zip(src, col)} | {(int(b), int(a)) for a, b in zip(src, col)}
    assert set(zip(*map(list, P.nonzero()))) == support


def test_rank_affinities_fall_with_rank_unless_the_decay_is_zero():
    # Vertex 0 lists 1, 2, 3 in that order; 1, 2 and 3 list only vertex 4.
    indptr = np.array([0, 3, 4, 5, 6, 6])
    col = np.array([1, 2, 3, 4, 4, 4], dtype=np.int32)
    rnk = np.array([1, 2, 3, 1, 1, 1], dtype=np.int32)
    P = L.rank_affinities(indptr, col, rnk, 5, 2.0)
    assert P[0, 1] > P[0, 2] > P[0, 3] > 0
    flat = L.rank_affinities(indptr, col, rnk, 5, 0.0)
    assert flat[0, 1] == flat[0, 2] == flat[0, 3]


def test_auto_rank_decay_grows_with_the_longest_list_and_is_two_at_k_ten():
    for k, decay in ((5, 1.5), (10, 2.0), (20, 3.0)):
        _, graph = clusters(n_per=15, n_clusters=2, k=k)
        assert KnnScalStartSelection(KnnScal(), rank_decay="auto").decay(neighbor_csr(graph)[0]) == decay
    assert KnnScalStartSelection(KnnScal(), rank_decay=0.5).decay(neighbor_csr(graph)[0]) == 0.5
    with pytest.raises(ValueError, match="neighbor_embedding_rank_decay"):
        fit_knnscal(graph, neighbor_embedding_rank_decay="wide")


def test_auto_rank_decay_at_k_ten_gives_the_fixed_decay_two_map():
    _, graph = clusters(n_per=20, n_clusters=2, dim=5, k=10, seed=7)
    common = {"random_state": 0, "neighbor_embedding": "exact", "max_iter": 0, "neighbor_embedding_starts": 1}
    auto = fit_knnscal(graph, neighbor_embedding_rank_decay="auto", **common)
    fixed = fit_knnscal(graph, neighbor_embedding_rank_decay=2.0, **common)
    np.testing.assert_array_equal(auto.coordinates_, fixed.coordinates_)


def test_exact_kl_gradient_matches_finite_differences():
    _, graph = clusters(n_per=8, n_clusters=2, dim=4, k=4, seed=1)
    P = affinities(graph)
    Y = np.random.default_rng(1).standard_normal((16, 2))
    args = (P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data)
    grad = np.zeros_like(Y)
    L.kl_gradient_exact(Y, *args, 1.0, grad)
    assert_gradient(lambda Z: L.kl_divergence_exact(Z, *args), Y, grad, range(0, 16, 3), rel=1e-6)


def test_exact_neighbor_embedding_lowers_kl_and_separates_clusters():
    points, graph = clusters()
    P = affinities(graph)
    start = 1e-4 * np.random.default_rng(0).standard_normal((points.shape[0], 2))
    Y = L.tsne_exact(start, P, n_iter=300, exaggeration_iter=100)
    args = (P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data)
    assert L.kl_divergence_exact(Y, *args) < 0.5 * L.kl_divergence_exact(start, *args)
    assert label_accuracy(Y, graph.labels) > 0.95


def test_sampled_neighbor_embedding_separates_clusters():
    points, graph = clusters()
    start = np.random.default_rng(0).standard_normal((points.shape[0], 2))
    Y = L.neighbor_embedding_sampled(start, affinities(graph), n_epochs=200, seed=3)
    assert label_accuracy(start, graph.labels) < 0.6
    assert label_accuracy(Y, graph.labels) > 0.95


def label_accuracy(Y, labels, k=5):
    """Share of points whose k map neighbours' majority label is their own."""
    d = ((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    near = np.argsort(d, axis=1)[:, :k]
    votes = [np.bincount(labels[row]).argmax() for row in near]
    return float(np.mean(np.array(votes) == labels))


# ------------------------------------------------------------- validation
def test_validated_iterations_never_score_below_their_start():
    _, graph = clusters(n_per=40, n_clusters=4, dim=10, k=8, seed=6)
    start = fit_knnscal(
        graph, random_state=0, neighbor_embedding="exact", neighbor_embedding_rank_decay=2.0, max_iter=0
    )
    always = fit_knnscal(
        graph,
        random_state=0,
        neighbor_embedding="exact",
        neighbor_embedding_rank_decay=2.0,
        max_iter=40,
        keep_iterations="always",
    )
    checked = start_selection(
        graph,  # step 4 alone: a kept polish (step 5) would move the map again
        random_state=0,
        neighbor_embedding="exact",
        neighbor_embedding_rank_decay=2.0,
        max_iter=40,
        keep_iterations="validated",
        polish_rounds=0,
    ).estimator_
    score = lambda est: sum(L.graph_agreement(est.coordinates_, *est.graph_))  # noqa: E731
    assert score(checked.estimator_) == max(score(start), score(always)) == checked.graph_score_
    assert checked.iterations_kept_ == (score(always) >= score(start))


def test_several_neighbor_embedding_starts_keep_the_best_scoring_one():
    _, graph = clusters(n_per=40, n_clusters=4, dim=10, k=8, seed=6)
    common = {"random_state": 0, "neighbor_embedding": "exact", "max_iter": 0}
    single = start_selection(graph, neighbor_embedding_starts=1, **common)
    several = start_selection(graph, neighbor_embedding_starts=4, **common)
    assert several.ne_scores_.shape == (4,) and np.unique(several.ne_scores_).size > 1  # the starts differ
    assert several.ne_scores_[0] == single.ne_scores_[0]  # the first start is the single start
    assert several.ne_start_ == int(np.argmax(several.ne_scores_))
    # With no iterations the validation picks between the kept start and the geodesic start, so the
    # ensemble's score is the maximum over a superset of the single start's candidates.
    assert several.estimator_.graph_score_ >= several.ne_scores_.max() - 1e-12
    assert several.estimator_.graph_score_ >= single.estimator_.graph_score_


def test_the_kept_neighbor_embedding_start_is_the_map_of_its_seed():
    _, graph = clusters(n_per=30, n_clusters=3, dim=6, k=6, seed=4)
    common = {"random_state": 0, "neighbor_embedding": "exact", "max_iter": 0, "keep_iterations": "always"}
    several = start_selection(graph, neighbor_embedding_starts=3, **common)
    kept = several.ne_start_
    indptr, col, rnk = neighbor_csr(graph)
    est = KnnScal(random_state=0)
    start = est.initial_configuration(indptr, col, rnk, 90, seed=None if kept == 0 else (0, kept))
    alone = embed("exact", start, affinities(graph, decay=several.decay(indptr)), seed=0)
    assert sum(L.graph_agreement(alone, indptr, col, rnk)) == several.ne_scores_[kept]
    coordinates = served(several).coordinates_
    assert sum(L.graph_agreement(coordinates, indptr, col, rnk)) == several.ne_scores_[kept]


def test_several_starts_give_the_same_map_for_the_same_seed():
    _, graph = clusters(n_per=30, n_clusters=3, dim=6, k=6, seed=4)
    common = {"random_state": 0, "neighbor_embedding_starts": 3, "max_iter": 5}
    np.testing.assert_array_equal(
        fit_knnscal(graph, **common).coordinates_, fit_knnscal(graph, **common).coordinates_
    )


def test_graph_agreement_of_the_truth_on_an_embeddable_graph_is_one():
    points = np.random.default_rng(0).uniform(size=(80, 2))
    graph = knn_lists(points, 6)
    oa, recall = L.graph_agreement(points, *neighbor_csr(graph))
    assert oa == 1.0 and recall == 1.0
    shuffled = np.random.default_rng(1).permutation(points)
    assert max(L.graph_agreement(shuffled, *neighbor_csr(graph))) < 0.7


def test_above_the_small_n_cut_the_fit_is_the_geodesic_start_refined_as_before():
    _, graph = clusters(n_per=20, n_clusters=2, dim=5, k=5, seed=7)
    small_cut = start_selection(graph, random_state=0, max_iter=20, solver={"exact_max_n": 10})
    previous = fit_knnscal(
        graph, random_state=0, max_iter=20, neighbor_embedding="none", keep_iterations="always"
    )
    assert not small_cut.neighbor_embedding_used_ and np.isnan(small_cut.estimator_.graph_score_)
    np.testing.assert_array_equal(served(small_cut).coordinates_, previous.coordinates_)


# ------------------------------------------------------------- local term
def local_problem(weight=0.05, seed=2):
    """A small fitted E+ and a LocalStress over it, at a random configuration."""
    _, graph = clusters(n_per=8, n_clusters=2, dim=4, k=4, seed=seed)
    est = fit_knnscal(
        graph, random_state=0, neighbor_embedding="none", max_iter=0, solver={"reorder": "none"}
    )
    local = L.LocalStress(
        (est.plus_indptr_, est.plus_col_, *est.entry_weights()),
        affinities(graph),
        3.0,
        weight,
        est.weight_total_,
    )
    X = np.random.default_rng(seed).standard_normal((16, 2))
    return local, X, est.disparities_


def test_local_objective_gradient_matches_finite_differences():
    local, X, delta = local_problem()
    _, grad = local.value_and_gradient(X, delta)
    assert_gradient(lambda Z: local.value_and_gradient(Z, delta)[0], X, grad, range(0, 16, 3), rel=1e-6)


def test_local_objective_is_the_stress_per_weight_plus_the_weighted_kl_at_the_embedding_scale():
    local, X, delta = local_problem(weight=0.5)
    stress_only = L.LocalStress(
        (local.indptr, local.col, local.rnk, local.q, local.edge_weight),
        affinities_of(local),
        3.0,
        0.0,
        local.total,
    )
    kl = L.kl_divergence_exact(3.0 * X, *local.p)
    assert (
        abs(local.value_and_gradient(X, delta)[0] - stress_only.value_and_gradient(X, delta)[0] - 0.5 * kl)
        < 1e-12
    )


def affinities_of(local):
    from scipy import sparse

    indptr, col, val = local.p
    return sparse.csr_matrix((val, col, indptr))


def test_local_descent_never_raises_the_objective_and_lowers_it_from_a_random_start():
    local, X, delta = local_problem()
    values = [local.value_and_gradient(X, delta)[0]]
    for _ in range(4):
        X = local.descend(X, delta, 3)
        values.append(local.value_and_gradient(X, delta)[0])
    assert all(b <= a for a, b in zip(values, values[1:]))
    assert values[-1] < 0.9 * values[0]


def test_with_a_local_term_no_configuration_step_raises_the_fit_objective():
    _, graph = clusters(n_per=30, n_clusters=3, dim=6, k=6, seed=4)
    est = fit_knnscal(
        graph, random_state=0, neighbor_embedding="exact", local_weight=0.05, max_iter=15, tol=0.0
    )
    history = est.local_history_
    assert [stage for _, stage, _ in history[1:3]] == ["step", "isotonic"]
    steps = [
        (before, after) for (_, _, before), (_, stage, after) in zip(history, history[1:]) if stage == "step"
    ]
    assert len(steps) == 15 and all(after <= before for before, after in steps)


def test_local_weight_zero_is_the_plain_stress_loop():
    _, graph = clusters(n_per=20, n_clusters=2, dim=5, k=5, seed=7)
    common = {"random_state": 0, "neighbor_embedding": "exact", "max_iter": 10, "keep_iterations": "always"}
    plain = fit_knnscal(graph, local_weight=0.0, **common)
    local = fit_knnscal(graph, local_weight=0.05, **common)
    assert plain.local_history_ == [] and len(local.local_history_) > 1
    assert not np.array_equal(plain.coordinates_, local.coordinates_)


def test_the_local_term_keeps_more_listed_neighbours_and_order_than_the_plain_stress_from_one_start():
    _, graph = clusters(n_per=40, n_clusters=4, dim=10, k=8, seed=6)
    common = {
        "random_state": 0,
        "neighbor_embedding": "exact",
        "neighbor_embedding_starts": 1,  # the start this comparison was written for
        "max_iter": 100,
        "tol": 0.0,
        "keep_iterations": "always",
    }
    plain = fit_knnscal(graph, local_weight=0.0, **common)
    local = fit_knnscal(graph, local_weight=0.003, **common)
    plain_oa, plain_recall = L.graph_agreement(plain.coordinates_, *plain.graph_)
    local_oa, local_recall = L.graph_agreement(local.coordinates_, *local.graph_)
    assert local_oa > plain_oa and local_recall > plain_recall + 0.01


def kl_gradient_at_one_and_two_threads() -> None:
    """Asserts the exact KL gradient is the same at one and two numba threads (run in a process
    started with NUMBA_NUM_THREADS=2)."""
    import numba

    _, graph = clusters(n_per=50, n_clusters=4, dim=6, k=8, seed=3)
    P = affinities(graph)
    Y = np.random.default_rng(3).standard_normal((200, 2))
    args = (P.indptr.astype(np.int64), P.indices.astype(np.int64), P.data, 1.0)
    results = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        grad = np.zeros_like(Y)
        results.append((L.kl_gradient_exact(Y, *args, grad), grad))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_the_exact_kl_gradient_does_not_depend_on_the_thread_count():
    # A rounding difference in Z becomes another map after t-SNE's iterations. In its own process:
    # a pytest-xdist worker runs one numba thread (tests/conftest.py).
    code = "from tests.test_knnscal_local import kl_gradient_at_one_and_two_threads as check; check()"
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
