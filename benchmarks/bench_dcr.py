"""DCR benchmarks: training time and memory, in-process Recommend latency, batch throughput.

    .venv/bin/python benchmarks/bench_dcr.py [--data $ORDREC_DATA/ml-100k/u.data]
        [--epochs 100] [--tol 0.002] [--order user|random] [--ranks 40,20] [--repeats 3]
        [--specs ml-100k,netflix1m,netflix1m:20,netflix1m:50] [--no-pairwise] [--skip-train] [--skip-serve]
        [--init random|marginal] [--stop tol|validation] [--lr 0.05] [--folds 1]
    .venv/bin/python benchmarks/bench_dcr.py --skip-serve --protocol --folds 3 --specs netflix1m:20,netflix1m:50

Defaults are the estimator's random-init training settings (at most 100
epochs with the tol 0.002 stopping rule, ratings grouped by user, 20
pairwise epochs); ``--init marginal --stop validation --lr 0.02`` times the
ML-100K protocol's current fit (per-level epochs chosen on a validation
hold-out, then a refit on all ratings: both stages timed);
``--tol 0 --order random`` gives the previous fixed-epoch random-order fit.
``--protocol`` times, on each ``netflix1m:N`` set, the fit the ML-100K
protocol makes for that N (``trainer.reproduce.dcr.protocol_fit``: start,
rank, noise, lr; per-level epochs the median over ``--folds`` hold-outs,
then the refit), and reports the refit on its own: the final model's
training, which is what the paper's Table 3 times (its grid search is not
timed either).

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

Serving: in-process ``DCRIndex.recommend`` (top-10, the user's training items
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
from pathlib import Path

# One BLAS thread: on 2 shared cores a multi-threaded gemv is 10-30x slower
# (threads wait for a busy core); set before numpy loads. Numba's training
# threads are separate (NUMBA_NUM_THREADS) and stay at the core count.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ordrec.service.indices.models.dcr import DCRIndex  # noqa: E402
from ordrec.service.storage.artifact import Artifact  # noqa: E402
from ordrec.service.storage.idmap import IdMap  # noqa: E402
from ordrec.trainer.data.types import Ratings  # noqa: E402

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
    return Ratings(
        IdMap([str(i) for i in range(n_users)]),
        IdMap([str(i) for i in range(n_items)]),
        user.astype(np.int32),
        item.astype(np.int32),
        rating,
    )


def load(spec: str) -> Ratings:
    if spec.startswith("netflix1m"):
        data = generated_ratings(*NETFLIX1M)
        if spec != "netflix1m":  # "netflix1m:N" = the protocol's training subset
            from ordrec.trainer.reproduce.dcr import per_user_split

            data, _ = per_user_split(data, int(spec.split(":")[1]), np.random.default_rng(0))
        return data
    from ordrec.trainer.data.readers import read_ratings

    return read_ratings(spec)


PAPER_TABLE3 = {"netflix1m:20": 1.05, "netflix1m:50": 2.31}  # DCR running time (s), Hu & Li 2017, Table 3


def train_child(spec: str, params: dict, pairwise: bool, repeats: int) -> dict:
    """Runs in a fresh process: fit ``repeats`` times (refine once more each when
    ``pairwise``), return median times, epochs and memory."""
    from ordrec.trainer.reproduce.dcr import fit_dcr, median_epochs, refinement_for, validation_split

    params = dict(params)
    stop = params.pop("stop", "tol")
    folds = int(params.pop("folds", 1))
    data = load(spec)
    small = data.subset(np.arange(min(len(data), 1000)))
    warm = fit_dcr(dict(params, max_iter=2), small)
    refinement_for(params, warm, pairwise_max_iter=1).refined(warm)
    if stop == "validation":
        fit_dcr(dict(params, max_iter=2), *validation_split(small, np.random.default_rng(0)))
    before = resource.getrusage(resource.RUSAGE_SELF)
    fits, fit_cpu, refines, refine_cpu, refits, refit_cpu, chosen_epochs = [], [], [], [], [], [], []
    for r in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        if stop == "validation":
            # The protocol's fit: per-level epochs chosen on hold-outs of the ratings (the median
            # over ``folds`` of them), then a refit on all of them for those counts; both stages
            # are timed, and the refit (the final model's training) also on its own.
            chosen = median_epochs(dict(params, random_state=r), data, np.random.default_rng(r), folds)[
                "level_epochs"
            ]
            chosen_epochs.append(chosen)
            c1, t1 = time.process_time(), time.perf_counter()
            model = fit_dcr(dict(params, random_state=r, level_epochs=chosen), data)
            refits.append(time.perf_counter() - t1)
            refit_cpu.append(time.process_time() - c1)
        else:
            model = fit_dcr(dict(params, random_state=r), data)
        fits.append(time.perf_counter() - t0)
        fit_cpu.append(time.process_time() - c0)
        if pairwise:
            c0, t0 = time.process_time(), time.perf_counter()
            refinement_for(params, model).refined(model)
            refines.append(time.perf_counter() - t0)
            refine_cpu.append(time.process_time() - c0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    med = lambda xs: float(np.median(xs)) if xs else float("nan")  # noqa: E731
    return {
        "ratings": len(data),
        "users_with_ratings": int(np.unique(data.user).size),
        "epochs_run": (str(model.best_epochs_) if stop == "validation" else int(model.epochs_run_)),
        "refit_seconds": med(refits),
        "refit_cpu_seconds": med(refit_cpu),
        "seconds": med(fits),
        "seconds_min": min(fits),
        "cpu_seconds": med(fit_cpu),
        "pairwise_seconds": med(refines),
        "pairwise_cpu_seconds": med(refine_cpu),
        "maxrss_mb": after.ru_maxrss / 1024,
        "rss_growth_mb": (after.ru_maxrss - before.ru_maxrss) / 1024,
        "factors_mb": (model.U_.nbytes + model.V_.nbytes) / 2**20,
    }


def bench_training(args) -> None:
    specs = [args.data if s == "ml-100k" else s for s in args.specs]
    if args.protocol:
        print(f"\nTraining ({os.cpu_count()} cores shared with other work): DCR, the ML-100K protocol's fit")
    else:
        print(
            f"\nTraining ({os.cpu_count()} cores shared with other work): DCR"
            f" (lr {args.lr}, lr_decay 0.02, reg 0.001, at most {args.epochs} epochs, order {args.order},"
            f" init {args.init} (noise {args.init_std}), "
            + (
                f"tol {args.tol}"
                if args.stop == "tol"
                else f"per-level epochs on {args.folds} validation hold-out(s) (val_tol {args.val_tol}, patience"
                f" {args.patience}) then a refit on all ratings (fit s = both; refit s = the refit)"
            )
            + f"); median of {args.repeats} fits"
        )
    print(
        "fit s = wall time of fit() (min in brackets); CPU s = user + system time of all its threads;"
        f" pairwise = refined() after it, {args.pairwise_epochs} epochs; paper s = Table 3 (DCR)"
    )
    if args.protocol:
        print(
            "--protocol: each netflix1m:N set gets the ML-100K protocol's fit for N (trainer.reproduce.dcr."
            "protocol_fit: start, rank, noise, lr), val_tol 0.01, per-level epochs the median over"
            f" {args.folds} hold-out(s), then the refit; --ranks/--init/--lr ignored"
        )
    print("refit s / refit CPU s = the refit alone (the final model's training, what Table 3 times)")
    header = (
        f"{'data':<16} {'ratings':>9} {'rank':>4} {'epochs':>18} {'fit s':>14} {'refit s':>7} {'CPU s':>6}"
        f" {'refit CPU s':>11} {'pairwise s':>10} {'CPU s':>6} {'paper s':>7} {'max RSS MB':>10}"
        f" {'factors MB':>10}"
    )
    print(header)
    print("-" * len(header))
    for spec in specs:
        for rank in args.ranks if not args.protocol else [None]:
            params = dict(
                n_components=rank,
                max_iter=args.epochs,
                tol=args.tol,
                order=args.order,
                learning_rate=args.lr,
                learning_rate_decay=0.02,
                reg=0.001,
                pairwise_max_iter=args.pairwise_epochs,
                pairwise_learning_rate=0.01,
                random_state=0,
                init=args.init,
                init_std=args.init_std,
                stop=args.stop,
                val_tol=args.val_tol,
                patience=args.patience,
                folds=args.folds,
            )
            if args.protocol:
                from ordrec.trainer.reproduce.dcr import protocol_fit

                if ":" not in spec:
                    print(f"{spec}: --protocol needs a netflix1m:N set")
                    continue
                params.update(protocol_fit(int(spec.split(":")[1])), stop="validation", val_tol=0.01)
                rank = params["n_components"]
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    spec,
                    json.dumps(params),
                    str(args.pairwise),
                    str(args.repeats),
                ],
                capture_output=True,
                text=True,
                timeout=3600,
            )
            if out.returncode:
                print(f"{spec}: child failed\n{out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            name = os.path.basename(os.path.dirname(spec)) if os.path.sep in spec else spec
            paper = PAPER_TABLE3.get(spec)
            fit = f"{r['seconds']:.2f} ({r['seconds_min']:.2f})"
            print(
                f"{name:<16} {r['ratings']:>9,} {rank:>4} {r['epochs_run']:>18} {fit:>14} {r['refit_seconds']:>7.2f}"
                f" {r['cpu_seconds']:>6.2f} {r['refit_cpu_seconds']:>11.2f}"
                f" {r['pairwise_seconds']:>10.2f} {r['pairwise_cpu_seconds']:>6.2f}"
                f" {paper if paper else '':>7} {r['maxrss_mb']:>10.0f} {r['factors_mb']:>10.1f}",
                flush=True,
            )


def random_index(
    n_users: int, n_items: int, rank: int, levels: int = 5, seen: int = 50, seed: int = 0
) -> DCRIndex:
    rng = np.random.default_rng(seed)
    L = levels - 1
    U = rng.normal(size=(n_users, L * rank)).astype(np.float32) / np.sqrt(rank)
    V = rng.normal(size=(n_items, L * rank)).astype(np.float32) / np.sqrt(rank)
    indices = np.concatenate([rng.choice(n_items, seen, replace=False) for _ in range(n_users)])
    return DCRIndex(
        Artifact(
            "dcr",
            {
                "user_factors": U,
                "item_factors": V,
                "seen_indptr": np.arange(0, seen * n_users + 1, seen, dtype=np.int64),
                "seen_indices": indices.astype(np.int32),
                "item_popularity": rng.random(n_items).astype(np.float32),
            },
            {
                "users": IdMap([str(i) for i in range(n_users)]),
                "items": IdMap([str(i) for i in range(n_items)]),
            },
            attributes={"levels": [1.0, 2.0, 3.0, 4.0, 5.0], "relevance": "linear", "rank": rank},
        )
    )


def latency(index: DCRIndex, calls: int, with_distribution: bool, seed: int = 1) -> tuple[float, float]:
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


def throughput(index: DCRIndex, batch: int, seconds: float = 2.0) -> float:
    rng = np.random.default_rng(2)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        users = rng.integers(0, len(index.users), batch)
        index.recommend_many(users, 10, excludes=[index.seen(int(u)) for u in users])
        done += batch
    return done / (time.perf_counter() - start)


def bench_serving(args) -> None:
    from ordrec.trainer.data.readers import read_ratings
    from ordrec.trainer.models.dcr import DCR, DCRVariants

    indexes = []
    data = read_ratings(args.data)
    for rank in args.ranks:
        model = DCR(
            n_components=rank,
            max_iter=args.epochs,
            tol=args.tol,
            learning_rate=0.05,
            random_state=0,
        ).fit(data, variants=DCRVariants(order=args.order))
        indexes.append(
            (f"ml-100k ({len(data.items)} items)", rank, DCRIndex.from_artifact(model.to_artifact()))
        )
        indexes.append(("17,770 items", rank, random_index(2_000, 17_770, rank)))
    print(
        f"\nIn-process Recommend, top-10 excluding seen items ({os.cpu_count()} cores shared with other work)"
    )
    header = (
        f"{'catalogue':<22} {'rank':>4} {'dims':>5} {'p50 us':>8} {'p99 us':>8} {'+dist p50':>10}"
        f" {'+dist p99':>10} {'batch 64 users/s':>17} {'batch 512 users/s':>18}"
    )
    print(header)
    print("-" * len(header))
    for name, rank, index in indexes:
        p50, p99 = latency(index, args.calls, False)
        d50, d99 = latency(index, args.calls, True)
        t64, t512 = throughput(index, 64), throughput(index, 512)
        print(
            f"{name:<22} {rank:>4} {index.item_factors.shape[1]:>5} {p50:>8.1f} {p99:>8.1f} {d50:>10.1f} {d99:>10.1f}"
            f" {t64:>17,.0f} {t512:>18,.0f}",
            flush=True,
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(
            json.dumps(
                train_child(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "True", int(sys.argv[5]))
            )
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data",
        default=os.path.join(
            os.environ.get("ORDREC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"),
            "ml-100k",
            "u.data",
        ),
    )
    parser.add_argument("--epochs", type=int, default=100, help="most DCR epochs (the protocol's 100)")
    parser.add_argument(
        "--tol",
        type=float,
        default=0.002,
        help="stopping rule of the protocol (relative training log-likelihood gain); 0: all epochs",
    )
    parser.add_argument("--order", default="user", choices=("user", "random"))
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--init", default="random", choices=("random", "marginal"))
    parser.add_argument("--init-std", type=float, default=None, help="default 0.1 random, 0.02 marginal")
    parser.add_argument(
        "--stop",
        default="tol",
        choices=("tol", "validation"),
        help="validation: the ML-100K protocol's per-level early stopping plus refit (both timed)",
    )
    parser.add_argument(
        "--val-tol",
        type=float,
        default=0.0,
        help="with --stop validation: least relative gain of a level's validation log-likelihood"
        " that counts as an improvement (0: any gain)",
    )
    parser.add_argument(
        "--patience", type=int, default=5, help="with --stop validation: epochs without improvement"
    )
    parser.add_argument(
        "--folds",
        type=int,
        default=1,
        help="with --stop validation: hold-outs whose per-level median epochs the refit uses"
        " (the protocol's 3)",
    )
    parser.add_argument(
        "--protocol",
        action="store_true",
        help="time the ML-100K protocol's fit for each netflix1m:N set (its start, rank, noise"
        " and lr for N; val_tol 0.01; --folds hold-outs; the refit timed on its own)",
    )
    parser.add_argument("--pairwise-epochs", type=int, default=20, help="the protocol's 20")
    parser.add_argument("--repeats", type=int, default=3, help="fits per configuration (median reported)")
    parser.add_argument("--ranks", default="40,20", help="ranks per level (the protocol's 40 first)")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument(
        "--specs",
        default="ml-100k,netflix1m,netflix1m:20,netflix1m:50",
        help="training sets: ml-100k (--data), netflix1m (generated), netflix1m:N (its N-per-user subset)",
    )
    parser.add_argument(
        "--no-pairwise", dest="pairwise", action="store_false", help="skip the refinement timing"
    )
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-serve", action="store_true")
    args = parser.parse_args()
    args.ranks = [int(x) for x in args.ranks.split(",")]
    if args.init_std is None:
        args.init_std = 0.02 if args.init == "marginal" else 0.1
    args.specs = args.specs.split(",")
    if not args.skip_train:
        bench_training(args)
    if not args.skip_serve:
        bench_serving(args)


if __name__ == "__main__":
    main()
