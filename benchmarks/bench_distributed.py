"""Time per epoch of the data-parallel DCR fit (DSGD on a local Dask cluster) at 1, 2, ...
single-threaded workers, beside the single-process fit, on generated ratings.

    python benchmarks/bench_distributed.py                      # 10^6 ratings, 1 and 2 workers
    python benchmarks/bench_distributed.py --ratings 200000 --epochs 2 --workers 1,2,4

The single-process fit runs numba on every core (its levels in parallel threads); each
worker of the cluster runs one thread. A table: setting, blocks, seconds per epoch (median
over the epochs), speed-up over one worker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_dcr import generated_ratings  # noqa: E402

from ordrec.trainer.models.dcr import DCR  # noqa: E402
from ordrec.trainer.models.dcr_distributed import DistributedFit, cluster_client  # noqa: E402


def single_process(data, params: dict) -> float:
    """Seconds per epoch of ``DCR.fit``: a fit of ``max_iter`` epochs minus one of 0 (set-up)."""
    t0 = time.perf_counter()
    DCR(**dict(params, max_iter=0)).fit(data)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    DCR(**params).fit(data)
    return (time.perf_counter() - t0 - setup) / params["max_iter"]


def on_cluster(data, params: dict, workers: int) -> float:
    """Median seconds per epoch of the DSGD fit on ``local:workers`` (W = workers blocks)."""
    with cluster_client(f"local:{workers}") as client:
        fit = DistributedFit(DCR(**params), client, blocks=workers)
        fit.fit(data)
        return float(np.median(fit.epoch_seconds_))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ratings", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--items", type=int, default=5_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,4")
    args = parser.parse_args()
    data = generated_ratings(args.users, args.items, args.ratings)
    params = dict(max_iter=args.epochs, random_state=0)
    print(f"{len(data):,} ratings, {args.users:,} users x {args.items:,} items, {os.cpu_count()} CPUs")
    print(f"{'setting':<28} {'blocks':>6} {'s/epoch':>8} {'speed-up':>9}")
    print(f"{'single process (all cores)':<28} {'-':>6} {single_process(data, params):8.2f} {'':>9}")
    base = None
    for workers in (int(w) for w in args.workers.split(",")):
        seconds = on_cluster(data, params, workers)
        base = base or seconds
        print(f"{f'local:{workers} (1 thread each)':<28} {workers:>6} {seconds:8.2f} {base / seconds:8.2f}x")


if __name__ == "__main__":
    main()
