"""Recommend on ordrec-serve beside a bare grpcio server in the same run, as one table.

    python benchmarks/bench_versus_bare.py [--catalogues ml100k,100000,1000000]
        [--structures exact,hnsw,ivf] [--rates 1000,2000] [--processes 2] [--seconds 4]

For every catalogue (``ml100k``: DCR trained on ML-100K, scored exactly; a number: that
many planted items x 200 dims, ``benchmarks/catalog_data.py``, once per ``--structures``
entry: scored exactly, or with the graph, the inverted file, or the structure chosen at
publish, each calibrated on 200 users) the ordrec row is followed by the bare grpcio row
(``tools/bare_server.py``: the same grpcio server and process layout answering a constant
reply of 10 item ids) measured in the same run: saturated QPS and server CPU per answered
call there, then p50 / p99 and server CPU per call at each offered rate (h2load, 8
connections, staggered arrivals), and the ratios. Both servers run ``--processes`` pinned
processes; the load generator shares the machine's cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_catalog import calibration_queries  # noqa: E402
from bench_service import build_registry, versus_bare  # noqa: E402
from catalog_data import catalog_artifact  # noqa: E402

from ordrec.service.indices import ann  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402

CATALOG_USERS = 20_000  # planted users per catalogue (the requests repeat one of them)


def publish_catalogue(root: Path, n_items: int, structure: str) -> tuple[Path, str]:
    """A registry holding ``n_items`` planted items as model "catalog", scored exactly or with
    ``structure``'s item index (calibrated on 200 users, as the trainer does)."""
    artifact = catalog_artifact(n_items, min(n_items, CATALOG_USERS))
    if structure != "exact":
        queries = calibration_queries(artifact, np.zeros(0, dtype=np.int64))
        params = {"structure": structure}
        artifact.indexes = {"items": ann.item_index(artifact.arrays["item_factors"], params, queries)}
    registry = Registry(root)
    registry.publish("catalog", artifact)
    entry = registry.load("catalog").indexes.get("items")
    served = "exact" if entry is None else ann.describe_choice(entry.library, entry.params)
    return root, served


def rows_for(label: str, registry: Path, model: str, args: argparse.Namespace) -> list[tuple]:
    """The ordrec row and the bare grpcio row of one catalogue, measured one after the other."""
    start = time.perf_counter()
    rows = versus_bare(registry, str(args.processes), args.rates, args, model=model)
    print(f"  {label}: measured in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return [(label, *row[1:]) for row in rows]


def cell(result: dict) -> str:
    return f"{result['p50_ms']:.2f} / {result['p99_ms']:.2f}, {result['server_ms']:.3f}"


def print_table(rows: list[tuple], args: argparse.Namespace) -> None:
    """One markdown table: each ordrec row followed by its bare grpcio row and the ratios."""
    rates = " | ".join(f"@{r:g} QPS: p50 / p99 ms, CPU ms" for r in args.rates)
    print(
        f"\n{args.processes} processes, h2load 8 connections, {args.seconds:g} s per step, "
        f"loadavg {os.getloadavg()[0]:.1f} at the end; CPU: the server processes' per answered call"
    )
    print(f"| catalogue | server | saturated QPS | CPU ms there | {rates} | errors |")
    print("|---|---|---:|---:|" + "---:|" * len(args.rates) + "---:|")
    for label, server, sat, at in rows:
        cells = " | ".join(cell(a) for a in at)
        errors = sat["errors"] + sum(a["errors"] for a in at)
        print(f"| {label} | {server} | {sat['qps']:.0f} | {sat['server_ms']:.3f} | {cells} | {errors} |")
        if server == "bare grpcio":
            ours = next(r for r in rows if r[0] == label and r[1] != "bare grpcio")
            ratios = " | ".join(
                f"{o['server_ms'] / max(b['server_ms'], 1e-9):.2f}x CPU" for o, b in zip(ours[3], at)
            )
            print(
                f"| {label} | ordrec / bare | {ours[2]['qps'] / max(sat['qps'], 1e-9):.2f} "
                f"| {ours[2]['server_ms'] / max(sat['server_ms'], 1e-9):.2f}x | {ratios} | |"
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--catalogues", default="ml100k,100000", help="ml100k and/or item counts, comma-separated")
    p.add_argument("--structures", default="exact,hnsw,ivf", help="for item counts: exact, hnsw, ivf, auto")
    p.add_argument("--rates", default="1000,2000", help="fixed offered rates (QPS)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data"))
    p.add_argument("--engine", default="h2load", choices=("h2load", "python"))
    p.add_argument("--tmp", default=None, help="where the registries go")
    args = p.parse_args()
    args.rates = [float(x) for x in args.rates.split(",") if x]
    args.server_args = [[]]  # versus_bare's ordrec variants: the server as deployed
    rows: list[tuple] = []
    for catalogue in (c for c in args.catalogues.split(",") if c):
        root = Path(tempfile.mkdtemp(prefix="ordrec-versus-", dir=args.tmp))
        try:
            if catalogue == "ml100k":
                build_registry(root / "reg", Path(args.data), only="dcr")
                rows += rows_for("ML-100K DCR, exact", root / "reg", "dcr", args)
                continue
            n_items = int(catalogue)
            for structure in args.structures.split(","):
                start = time.perf_counter()
                registry, served = publish_catalogue(root / structure, n_items, structure)
                print(
                    f"  {n_items:,} items, {structure}: published in {time.perf_counter() - start:.0f} s: {served}",
                    file=sys.stderr,
                )
                rows += rows_for(f"{n_items:,} items, {served}", registry, "catalog", args)
                shutil.rmtree(root / structure, ignore_errors=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
