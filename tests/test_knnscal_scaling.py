"""KNNSCAL at scale: the multilevel start (coarsening, coarse lists, prolongation, planted
recovery) and the per-phase progress lines."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csgraph
from scipy.spatial import procrustes

from ordrec.trainer.models import knnscal_multilevel as ML
from ordrec.trainer.models.knnscal import KnnScal, knn_lists, neighbor_csr, symmetric_graph
from ordrec.trainer.models.knnscal_selection import KnnScalStartSelection, PolishedMap, ValidatedIterations
from tests.map_measures import order_agreement
from tests.test_knnscal_local import fit_knnscal


def planted_graph(n, k, seed, dim=2):
    points = np.random.default_rng(seed).uniform(size=(n, dim))
    graph = knn_lists(points, k)
    indptr, col, rnk = neighbor_csr(graph)
    return points, graph, symmetric_graph(indptr, col, rnk, n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_coarse_vertices_are_a_maximal_independent_set(seed):
    _, _, G = planted_graph(500, 6, seed)
    selected = ML.maximal_independent_set(G.indptr.astype(np.int64), G.indices.astype(np.int64), seed)
    adjacency = G.tocoo()
    assert not np.any(selected[adjacency.row] & selected[adjacency.col])  # independent
    has_coarse_neighbour = np.zeros(500, dtype=bool)
    has_coarse_neighbour[adjacency.row[selected[adjacency.col]]] = True
    assert np.all(selected | has_coarse_neighbour)  # maximal
    # A k-NN graph coarsens by a constant factor: the next level is O(n) smaller.
    assert 0.05 * 500 < selected.sum() < 0.5 * 500


def test_coarse_lists_are_the_geodesically_nearest_coarse_vertices():
    k = 5
    _, _, G = planted_graph(300, 6, seed=3)
    coarse_id, lists = ML.coarse_graph(G, k, seed=3)
    fine_of = np.flatnonzero(coarse_id >= 0)
    n_coarse = fine_of.size
    # Memory stays O(n k): at most k entries per coarse vertex, ranks 1..k.
    assert len(lists.vertices) == n_coarse and lists.source.size <= k * n_coarse
    geodesic = csgraph.dijkstra(G, directed=True, indices=fine_of)[:, fine_of]
    for c in range(n_coarse):
        row = lists.source == c
        assert np.array_equal(lists.rank[row], np.arange(1, row.sum() + 1))
        nbr = lists.neighbor[row]
        assert c not in nbr and len(set(nbr)) == nbr.size
        others = np.delete(geodesic[c], c)
        # The listed ones are the k nearest (ties may be broken either way), nearest first.
        assert np.all(np.diff(geodesic[c, nbr]) >= 0)
        assert geodesic[c, nbr].max() <= np.sort(others)[k - 1] + 1e-12


def test_prolongation_keeps_coarse_vertices_and_averages_those_two_edges_away():
    _, _, G = planted_graph(200, 6, seed=4)
    coarse_id, _ = ML.coarse_graph(G, 5, seed=4)
    n_coarse = int((coarse_id >= 0).sum())
    X_coarse = np.random.default_rng(4).standard_normal((n_coarse, 2))
    args = (coarse_id, G.indptr.astype(np.int64), G.indices.astype(np.int64), G.data.astype(np.float64))
    X = ML.prolong(X_coarse, *args)
    np.testing.assert_array_equal(X[coarse_id >= 0], X_coarse)
    # Shortest paths of at most two edges: the (min, +) square of the graph.
    one_hop = G.toarray()
    one_hop[one_hop == 0] = np.inf
    np.fill_diagonal(one_hop, 0.0)
    two_hop = np.min(one_hop[:, :, None] + one_hop[None, :, :], axis=1)
    for v in np.flatnonzero(coarse_id < 0)[:20]:
        coarse = np.flatnonzero((coarse_id >= 0) & np.isfinite(two_hop[v]))
        w = 1.0 / two_hop[v, coarse]
        np.testing.assert_allclose(X[v], w @ X_coarse[coarse_id[coarse]] / w.sum())


def test_multilevel_start_reproduces_a_planted_layout():
    # Two levels (2000 -> ~270 -> landmark MDS): the prolonged start is the
    # planted layout up to a similarity (local order is left to the fine fit).
    points, graph, _ = planted_graph(2000, 10, seed=5)
    est = KnnScal(init="multilevel", solver={"multilevel_min_n": 100}, random_state=0, tol=1e-3)
    start = est.initial_configuration(*neighbor_csr(graph), 2000)
    assert procrustes(points, start)[2] < 0.03
    est = (
        PolishedMap(KnnScalStartSelection(ValidatedIterations(est))).fit(graph).best_estimator_
    )  # as a job fits
    assert order_agreement(points, est) > 0.999
    assert order_agreement(est.coordinates_, est) > 0.9


def test_small_graphs_skip_the_coarse_level():
    _, graph, _ = planted_graph(150, 6, seed=6)
    fits = [
        fit_knnscal(graph, init=init, solver={"multilevel_min_n": 200}, max_iter=5)
        for init in ("multilevel", "auto")
    ]
    np.testing.assert_array_equal(fits[0].coordinates_, fits[1].coordinates_)


def test_verbose_fit_prints_every_phase_and_iteration_as_it_goes(capsys):
    _, graph, _ = planted_graph(300, 6, seed=7)
    est = fit_knnscal(
        graph, init="multilevel", solver={"multilevel_min_n": 100}, max_iter=3, tol=0, verbose=True
    )
    err = capsys.readouterr().err
    for phase in ("n=300 |E+|=", "coarsened 300 ->", "n=300: start", "n=300: reorder"):
        assert phase in err, phase
    for it in range(1, est.n_iter_ + 1):
        assert f"n=300: iteration {it} " in err
    assert err.count("[CPU ") >= 4 + est.n_iter_
    fit_knnscal(graph, max_iter=2)
    assert "KNNSCAL n=" not in capsys.readouterr().err


def test_a_graph_that_does_not_coarsen_gets_the_landmark_start():
    # A star: the independent set is its centre alone or all its leaves.
    from ordrec.service.storage.idmap import IdMap
    from ordrec.trainer.data.types import NeighborLists

    n = 40
    leaves = np.arange(1, n, dtype=np.int32)
    source = np.concatenate([np.zeros(5, np.int32), leaves])
    neighbor = np.concatenate([leaves[:5], np.zeros(n - 1, np.int32)])
    rank = np.concatenate([np.arange(1, 6), np.ones(n - 1)]).astype(np.int32)
    graph = NeighborLists(IdMap([str(i) for i in range(n)]), source, neighbor, rank)
    csr = neighbor_csr(graph)
    starts = [
        KnnScal(init=init, solver={"multilevel_min_n": 3}).initial_configuration(*csr, n)
        for init in ("multilevel", "landmark")
    ]
    # Equal up to the start's 1e-6 jitter (drawn from another point of the random stream).
    np.testing.assert_allclose(starts[0], starts[1], atol=1e-5 * starts[1].std())
    assert fit_knnscal(
        graph, init="multilevel", solver={"multilevel_min_n": 3}, max_iter=3
    ).coordinates_.shape == (n, 2)
