"""How long publishing a large catalogue's item index takes with ``structure="auto"``.

Builds the index the way publishing does (``ann.write_index`` with the auto parameters and
their time budget) over a planted catalogue (``catalog_data.py``), then measures recall@10 of
the index chosen on users other than the 200 it was calibrated on, against exact scoring, with
each user's training items excluded as served. Prints what the version records: each structure
tried, its breadth, calibrated recall, CPU per query and seconds, or the graph's predicted
build time when it was skipped.

    .venv/bin/python benchmarks/bench_index_build.py --items 1000000 --rank 50

(10^6 items x 5 levels x rank 50 = 250 dimensions, 1 GB of float32 factors.) With ``--version
REG/dcr/<version>`` the same over a published DCR version's item factors, calibrated and measured
on its own users (their training items excluded, as served); ``--budget`` large enough lets the
graph be built beside the inverted file; ``--structure hnsw`` or ``ivf`` builds that one alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from catalog_data import folded_queries, planted_catalog  # noqa: E402

from ordrec.service.indices import ann  # noqa: E402
from ordrec.service.storage.artifact import SearchIndex  # noqa: E402

SEEN_PER_USER = 20


def queries_of(users: np.ndarray, n_items: int, seed: int) -> ann.Queries:
    """Folded users, each with ``SEEN_PER_USER`` random items excluded (their training items)."""
    rng = np.random.default_rng(seed)
    seen = [np.unique(rng.integers(0, n_items, SEEN_PER_USER)).astype(np.int64) for _ in users]
    return ann.Queries(folded_queries(users), seen)


def planted(args) -> tuple[np.ndarray, ann.Queries, ann.Queries]:
    """A planted catalogue's items, its calibration users and the users measured after."""
    users, items = planted_catalog(args.items, ann.CALIBRATION_QUERIES + args.users, rank=args.rank)
    calibration = queries_of(users[: ann.CALIBRATION_QUERIES], args.items, seed=1)
    return items, calibration, queries_of(users[ann.CALIBRATION_QUERIES :], args.items, seed=2)


def trained(args) -> tuple[np.ndarray, ann.Queries, ann.Queries]:
    """A DCR version's items and a seeded sample of its users as Recommend searches for them."""
    from ivf_partitions import served_queries

    from ordrec.service.storage.format import load_version

    artifact = load_version(args.version)
    items = np.ascontiguousarray(artifact.arrays["item_factors"], dtype=np.float32)
    users = served_queries(artifact, ann.CALIBRATION_QUERIES + args.users)
    first = ann.CALIBRATION_QUERIES
    excludes = users.excludes or []
    return (
        items,
        ann.Queries(users.vectors[:first], excludes[:first]),
        ann.Queries(users.vectors[first:], excludes[first:]),
    )


def measured_recall(search: ann.AnnSearch, items: np.ndarray, queries: ann.Queries) -> tuple[float, float]:
    """recall@10 against exact scoring, and the p50 of one search in microseconds."""
    truth = ann.exact_tops(items, queries, 10)
    hits, took = 0, []
    for query, exclude, exact in zip(queries.vectors, queries.excludes or [], truth):
        start = time.perf_counter()
        found = search.search(query, 10, exclude)
        took.append(time.perf_counter() - start)
        hits += exact.size if found is None else np.intersect1d(found[0], exact).size
    return hits / sum(t.size for t in truth), float(np.median(took) * 1e6)


def print_phases(phases: dict[str, dict[str, float]], wall: float, cpu: float) -> None:
    """The build's phases as the version records them (wall and CPU seconds of all threads)."""
    print("\n| phase | wall s | CPU s |\n|---|---:|---:|")
    for name, took in phases.items():
        print(f"| {name} | {took['seconds']:.1f} | {took['cpu_seconds']:.1f} |")
    print(f"| whole publish | {wall:.1f} | {cpu:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--rank", type=int, default=50, help="per level; 5 levels")
    p.add_argument("--users", type=int, default=1000, help="measured users (besides the 200 calibrated on)")
    p.add_argument("--recall-target", type=float, default=ann.AUTO_DEFAULT_PARAMS["recall_target"])
    p.add_argument("--budget", type=float, default=ann.AUTO_DEFAULT_PARAMS["budget_seconds"])
    p.add_argument(
        "--structure",
        default=ann.AUTO,
        choices=[ann.AUTO, "hnsw", "ivf"],
        help="the structure to build (default: auto, as publishing chooses)",
    )
    p.add_argument(
        "--version", type=Path, help="a published DCR version's folder instead of a planted catalogue"
    )
    args = p.parse_args()

    start = time.perf_counter()
    items, calibration, measured = (trained if args.version else planted)(args)
    print(
        f"catalogue {items.shape[0]} x {items.shape[1]} ({items.nbytes / 2**20:.0f} MB float32)"
        f" {'read' if args.version else 'generated'} in {time.perf_counter() - start:.1f} s;"
        f" load average {os.getloadavg()[0]:.2f}"
    )
    chosen = {"structure": args.structure, "recall_target": args.recall_target}
    params = ann.build_params(
        {**chosen, "budget_seconds": args.budget} if args.structure == ann.AUTO else chosen
    )
    with tempfile.TemporaryDirectory(prefix="ordrec-index-build-") as tmp:
        path = Path(tmp) / "items.index"
        start, cpu = time.perf_counter(), time.process_time()
        phases = ann.Phases()
        library = ann.write_index(items, path, params, calibration, phases=phases)
        wall = time.perf_counter() - start
        budget = f" (budget {args.budget:.0f} s)" if args.structure == ann.AUTO else ""
        print(f"published index in {wall:.1f} s{budget}; load average {os.getloadavg()[0]:.2f}")
        print(ann.describe_choice(library, params))
        print_compared(params.get("compared", {}))
        print_phases(params.get("build_phases", phases.taken), wall, time.process_time() - cpu)
        search = ann.AnnSearch.open(SearchIndex(library, params, path=path), items)
        recall, p50 = measured_recall(search, items, measured)
        print(
            f"chosen {search.description}: recall@10 {recall:.3f} on {args.users} other users,"
            f" p50 {p50:.0f} us per search (one thread)"
        )


def print_compared(compared: dict[str, dict]) -> None:
    """What ``structure="auto"`` tried: each structure built or skipped, its breadth and cost."""
    if compared:
        print("| structure | built | seconds | breadth | calibrated recall@10 | us/query |")
        print("|---|---|---:|---|---:|---:|")
    for structure, f in compared.items():
        if f.get("skipped"):
            why = f"no: predicted {f['predicted_seconds']} s, {f['left_seconds']} s left"
            print(f"| {structure} | {why} | - | - | - | - |")
            continue
        breadth = ", ".join(f"{k} {v}" for k, v in f.items() if k in ("ef_search", "nlist", "nprobe"))
        print(f"| {structure} | yes | {f['seconds']} | {breadth} | {f['recall']:.3f} | {f['us_per_query']} |")


if __name__ == "__main__":
    main()
