"""How calls spread over ``ordrec-serve --processes 2``, by client connections and
``--max-connection-age``, and what the reconnects cost.

    python benchmarks/bench_spread.py [--data ../shared/data] [--connections 8,32]
        [--ages 30,2,1] [--seconds 20] [--runs 3] [--rate 400]

The kernel hashes each connection (SO_REUSEPORT) to one process and HTTP/2 keeps a client's
calls on its connections, so a process's share of the calls is its share of the connections
until they reconnect; ``--max-connection-age`` sends each a GOAWAY at that age (gRPC adds
±10 % jitter) and the client's reconnect is hashed anew. For each age one server (DCR on
ML-100K, or a generated set of its size) is driven by ``ordrec-loadtest --engine python`` at a
fixed rate, so every connection carries the same calls (h2load cannot be used: its clients stop
at the first GOAWAY instead of reconnecting). Per run: each process's share of the calls it
answered (its own ``/metrics``), failed calls as the client saw them, p50/p99, and the
server processes' CPU per answered call (the throughput cost of reconnecting: saturated QPS is
about cores / CPU per call). Every run is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_service import build_registry, loadtest, measured  # noqa: E402

from ordrec.tools.process import ServerProcess  # noqa: E402


def spread_runs(registry: Path, age: float, args: argparse.Namespace) -> list[tuple]:
    """Every (connections, run) at one ``--max-connection-age``, on one server."""
    rows = []
    age_flag = ("--max-connection-age", f"{age:g}")
    with ServerProcess(registry, "--processes", "2", *age_flag, startup_timeout=600) as server:
        for connections in args.connections:
            for run in range(args.runs):
                result = measured(
                    server,
                    lambda c=connections: loadtest(
                        server,
                        registry,
                        "recommend",
                        ["--recommend-model", "dcr"],
                        args.rate,
                        args.seconds,
                        "python",
                        "aligned",
                        connections=c,
                    ),
                )
                rows.append((connections, age, run, result))
                print_row(*rows[-1], args)
    return rows


def print_header() -> None:
    print(
        f"{'connections':>11} {'duration s':>10} {'max age s':>9} {'run':>3} {'share p0 / p1':>15} "
        f"{'calls':>6} {'failed':>6} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/call':>11}",
        flush=True,
    )


def print_row(connections: int, age: float, run: int, result: dict, args: argparse.Namespace) -> None:
    shares = " / ".join(f"{s:.3f}" for s in result.get("process_shares") or [])
    print(
        f"{connections:>11} {args.seconds:>10g} {age:>9g} {run + 1:>3} {shares:>15} "
        f"{result['requests']:>6} {result['errors']:>6} {result['p50_ms']:>7.2f} {result['p99_ms']:>7.2f} "
        f"{result['server_ms']:>11.3f}",
        flush=True,
    )


def print_summary(rows: list[tuple]) -> None:
    """Per (connections, age): the shares' range over the runs and how many runs kept 0.4-0.6."""
    print("\nsummary: the busier process's share over the runs, runs within 0.4-0.6, failed calls")
    groups: dict[tuple[int, float], list[dict]] = {}
    for connections, age, _, result in rows:
        groups.setdefault((connections, age), []).append(result)
    for (connections, age), results in sorted(groups.items()):
        busiest = [max(r["process_shares"]) for r in results if r.get("process_shares")]
        within = sum(share <= 0.6 for share in busiest)
        failed = sum(r["errors"] for r in results)
        print(
            f"  {connections:>3} connections, age {age:>4g} s: busier process "
            f"{min(busiest):.3f}-{max(busiest):.3f}, {within}/{len(busiest)} runs within 0.4-0.6, "
            f"{failed} failed calls"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--connections", default="8,32", help="client HTTP/2 connections, comma-separated")
    p.add_argument("--ages", default="30,2,1", help="--max-connection-age values (s), comma-separated")
    p.add_argument("--seconds", type=float, default=20.0, help="length of one run")
    p.add_argument("--runs", type=int, default=3, help="runs per (connections, age)")
    p.add_argument("--rate", type=float, default=400.0, help="offered QPS (open loop)")
    args = p.parse_args()
    args.connections = [int(c) for c in args.connections.split(",")]
    with tempfile.TemporaryDirectory(prefix="ordrec-spread-") as tmp:
        registry = build_registry(Path(tmp) / "registry", Path(args.data), only="dcr").root
        print(
            f"--processes 2, ordrec-loadtest --engine python at {args.rate:g} QPS, concurrency 64; "
            f"shares from each process's /metrics",
            flush=True,
        )
        print_header()
        rows = []
        for age in (float(a) for a in args.ages.split(",")):
            rows += spread_runs(registry, age, args)
    print_summary(rows)
    print(f"loadavg {os.getloadavg()[0]:.1f} at the end (2 cores shared with other work)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
