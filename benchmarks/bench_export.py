"""Batch export throughput beside the same users asked over gRPC (docs/operations.md, "Batch export").

A DCR version over a planted catalogue (generated factors: ``catalog_data.catalog_artifact``)
is published into a temporary registry; ``ordrec-train export``'s code writes the top-N of
every user to a file, then a real ``ordrec-serve`` answers the same users (the first
``--grpc-users`` of them) in batched ``Recommend`` calls through ``ordrec.client``.

    python benchmarks/bench_export.py --users 100000 --items 5000 --n 100 --grpc-users 20000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.catalog_data import catalog_artifact
from ordrec.client import Client
from ordrec.service.artifacts import Registry
from ordrec.tools.process import ServerProcess
from ordrec.trainer.export import export


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--items", type=int, default=5_000)
    p.add_argument("--rank", type=int, default=20)
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--batch", type=int, default=1000, help="users per matrix product (export)")
    p.add_argument("--grpc-users", type=int, default=20_000, help="users asked over gRPC (the first ones)")
    p.add_argument("--grpc-batch", type=int, default=100, help="users per Recommend call")
    p.add_argument("--formats", default="parquet,csv,jsonl")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        registry = Registry(Path(tmp) / "registry")
        registry.publish("dcr", catalog_artifact(args.items, args.users, rank=args.rank))
        print(f"{args.users:,} users x {args.items:,} items, rank {args.rank}, n={args.n}")
        print("| path | users | seconds | users/s |")
        print("|---|---|---|---|")
        for fmt in args.formats.split(","):
            out = Path(tmp) / f"recs.{fmt}"
            t0 = time.perf_counter()
            summary = export(registry, "dcr", args.n, out, batch=args.batch, progress=False)
            seconds = time.perf_counter() - t0
            size = out.stat().st_size / 1e6
            print(
                f"| export .{fmt} ({size:.0f} MB) | {summary.users:,} | {seconds:.1f} | {summary.users / seconds:,.0f} |"
            )
        users = [f"u{i}" for i in range(min(args.grpc_users, args.users))]
        with ServerProcess(registry.root) as proc, Client(proc.target, timeout=60) as client:
            client.recommend(users[: args.grpc_batch], model="dcr", n=args.n)  # warm
            t0 = time.perf_counter()
            for start in range(0, len(users), args.grpc_batch):
                client.recommend(users[start : start + args.grpc_batch], model="dcr", n=args.n)
            seconds = time.perf_counter() - t0
        print(
            f"| gRPC Recommend, {args.grpc_batch} users a call | {len(users):,} | {seconds:.1f} | {len(users) / seconds:,.0f} |"
        )


if __name__ == "__main__":
    main()
