"""KNNSCAL: kernels (PAV, gradient, majorization), planted recovery, serving round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import isotonic_regression

from ordrec.service.indices.models.knnscal import KNNSCALIndex, place_point, placement_stress
from ordrec.service.storage.registry import Registry
from ordrec.trainer.models import knnscal_kernels as K
from ordrec.trainer.models.knnscal import KnnScal, KnnScalSolver, enlarged_edges, knn_lists, neighbor_csr
from ordrec.trainer.models.knnscal_selection import (
    KnnScalStartSelection,
    PolishedMap,
    ValidatedIterations,
    served,
    served_settings,
)
from ordrec.trainer.models.pipeline import configure
from tests.gradient_check import assert_gradient
from tests.map_measures import order_agreement
from tests.test_knnscal_local import fit_knnscal


def random_graph(n=40, k=4, seed=0, factor=2.0, hop2=0.5):
    """A random directed graph with ranked lists, its E+ and incoming CSR."""
    rng = np.random.default_rng(seed)
    src, nbr, rank = [], [], []
    for i in range(n):
        others = rng.choice(np.delete(np.arange(n), i), size=k, replace=False)
        src += [i] * k
        nbr += list(others)
        rank += list(range(1, k + 1))
    indptr = np.zeros(n + 1, np.int64)
    indptr[1:] = np.cumsum(np.full(n, k))
    col = np.array(nbr, np.int32)
    rnk = np.array(rank, np.int32)
    q, ptr, pcol, prnk = enlarged_edges(indptr, col, rnk, n, factor, seed, hop2)
    in_ptr, in_src, in_entry = K.incoming(ptr, pcol, n)
    return q, ptr, pcol, prnk, in_ptr, in_src, in_entry


# ---------------------------------------------------------------- PAV
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=40), st.integers(0, 2**31 - 1))
def test_pav_matches_sklearn(values, seed):
    y = np.array(values)
    w = np.random.default_rng(seed).uniform(0.1, 3.0, size=y.size)
    np.testing.assert_allclose(K.pav(y, w), isotonic_regression(y, sample_weight=w), atol=1e-9, rtol=1e-9)


def test_isotonic_rows_is_per_source_fit_with_ties_ordered_by_distance():
    rng = np.random.default_rng(3)
    q, ptr, pcol, prnk, *_ = random_graph(n=30, k=5, seed=3)
    d = rng.uniform(0, 2, size=pcol.size)
    delta = np.empty_like(d)
    K.isotonic_rows(ptr, prnk, q, 1.0, 0.0, d, delta, K.row_positions(ptr))
    for i in range(30):
        a, b = ptr[i], ptr[i + 1]
        order = np.lexsort((d[a:b], prnk[a:b]))  # by rank, ties by distance
        expect = np.empty(b - a)
        expect[order] = isotonic_regression(d[a:b][order])
        np.testing.assert_allclose(delta[a:b], expect, atol=1e-12)
        # the fit is monotone in rank
        for r1, r2, x1, x2 in zip(prnk[a:b], prnk[a + 1 : b], delta[a:b], delta[a + 1 : b]):
            if r1 < r2:
                assert x1 <= x2 + 1e-12


# ---------------------------------------------------------------- E+
def test_nonedges_are_distinct_non_neighbours_of_rank_q():
    n, k = 300, 6
    q, ptr, pcol, prnk, *_ = random_graph(n=n, k=k, seed=1, factor=5.0, hop2=0.5)
    assert q == k + 1
    for i in range(n):
        row = pcol[ptr[i] : ptr[i + 1]]
        ranks = prnk[ptr[i] : ptr[i + 1]]
        assert row.size == k + 5 * q
        assert np.unique(row).size == row.size and i not in row
        assert np.all(ranks[:k] == np.arange(1, k + 1)) and np.all(ranks[k:] == q)


def test_nonedges_on_a_small_graph_take_every_candidate():
    q, ptr, pcol, prnk, *_ = random_graph(n=8, k=3, seed=2, factor=5.0)
    for i in range(8):
        row = pcol[ptr[i] : ptr[i + 1]]
        assert sorted(row) == [j for j in range(8) if j != i]


# ------------------------------------------------------- gradient, majorization
W = 3.0  # edge weight; non-edges weigh 1


def test_gradient_matches_finite_differences():
    q, ptr, pcol, prnk, *_ = random_graph(n=25, k=4, seed=4)
    rng = np.random.default_rng(4)
    X = rng.standard_normal((25, 3))
    delta = rng.uniform(0.5, 2.0, size=pcol.size)
    g = K.stress_gradient(X, ptr, pcol, prnk, q, W, delta)
    assert_gradient(lambda Y: K.stress(Y, ptr, pcol, prnk, q, W, delta), X, g, range(0, 25, 4), rel=1e-5)


def test_jacobi_step_is_minus_gradient_over_twice_gamma():
    q, ptr, pcol, prnk, in_ptr, in_src, in_entry = random_graph(n=25, k=4, seed=5)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((25, 2))
    delta = rng.uniform(0.5, 2.0, size=pcol.size)
    # gamma_i = weighted out-degree + in-degree in E+ (with unit weights: the poster's degrees)
    w = np.where(prnk < q, W, 1.0)
    src = np.repeat(np.arange(25), np.diff(ptr))
    gamma = np.bincount(src, weights=w, minlength=25) + np.bincount(pcol, weights=w, minlength=25)
    step = K.majorize_jacobi(X.copy(), ptr, pcol, prnk, q, W, delta, in_ptr, in_src, in_entry, 1) - X
    grad = K.stress_gradient(X, ptr, pcol, prnk, q, W, delta)
    np.testing.assert_allclose(step, -grad / (2 * gamma[:, None]), atol=1e-12)


@pytest.mark.parametrize("update", ["jacobi", "gauss-seidel"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_majorization_never_increases_stress(update, seed):
    q, ptr, pcol, prnk, in_ptr, in_src, in_entry = random_graph(n=60, k=5, seed=seed)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((60, 2))
    delta = rng.uniform(0.1, 3.0, size=pcol.size)
    args = (ptr, pcol, prnk, q, W, delta, in_ptr, in_src, in_entry, 1)
    before = K.stress(X, ptr, pcol, prnk, q, W, delta)
    for _ in range(30):
        if update == "jacobi":
            X = K.majorize_jacobi(X, *args)
        else:
            K.majorize_gauss_seidel(X, *args)
        after = K.stress(X, ptr, pcol, prnk, q, W, delta)
        assert after <= before * (1 + 1e-12)
        before = after


# ------------------------------------------------------------------ locality
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_permute_rows_moves_whole_rows_and_inverts(seed):
    q, ptr, pcol, prnk, *_ = random_graph(n=30, k=3, seed=seed % 1000)
    order = np.random.default_rng(seed).permutation(30)
    new_ptr, src = K.permute_rows(ptr, order)
    for r, v in enumerate(order):
        np.testing.assert_array_equal(pcol[src[new_ptr[r] : new_ptr[r + 1]]], pcol[ptr[v] : ptr[v + 1]])
    pos = np.empty(30, np.int64)
    pos[order] = np.arange(30)
    back_ptr, back = K.permute_rows(new_ptr, pos)
    np.testing.assert_array_equal(back_ptr, ptr)
    np.testing.assert_array_equal(src[back], np.arange(pcol.size))


def test_morton_order_keeps_map_neighbours_close_in_memory():
    points = np.random.default_rng(0).uniform(size=(4000, 2))
    g = knn_lists(points, 5)
    order = np.argsort(K.morton_keys(points), kind="stable")
    pos = np.empty(4000, np.int64)
    pos[order] = np.arange(4000)
    gap_random = np.median(np.abs(g.source - g.neighbor))
    gap_morton = np.median(np.abs(pos[g.source] - pos[g.neighbor]))
    assert gap_random > 1000 and gap_morton < 50, (gap_random, gap_morton)


@pytest.mark.parametrize("dim", [2, 3])
def test_reordered_fit_is_returned_in_input_order(dim):
    # The loop runs on renumbered vertices; coordinates, E+ and disparities
    # must come back in the input's order, consistent with each other. (No
    # polish: a kept polish moves the map after the iterations the history records.)
    points, graph = planted(300, dim, 8, seed=4)
    fits = {
        r: fit_knnscal(
            graph, n_components=dim, random_state=0, max_iter=60, solver={"reorder": r}, polish_rounds=0
        )
        for r in ("morton", "none")
    }
    est = fits["morton"]
    last = est.stress_history_[-1][2]
    again = K.stress(
        est.coordinates_,
        est.plus_indptr_,
        est.plus_col_,
        est.plus_rnk_,
        est.q_,
        float(est.edge_weight),
        est.disparities_,
    )
    assert abs(again - last) <= 1e-9 * last
    np.testing.assert_array_equal(np.diff(est.plus_indptr_), np.diff(fits["none"].plus_indptr_))
    oa = {r: order_agreement(f.coordinates_, f) for r, f in fits.items()}
    assert oa["morton"] > 0.8 and abs(oa["morton"] - oa["none"]) < 0.03, oa


# ------------------------------------------------------------------ fitting
def planted(n, dim, k, seed):
    points = np.random.default_rng(seed).uniform(size=(n, dim))
    return points, knn_lists(points, k)


@pytest.mark.parametrize("dim", [2, 3])
def test_planted_configuration_is_recovered(dim):
    # An exactly embeddable low-dimensional graph: smaller rank gaps and more
    # weight on the lists than the defaults (chosen for high-dimensional data
    # such as digits, whose lists have nearly equal distances).
    points, graph = planted(200, dim, 10, seed=dim)
    est = fit_knnscal(graph, n_components=dim, random_state=0, edge_weight=5.0, rank_gap=0.5)
    oa = order_agreement(est.coordinates_, est)
    assert oa > 0.95, oa
    # Sanity: the truth itself scores (nearly) 1 under the same measure.
    assert order_agreement(points, est) > 0.999


def test_stress_history_is_monotone_and_stops_on_relative_change():
    # rank_gap = 0: every step is an exact minimisation, so all of the history falls.
    _, graph = planted(200, 2, 8, seed=7)
    est = fit_knnscal(graph, random_state=1, tol=1e-2, max_iter=500, rank_gap=0.0)
    stresses = np.array([s for _, _, s in est.stress_history_])
    assert np.all(np.diff(stresses) <= 1e-12 * stresses[:-1])
    assert est.converged_ and est.n_iter_ < 500
    last = [s for it, step, s in est.stress_history_ if step == "isotonic"][-2:]
    assert (last[0] - last[1]) / last[0] < 1e-2


@pytest.mark.parametrize("update", ["gauss-seidel", "jacobi"])
def test_majorization_steps_fall_in_a_default_fit(update):
    _, graph = planted(150, 2, 8, seed=8)
    est = fit_knnscal(graph, random_state=2, max_iter=40, solver={"update": update})
    h = est.stress_history_
    for (_, before_step, before), (_, step, after) in zip(h, h[1:]):
        if step == "majorize":
            assert after <= before * (1 + 1e-12), (before_step, before, after)


def test_feature_matrix_input_and_progress_bar(capsys):
    points = np.random.default_rng(0).uniform(size=(80, 2))
    est = fit_knnscal(points, n_neighbors=6, max_iter=5, verbose=True)
    assert est.coordinates_.shape == (80, 2)
    assert "KNNSCAL" in capsys.readouterr().err


def test_csr_drops_self_loops_and_keeps_best_rank_of_duplicates():
    from ordrec.service.storage.idmap import IdMap
    from ordrec.trainer.data.types import NeighborLists

    g = NeighborLists(
        IdMap(["a", "b", "c"]),
        np.array([0, 0, 0, 1], np.int32),
        np.array([0, 2, 2, 0], np.int32),
        np.array([1, 3, 2, 1], np.int32),
    )
    indptr, col, rnk = neighbor_csr(g)
    assert list(indptr) == [0, 1, 2, 2]
    assert list(col) == [2, 0] and list(rnk) == [2, 1]


# ------------------------------------------------------------------ serving
def test_registry_round_trip_and_placement(tmp_path):
    points, graph = planted(150, 2, 8, seed=11)
    graph.labels = (points[:, 0] > 0.5).astype(np.int64)
    est = fit_knnscal(graph, random_state=0)
    registry = Registry(tmp_path)
    version = registry.publish("knnscal", est.to_artifact())
    loaded = registry.load("knnscal")
    assert loaded.version == version
    index = KNNSCALIndex.from_artifact(loaded)
    index.smoke()
    assert index.default_entity == "objects" and "Place" in index.rpcs
    np.testing.assert_allclose(index.points.coords, est.coordinates_)
    np.testing.assert_array_equal(index.labels, graph.labels)
    rows, scores = index.neighbors("", "objects", 3, "objects", 5)
    assert 3 not in rows and np.all(np.diff(scores) <= 0)
    # Placing vertex 3 from its own ranked list lands close to where training put it.
    indptr, col, _ = est.graph_
    ranked = col[indptr[3] : indptr[4]]
    x = index.place(ranked)
    np.testing.assert_allclose(x, est.place(ranked))
    np.testing.assert_allclose(x, est.place([graph.vertices.external(r) for r in ranked]))
    typical = np.median(
        np.linalg.norm(est.coordinates_[col] - est.coordinates_[np.repeat(np.arange(150), 8)], axis=1)
    )
    assert np.linalg.norm(x - est.coordinates_[3]) < typical


def test_placement_steps_never_increase_its_stress():
    rng = np.random.default_rng(0)
    coords = rng.standard_normal((50, 2))
    rows = rng.choice(50, size=8, replace=False)
    table = np.concatenate([[0.0], np.linspace(0.2, 1.5, 9)])
    previous = np.inf
    for steps in range(0, 12):
        s = placement_stress(coords, rows, table, place_point(coords, rows, table, steps))
        assert s <= previous * (1 + 1e-12)
        previous = s


def test_placement_rejects_bad_lists():
    coords = np.zeros((5, 2))
    table = np.array([0.0, 1.0, 2.0])
    for bad in ([], [7], [1, 1]):
        with pytest.raises(ValueError):
            place_point(coords, np.array(bad, dtype=np.int64), table)


def test_convergence_means_a_small_change_not_a_rise():
    # Wide rank gaps make the disparity step raise the stress early on; the
    # old rule "(prev - s) / prev < tol" stopped such a fit after 1 iteration.
    # The plain stress loop (no local term): its rule is the one tested here.
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    features = StandardScaler().fit_transform(load_breast_cancer(return_X_y=True)[0])
    wide_gaps = {"random_state": 0, "edge_weight": 3.0, "rank_gap": 8.0, "tol": 1e-3, "max_iter": 300}
    est = fit_knnscal(knn_lists(features, 10), local_weight=0.0, **wide_gaps)
    iso = [s for _, step, s in est.stress_history_ if step == "isotonic"]
    assert est.n_iter_ > 5
    if est.converged_:
        assert abs(iso[-2] - iso[-1]) / iso[-2] < 1e-3


def test_the_protocol_reports_recall_at_10_whatever_k_is():
    from ordrec.trainer.reproduce import knnscal as protocol

    rng = np.random.default_rng(0)
    features = np.concatenate([rng.normal(size=(30, 3)), rng.normal(size=(30, 3)) + 8.0])
    graph = knn_lists(features, 4)
    problem = protocol.Problem(graph, "two-blobs", 4, features=features)
    # A map that is the features' first two coordinates keeps each blob's neighbours close.
    index = protocol.map_index(problem, features[:, :2])
    metrics = protocol.map_metrics(problem, index)
    ten = knn_lists(features, 10)
    expected = np.mean(
        [
            np.intersect1d(
                index.neighbors("", "objects", i, "objects", 10)[0], ten.neighbor[ten.source == i]
            ).size
            / 10
            for i in range(problem.n)
        ]
    )
    assert metrics["recall@4"] > 0 and metrics["recall@10"] == pytest.approx(expected)
    # Lists shorter than 10 without features: no recall@10 to report.
    no_features = protocol.map_metrics(protocol.Problem(graph, "lists", 4), index)
    assert "recall@10" not in no_features


# ------------------------------------------------------------- parallel sweeps
@pytest.mark.parametrize("n_blocks", [2, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_block_sweeps_never_increase_stress(n_blocks, seed):
    # Blocks move at the same time, each reading the others' rows as the sweep
    # found them: the split majorizer must still make every sweep monotone.
    q, ptr, pcol, prnk, in_ptr, in_src, in_entry = random_graph(n=60, k=5, seed=seed)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((60, 2))
    delta = rng.uniform(0.1, 3.0, size=pcol.size)
    before = K.stress(X, ptr, pcol, prnk, q, W, delta)
    for _ in range(30):
        K.majorize_blocks(X, ptr, pcol, prnk, q, W, delta, in_ptr, in_src, in_entry, 1, n_blocks)
        after = K.stress(X, ptr, pcol, prnk, q, W, delta)
        assert after <= before * (1 + 1e-12)
        before = after


def test_one_block_is_gauss_seidel_and_blocks_read_the_sweep_start():
    q, ptr, pcol, prnk, in_ptr, in_src, in_entry = random_graph(n=30, k=4, seed=6)
    rng = np.random.default_rng(6)
    X = rng.standard_normal((30, 2))
    delta = rng.uniform(0.5, 2.0, size=pcol.size)
    args = (ptr, pcol, prnk, q, W, delta, in_ptr, in_src, in_entry, 1)
    # As many blocks as vertices: every entry crosses blocks, so one sweep is
    # the simultaneous step -gradient / (2 gamma): the poster's Jacobi step.
    jacobi = K.majorize_jacobi(X.copy(), *args)
    every_vertex = X.copy()
    K.majorize_blocks(every_vertex, *args, 30)
    np.testing.assert_allclose(every_vertex, jacobi, atol=1e-12)
    one_block, seidel = X.copy(), X.copy()
    K.majorize_blocks(one_block, *args, 1)
    K.majorize_gauss_seidel(seidel, *args)
    np.testing.assert_array_equal(one_block, seidel)
    assert np.abs(one_block - jacobi).max() > 1e-3


def test_blocked_fit_matches_the_sequential_fit():
    _, graph = planted(400, 2, 8, seed=9)
    fits = [fit_knnscal(graph, random_state=0, max_iter=60, solver={"block_size": b}) for b in (400, 100)]
    oa = [order_agreement(f.coordinates_, f) for f in fits]
    assert abs(oa[0] - oa[1]) < 0.01, oa


def test_isotonic_start_keeps_the_start_and_converges_sooner_than_rank_disparities():
    # Rank disparities put the k-th neighbour at k/q of the non-edges'
    # distance, which undoes the start's local structure (order agreement
    # first falls, then climbs back slowly).
    _, graph = planted(300, 2, 10, seed=10)
    fits = {
        start: fit_knnscal(graph, random_state=0, initial_disparities=start, tol=1e-3, max_iter=400)
        for start in ("isotonic", "ranks")
    }
    oa = {start: order_agreement(f.coordinates_, f) for start, f in fits.items()}
    assert fits["isotonic"].converged_
    assert fits["isotonic"].n_iter_ < fits["ranks"].n_iter_, {s: f.n_iter_ for s, f in fits.items()}
    assert oa["isotonic"] >= oa["ranks"] - 0.005, oa


def _protocol_args(flags: list[str]):
    import argparse

    from ordrec.trainer.reproduce import knnscal as protocol

    parser = argparse.ArgumentParser(exit_on_error=False)
    protocol.add_arguments(parser)
    args = parser.parse_args(["--sklearn", "iris", "--n-neighbors", "5", "--references", "", *flags])
    args.seed, args.data, args.runs, args.quiet = 0, None, 1, True
    return protocol, args


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], {"knnscal", "knnscal-geodesic-start", "knnscal-poster-start"}),
        (["--initial-disparities", "ranks"], {"knnscal"}),
        (["--neighbor-embedding", "none"], {"knnscal"}),
    ],
)
def test_the_protocol_shows_the_posters_start_next_to_the_default(flags, expected):
    protocol, args = _protocol_args([*flags, "--max-iter", "5", "--solver", '{"reorder": "none"}'])
    rows = protocol.run(args)
    assert {row.method for row in rows} == expected


# each bad value, by the name its error must carry
BAD_PROTOCOL_FLAGS = {
    "edge_weight": ["--edge-weight", "-1"],
    "neighbor_embedding_rank_decay": ["--neighbor-embedding-rank-decay", "-2"],
    "block_size": ["--solver", '{"block_size": 0}'],
    "blocks": ["--solver", '{"blocks": 4}'],
}


@pytest.mark.parametrize("match", sorted(BAD_PROTOCOL_FLAGS))
def test_the_protocols_flags_refuse_bad_values_by_name(match):
    protocol, args = _protocol_args(BAD_PROTOCOL_FLAGS[match])
    with pytest.raises(ValueError, match=match):
        protocol.run(args)


def test_the_protocols_flags_are_the_parameter_names():
    _, args = _protocol_args(
        ["--neighbor-embedding-rank-decay", "auto", "--polish-rounds", "3", "--init", "cmds"]
    )
    assert (args.neighbor_embedding_rank_decay, args.polish_rounds, args.init) == ("auto", 3, "cmds")


def test_the_solver_settings_are_one_parameter_checked_by_name():
    small = knn_lists(np.random.default_rng(0).normal(size=(30, 2)), 4)
    assert KnnScal().solver_settings() == KnnScalSolver()
    assert KnnScal(solver={"block_size": 7}).solver_settings().block_size == 7
    with pytest.raises(ValueError, match="block_size"):
        KnnScalSolver(block_size=0)
    with pytest.raises(ValueError, match="no field"):
        fit_knnscal(small, solver={"block": 7})
    with pytest.raises(ValueError, match="solver"):
        fit_knnscal(small, solver="fast")
    est = fit_knnscal(small, solver={"reorder": "none"}, max_iter=2, polish_rounds=0)
    solver = est.to_artifact().hyperparameters["solver"]
    assert solver == dict(vars(KnnScalSolver()), reorder="none")
    json.dumps(est.to_artifact().hyperparameters)  # what the registry writes


def test_the_protocols_flags_take_the_solver_fields_by_name():
    _, args = _protocol_args(
        ["--block-size", "7", "--keep-iterations", "always", "--neighbor-embedding-starts", "2"]
    )
    assert (args.block_size, args.keep_iterations, args.neighbor_embedding_starts) == (7, "always", 2)


def test_the_protocols_old_flags_of_renamed_settings_still_work():
    _, args = _protocol_args(["--refinement", "always", "--ne-starts", "2", "--ne-rank-decay", "auto"])
    assert (args.keep_iterations, args.neighbor_embedding_starts) == ("always", 2)
    assert args.neighbor_embedding_rank_decay == "auto"


def test_a_job_table_configures_the_start_selection_by_the_flat_names():
    flat = {
        "neighbor_embedding": "sampled",
        "neighbor_embedding_starts": 2,
        "neighbor_embedding_rank_decay": "auto",
        "polish_rounds": 0,
    }
    polish = configure("knnscal", dict(flat, max_iter=3)).estimator
    search = polish.estimator
    assert isinstance(polish, PolishedMap) and isinstance(search, KnnScalStartSelection)
    assert (search.method, search.n_starts, search.rank_decay) == ("sampled", 2, "auto")
    assert (
        isinstance(search.estimator, ValidatedIterations) and search.estimator.keep_iterations == "validated"
    )
    assert polish.rounds == 0 and search.estimator.estimator.max_iter == 3
    assert len(KnnScal.param_names()) <= 13
    with pytest.raises(ValueError, match="neighbor_embedding_rank_decay"):  # named as the job table wrote it
        configure("knnscal", {"neighbor_embedding_rank_decay": "wide"})
    with pytest.raises(ValueError, match="neighbor_embedding_starts"):
        configure("knnscal", {"neighbor_embedding_starts": 0})


def test_the_start_selection_records_its_settings_and_without_an_embedding_is_the_plain_fit():
    graph = knn_lists(np.random.default_rng(3).normal(size=(40, 2)), 5)
    common = {"random_state": 1, "max_iter": 4}
    plain = PolishedMap(ValidatedIterations(KnnScal(**common)), rounds=2).fit(graph).best_estimator_
    fitted = configure("knnscal", dict(common, neighbor_embedding="none", polish_rounds=2))
    search = fitted.fit(graph, check_memory=False).estimator.estimator_
    assert not search.neighbor_embedding_used_
    np.testing.assert_array_equal(served(search).coordinates_, plain.coordinates_)
    recorded = fitted.to_artifact().hyperparameters
    assert (
        recorded["neighbor_embedding"],
        recorded["neighbor_embedding_starts"],
        recorded["neighbor_embedding_rank_decay"],
    ) == (
        "none",
        4,
        2.0,
    )
    assert (recorded["polish_rounds"], recorded["keep_iterations"]) == (2, "validated")
    assert not hasattr(served_settings(search), "coordinates_")  # the wrappers fit copies
