"""Multilevel start of KNNSCAL: fit a coarser graph, prolong, then refine.

The majorization sweeps move one vertex at a time against its neighbours,
so they fix local order quickly but need many iterations to straighten
distortions that span many vertices (the landmark-MDS start leaves those).
A coarse graph with a few times fewer vertices has the same large-scale
shape at a fraction of the cost per iteration, so its fit removes them
cheaply (the classic multigrid argument).

Coarsening (all O(n k) memory):

1. the coarse vertices are a maximal independent set of the symmetrised
   k-NN graph, drawn greedily in a random order, so every other vertex has
   a coarse vertex among its own neighbours;
2. each coarse vertex's ranked list is its ``k`` nearest other coarse
   vertices by graph geodesic over Delta_sym = min(r_ij, r_ji) (the lengths
   of the single-level start), found by a Dijkstra search stopped after
   ``k`` coarse vertices: the coarse graph is again a ranked k-NN graph;
3. the coarse graph is fitted by :class:`KnnScal` itself (recursively, until
   a level has at most the solver's ``multilevel_min_n`` vertices, which starts from
   landmark MDS);
4. each fine vertex starts at its coarse vertex, or at the mean of the coarse
   vertices at most two edges away, weighted by 1 / (path length over
   Delta_sym).
"""

from __future__ import annotations

import heapq
import time

import numba
import numpy as np
from numba import njit, prange

from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.types import NeighborLists
from ordrec.trainer.models.knnscal import landmark_mds


@njit(cache=True)
def maximal_independent_set(g_indptr, g_col, seed):
    """A maximal independent set of an undirected CSR graph, greedy in a random order.

    Returns a boolean mask. Every unselected vertex has a selected neighbour
    (maximality), and no two selected vertices are neighbours.
    """
    n = g_indptr.shape[0] - 1
    np.random.seed(seed)
    order = np.random.permutation(n)
    selected = np.zeros(n, dtype=np.bool_)
    blocked = np.zeros(n, dtype=np.bool_)
    for v in order:
        if blocked[v]:
            continue
        selected[v] = True
        for e in range(g_indptr[v], g_indptr[v + 1]):
            blocked[g_col[e]] = True
    return selected


@njit(cache=True)
def _nearest_coarse(s, k, g_indptr, g_col, g_len, coarse_id, dist, done, touched, nbr):
    """Dijkstra from ``s`` until ``k`` other coarse vertices are settled; writes their
    coarse numbers to ``nbr`` nearest first and returns how many were found.

    ``dist`` (all inf) and ``done`` (all False) are restored before returning.
    """
    n_touched = 0
    found = 0
    dist[s] = 0.0
    touched[n_touched] = s
    n_touched += 1
    heap = [(0.0, s)]
    while len(heap) > 0 and found < k:
        dv, v = heapq.heappop(heap)
        if done[v]:
            continue
        done[v] = True
        if v != s and coarse_id[v] >= 0:
            nbr[found] = coarse_id[v]
            found += 1
        for e in range(g_indptr[v], g_indptr[v + 1]):
            u = g_col[e]
            du = dv + g_len[e]
            if du < dist[u]:
                if dist[u] == np.inf:
                    touched[n_touched] = u
                    n_touched += 1
                dist[u] = du
                heapq.heappush(heap, (du, u))
    for t in range(n_touched):
        dist[touched[t]] = np.inf
        done[touched[t]] = False
    return found


@njit(cache=True, parallel=True)
def coarse_neighbour_lists(g_indptr, g_col, g_len, coarse_id, n_coarse, k, n_chunks):
    """Each coarse vertex's ``k`` geodesically nearest coarse vertices (Dijkstra, stopped early).

    ``coarse_id[v]`` is v's coarse number or -1. Returns ``(source, neighbour,
    rank)`` in coarse numbers, rank 1 nearest; a coarse vertex in a small
    component gets fewer than ``k``. The searches run in ``n_chunks`` parallel
    chunks (one per thread); memory: per chunk, three length-n arrays reused by
    every search (reset through the list of touched vertices).
    """
    n = g_indptr.shape[0] - 1
    fine_of = np.flatnonzero(coarse_id >= 0)
    slots = np.empty((n_coarse, k), dtype=np.int32)
    found = np.zeros(n_coarse, dtype=np.int64)
    n_chunks = max(1, min(n_coarse, n_chunks))
    for chunk in prange(n_chunks):
        dist = np.full(n, np.inf)
        done = np.zeros(n, dtype=np.bool_)
        touched = np.empty(n, dtype=np.int64)
        for c in range(chunk * n_coarse // n_chunks, (chunk + 1) * n_coarse // n_chunks):
            found[c] = _nearest_coarse(
                fine_of[c], k, g_indptr, g_col, g_len, coarse_id, dist, done, touched, slots[c]
            )
    total = int(found.sum())
    src = np.empty(total, dtype=np.int32)
    nbr = np.empty(total, dtype=np.int32)
    rnk = np.empty(total, dtype=np.int32)
    out = 0
    for c in range(n_coarse):
        for r in range(found[c]):
            src[out] = c
            nbr[out] = slots[c, r]
            rnk[out] = r + 1
            out += 1
    return src, nbr, rnk


@njit(cache=True, inline="always")
def _reach(c, path_length, length, reached, m):
    """Record a path of ``path_length`` to coarse vertex ``c`` (-1: not coarse); returns the count reached."""
    if c < 0:
        return m
    if length[c] == np.inf:
        reached[m] = c
        m += 1
    length[c] = min(length[c], path_length)
    return m


@njit(cache=True)
def prolong(X_coarse, coarse_id, g_indptr, g_col, g_len):
    """Fine coordinates: a coarse vertex keeps its place; any other vertex goes to the
    mean of the coarse vertices at most two edges away, weighted by 1 / (their
    shortest such path's Delta_sym length).

    Two hops rather than one: a vertex has few coarse neighbours, so one hop
    puts many vertices on the same few points and the fine fit spends its
    first iterations separating them.
    """
    n = g_indptr.shape[0] - 1
    dim = X_coarse.shape[1]
    X = np.zeros((n, dim))
    length = np.full(X_coarse.shape[0], np.inf)  # per coarse vertex, reset after each v
    reached = np.empty(X_coarse.shape[0], dtype=np.int64)
    for v in range(n):
        if coarse_id[v] >= 0:
            X[v] = X_coarse[coarse_id[v]]
            continue
        m = 0
        for e in range(g_indptr[v], g_indptr[v + 1]):
            u = g_col[e]
            m = _reach(coarse_id[u], g_len[e], length, reached, m)
            for f in range(g_indptr[u], g_indptr[u + 1]):
                m = _reach(coarse_id[g_col[f]], g_len[e] + g_len[f], length, reached, m)
        total = 0.0
        for t in range(m):
            c = reached[t]
            w = 1.0 / length[c]
            total += w
            for a in range(dim):
                X[v, a] += w * X_coarse[c, a]
            length[c] = np.inf
        if total > 0:
            for a in range(dim):
                X[v, a] /= total
    return X


def coarse_graph(G, k: int, seed: int) -> tuple[np.ndarray, NeighborLists]:
    """The coarse level of the symmetric graph ``G`` (CSR, lengths Delta_sym).

    Returns ``(coarse_id, lists)``: each fine vertex's coarse number (-1 if it
    is not coarse) and the coarse ranked k-NN lists.
    """
    indptr = G.indptr.astype(np.int64)
    col = G.indices.astype(np.int64)
    length = G.data.astype(np.float64)
    selected = maximal_independent_set(indptr, col, np.int64(seed))
    n_coarse = int(selected.sum())
    coarse_id = np.full(G.shape[0], -1, dtype=np.int64)
    coarse_id[selected] = np.arange(n_coarse)
    src, nbr, rnk = coarse_neighbour_lists(
        indptr, col, length, coarse_id, n_coarse, int(k), numba.get_num_threads()
    )
    lists = NeighborLists(IdMap([str(i) for i in range(n_coarse)]), src, nbr, rnk)
    return coarse_id, lists


def coarsens(n: int, lists: NeighborLists) -> bool:
    """Whether a coarse level is worth fitting: at most half the vertices (so the
    levels shrink geometrically), at least 3 of them, and some edges between them.
    A star, say, does not coarsen: its centre alone, or all its leaves."""
    n_coarse = len(lists.vertices)
    return 3 <= n_coarse <= n // 2 and lists.source.size > 0


def multilevel_start(estimator, G, k: int, choice=None) -> np.ndarray:
    """Step 3 by coarsening: fit the coarse graph with ``estimator``'s settings, prolong it.

    ``G`` is the fine symmetric graph (:func:`knnscal.symmetric_graph`), ``k``
    the fine lists' length (the coarse lists get as many); ``choice`` is the fine fit's
    (``KnnScal.fit_from``), so each level keeps its iterations as the fine fit would. A graph
    that does not coarsen (:func:`coarsens`) gets the landmark-MDS start instead.
    """
    t0 = time.perf_counter()
    coarse_id, lists = coarse_graph(G, k, int(estimator.random_state))
    estimator.log(
        f"coarsened {G.shape[0]:,} -> {len(lists.vertices):,} vertices in {time.perf_counter() - t0:.1f} s"
    )
    if not coarsens(G.shape[0], lists):
        rng = np.random.default_rng(estimator.random_state)
        return landmark_mds(G, int(estimator.n_components), estimator.solver_settings().n_landmarks, rng)
    coarse = estimator.geodesic_estimator()
    coarse.fit(lists, choice)
    return prolong(
        coarse.coordinates_,
        coarse_id,
        G.indptr.astype(np.int64),
        G.indices.astype(np.int64),
        G.data.astype(np.float64),
    )
