"""Batch export throughput beside the same users asked over gRPC (docs/operations.md, "Batch export").

A DCR version over a planted catalogue (generated factors: ``catalog_data.catalog_artifact``)
is published into a temporary registry; ``ordrec-train export``'s code writes the top-N of
every user to a file, then a real ``ordrec-serve`` answers the same users (the first
``--grpc-users`` of them) in batched ``Recommend`` calls through ``ordrec.client``.

    python benchmarks/bench_export.py --users 100000 --items 5000 --n 100 --grpc-users 20000 --workers 1,2
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its sibling modules

from catalog_data import catalog_artifact  # noqa: E402

from ordrec.client import Client  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.tools.process import ServerProcess  # noqa: E402
from ordrec.trainer.export import export  # noqa: E402


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
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts to measure")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        registry = Registry(Path(tmp) / "registry")
        registry.publish("dcr", catalog_artifact(args.items, args.users, rank=args.rank))
        print(f"{args.users:,} users x {args.items:,} items, rank {args.rank}, n={args.n}")
        print("| path | users | seconds | users/s | CPU s | users per CPU s |")
        print("|---|---|---|---|---|---|")
        for workers in (int(w) for w in args.workers.split(",")):
            for fmt in args.formats.split(","):
                out = Path(tmp) / f"recs.{fmt}"
                t0, cpu0 = time.perf_counter(), cpu_seconds()
                summary = export(
                    registry, "dcr", args.n, out, batch=args.batch, progress=False, workers=workers
                )
                seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
                detail = f".{fmt} ({out.stat().st_size / 1e6:.0f} MB), {workers} worker(s)"
                # forkserver workers are not our children: their CPU is not in RUSAGE_CHILDREN
                row("export", detail, summary.users, seconds, cpu if workers == 1 else None)
        users = [f"u{i}" for i in range(min(args.grpc_users, args.users))]
        with ServerProcess(registry.root) as proc, Client(proc.target, timeout=60) as client:
            client.recommend(users[: args.grpc_batch], model="dcr", n=args.n)  # warm
            assert proc.proc is not None
            t0, cpu0, server0 = time.perf_counter(), cpu_seconds(), process_cpu_seconds(proc.proc.pid)
            for start in range(0, len(users), args.grpc_batch):
                client.recommend(users[start : start + args.grpc_batch], model="dcr", n=args.n)
            seconds = time.perf_counter() - t0
            cpu = cpu_seconds() - cpu0 + process_cpu_seconds(proc.proc.pid) - server0
        row(
            "gRPC Recommend",
            f"{args.grpc_batch} users a call (client + server CPU)",
            len(users),
            seconds,
            cpu,
        )
        print(f"load average at the end: {os.getloadavg()[0]:.1f} (the machine is shared)")


def row(path: str, detail: str, users: int, seconds: float, cpu: float | None) -> None:
    per_cpu = f"{cpu:.1f} | {users / cpu:,.0f}" if cpu else "– | –"
    print(f"| {path} {detail} | {users:,} | {seconds:.1f} | {users / seconds:,.0f} | {per_cpu} |")


def cpu_seconds() -> float:
    """CPU of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """CPU of another process (the server), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
