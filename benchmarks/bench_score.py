"""SCORE benchmarks: training time and in-process Neighbors latency.

    .venv/bin/python benchmarks/bench_score.py [--zoo PATH] [--objects 10000] [--aspects 50]
        [--epochs 20] [--queries 2000]

Prints one table of training times (UCI Zoo with all 17 aspects, and a
generated table of objects x aspects with 2-8 values per aspect) and one of
Neighbors latencies on an aspect's map (KD-tree, k = 10) and of related
aspects on the sphere. Not a timed test: numbers depend on the machine and its
load. The first fit of a process pays numba's compile (or cache load); it is
warmed up on a tiny table and excluded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ordrec.service.indices.models.score import SCOREIndex  # noqa: E402
from ordrec.service.storage.idmap import IdMap  # noqa: E402
from ordrec.trainer.data.types import AttributeTable  # noqa: E402
from ordrec.trainer.models.score import SCORE, GroupLayout  # noqa: E402


def generated_table(n_objects: int, n_aspects: int, seed: int = 0) -> AttributeTable:
    rng = np.random.default_rng(seed)
    n_values = rng.integers(2, 9, size=n_aspects)
    codes = np.stack([rng.integers(0, v, size=n_objects) for v in n_values], axis=1).astype(np.int32)
    values = [[str(v) for v in range(int(n))] for n in n_values]
    return AttributeTable(
        IdMap([f"o{i}" for i in range(n_objects)]),
        [f"a{t}" for t in range(n_aspects)],
        codes,
        values,
        source="generated",
    )


def time_fit(
    table: AttributeTable, epochs: int, mode: str = "multi"
) -> tuple[float, int, float, SCOREIndex, float]:
    t0 = time.perf_counter()
    est = SCORE(mode=mode, max_iter=epochs, random_state=0).fit(table)
    fit_s = time.perf_counter() - t0
    steps = epochs * (
        int(est.steps_per_epoch) or int(min(est.triplets_per_aspect_.sum(), est.max_steps_per_epoch))
    )
    t0 = time.perf_counter()
    index = SCOREIndex.from_artifact(est.to_artifact())
    build_s = time.perf_counter() - t0
    return fit_s, steps, float(est.triplets_per_aspect_.sum()), index, build_s


def latency(fn, n: int) -> tuple[float, float, float]:
    times = np.empty(n)
    for q in range(n):
        t0 = time.perf_counter_ns()
        fn(q)
        times[q] = (time.perf_counter_ns() - t0) / 1e3
    return float(np.median(times)), float(np.percentile(times, 99)), float(times.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--zoo",
        default=os.path.join(
            os.environ.get("ORDREC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"),
            "zoo",
            "zoo.data",
        ),
    )
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--aspects", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--queries", type=int, default=2000)
    args = parser.parse_args()

    SCORE(max_iter=1, random_state=0).fit(generated_table(30, 3))  # compile / load the numba cache

    tables = []
    if os.path.exists(args.zoo):
        from ordrec.trainer.data.readers import read_attributes

        tables.append(("zoo (101 x 17)", read_attributes(args.zoo, "zoo")))
    else:
        print(f"(no Zoo file at {args.zoo}: skipped)")
    t0 = time.perf_counter()
    gen = generated_table(args.objects, args.aspects)
    GroupLayout.from_codes(gen.codes)
    layout_s = time.perf_counter() - t0
    tables.append((f"generated ({args.objects} x {args.aspects})", gen))

    print(f"training: mode multi, K=2, {args.epochs} epochs (steps/epoch = triplets, capped at 2e6)")
    header = ("data", "triplets", "SGD steps", "fit s", "steps/s", "index build s")
    results, lines = [], []
    for name, table in tables:
        fit_s, steps, n_trip, index, build_s = time_fit(table, args.epochs)
        results.append((name, table, index))
        lines.append(
            (name, f"{n_trip:.3g}", f"{steps:.3g}", f"{fit_s:.1f}", f"{steps / fit_s:.3g}", f"{build_s:.3f}")
        )
    _print(header, lines)
    print(f"(layout of the generated table's groups: {layout_s:.2f} s, data generation included)")

    print(f"\nin-process queries, {args.queries} each (k = 10), microseconds")
    header = ("data", "query", "p50 us", "p99 us", "mean us")
    lines = []
    for name, _table, index in results:
        spaces = index.spaces()
        n_obj = len(index.objects)
        rng = np.random.default_rng(1)
        rows = rng.integers(0, n_obj, size=args.queries)
        aspects = rng.integers(0, len(spaces), size=args.queries)
        stats = latency(
            lambda q: index.neighbors(spaces[aspects[q]], "objects", int(rows[q]), "objects", 10),  # noqa: B023 - called within this iteration
            args.queries,
        )
        lines.append((name, "Neighbors on an aspect map", *(f"{v:.1f}" for v in stats)))
        stats = latency(
            lambda q: index.related_aspects(int(aspects[q]), min(10, len(spaces) - 1)),  # noqa: B023 - called within this iteration
            args.queries,
        )
        lines.append((name, "related aspects (sphere)", *(f"{v:.1f}" for v in stats)))
    _print(header, lines)


def _print(header, lines) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))


if __name__ == "__main__":
    main()
