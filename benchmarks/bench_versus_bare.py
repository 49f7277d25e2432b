"""Recommend on ordrec-serve beside a bare grpcio server in the same run, as one table.

    python benchmarks/bench_versus_bare.py [--catalogues ml100k,100000,1000000]
        [--structures exact,hnsw,ivf] [--rates 1000,2000] [--processes 2] [--seconds 4]
        [--trained VERSION_DIR] [--runs 3] [--heavy 10000] [--out results.md]

For every catalogue (``ml100k``: DCR trained on ML-100K, scored exactly; a number: that
many planted items x 200 dims, ``benchmarks/catalog_data.py``, once per ``--structures``
entry: scored exactly, or with the graph, the inverted file, or the structure chosen at
publish, each calibrated on 200 users) the ordrec row is followed by the bare grpcio row
(``tools/bare_server.py``: the same grpcio server and process layout answering a constant
reply of 10 item ids) measured in the same run: saturated QPS and server CPU per answered
call there, then p50 / p99 and server CPU per call at each offered rate (h2load, 8
connections, staggered arrivals), and the ratios. Both servers run ``--processes`` pinned
processes; the load generator shares the machine's cores.

``--trained`` adds a published DCR version (its folder in a registry, e.g. the default
``ordrec-train train dcr`` over ``benchmarks/sparse_ratings.py``'s million items), served with
the index its calibration chose. ``--runs`` repeats every pair of rows (each run restarts both
servers). ``--heavy H``: per catalogue, recall@10 and in-process latency of users with H history
items excluded (half their own exact best, half random: what the index's search must skip),
against exact scoring. ``--out`` writes the tables to a file too. ``benchmarks/million.sh``
runs the issue-45 table in one command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_catalog import calibration_queries, heavy_exclusions, recall  # noqa: E402
from bench_service import build_registry, versus_bare  # noqa: E402
from catalog_data import catalog_artifact  # noqa: E402

from ordrec.service.indices import ann  # noqa: E402
from ordrec.service.indices.models import build_index  # noqa: E402
from ordrec.service.storage.format import MANIFEST  # noqa: E402
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
    return root, served_by(registry, "catalog")


def served_by(registry: Registry, model: str) -> str:
    """What answers the model's Recommend: exact, or the index's structure, breadth and recall
    (``ordrec-train versions`` shows the whole choice)."""
    entry = registry.load(model).indexes.get("items")
    if entry is None:
        return "exact"
    chosen = {k: v for k, v in entry.params.items() if k not in ("compared", "build_phases")}
    return ann.describe_choice(entry.library, chosen).split(" built in")[0]


def trained_registry(root: Path, version_dir: Path) -> tuple[Path, str]:
    """A registry in ``root`` holding only the published version in ``version_dir`` (its files
    hard-linked where the file system allows, not copied: they are a gigabyte at 10^6 items),
    and the version's model name."""
    version_dir = version_dir.resolve()
    if not (version_dir / MANIFEST).exists():
        raise SystemExit(f"{version_dir}: not a published version (no {MANIFEST})")
    model = version_dir.parent.name
    shutil.copytree(version_dir, root / model / version_dir.name, copy_function=_link_or_copy)
    return root, model


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def rows_for(label: str, registry: Path, model: str, args: argparse.Namespace) -> list[tuple]:
    """The ordrec row and the bare grpcio row of one catalogue, measured one after the other,
    ``args.runs`` times."""
    rows = []
    for run in range(1, args.runs + 1):
        start = time.perf_counter()
        run_label = label if args.runs == 1 else f"{label}, run {run}"
        try:
            measured = versus_bare(registry, str(args.processes), args.rates, args, model=model)
        except subprocess.CalledProcessError as exc:  # a load test that failed: say why, go on
            why = (exc.stderr or "").strip().splitlines()[-1:] or [str(exc)]
            print(f"  {run_label}: load test failed: {why[0]}", file=sys.stderr)
            args.failures.append(f"{run_label}: load test failed: {why[0]}")
            continue
        print(f"  {run_label}: measured in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        rows += [(run_label, *row[1:]) for row in measured]
    return rows


def heavy_row(label: str, registry: Path, model: str, args: argparse.Namespace) -> tuple:
    """Recall@10 and in-process latency of the index for users with ``args.heavy`` exclusions,
    beside exact scoring (``bench_catalog.heavy_exclusions``)."""
    index = build_index(Registry(registry).load(model))
    users = np.random.default_rng(3).choice(len(index.users), args.heavy_users, replace=False)
    users = users[np.linalg.norm(index.folded(users), axis=1) > 0]  # a zero user ties every item
    runs = heavy_exclusions(index, users, users.size, args.heavy)
    truth = runs["exact"]["answers"]
    return (
        label,
        users.size,
        *[
            (name, recall(r["answers"], truth), np.percentile(r["times"], [50, 99]) * 1e3)
            for name, r in runs.items()
        ],
    )


def cell(result: dict) -> str:
    return f"{result['p50_ms']:.2f} / {result['p99_ms']:.2f}, {result['server_ms']:.3f}"


def print_table(rows: list[tuple], args: argparse.Namespace, print=print) -> None:
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


def print_heavy(rows: list[tuple], args: argparse.Namespace, print=print) -> None:
    """Heavy users: recall@10 against exact scoring and in-process p50 / p99 per search."""
    print(f"\nHeavy users: {args.heavy:,} history items excluded each (half their own best), in process")
    print("| catalogue | users | search | recall@10 | p50 ms | p99 ms |\n|---|---:|---|---:|---:|---:|")
    for label, users, *searches in rows:
        for name, value, (p50, p99) in searches:
            print(f"| {label} | {users} | {name} | {value:.3f} | {p50:.2f} | {p99:.2f} |")


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
    p.add_argument("--trained", type=Path, help="a published DCR version's folder, served too")
    p.add_argument("--runs", type=int, default=1, help="measurements of every ordrec / bare pair")
    p.add_argument("--heavy", type=int, default=0, help="history items of the heavy users (0: not measured)")
    p.add_argument("--heavy-users", type=int, default=100, help="heavy users measured per catalogue")
    p.add_argument("--out", type=Path, help="also write the tables to this file")
    args = p.parse_args()
    args.rates = [float(x) for x in args.rates.split(",") if x]
    args.failures = []
    args.server_args = [[]]  # versus_bare's ordrec variants: the server as deployed
    rows: list[tuple] = []
    heavy: list[tuple] = []

    def measure(label: str, registry: Path, model: str) -> None:
        rows.extend(rows_for(label, registry, model, args))
        if args.heavy:
            heavy.append(heavy_row(label, registry, model, args))
        write_tables(rows, heavy, args, quiet=True)  # what is measured so far survives a later failure

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
                measure(f"{n_items:,} planted items, {served}", registry, "catalog")
                shutil.rmtree(root / structure, ignore_errors=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if args.trained is not None:
        root = Path(tempfile.mkdtemp(prefix="ordrec-versus-", dir=args.tmp))
        try:
            registry, model = trained_registry(root, args.trained)
            measure(f"trained DCR, {served_by(Registry(registry), model)}", registry, model)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    write_tables(rows, heavy, args)
    return 0


def write_tables(
    rows: list[tuple], heavy: list[tuple], args: argparse.Namespace, quiet: bool = False
) -> None:
    """The tables (and any failed load test) in ``args.out`` when given, and on stdout unless
    ``quiet``."""
    lines: list[str] = []
    print_table(rows, args, print=lines.append)
    if heavy:
        print_heavy(heavy, args, print=lines.append)
    lines += [f"\n{failure}" for failure in args.failures]
    text = "\n".join(lines) + "\n"
    if not quiet:
        sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)
        print(f"tables written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
