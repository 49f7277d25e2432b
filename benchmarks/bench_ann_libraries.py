"""Compare approximate maximum-inner-product libraries on a planted DCR-shaped catalogue.

    .venv/bin/python benchmarks/bench_ann_libraries.py --items 100000
    .venv/bin/python benchmarks/bench_ann_libraries.py --items 1000000 --queries 500

Needs the candidates installed (``pip install faiss-cpu hnswlib usearch``); a
missing one is skipped. Every configuration runs in its own process (so
its memory is its own) and prints one row: build time (all cores), file
size, the process's RSS growth on loading the saved file, whether the file
can be memory-mapped, and, for each search breadth (``ef``), recall@10
against exact top-10 and single-thread p50/p99 of one query. Queries are
user vectors with DCR's level weights folded in; recall is on raw index
answers (no exact re-ranking).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from catalog_data import folded_queries, planted_catalog  # noqa: E402

# name -> (library, constructor parameters)
CONFIGS = {
    "faiss-hnsw-ip": ("faiss", {"M": 32, "ef_construction": 128, "mmap": False}),
    "faiss-hnsw-ip-mmap": ("faiss", {"M": 32, "ef_construction": 128, "mmap": True}),
    "hnswlib-ip": ("hnswlib", {"M": 32, "ef_construction": 128}),
    "usearch-ip-f32": ("usearch", {"connectivity": 32, "expansion_add": 128, "dtype": "f32"}),
    "usearch-ip-f16": ("usearch", {"connectivity": 32, "expansion_add": 128, "dtype": "f16"}),
    "usearch-l2-reduction": (
        "usearch",
        {"connectivity": 32, "expansion_add": 128, "dtype": "f32", "reduction": True},
    ),
}
EFS = (32, 64, 128, 256)


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def exact_top10(items: np.ndarray, queries: np.ndarray) -> np.ndarray:
    out = np.empty((len(queries), 10), np.int64)
    for start in range(0, len(queries), 64):
        s = queries[start : start + 64] @ items.T
        top = np.argpartition(-s, 10, axis=1)[:, :10]
        out[start : start + 64] = top
    return out


def augment(items: np.ndarray) -> np.ndarray:
    """MIPS -> L2: append sqrt(M^2 - |v|^2), so nearest in L2 is largest inner product."""
    sq = np.einsum("ij,ij->i", items, items)
    extra = np.sqrt(np.maximum(sq.max() - sq, 0.0)).astype(np.float32)
    return np.ascontiguousarray(np.hstack([items, extra[:, None]]))


class Faiss:
    def __init__(self, dim, M, ef_construction, mmap):
        import faiss

        self.faiss = faiss
        self.index = faiss.IndexHNSWFlat(dim, M, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = ef_construction
        self.mmap = mmap

    def build(self, items):
        self.faiss.omp_set_num_threads(os.cpu_count())
        self.index.add(items)

    def save(self, path):
        self.faiss.write_index(self.index, path)

    def load(self, path, dim):
        self.index = None
        flags = self.faiss.IO_FLAG_MMAP_IFC if self.mmap else 0
        self.index = self.faiss.read_index(path, flags)
        self.faiss.omp_set_num_threads(1)

    def set_ef(self, ef):
        self.index.hnsw.efSearch = ef

    def query(self, q, k):
        _, ids = self.index.search(q[None, :], k)
        return ids[0]


class Hnswlib:
    def __init__(self, dim, M, ef_construction):
        import hnswlib

        self.hnswlib = hnswlib
        self.dim, self.M, self.efc = dim, M, ef_construction

    def build(self, items):
        self.index = self.hnswlib.Index(space="ip", dim=self.dim)
        self.index.init_index(max_elements=len(items), ef_construction=self.efc, M=self.M)
        self.index.add_items(items, num_threads=os.cpu_count())

    def save(self, path):
        self.index.save_index(path)

    def load(self, path, dim):
        self.index = None
        self.index = self.hnswlib.Index(space="ip", dim=dim)
        self.index.load_index(path)
        self.index.set_num_threads(1)

    def set_ef(self, ef):
        self.index.set_ef(ef)

    def query(self, q, k):
        labels, _ = self.index.knn_query(q, k=k, num_threads=1)
        return labels[0]


class Usearch:
    def __init__(self, dim, connectivity, expansion_add, dtype, reduction=False):
        from usearch.index import Index

        self.Index = Index
        self.reduction = reduction
        self.kw = dict(
            ndim=dim + reduction,
            metric="l2sq" if reduction else "ip",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
        )

    def build(self, items):
        if self.reduction:
            items = augment(items)
        self.index = self.Index(**self.kw)
        self.index.add(np.arange(len(items), dtype=np.uint64), items, threads=os.cpu_count())

    def save(self, path):
        self.index.save(path)

    def load(self, path, dim):
        self.index = None
        self.index = self.Index(**self.kw)
        self.index.view(path)

    def set_ef(self, ef):
        self.index.expansion_search = ef

    def query(self, q, k):
        if self.reduction:
            q = np.append(q, np.float32(0.0))
        return self.index.search(q, k, threads=1).keys.astype(np.int64)


LIBS = {"faiss": Faiss, "hnswlib": Hnswlib, "usearch": Usearch}


def build_child(name: str, n_items: int, seed: int, path: str) -> dict:
    lib, params = CONFIGS[name]
    _, items = planted_catalog(n_items, 1, seed=seed)
    wrapper = LIBS[lib](items.shape[1], **params)
    t0 = time.perf_counter()
    wrapper.build(items)
    build = time.perf_counter() - t0
    wrapper.save(path)
    return {"build_s": build, "file_mb": os.path.getsize(path) / 2**20}


def query_child(name: str, n_items: int, n_queries: int, seed: int, path: str) -> dict:
    """In a fresh process, so the RSS growth on load is the loaded index's alone."""
    lib, params = CONFIGS[name]
    users, items = planted_catalog(n_items, n_queries, seed=seed)
    queries = folded_queries(users)
    truth = exact_top10(items, queries)
    dim = items.shape[1]
    del items, users
    wrapper = LIBS[lib](dim, **params)
    before = rss_mb()
    t0 = time.perf_counter()
    wrapper.load(path, dim)
    load = time.perf_counter() - t0
    loaded_rss = rss_mb() - before
    rows = []
    for ef in EFS:
        wrapper.set_ef(ef)
        wrapper.query(queries[0], 10)
        times, hits = [], 0
        for q, t in zip(queries, truth):
            t0 = time.perf_counter()
            got = wrapper.query(q, 10)
            times.append(time.perf_counter() - t0)
            hits += np.intersect1d(got, t).size
        rows.append(
            {
                "ef": ef,
                "recall": hits / truth.size,
                "p50_us": float(np.percentile(times, 50) * 1e6),
                "p99_us": float(np.percentile(times, 99) * 1e6),
            }
        )
    return {
        "load_s": load,
        "rss_loaded_mb": loaded_rss,
        "rss_after_queries_mb": rss_mb() - before,
        "rows": rows,
    }


def run_child(*argv: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build-child", help=argparse.SUPPRESS)
    parser.add_argument("--query-child", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_child:
        print(json.dumps(build_child(args.build_child, args.items, args.seed, args.path)))
        return
    if args.query_child:
        print(json.dumps(query_child(args.query_child, args.items, args.queries, args.seed, args.path)))
        return
    print(
        f"# {args.items:,} items x 200 dims, {args.queries} queries, recall@10 vs exact; "
        f"single-thread query latency; build on {os.cpu_count()} threads; loadavg {os.getloadavg()[0]:.2f}"
    )
    print(
        "| library / config | build s | file MB | load s | RSS after load MB | RSS after queries MB "
        "| ef | recall@10 | p50 us | p99 us |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.configs.split(","):
        common = ["--items", str(args.items), "--queries", str(args.queries), "--seed", str(args.seed)]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "index.bin")
            try:
                r = run_child("--build-child", name, "--path", path, *common)
                r.update(run_child("--query-child", name, "--path", path, *common))
            except RuntimeError as exc:
                print(f"| {name} | failed: {exc} |")
                continue
        for i, row in enumerate(r["rows"]):
            head = (
                (
                    f"| {name} | {r['build_s']:.1f} | {r['file_mb']:.0f} | {r['load_s']:.2f} | "
                    f"{r['rss_loaded_mb']:.0f} | {r['rss_after_queries_mb']:.0f} |"
                )
                if i == 0
                else "| | | | | | |"
            )
            print(
                f"{head} {row['ef']} | {row['recall']:.3f} | {row['p50_us']:.0f} | {row['p99_us']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
