"""Whether an inverted file's lists or its codes limit recall on a DCR version's factors.

    .venv/bin/python benchmarks/ivf_partitions.py REG/dcr/<version> [--queries 200]

Recall@10 of inverted files over the version's float item vectors (no 4-bit codes, so only the
partition limits it), against exact scoring with each user's training items excluded, at 16 to
1,024 of 2,048 lists: lists found by k-means on inner products (as the published index finds
them), and by k-means in L2 over items widened to one length (Bachrach et al., RecSys 2014:
nearest in L2 is then best by inner product). Also how long the items are, and how many of the
users' exact top 10 are among the 1 % longest (a length that singles out the best items lets an
inner-product partition work).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ordrec.service.indices.models.dcr import level_weights
from ordrec.service.storage.registry import Registry

LISTS = 2048
PROBES = (16, 64, 256, 1024)


def load(version_dir: Path):
    return Registry(version_dir.parent.parent).load(version_dir.parent.name, version_dir.name)


def folded_users(artifact, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """The users' factors with the level weights folded in (what Recommend scores with), and the
    dimension of a level block."""
    c, _ = level_weights(np.asarray(artifact.attributes["levels"]), artifact.attributes["relevance"])
    rank = int(artifact.attributes["rank"])
    users = np.asarray(artifact.arrays["user_factors"][rows], dtype=np.float64)
    return users * np.repeat(c, rank)[None, :], rank


def widened(vectors: np.ndarray, norm: float) -> np.ndarray:
    """Every row made ``norm`` long by one more column: nearest in L2 is best by inner product."""
    lengths = np.einsum("ij,ij->i", vectors, vectors)
    return np.hstack([vectors, np.sqrt(np.maximum(norm * norm - lengths, 0.0))[:, None]]).astype(np.float32)


def partition_recall(artifact, n_queries: int) -> None:
    import faiss

    items = np.ascontiguousarray(artifact.arrays["item_factors"], dtype=np.float32)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(len(artifact.ids["users"]), n_queries, replace=False))
    queries = folded_users(artifact, rows)[0].astype(np.float32)
    indptr, indices = artifact.arrays["seen_indptr"], artifact.arrays["seen_indices"]
    seen = [indices[indptr[u] : indptr[u + 1]].astype(np.int64) for u in rows]
    scores = queries @ items.T
    for k, excluded in enumerate(seen):
        scores[k, excluded] = -np.inf
    truth = np.argsort(-scores, axis=1)[:, :10]
    del scores
    sample = np.sort(rng.choice(len(items), 40 * LISTS, replace=False))
    norm = float(np.sqrt(np.einsum("ij,ij->i", items, items).max()))
    built = {
        "inner product": (items, queries, faiss.METRIC_INNER_PRODUCT),
        "L2, widened items": (
            widened(items, norm),
            np.hstack([queries, np.zeros((len(queries), 1), np.float32)]),
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
        cells = []
        for nprobe in PROBES:
            hits = 0
            for q, excluded, wanted in zip(searched, seen, truth):
                params = faiss.SearchParametersIVF()
                params.nprobe = nprobe
                params.sel = faiss.IDSelectorNot(selected := faiss.IDSelectorBatch(excluded))
                _, found = index.search(q[None, :], 10, params=params)
                hits += np.intersect1d(found[0], wanted).size
                del selected
            cells.append(f"{hits / truth.size:.3f}")
        print(f"| {label} | " + " | ".join(cells) + f" | {seconds:.0f} |")


def lengths_line(artifact, n_queries: int) -> None:
    items = np.asarray(artifact.arrays["item_factors"], dtype=np.float32)
    lengths = np.sqrt(np.einsum("ij,ij->i", items, items))
    rows = np.sort(np.random.default_rng(0).choice(len(artifact.ids["users"]), n_queries, replace=False))
    queries = folded_users(artifact, rows)[0].astype(np.float32)
    top = np.argsort(-(queries @ items.T), axis=1)[:, :10]
    longest = lengths >= np.quantile(lengths, 0.99)
    q = np.quantile(lengths, [0.01, 0.5, 0.99])
    print(
        f"item length 1 % / median / 99 %: {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}; "
        f"users' top 10 among the 1 % longest: {longest[top].mean():.2f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("version", type=Path, help="a published DCR version's folder (REG/MODEL/VERSION)")
    p.add_argument("--queries", type=int, default=200)
    args = p.parse_args()
    artifact = load(args.version)
    if artifact.kind != "dcr":
        print(f"{args.version}: a {artifact.kind} version, not dcr", file=sys.stderr)
        return 2
    print(f"{args.version}: {len(artifact.ids['items'])} items x {artifact.arrays['item_factors'].shape[1]}")
    lengths_line(artifact, args.queries)
    partition_recall(artifact, args.queries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
