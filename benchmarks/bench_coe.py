"""COE benchmarks: training time / peak memory / triples per second, scaling, serving latency.

    .venv/bin/python benchmarks/bench_coe.py train   --data $ORDREC_DATA/ml-100k/u.data
    .venv/bin/python benchmarks/bench_coe.py scaling [--factors 1,10,100]
    .venv/bin/python benchmarks/bench_coe.py latency --data $ORDREC_DATA/ml-100k/u.data
    .venv/bin/python benchmarks/bench_coe.py all     --data $ORDREC_DATA/ml-100k/u.data

Each memory figure comes from a fresh subprocess (peak RSS from getrusage),
so one measurement does not inherit another's heap; the baseline RSS of the
interpreter with numpy/numba/scipy loaded is printed beside it. Timings on a
shared 2-core machine are noisy: read them as orders of magnitude.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _ml100k(path: str):
    from ordrec.trainer.reproduce.coe import paper_filter, read_whitespace_ratings

    return paper_filter(read_whitespace_ratings(path))


def _generated(factor: int, seed: int = 0):
    """ML-100K-like ratings with ``factor`` x the users (items fixed), 1..5 stars.

    Items stay at 1,413, so each item's user list grows ``factor`` x and the
    type-B triples grow about ``factor``^2 x while the ratings grow ``factor`` x.
    """
    from ordrec.service.storage.idmap import IdMap
    from ordrec.trainer.data.types import Ratings

    rng = np.random.default_rng(seed)
    n_users, n_items, per_user = 943 * factor, 1413, 106
    user = np.repeat(np.arange(n_users, dtype=np.int32), per_user)
    # popularity-skewed item choice (with replacement; duplicates are harmless here)
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.8
    item = rng.choice(n_items, size=user.size, p=pop / pop.sum()).astype(np.int32)
    rating = rng.integers(1, 6, size=user.size).astype(np.float32)
    return Ratings(
        IdMap([str(u) for u in range(n_users)]), IdMap([str(i) for i in range(n_items)]), user, item, rating
    )


# ------------------------------------------------------------ child runs
def child_train(spec: dict) -> dict:
    from ordrec.trainer.models.coe import TripleSource, normalise
    from ordrec.trainer.models.pipeline import configure

    baseline = _rss_mb()
    data = _ml100k(spec["data"]) if spec.get("data") else _generated(spec["factor"])
    after_data = _rss_mb()
    t0 = time.perf_counter()
    values = normalise(data, "ratings")
    triples = TripleSource.build(data.user, data.item, values, data.n_users, data.n_items)
    prep = time.perf_counter() - t0
    params = dict(spec["params"])
    model = configure("coe", params).estimator  # the flat names a job table writes
    # warm-up: load or compile the kernels outside the timed fit
    configure("coe", dict(params, max_iter=1, steps_per_epoch=1000)).estimator.fit_triples(data, triples)
    t0 = time.perf_counter()
    model.fit_triples(data, triples)
    fit = time.perf_counter() - t0
    return {
        "ratings": len(data),
        "users": data.n_users,
        "items": data.n_items,
        "type_a": triples.n_type_a,
        "type_b": triples.n_type_b,
        "source_mb": triples.nbytes() / 2**20,
        "prep_s": prep,
        "fit_s": fit,
        "steps": model.steps_,
        "triples_per_s": model.steps_ / fit,
        "baseline_rss_mb": baseline,
        "data_rss_mb": after_data,
        "peak_rss_mb": _rss_mb(),
    }


def _in_child(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "_child", json.dumps(spec)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# -------------------------------------------------------------- commands
def bench_train(args) -> None:
    from ordrec.trainer.reproduce.coe import DEFAULTS

    print("Training on ML-100K (filtered, all 99,543 ratings), tuned settings; each row a fresh process")
    print(
        f"{'function':10s} {'steps':>10s} {'fit s':>7s} {'triples/s':>11s} {'prep s':>7s} "
        f"{'source MB':>9s} {'base RSS':>9s} {'peak RSS':>9s}"
    )
    for function in ("sigmoid", "gompertz"):
        params = dict(DEFAULTS[function], function=function, n_components=2)
        r = _in_child({"data": args.data, "params": params})
        print(
            f"{function:10s} {r['steps']:10d} {r['fit_s']:7.2f} {r['triples_per_s']:11.3g} {r['prep_s']:7.2f} "
            f"{r['source_mb']:9.1f} {r['baseline_rss_mb']:8.0f}M {r['peak_rss_mb']:8.0f}M"
        )


def bench_scaling(args) -> None:
    from ordrec.trainer.reproduce.coe import DEFAULTS

    factors = [int(x) for x in args.factors.split(",")]
    print("Scaling: generated ratings, users x factor (items fixed at 1,413), 2,000,000 SGA steps each")
    print(
        f"{'factor':>6s} {'ratings':>10s} {'type-A':>10s} {'type-B':>10s} {'source MB':>9s} "
        f"{'bytes/rating':>12s} {'peak RSS':>9s} {'prep s':>7s} {'triples/s':>10s}"
    )
    for f in factors:
        params = dict(
            DEFAULTS["sigmoid"], function="sigmoid", n_components=2, max_iter=1, steps_per_epoch=2_000_000
        )
        r = _in_child({"factor": f, "params": params})
        print(
            f"{f:6d} {r['ratings']:10d} {r['type_a']:10.3g} {r['type_b']:10.3g} {r['source_mb']:9.1f} "
            f"{r['source_mb'] * 2**20 / r['ratings']:12.1f} {r['peak_rss_mb']:8.0f}M {r['prep_s']:7.2f} "
            f"{r['triples_per_s']:10.3g}"
        )


def _percentiles(fn, calls: int) -> tuple[float, float, float, float]:
    """Wall p50/p99 and thread-CPU p50/p99 in microseconds.

    On a shared machine a call longer than a few tens of microseconds is
    sometimes preempted for a whole scheduler slice (4-16 ms), which then
    dominates the wall p99; thread CPU time excludes that wait.
    """
    wall = np.empty(calls)
    cpu = np.empty(calls)
    for k in range(calls):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        fn(k)
        wall[k] = time.perf_counter() - t0
        cpu[k] = time.thread_time() - c0
    return tuple(float(np.percentile(x, q) * 1e6) for x in (wall, cpu) for q in (50, 99))


def _latency_rows(index, label: str, calls: int) -> None:
    rng = np.random.default_rng(0)
    users = rng.integers(0, len(index.users), calls)
    items = rng.integers(0, len(index.items), calls)
    for _ in range(200):  # warm up
        index.recommend(int(users[0]), 10, exclude=index.seen(int(users[0])))
    cases = {
        "Recommend n=10 (exclude seen)": lambda k: index.recommend(
            int(users[k]), 10, exclude=index.seen(int(users[k]))
        ),
        "Neighbors item->items k=10": lambda k: index.neighbors("", "items", int(items[k]), "items", 10),
        "Neighbors user->users k=10": lambda k: index.neighbors("", "users", int(users[k]), "users", 10),
        "Neighbors item->users k=10": lambda k: index.neighbors("", "items", int(items[k]), "users", 10),
        "Neighbors user->items k=10": lambda k: index.neighbors("", "users", int(users[k]), "items", 10),
    }
    for name, fn in cases.items():
        p50, p99, c50, c99 = _percentiles(fn, calls)
        print(f"{label:28s} {name:32s} {p50:8.1f} {p99:8.1f} {c50:8.1f} {c99:8.1f}")


def bench_latency(args) -> None:
    from ordrec.service.indices.models.coe import COEIndex
    from ordrec.service.storage.artifact import Artifact
    from ordrec.service.storage.idmap import IdMap
    from ordrec.trainer.models.pipeline import configure
    from ordrec.trainer.reproduce.coe import DEFAULTS

    print("In-process latency (index methods on row numbers, no gRPC), microseconds")
    print(f"{'map':28s} {'query':32s} {'p50 us':>8s} {'p99 us':>8s} {'cpu p50':>8s} {'cpu p99':>8s}")
    data = _ml100k(args.data)
    model = configure("coe", dict(DEFAULTS["sigmoid"], function="sigmoid")).estimator.fit(data)
    _latency_rows(COEIndex.from_artifact(model.to_artifact()), "ML-100K (943 x 1,413)", args.calls)

    rng = np.random.default_rng(1)
    n_items, n_users, per_user = 1_000_000, 10_000, 50
    seen = np.sort(rng.integers(0, n_items, (n_users, per_user)), axis=1).astype(np.int32)
    t0 = time.perf_counter()
    artifact = Artifact(
        kind="coe",
        arrays={
            "user_coords": rng.normal(size=(n_users, 2)).astype(np.float32),
            "item_coords": rng.normal(size=(n_items, 2)).astype(np.float32),
            "seen_indptr": np.arange(0, n_users * per_user + 1, per_user, dtype=np.int64),
            "seen_indices": seen.ravel(),
            "item_popularity": np.ones(n_items, np.float32),
        },
        ids={
            "users": IdMap([f"u{k}" for k in range(n_users)]),
            "items": IdMap([f"i{k}" for k in range(n_items)]),
        },
    )
    index = COEIndex.from_artifact(artifact)
    print(
        f"(generated map: {n_items:,} items, {n_users:,} users, {per_user} seen each;"
        f" ids + KD-trees built in {time.perf_counter() - t0:.1f}s)"
    )
    _latency_rows(index, "generated (10,000 x 1e6)", args.calls)


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "_child":
        print(json.dumps(child_train(json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("train", "scaling", "latency", "all"))
    parser.add_argument(
        "--data",
        default=os.path.join(
            os.environ.get("ORDREC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"),
            "ml-100k",
            "u.data",
        ),
    )
    parser.add_argument("--factors", default="1,10,100")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.what in ("train", "all"):
        bench_train(args)
    if args.what in ("scaling", "all"):
        bench_scaling(args)
    if args.what in ("latency", "all"):
        bench_latency(args)


if __name__ == "__main__":
    main()
