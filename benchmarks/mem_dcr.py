"""Peak memory and time per epoch of DCR and Pairwise DCR fits (top-N defaults) on generated
ratings with planted structure, per rating (issue 35, item 1); prints one table.

    python benchmarks/mem_dcr.py                       # 10^6 and 10^7 ratings, Netflix shape
    python benchmarks/mem_dcr.py --ratings 1e8 --shape netflix --models dcr --json out.jsonl
    python benchmarks/mem_dcr.py --ratings 1e7 --models refine,pairwise --folds 1
    python benchmarks/mem_dcr.py --ratings 1e8 --models read --data-dir /tmp/planted

Each row runs in a fresh subprocess, so its peak (VmHWM above the process's start) is its
own. The ratings are generated in blocks of users straight into their final int32 / float32
arrays (:func:`planted_ratings`), so the generator is never the peak. A row times a fit of 0
epochs (the set-up: levels, the seen CSR, the initial factors) and then a fit of one epoch:
the epoch's time is the difference. "peak" counts everything above the start: the
ratings themselves (12 B/rating), the fit's arrays and the factors (shown apart).

Models: ``dcr`` (pointwise, one epoch); ``refine`` (that fit, then one epoch of the pairwise
refinement, ``PairwiseDCR.refined``: its time is the refinement's epoch, and both sets of factors are
held); ``refine0`` (the same refinement epoch from the set-up's factors, without the DCR
epoch: the same steps, in less time); ``inplace`` and ``inplace0`` (the same, refined in place,
``PairwiseDCR.refine_fitted``, as a job with ``pairwise_validation=false`` refines: one set of
factors); ``pairwise`` (the whole validated fit a job runs: ``ValidatedRefinement`` over
``--folds`` hold-outs, one epoch each, scoring at most ``--scored-users`` users); ``read`` (the
generated ratings written once to a tsv file under /tmp, then read by ``read_ratings``, the one
line reader, in a fresh process: its time and peak; the file is deleted after). ``--data-dir``
keeps the generated arrays there as .npy files, so later rows load them instead of generating
them again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ordrec.service.storage.idmap import numbered_ids
from ordrec.trainer.data.types import Ratings

#: Users x items of each shape: like the Netflix prize, a large shop, and a small one for a quick look.
SHAPES = {"netflix": (480_000, 17_770), "shop": (10_000_000, 1_000_000), "small": (20_000, 2_000)}
#: The rating shares of 1..5 (Netflix / MovieLens-like), as in bench_dcr.generated_ratings.
SHARES = (0.06, 0.11, 0.27, 0.34)
BLOCK_RATINGS = 1 << 20


def _activity(n_users: int, n_items: int, n_ratings: int, rng: np.random.Generator) -> np.ndarray:
    """Ratings per user: heavy-tailed (lognormal), at least 1, at most half the catalogue, summing to ``n_ratings``."""
    weights = rng.lognormal(0.0, 1.0, n_users)
    counts = np.maximum(1, np.floor(weights / weights.sum() * n_ratings)).astype(np.int64)
    counts = np.minimum(counts, n_items // 2)
    short = n_ratings - int(counts.sum())
    while short > 0:  # top up the rounding loss on random users with room left
        room = np.flatnonzero(counts < n_items // 2)
        extra = rng.choice(room, min(room.size, short), replace=False)
        counts[extra] += 1
        short -= extra.size
    while short < 0:
        big = np.argsort(-counts)[:-short]
        counts[big] -= 1
        short += big.size
    return counts


def _distinct_draws(
    owners: np.ndarray, cdf: np.ndarray, n_items: int, rng: np.random.Generator
) -> np.ndarray:
    """For each entry of ``owners`` (sorted user rows), an item drawn from ``cdf`` that its user
    has no other entry for; duplicates are redrawn until none is left."""
    items = np.searchsorted(cdf, rng.random(owners.size) * cdf[-1], side="right").clip(0, n_items - 1)
    while True:
        key = owners.astype(np.int64) * n_items + items
        order = np.argsort(key, kind="stable")
        repeat = np.flatnonzero(key[order][1:] == key[order][:-1]) + 1
        if repeat.size == 0:
            return items
        again = order[repeat]
        items[again] = np.searchsorted(cdf, rng.random(again.size) * cdf[-1], side="right").clip(
            0, n_items - 1
        )


def planted_ratings(n_users: int, n_items: int, n_ratings: int, seed: int = 0, rank: int = 5) -> Ratings:
    """Heavy-tailed activity over Zipf(0.8) item popularity, each rating the cut of a rank-``rank``
    preference plus an item effect at the :data:`SHARES`; built in blocks of about
    :data:`BLOCK_RATINGS` ratings directly into int32 / float32 arrays."""
    rng = np.random.default_rng(seed)
    counts = _activity(n_users, n_items, n_ratings, rng)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    cdf = np.cumsum(popularity)
    A = rng.normal(size=(n_users, rank)).astype(np.float32)
    B = rng.normal(size=(n_items, rank)).astype(np.float32)
    effect = rng.normal(size=n_items).astype(np.float32)
    user = np.empty(n_ratings, dtype=np.int32)
    item = np.empty(n_ratings, dtype=np.int32)
    rating = np.empty(n_ratings, dtype=np.float32)
    ends = np.cumsum(counts)
    cuts = None
    first, pos = 0, 0
    while first < n_users:
        last = int(np.searchsorted(ends, pos + BLOCK_RATINGS, side="right")) + 1
        last = min(max(last, first + 1), n_users)
        owners = np.repeat(np.arange(first, last, dtype=np.int32), counts[first:last])
        drawn = _distinct_draws(owners, cdf, n_items, rng)
        x = np.einsum("nk,nk->n", A[owners], B[drawn]) + effect[drawn]
        if cuts is None:  # the first block's quantiles: users are in random order, so a fair sample
            cuts = np.quantile(x, np.cumsum(SHARES))
        stop = pos + owners.size
        user[pos:stop], item[pos:stop] = owners, drawn
        rating[pos:stop] = np.digitize(x, cuts) + 1
        first, pos = last, stop
    return Ratings(numbered_ids(n_users), numbered_ids(n_items), user, item, rating)


def cached_ratings(shape: str, n: int, seed: int, data_dir: str | None) -> Ratings:
    """:func:`planted_ratings` of ``shape``, kept in ``data_dir`` as .npy files when given (and
    loaded from there when already kept)."""
    n_users, n_items = SHAPES[shape]
    if data_dir is None:
        return planted_ratings(n_users, n_items, n, seed)
    stem = Path(data_dir) / f"{shape}_{n}_{seed}"
    paths = [Path(f"{stem}_{column}.npy") for column in ("user", "item", "rating")]
    if all(p.exists() for p in paths):
        user, item, rating = (np.load(p) for p in paths)
        return Ratings(numbered_ids(n_users), numbered_ids(n_items), user, item, rating)
    data = planted_ratings(n_users, n_items, n, seed)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    for p, column in zip(paths, (data.user, data.item, data.rating)):
        np.save(p, column)
    return data


def write_tsv(data: Ratings, path: str) -> None:
    """The ratings as a tsv file with a header, written by blocks (ids are their row numbers)."""
    with open(path, "w") as out:
        out.write("user\titem\trating\n")
        for lo in range(0, len(data), BLOCK_RATINGS):
            hi = lo + BLOCK_RATINGS
            rows = zip(
                data.user[lo:hi].tolist(),
                data.item[lo:hi].tolist(),
                data.rating[lo:hi].astype(np.int32).tolist(),
            )
            out.write("".join(f"{u}\t{i}\t{r}\n" for u, i, r in rows))


def measure_read(path: str, n: int, shape: str) -> dict:
    """One ``read`` row, in this process: read the tsv file, time it, read the peak."""
    from ordrec.trainer.data.readers import read_ratings

    # Warm the reader's kernels on a small file of the same form, so loading them is not counted.
    with tempfile.NamedTemporaryFile("w", suffix=".tsv") as small:
        write_tsv(planted_ratings(200, 50, 2_000), small.name)
        read_ratings(small.name, "tsv")
    base = rss()
    t = time.perf_counter()
    data = read_ratings(path, "tsv")
    read_s = time.perf_counter() - t
    top = peak() - base
    if len(data) != n:
        raise SystemExit(f"{path}: read {len(data)} ratings, wrote {n}")
    return {
        "model": "read",
        "shape": shape,
        "ratings": n,
        "file_mb": round(os.path.getsize(path) / 1e6),
        "read_s": round(read_s, 1),
        "peak_b": round(top / n, 1),
        "held_b": round((rss() - base) / n, 1),
        "peak_mb": round(top / 1e6),
    }


def rss() -> int:
    """Resident bytes now (Linux)."""
    with open(f"/proc/{os.getpid()}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


def peak() -> int:
    """This process's peak resident bytes (VmHWM: its own, not the parent's)."""
    with open(f"/proc/{os.getpid()}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def factor_hash(model) -> str:
    """A short hash of the fitted factors: equal hashes, equal fits. Hashed from the arrays'
    buffers (the digest of their bytes one after the other): a ``tobytes`` copy of 10^7 users'
    factors would be 10 GB."""
    digest = hashlib.sha256()
    for factors in (model.U_, model.V_):
        digest.update(np.ascontiguousarray(factors).data)
    return digest.hexdigest()[:16]


def measure(
    model_name: str,
    n: int,
    shape: str,
    seed: int,
    folds: int = 3,
    data_dir: str | None = None,
    scored_users: int | None = 100_000,
) -> dict:
    """One table row, in this process: generate, time the set-up and one epoch, read the peak."""
    from ordrec.trainer.models.dcr import DCR, PairwiseDCR, ValidatedRefinement

    pair_s: list[float] = []
    decision: dict = {}

    def fit(data):
        if model_name == "dcr":
            return DCR(max_iter=1).fit(data)
        if model_name in (
            "refine",
            "refine0",
        ):  # the pointwise epoch (refine0: none), then one of the refinement
            point = DCR(max_iter=int(model_name == "refine")).fit(data)
            t = time.perf_counter()
            refined = PairwiseDCR(DCR(max_iter=1), max_iter=1).refined(point)
            pair_s.append(time.perf_counter() - t)
            return refined
        if model_name in ("inplace", "inplace0"):  # as PairwiseDCR.fit refines: in place
            point = DCR(max_iter=int(model_name == "inplace")).fit(data)
            t = time.perf_counter()
            PairwiseDCR(DCR(max_iter=1), max_iter=1).refine_fitted(point)
            pair_s.append(time.perf_counter() - t)
            return point
        # As a job fits it: the refinement kept only where it wins on hold-outs.
        validated = ValidatedRefinement(
            PairwiseDCR(DCR(max_iter=1), max_iter=1), folds=folds, max_users=scored_users
        )
        validated.fit(data)
        decision.update(pairwise_kept=validated.kept_, val_recall=validated.val_scores_)
        return validated.best_estimator_

    # Warm the numba kernels on a small set, so compiling is neither timed nor counted.
    small = planted_ratings(2000, 500, 20_000, seed)
    fit(small)
    del small
    pair_s.clear()
    base = rss()
    t = time.perf_counter()
    data = cached_ratings(shape, n, seed, data_dir)
    generate_s = time.perf_counter() - t
    n_users, n_items = data.n_users, data.n_items
    held = rss() - base
    t = time.perf_counter()
    from_setup = model_name in ("refine0", "inplace0")
    if not from_setup:  # refine0's and inplace0's own fit is the set-up
        DCR(max_iter=0).fit(data)
    setup_s = time.perf_counter() - t
    t = time.perf_counter()
    model = fit(data)
    fit_s = time.perf_counter() - t
    if from_setup:
        setup_s = fit_s - sum(pair_s)
    top = peak() - base
    # A refined copy holds both sets of factors (the pointwise fit's and its own). The user
    # factors' pages are touched only for users with ratings (DCR allocates them lazily), so
    # those rows count; the allocation is reported besides (equal when every user has ratings).
    rated_users = int(np.count_nonzero(np.diff(model.seen_indptr_)))
    user_row = model.U_.nbytes // max(model.U_.shape[0], 1)
    sets = 2 if model_name.startswith("refine") else 1
    factors = (rated_users * user_row + model.V_.nbytes) * sets
    allocated = (model.U_.nbytes + model.V_.nbytes) * sets
    pointwise_s = fit_s - sum(pair_s)
    return {
        "model": model_name,
        "shape": shape,
        "ratings": n,
        "users": n_users,
        "items": n_items,
        "generate_s": round(generate_s, 1),
        "setup_s": round(setup_s, 2),
        "fit_s": round(fit_s, 2),
        "folds": folds if model_name == "pairwise" else None,
        "scored_users": scored_users if model_name == "pairwise" else None,
        "epoch_s": round(pointwise_s - setup_s, 2) if model_name in ("dcr", "refine", "inplace") else None,
        "pair_epoch_s": round(pair_s[0], 2) if pair_s else None,
        "data_b": round(held / n, 1),
        "peak_b": round(top / n, 1),
        "factors_b": round(factors / n, 1),
        "factors_allocated_mb": round(allocated / 1e6),
        "rated_users": rated_users,
        "rest_b": round((top - factors) / n, 1),
        "peak_mb": round(top / 1e6),
        "factor_hash": factor_hash(model),
        # The validated fit's decision: refined or not, and (pointwise, refined, SE of the gain).
        "pairwise_kept": decision.get("pairwise_kept"),
        "val_recall": decision.get("val_recall"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratings", default="1e6,1e7", help="comma-separated counts (1e6,1e7,1e8)")
    parser.add_argument("--shape", default="netflix", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument(
        "--models",
        default="dcr,pairwise",
        help="dcr, refine (one pairwise epoch after it, on a copy), inplace (in place), refine0 and"
        " inplace0 (from the set-up's factors), pairwise (Pairwise DCR, validated), read (the reader)",
    )
    parser.add_argument("--folds", type=int, default=3, help="hold-outs of the validated pairwise fit")
    parser.add_argument(
        "--scored-users",
        type=int,
        default=100_000,
        help="most users the validated pairwise fit scores (ValidatedRefinement max_users)",
    )
    parser.add_argument("--data-dir", help="keep the generated ratings here as .npy files (and reuse them)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="append each row as a JSON line to this file")
    parser.add_argument("--row", nargs=3, help=argparse.SUPPRESS)  # model ratings shape: run one row here
    parser.add_argument("--write", help=argparse.SUPPRESS)  # with --row read: write the file there
    parser.add_argument("--read", help=argparse.SUPPRESS)  # with --row read: read the file there
    args = parser.parse_args()
    if args.row:
        model_name, n, shape = args.row
        if args.write:
            write_tsv(cached_ratings(shape, int(float(n)), args.seed, args.data_dir), args.write)
            print(json.dumps({"written": args.write}))
        elif args.read:
            print(json.dumps(measure_read(args.read, int(float(n)), shape)))
        else:
            row = measure(
                model_name, int(float(n)), shape, args.seed, args.folds, args.data_dir, args.scored_users
            )
            print(json.dumps(row))
        return
    print(
        f"{'model':9} {'shape':8} {'ratings':>12} {'epoch s':>8} {'pair s':>8} {'set-up s':>9} {'peak B/r':>9} "
        f"{'factors':>8} {'rest':>6} {'ratings held':>13}"
    )
    for shape in args.shape.split(","):
        for n in args.ratings.split(","):
            for model_name in args.models.split(","):
                row = (
                    read_row(args, shape, n) if model_name == "read" else run_row(args, model_name, shape, n)
                )
                print(format_row(row), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(row) + "\n")


def _row(args: argparse.Namespace, model_name: str, shape: str, n: str, *extra: str) -> dict:
    """One row's JSON, from a fresh subprocess (so its peak is its own)."""
    command = [sys.executable, __file__, "--seed", str(args.seed), "--folds", str(args.folds)]
    command += ["--scored-users", str(args.scored_users)]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    out = subprocess.run(
        command + ["--row", model_name, n, shape, *extra], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_row(args: argparse.Namespace, model_name: str, shape: str, n: str) -> dict:
    return _row(args, model_name, shape, n)


def read_row(args: argparse.Namespace, shape: str, n: str) -> dict:
    """Write the ratings to a tsv file under /tmp (one process), read it (another), delete it."""
    handle, path = tempfile.mkstemp(prefix="mem_dcr_", suffix=".tsv")
    os.close(handle)
    try:
        _row(args, "read", shape, n, "--write", path)
        return _row(args, "read", shape, n, "--read", path)
    finally:
        os.unlink(path)


def format_row(row: dict) -> str:
    """A row of the printed table (a read row: its seconds under "epoch s", no fit columns)."""
    if row["model"] == "read":
        return (
            f"{'read':9} {row['shape']:8} {row['ratings']:>12,} {row['read_s']:>8.1f} {'':>8} {'':>9} "
            f"{row['peak_b']:>9.1f} {'':>8} {'':>6} {row['held_b']:>13.1f}"
        )
    epoch = f"{row['epoch_s']:.2f}" if row["epoch_s"] is not None else f"({row['fit_s']:.0f})"
    pair = f"{row['pair_epoch_s']:.2f}" if row.get("pair_epoch_s") is not None else ""
    return (
        f"{row['model']:9} {row['shape']:8} {row['ratings']:>12,} {epoch:>8} {pair:>8} {row['setup_s']:>9.2f} "
        f"{row['peak_b']:>9.1f} {row['factors_b']:>8.1f} {row['rest_b']:>6.1f} {row['data_b']:>13.1f}"
    )


if __name__ == "__main__":
    main()
