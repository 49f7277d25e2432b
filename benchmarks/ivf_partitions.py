"""Whether an inverted file's lists or its codes limit recall on a DCR version's factors.

    .venv/bin/python benchmarks/ivf_partitions.py REG/dcr/<version> [--queries 200]

Recall@10 of inverted files over the version's float item vectors (no 4-bit codes, so only the
partition limits it), against exact scoring with each user's training items excluded, at 16 to
1,024 of 2,048 lists: lists found by k-means on inner products (as the published index finds
them), and by k-means in L2 over items widened to one length (Bachrach et al., RecSys 2014:
nearest in L2 is then best by inner product). Also how long the items are, and how many of the
users' exact top 10 are among the 1 % longest (a length that singles out the best items lets an
inner-product partition work). With ``--groups G`` (a version trained on
``benchmarks/sparse_ratings.py``'s output, item ``i<n>`` in group ``n // (items / G)``), also the
recall of one list per planted group, its centroid the group's mean: the best a partition that
finds the groups can do. With ``--spill S ...``, also the inner-product lists with each item
stored in its S best lists (spilled assignment, as ScaNN's SOAR spills).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ordrec.service.indices import ann
from ordrec.service.indices.models.dcr import level_weights
from ordrec.service.storage.format import load_version

LISTS = 2048
PROBES = (16, 64, 256, 1024)


def served_queries(artifact, n_queries: int) -> ann.Queries:
    """A seeded sample of the version's users as Recommend searches for them: factors with the
    level weights folded in, their training items excluded."""
    rows = np.sort(np.random.default_rng(0).choice(len(artifact.ids["users"]), n_queries, replace=False))
    c, _ = level_weights(np.asarray(artifact.attributes["levels"]), artifact.attributes["relevance"])
    scale = np.repeat(c, int(artifact.attributes["rank"]))[None, :]
    indptr, indices = artifact.arrays["seen_indptr"], artifact.arrays["seen_indices"]
    seen = [indices[indptr[u] : indptr[u + 1]].astype(np.int64) for u in rows]
    return ann.Queries((artifact.arrays["user_factors"][rows] * scale).astype(np.float32), seen)


def widened(vectors: np.ndarray, norm: float) -> np.ndarray:
    """Every row made ``norm`` long by one more column: nearest in L2 is best by inner product."""
    lengths = np.einsum("ij,ij->i", vectors, vectors)
    return np.hstack([vectors, np.sqrt(np.maximum(norm * norm - lengths, 0.0))[:, None]]).astype(np.float32)


def partition_recall(
    items: np.ndarray, queries: ann.Queries, truth: list[np.ndarray], spill: tuple[int, ...] = ()
) -> None:
    import faiss

    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(len(items), 40 * LISTS, replace=False))
    norm = float(np.sqrt(np.einsum("ij,ij->i", items, items).max()))
    built = {
        "inner product": (items, queries.vectors, faiss.METRIC_INNER_PRODUCT),
        "L2, widened items": (
            widened(items, norm),
            np.hstack([queries.vectors, np.zeros((len(queries.vectors), 1), np.float32)]),
            faiss.METRIC_L2,
        ),
    }
    print("\n| lists found by | " + " | ".join(f"nprobe {p}" for p in PROBES) + " | build s |")
    print("|---|" + "---:|" * (len(PROBES) + 1))
    for label, (vectors, searched, metric) in built.items():
        started = time.perf_counter()
        flat = (
            faiss.IndexFlatIP(vectors.shape[1])
            if metric == faiss.METRIC_INNER_PRODUCT
            else faiss.IndexFlatL2(vectors.shape[1])
        )
        index = faiss.IndexIVFFlat(flat, vectors.shape[1], LISTS, metric)
        index.cp.niter = 10
        index.train(vectors[sample])
        index.add(vectors)
        seconds = time.perf_counter() - started
        cells = [f"{ivf_recall(faiss, index, searched, queries, truth, nprobe):.3f}" for nprobe in PROBES]
        print(f"| {label} | " + " | ".join(cells) + f" | {seconds:.0f} |")
        if metric == faiss.METRIC_INNER_PRODUCT and spill:
            _, best = index.quantizer.search(items, max(spill))  # each item's lists, best first
            for copies in spill:
                spilled_row(faiss, index.quantizer, items, best, copies, queries, truth)


def spilled_row(
    faiss, quantizer, items: np.ndarray, best: np.ndarray, copies: int, queries: ann.Queries, truth
) -> None:
    """The inner-product lists again, each item stored in its ``copies`` best lists (a top 10
    near a list's edge is then also in the next list the user scans), at the same lists scanned."""
    started = time.perf_counter()
    index = faiss.IndexIVFFlat(quantizer, items.shape[1], quantizer.ntotal, faiss.METRIC_INNER_PRODUCT)
    index.is_trained = True
    ids = np.arange(len(items), dtype=np.int64)
    for column in range(copies):
        lists = np.ascontiguousarray(best[:, column], dtype=np.int64)
        index.add_core(len(items), faiss.swig_ptr(items), faiss.swig_ptr(ids), faiss.swig_ptr(lists))
    seconds = time.perf_counter() - started
    cells = [f"{ivf_recall(faiss, index, queries.vectors, queries, truth, p, copies):.3f}" for p in PROBES]
    print(f"| inner product, each item in {copies} lists | " + " | ".join(cells) + f" | {seconds:.0f} |")


def group_recall(
    items: np.ndarray, groups: np.ndarray, queries: ann.Queries, truth: list[np.ndarray]
) -> None:
    """Recall@10 of an inverted file with one list per planted group (centroid: its mean)."""
    import faiss

    centroids = group_means(items, groups)
    quantizer = faiss.IndexFlatIP(items.shape[1])
    quantizer.add(centroids)
    index = faiss.IndexIVFFlat(quantizer, items.shape[1], len(centroids), faiss.METRIC_INNER_PRODUCT)
    index.is_trained = True
    index.add(items)
    step = max(1, len(items) // 5000)  # a sample of the items is enough for the share
    own = np.mean((items[::step] @ centroids.T).argmax(axis=1) == groups[::step])
    cells = [
        f"{p}: {ivf_recall(faiss, index, queries.vectors, queries, truth, p):.3f}" for p in (1, 4, 16, 64)
    ]
    print(
        f"\none list per planted group ({len(centroids)}; items nearest their own group's mean: {own:.2f}), "
        "recall@10 at lists scanned " + ", ".join(cells)
    )


def group_means(items: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each group's mean item vector, in one pass over the items (a sparse one-hot product)."""
    import scipy.sparse as sp

    n_groups = int(groups.max()) + 1
    members = sp.csr_matrix((np.ones(groups.size), (groups, np.arange(groups.size))), (n_groups, groups.size))
    counts = np.asarray(members.sum(axis=1))
    return (members @ items / counts).astype(np.float32)


def ivf_recall(
    faiss,
    index,
    searched: np.ndarray,
    queries: ann.Queries,
    truth: list[np.ndarray],
    nprobe: int,
    copies: int = 1,
) -> float:
    """Recall@10 of ``index`` scanning ``nprobe`` lists, each user's training items excluded
    (with items stored ``copies`` times, the first 10 distinct of ``10 * copies`` found)."""
    hits = 0
    for q, excluded, wanted in zip(searched, queries.excludes or [], truth):
        params = faiss.SearchParametersIVF()
        params.nprobe = nprobe
        params.sel = faiss.IDSelectorNot(selected := faiss.IDSelectorBatch(excluded))
        _, found = index.search(q[None, :], 10 * copies, params=params)
        found = found[0][found[0] >= 0]
        _, first = np.unique(found, return_index=True)
        hits += np.intersect1d(found[np.sort(first)][:10], wanted).size
        del selected
    return hits / (10 * len(truth))


def lengths_line(items: np.ndarray, truth: list[np.ndarray]) -> None:
    lengths = np.sqrt(np.einsum("ij,ij->i", items, items))
    longest = lengths >= np.quantile(lengths, 0.99)
    q = np.quantile(lengths, [0.01, 0.5, 0.99])
    print(
        f"item length 1 % / median / 99 %: {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}; "
        f"users' top 10 among the 1 % longest: {np.mean([longest[t].mean() for t in truth]):.2f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("version", type=Path, help="a published DCR version's folder (REG/MODEL/VERSION)")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--groups", type=int, default=0, help="planted groups of sparse_ratings.py's items")
    p.add_argument(
        "--spill", type=int, nargs="*", default=[], help="also each item in its S best lists (e.g. 2 4)"
    )
    args = p.parse_args()
    artifact = load_version(args.version)
    if artifact.kind != "dcr":
        print(f"{args.version}: a {artifact.kind} version, not dcr", file=sys.stderr)
        return 2
    items = np.ascontiguousarray(artifact.arrays["item_factors"], dtype=np.float32)
    print(f"{args.version}: {items.shape[0]} items x {items.shape[1]}")
    queries = served_queries(artifact, args.queries)
    truth = ann.exact_tops(items, queries, 10)  # each user's served top 10, training items excluded
    lengths_line(items, truth)
    partition_recall(items, queries, truth, tuple(args.spill))
    if args.groups:
        numbers = np.array([int(str(i)[1:]) for i in artifact.ids["items"].ids])
        group_recall(items, numbers // (len(numbers) // args.groups), queries, truth)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
