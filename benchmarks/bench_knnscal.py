"""KNNSCAL scaling: time per iteration and to convergence, iterations, quality, peak memory.

Generated graphs: n points uniform in the unit square, their exact directed
k-NN lists (rank 1 nearest). Each fit runs in its own process so that its
peak resident memory (``ru_maxrss``) is its own. Prints one table; the
per-iteration time divided by n k log2 k should stay flat if the cost is
O(n k log k). Every size up to ``--reference-max`` also gets a "full" row:
the same fit run to ``--reference-tol``, the same-run reference for the
quality (order agreement) of the fit stopped at ``--tol``.

    .venv/bin/python benchmarks/bench_knnscal.py --sizes 10000 100000 1000000

Timings on a shared machine are wall-clock under whatever else is running;
the CPU columns are steadier. Each fit prints its phases and iterations on
stderr as it goes (``--quiet``: only the table), so a long run shows where
its time goes even if it is stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np

# The setting of the scaling figures: 5 q non-edges per source (the
# poster's count), stopped at a relative stress change of DEFAULT_TOL.
DEFAULT_TOL = 1e-3
REFERENCE_MAX_ITER = 2000
DEFAULT_PARAMS = {"nonedge_factor": 5}


def generated_graph(n: int, k: int, seed: int):
    from scipy.spatial import cKDTree

    from ordrec.service.storage.idmap import IdMap
    from ordrec.trainer.data.types import NeighborLists

    points = np.random.default_rng(seed).uniform(size=(n, 2))
    _, idx = cKDTree(points).query(points, k + 1)
    idx = idx[:, 1:]  # column 0 is the point itself (no duplicates in continuous data)
    source = np.repeat(np.arange(n, dtype=np.int32), k)
    rank = np.tile(np.arange(1, k + 1, dtype=np.int32), n)
    return NeighborLists(IdMap([str(i) for i in range(n)]), source, idx.ravel().astype(np.int32), rank)


def one(args) -> dict:
    from ordrec.trainer.models import knnscal_kernels as K
    from ordrec.trainer.models.pipeline import configure

    t0 = time.perf_counter()
    graph = generated_graph(args.one, args.k, args.seed)
    gen_s = time.perf_counter() - t0
    if args.verbose:
        print(
            f"n={args.one:,} tol={args.tol:g}: graph generated in {gen_s:.1f} s", file=sys.stderr, flush=True
        )
    params = json.loads(args.params)
    pipeline = configure(
        "knnscal",
        dict(
            params,
            n_components=args.dim,
            max_iter=args.max_iter,
            tol=args.tol,
            random_state=args.seed,
            verbose=args.verbose,
        ),
    )
    t0 = time.perf_counter()
    polished = pipeline.fit(graph, check_memory=False).estimator  # PolishedMap(KnnScalStartSelection(...))
    search, est = polished.estimator_, polished.best_estimator_
    fit_s = time.perf_counter() - t0
    indptr, col, rnk = est.graph_
    agree, pairs = K.order_counts(est.coordinates_, indptr, col, rnk, est.q_)
    return {
        "n": args.one,
        "k": args.k,
        "tol": args.tol,
        "entries": int(est.plus_col_.shape[0]),
        "generate_s": gen_s,
        "edges_s": est.timings_["edges_s"],
        "init_s": est.timings_["init_s"]
        + (search.start_seconds_ if search.neighbor_embedding_used_ else 0.0),
        "reorder_s": est.timings_.get("reorder_s", 0.0),
        "iterations": est.n_iter_,
        "converged": bool(est.converged_),
        "per_iter_s": float(np.median(est.iteration_seconds_)) if est.n_iter_ else float("nan"),
        "per_iter_min_s": float(np.min(est.iteration_seconds_)) if est.n_iter_ else float("nan"),
        "iterations_s": est.timings_["iterations_s"],
        "fit_s": fit_s,
        "cpu_per_iter_s": est.timings_["iterations_cpu_s"] / max(est.n_iter_, 1),
        "stress": est.stress_,
        "order_agreement": agree / max(pairs, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def sweeps_only(args) -> None:
    """CPU time of ``--sweeps`` Gauss-Seidel sweeps on the generated E+, with the true
    points as X, in the input order and in Morton order; ``--kernels PATH`` adds
    another version of ``knnscal_kernels.py`` (e.g. an older commit's) for comparison."""
    import importlib

    from ordrec.trainer.models import knnscal_kernels as K
    from ordrec.trainer.models.knnscal import KnnScal, enlarged_edges, neighbor_csr

    n = int(args.sizes[0])
    points = np.random.default_rng(args.seed).uniform(size=(n, 2))
    graph = generated_graph(n, args.k, args.seed)
    indptr, col, rnk = neighbor_csr(graph)
    params = json.loads(args.params)
    est = KnnScal.from_flat(**params)
    est.q_, est.plus_indptr_, est.plus_col_, est.plus_rnk_ = enlarged_edges(
        indptr, col, rnk, n, float(est.nonedge_factor), args.seed, float(est.two_hop_fraction)
    )
    kernels = {"current": K}
    if args.kernels:
        # A plain import (not exec of a spec) so that numba's on-disk cache can find the module again.
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.kernels)))
        other = importlib.import_module(os.path.splitext(os.path.basename(args.kernels))[0])
        kernels = {"other": other, "current": K}
    print(f"n={n:,} |E+|={est.plus_col_.shape[0]:,}: CPU s of {args.sweeps} Gauss-Seidel sweeps")
    for layout in ("input", "morton"):
        X = points.copy()
        if layout == "morton":
            order = np.argsort(K.morton_keys(X), kind="stable")
            X = np.ascontiguousarray(X[order])
            est.relabel(order)
        in_ptr, in_src, in_entry = K.incoming(est.plus_indptr_, est.plus_col_, n)
        delta = 0.01 * np.sqrt(est.plus_rnk_.astype(np.float64))
        common = (
            est.plus_indptr_,
            est.plus_col_,
            est.plus_rnk_,
            est.q_,
            1.0,
            delta,
            in_ptr,
            in_src,
            in_entry,
        )
        for name, mod in kernels.items():
            mod.majorize_gauss_seidel(X.copy(), *common, 1)  # compile / warm up
            Y = X.copy()
            t0 = time.process_time()
            mod.majorize_gauss_seidel(Y, *common, args.sweeps)
            print(f"  {layout:6s} order, {name:7s} kernel: {time.process_time() - t0:8.3f}")


def run_one_size(args, n: int, tol: float, max_iter: int) -> dict:
    """One fit in a child process (its own peak memory); returns its JSON record."""
    cmd = [
        sys.executable,
        __file__,
        "--one",
        str(n),
        "--k",
        str(args.k),
        "--dim",
        str(args.dim),
        "--max-iter",
        str(max_iter),
        "--tol",
        str(tol),
        "--seed",
        str(args.seed),
        "--params",
        args.params,
    ] + ([] if args.verbose else ["--quiet"])
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e5])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--dim", type=int, default=2)
    parser.add_argument("--max-iter", type=int, default=200)
    parser.add_argument("--tol", type=float, default=DEFAULT_TOL)
    parser.add_argument(
        "--reference-tol", type=float, default=1e-4, help="tolerance of the full-method reference rows"
    )
    parser.add_argument(
        "--reference-max",
        type=float,
        default=1e5,
        help="largest size that also gets a full-method reference row (0: none)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--params", default=json.dumps(DEFAULT_PARAMS), help="KNNSCAL hyperparameters as JSON"
    )
    parser.add_argument(
        "--quiet",
        dest="verbose",
        action="store_false",
        help="no phase and iteration lines on stderr (by default each fit prints them as it goes)",
    )
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one size
    parser.add_argument(
        "--sweeps-only",
        action="store_true",
        help="time only the majorization sweeps at the first size (input vs Morton order)",
    )
    parser.add_argument("--sweeps", type=int, default=5)
    parser.add_argument("--kernels", help="with --sweeps-only: another knnscal_kernels.py to compare")
    parser.add_argument(
        "--table",
        nargs="+",
        metavar="JSON",
        help="print the table from JSON lines saved from earlier runs (stderr), run nothing",
    )
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args)))
        return 0
    if args.sweeps_only:
        sweeps_only(args)
        return 0
    results = []
    if args.table:
        for path in args.table:
            with open(path) as f:
                results += [json.loads(line) for line in f if line.startswith("{")]
    for n in [] if args.table else args.sizes:
        runs = [(args.tol, args.max_iter)]
        if n <= args.reference_max:
            runs.append((args.reference_tol, REFERENCE_MAX_ITER))
        for tol, max_iter in runs:
            results.append(run_one_size(args, int(n), tol, max_iter))
            print(json.dumps(results[-1]), file=sys.stderr)
    header = (
        "n",
        "tol",
        "|E+|",
        "gen s",
        "E+ s",
        "init s",
        "reorder s",
        "iters",
        "conv",
        "s/iter",
        "CPU s/iter",
        "us/iter/(n k log2 k)",
        "CPU us/iter/(n k log2 k)",
        "to conv s",
        "fit s",
        "peak RSS MB",
        "order agr.",
        "vs full",
    )
    full = {r["n"]: r["order_agreement"] for r in results if r.get("tol") == args.reference_tol}

    def cpu(r, fmt, scale):  # runs recorded before CPU time was measured have none
        return fmt.format(scale * r["cpu_per_iter_s"]) if "cpu_per_iter_s" in r else "-"

    rows = []
    for r in results:
        unit = r["n"] * r["k"] * math.log2(r["k"])
        rows.append(
            (
                f"{r['n']:,}",
                f"{r['tol']:g}" if "tol" in r else "-",
                f"{r['entries']:,}",
                f"{r['generate_s']:.1f}",
                f"{r['edges_s']:.1f}",
                f"{r['init_s']:.1f}",
                f"{r['reorder_s']:.1f}",
                str(r["iterations"]),
                "yes" if r["converged"] else "no",
                f"{r['per_iter_s']:.3f}",
                cpu(r, "{:.3f}", 1.0),
                f"{1e6 * r['per_iter_s'] / unit:.4f}",
                cpu(r, "{:.4f}", 1e6 / unit),
                f"{r['iterations_s']:.1f}",
                f"{r['fit_s']:.1f}",
                f"{r['peak_rss_mb']:.0f}",
                f"{r['order_agreement']:.4f}",
                f"{r['order_agreement'] - full[r['n']]:+.4f}" if r["n"] in full else "-",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
