"""DCR benchmarks: training time and memory, in-process Recommend latency, batch throughput.

    .venv/bin/python benchmarks/bench_dcr.py [--data /work/shared/data/ml-100k/u.data]
        [--epochs 20] [--ranks 20,40] [--specs ml-100k,netflix1m,netflix1m:20,netflix1m:50]
        [--pairwise false,true] [--skip-train] [--skip-serve]

Prints tables (not a timed test). Training runs each configuration in a
fresh child process so its peak resident memory (``ru_maxrss``) is its own;
the numba kernels are compiled (or loaded from cache) before the clock
starts. Data sets:

- ML-100K, all 100,000 ratings (``--data``);
- a generated set the size of the paper's Netflix 1M sample: 48,018 users,
  1,777 items, 1,020,752 ratings on 1..5, heavy-tailed user and item
  activity, and the protocol's N = 20 and N = 50 training subsets of it
  (users with at least N + 10 ratings, N ratings each), which is what the
  paper's Table 3 times (1.05 s and 2.31 s).

Serving: in-process ``Index.recommend`` (top-10, the user's training items
excluded) for the ML-100K model and for a 17,770-item catalogue (the Netflix
item count) with random factors, p50/p99 over single calls, then
``recommend_many`` throughput in users per second.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# One BLAS thread: on 2 shared cores a multi-threaded gemv is 10-30x slower
# (threads wait for a busy core); set before numpy loads. Numba's training
# threads are separate (NUMBA_NUM_THREADS) and stay at the core count.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from service.artifacts import Artifact  # noqa: E402
from service.idmap import IdMap  # noqa: E402
from service.models.dcr import Index  # noqa: E402
from trainer.data.types import Ratings  # noqa: E402

NETFLIX1M = (48_018, 1_777, 1_020_752)


def generated_ratings(n_users: int, n_items: int, n_ratings: int, seed: int = 0) -> Ratings:
    """Heavy-tailed activity, ratings from a low-rank preference cut at the ML/Netflix rating shares."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 1.0, n_users)
    counts = np.maximum(1, np.floor(weights / weights.sum() * n_ratings)).astype(np.int64)
    counts = np.minimum(counts, n_items)
    while counts.sum() < n_ratings:  # top up the rounding loss on random users with room left
        room = np.flatnonzero(counts < n_items)
        extra = rng.choice(room, min(room.size, n_ratings - counts.sum()), replace=False)
        counts[extra] += 1
    excess = counts.sum() - n_ratings
    if excess > 0:
        big = np.argsort(-counts)[:excess]
        counts[big] -= 1
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    popularity /= popularity.sum()
    user = np.repeat(np.arange(n_users), counts)
    item = np.empty(user.size, np.int64)
    pos = 0
    for c in counts:
        item[pos : pos + c] = rng.choice(n_items, c, replace=False, p=popularity)
        pos += c
    A = rng.normal(size=(n_users, 5))
    B = rng.normal(size=(n_items, 5))
    x = np.einsum("nk,nk->n", A[user], B[item]) + rng.normal(size=n_items)[item]
    cuts = np.quantile(x, np.cumsum([0.06, 0.11, 0.27, 0.34]))
    rating = (np.digitize(x, cuts) + 1).astype(np.float32)
    return Ratings(IdMap([str(i) for i in range(n_users)]), IdMap([str(i) for i in range(n_items)]),
                   user.astype(np.int32), item.astype(np.int32), rating)


def load(spec: str) -> Ratings:
    if spec.startswith("netflix1m"):
        data = generated_ratings(*NETFLIX1M)
        if spec != "netflix1m":  # "netflix1m:N" = the protocol's training subset
            from trainer.evaluation.dcr import per_user_split

            data, _ = per_user_split(data, int(spec.split(":")[1]), np.random.default_rng(0))
        return data
    from trainer.data.readers import read_ratings

    return read_ratings(spec)


def train_child(spec: str, params: dict) -> dict:
    """Runs in a fresh process: fit once, return time and memory."""
    from trainer.models.dcr import DCR

    data = load(spec)
    DCR(**dict(params, epochs=1, pairwise_epochs=1)).fit(data.subset(np.arange(min(len(data), 1000))))
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    model = DCR(**params).fit(data)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    rss_before, rss_after = before.ru_maxrss, after.ru_maxrss
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"ratings": len(data), "users_with_ratings": int(np.unique(data.user).size),
            "seconds": seconds, "cpu_seconds": cpu, "per_epoch": seconds / max(1, params["epochs"] + params.get("pairwise_epochs", 0)
                                                           * bool(params.get("pairwise"))),
            "maxrss_mb": rss_after / 1024, "rss_growth_mb": (rss_after - rss_before) / 1024,
            "factors_mb": (model.U_.nbytes + model.V_.nbytes) / 2**20}


def bench_training(args) -> None:
    specs = [args.data if s == "ml-100k" else s for s in args.specs]
    print(f"\nTraining (wall time, {os.cpu_count()} cores shared with other work; epochs={args.epochs})")
    print("fit s = wall time of fit(); CPU s = user + system time of all its threads (robust to other load)")
    header = (f"{'data':<16} {'ratings':>9} {'rank':>4} {'pairwise':>8} {'fit s':>7} {'CPU s':>7} {'s/epoch':>8}"
              f" {'max RSS MB':>10} {'factors MB':>10}")
    print(header)
    print("-" * len(header))
    for spec in specs:
        for rank in args.ranks:
            for pairwise in args.pairwise:
                params = dict(rank=rank, epochs=args.epochs, pairwise=pairwise, pairwise_epochs=args.epochs,
                              lr=0.05, lr_decay=0.02, seed=0)
                out = subprocess.run([sys.executable, __file__, "--child", spec, json.dumps(params)],
                                     capture_output=True, text=True, timeout=3600)
                if out.returncode:
                    print(f"{spec}: child failed\n{out.stderr[-2000:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                name = os.path.basename(os.path.dirname(spec)) if os.path.sep in spec else spec
                print(f"{name:<16} {r['ratings']:>9,} {rank:>4} {str(pairwise):>8} {r['seconds']:>7.2f}"
                      f" {r['cpu_seconds']:>7.2f}"
                      f" {r['per_epoch']:>8.3f} {r['maxrss_mb']:>10.0f} {r['factors_mb']:>10.1f}", flush=True)


def random_index(n_users: int, n_items: int, rank: int, levels: int = 5, seen: int = 50, seed: int = 0) -> Index:
    rng = np.random.default_rng(seed)
    L = levels - 1
    U = rng.normal(size=(n_users, L * rank)).astype(np.float32) / np.sqrt(rank)
    V = rng.normal(size=(n_items, L * rank)).astype(np.float32) / np.sqrt(rank)
    indices = np.concatenate([rng.choice(n_items, seen, replace=False) for _ in range(n_users)])
    return Index(Artifact("dcr", {
        "user_factors": U, "item_factors": V,
        "seen_indptr": np.arange(0, seen * n_users + 1, seen, dtype=np.int64),
        "seen_indices": indices.astype(np.int32),
        "item_popularity": rng.random(n_items).astype(np.float32),
    }, {"users": IdMap([str(i) for i in range(n_users)]), "items": IdMap([str(i) for i in range(n_items)])},
        attributes={"levels": [1.0, 2.0, 3.0, 4.0, 5.0], "relevance": "linear", "rank": rank}))


def latency(index: Index, calls: int, with_distribution: bool, seed: int = 1) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, len(index.users), calls)
    index.recommend(0, 10, exclude=index.seen(0))  # warm-up (numba top-k)
    times = np.empty(calls)
    for k, u in enumerate(users):
        start = time.perf_counter_ns()
        rows, _ = index.recommend(int(u), 10, exclude=index.seen(int(u)))
        if with_distribution:
            index.distribution(int(u), rows)
        times[k] = time.perf_counter_ns() - start
    return float(np.percentile(times, 50)) / 1e3, float(np.percentile(times, 99)) / 1e3


def throughput(index: Index, batch: int, seconds: float = 2.0) -> float:
    rng = np.random.default_rng(2)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        users = rng.integers(0, len(index.users), batch)
        index.recommend_many(users, 10, excludes=[index.seen(int(u)) for u in users])
        done += batch
    return done / (time.perf_counter() - start)


def bench_serving(args) -> None:
    from trainer.data.readers import read_ratings
    from trainer.models.dcr import DCR

    indexes = []
    data = read_ratings(args.data)
    for rank in args.ranks:
        model = DCR(rank=rank, epochs=args.epochs, lr=0.05, lr_decay=0.02, seed=0).fit(data)
        indexes.append((f"ml-100k ({len(data.items)} items)", rank, Index.from_artifact(model.to_artifact())))
        indexes.append(("17,770 items", rank, random_index(2_000, 17_770, rank)))
    print(f"\nIn-process Recommend, top-10 excluding seen items ({os.cpu_count()} cores shared with other work)")
    header = f"{'catalogue':<22} {'rank':>4} {'dims':>5} {'p50 us':>8} {'p99 us':>8} {'+dist p50':>10} {'+dist p99':>10} {'batch 64 users/s':>17} {'batch 512 users/s':>18}"
    print(header)
    print("-" * len(header))
    for name, rank, index in indexes:
        p50, p99 = latency(index, args.calls, False)
        d50, d99 = latency(index, args.calls, True)
        t64, t512 = throughput(index, 64), throughput(index, 512)
        print(f"{name:<22} {rank:>4} {index._item.shape[1]:>5} {p50:>8.1f} {p99:>8.1f} {d50:>10.1f} {d99:>10.1f}"
              f" {t64:>17,.0f} {t512:>18,.0f}", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(train_child(sys.argv[2], json.loads(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(os.environ.get("ORDREC_DATA", "/work/shared/data"),
                                                       "ml-100k", "u.data"))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--ranks", default="20,40")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--specs", default="ml-100k,netflix1m,netflix1m:20,netflix1m:50",
                        help="training sets: ml-100k (--data), netflix1m (generated), netflix1m:N (its N-per-user subset)")
    parser.add_argument("--pairwise", default="false,true", help="train without / with the pairwise refinement")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-serve", action="store_true")
    args = parser.parse_args()
    args.ranks = [int(x) for x in args.ranks.split(",")]
    args.specs = args.specs.split(",")
    args.pairwise = [x.strip().lower() == "true" for x in args.pairwise.split(",")]
    if not args.skip_train:
        bench_training(args)
    if not args.skip_serve:
        bench_serving(args)


if __name__ == "__main__":
    main()
