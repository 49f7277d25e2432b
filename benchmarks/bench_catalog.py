"""Large catalogues (issue 17): the approximate item index against exact scoring.

    .venv/bin/python benchmarks/bench_catalog.py --sizes 100000,1000000
    .venv/bin/python benchmarks/bench_catalog.py --quick                  # 10^5 items, short runs
    .venv/bin/python benchmarks/bench_catalog.py --train 1000000,1000000,10000000 --skip-serve --publish REG
    .venv/bin/python benchmarks/bench_catalog.py --skip-serve --trained REG    # the index on trained factors

For each generated catalogue (planted clusters shaped like a trained DCR:
200 folded dimensions, ``benchmarks/catalog_data.py``) two versions are
published, one scored exactly and one with the item index (its breadth
calibrated on 200 users outside the measured ones, as the trainer does), and
the script prints for both: index build (+ calibration) time, load time,
recall@10 against this run's exact answers (training items excluded, as
served), in-process p50/p99 of ``Index.recommend``; then over gRPC with the
service's usual layout (``--processes 2``, one pinned process per core):
saturated QPS, p50/p99 at a fixed offered rate and the CPU per call the
servers and the load generator (same cores) spent there, server memory (PSS summed
over the processes, beside the item factors' bytes; again after
``--distinct-users`` users were each asked once, since the h2load runs
repeat one user), and a hot reload of a new version under that load
(seconds until every process serves it, failed requests).

``--train USERS,ITEMS,RATINGS`` fits DCR (and Pairwise DCR) on generated
ratings of that size with planted structure and prints time and peak memory
per epoch.

h2load repeats one request body, so each gRPC run asks for one user's top-10
over and over (the in-process rows use a different user per call).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_service import (  # noqa: E402
    BARE_MODULE,
    NO_RECYCLING,
    cpu_seconds,
    load_generator_cpu_seconds,
    loadtest,
    server_pids,
)
from catalog_data import catalog_artifact, folded_queries  # noqa: E402

from ordrec.service.indices import ann  # noqa: E402
from ordrec.service.indices.models import build_index  # noqa: E402
from ordrec.service.indices.topk import warm_up  # noqa: E402
from ordrec.service.storage.artifact import SearchIndex  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.tools.process import ServerProcess, wait_for  # noqa: E402

TARGETS = (
    "targets at 10^6 items: recall@10 >= 0.95, in-process p50 <= 1 ms, gRPC >= 2,000 QPS with p99 <= 10 ms, "
    "reload <= 10 s with no failed request, server memory <= 2x item-factor bytes"
)


# ------------------------------------------------------------------ serving
def timed_index(
    item_factors: np.ndarray, params: dict, queries: ann.Queries
) -> tuple[SearchIndex, list[float]]:
    """The item index entry, recording how long its build (and calibration) takes when published."""
    entry = ann.item_index(item_factors, params, queries)
    took: list[float] = []

    def write(path: Path) -> None:
        start = time.perf_counter()
        entry.write(path)
        took.append(time.perf_counter() - start)

    return SearchIndex(entry.library, entry.params, write=write), took


def calibration_queries(artifact, avoid: np.ndarray) -> ann.Queries:
    """Folded factors and training items of 200 users outside the measured ones, as the
    trainer calibrates on its own users."""
    n_users = len(artifact.ids["users"])
    pool = np.setdiff1d(np.arange(n_users), avoid)
    users = np.sort(
        np.random.default_rng(2).choice(pool, min(len(pool), ann.CALIBRATION_QUERIES), replace=False)
    )
    indptr, indices = artifact.arrays["seen_indptr"], artifact.arrays["seen_indices"]
    seen = [indices[indptr[u] : indptr[u + 1]].astype(np.int64) for u in users]
    return ann.Queries(folded_queries(artifact.arrays["user_factors"][users]), seen)


def publish_pair(
    root: Path, n_items: int, n_users: int, params: dict, measured: np.ndarray, rank: int = 40
) -> tuple[Registry, Registry, float]:
    """Registries "exact" and "ann" holding the same factors (5 levels x ``rank`` dimensions),
    without and with the index."""
    artifact = catalog_artifact(n_items, n_users, rank=rank)
    exact, approx = (
        Registry(root / "exact"),
        Registry(root / "ann"),
    )
    exact.publish("catalog", artifact)
    artifact.indexes = {}
    queries = calibration_queries(artifact, measured)
    entry, took = timed_index(artifact.arrays["item_factors"], params, queries)
    artifact.indexes = {"items": entry}
    approx.publish("catalog", artifact)
    return exact, approx, took[0]


def in_process(registry: Registry, users: np.ndarray, calls: int) -> dict:
    start = time.perf_counter()
    index = build_index(registry.load("catalog"))
    load = time.perf_counter() - start
    return {"load_s": load, **in_process_on(index, users, calls)}


def in_process_on(index, users: np.ndarray, calls: int) -> dict:
    """Top-10 answers and latency of ``index.recommend`` (training items excluded, then none)."""
    answers, times = [], []
    for user in users[:calls]:
        exclude = index.seen(int(user))
        t0 = time.perf_counter()
        rows, _ = index.recommend(int(user), 10, exclude=exclude)
        times.append(time.perf_counter() - t0)
        answers.append(rows)
    unfiltered = []
    for user in users[:calls]:
        t0 = time.perf_counter()
        index.recommend(int(user), 10)
        unfiltered.append(time.perf_counter() - t0)
    return {
        "index": index,
        "answers": answers,
        "p50_ms": np.percentile(times, 50) * 1e3,
        "p99_ms": np.percentile(times, 99) * 1e3,
        "p50_unfiltered_ms": np.percentile(unfiltered, 50) * 1e3,
    }


def heavy_exclusions(
    index, users: np.ndarray, calls: int, excluded: int, best_share: float = 0.5
) -> dict[str, dict]:
    """Filtered search against over-fetching for users with ``excluded`` excluded items.

    ``best_share`` of the exclusions are the user's own exact best items (what a graph walk must
    step over), the rest random. Over-fetching asks the unfiltered graph for ``n + excluded`` items
    (breadth at least that) and drops the excluded ones.
    """
    import faiss

    rng = np.random.default_rng(2)
    out: dict[str, dict] = {
        "exact": {"answers": [], "times": []},
        "filtered": {"answers": [], "times": []},
    }
    if index.ann.structure == "hnsw":
        out["over-fetch"] = {"answers": [], "times": []}
    for user in users[:calls]:
        user = int(user)
        wanted_best = int(excluded * best_share)
        best = index.recommend_exact(user, wanted_best)[0] if wanted_best else np.empty(0, np.int64)
        exclude = np.unique(np.concatenate([best, rng.integers(0, len(index.items), excluded - best.size)]))
        for name in out:
            t0 = time.perf_counter()
            if name == "exact":
                rows, _ = index.recommend_exact(user, 10, exclude=exclude)
            elif name == "filtered":
                rows, _ = index.recommend(user, 10, exclude=exclude)
            else:
                params = faiss.SearchParametersHNSW()
                params.efSearch = max(index.ann.breadth, 10 + exclude.size)
                _, found = index.ann.index.search(index.folded([user]), 10 + exclude.size, params=params)
                found = found[0][found[0] >= 0]
                rows = found[~np.isin(found, exclude)][:10]
            out[name]["times"].append(time.perf_counter() - t0)
            out[name]["answers"].append(rows)
    return out


def recall(answers: list[np.ndarray], truth: list[np.ndarray]) -> float:
    return float(np.mean([np.intersect1d(a, t).size / max(1, t.size) for a, t in zip(answers, truth)]))


def server_memory_mb(supervisor_pid: int) -> tuple[float, float]:
    """(PSS, RSS) summed over the supervisor and its server processes, in MB."""
    pss = rss = 0.0
    for pid in server_pids(supervisor_pid):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        pss += int(re.search(r"^Pss:\s+(\d+)", text, re.M).group(1)) / 1024
        rss += int(re.search(r"^Rss:\s+(\d+)", text, re.M).group(1)) / 1024
    return pss, rss


def served_versions(server: ServerProcess) -> list[str]:
    versions = []
    for url in server.metrics_urls.split(","):
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        found = re.search(r'ordrec_model_info\{[^}]*version="([^"]+)"', text)
        versions.append(found.group(1) if found else "")
    return versions


def republish(registry: Registry) -> None:
    """A new version with the same content, its index file copied (not rebuilt)."""
    artifact = registry.load("catalog")
    entry = artifact.indexes["items"]
    artifact.indexes = {
        "items": SearchIndex(
            entry.library, entry.params, write=lambda path: shutil.copyfile(entry.path, path)
        )
    }
    registry.publish("catalog", artifact)


def over_grpc(
    registry: Registry, args, with_reload: bool, bare: bool = False, rate: float | None = None
) -> dict:
    """One server over ``registry`` (``bare``: the bare grpcio yardstick, tools/bare_server.py)
    under h2load: saturated, then at ``rate`` (None: ``--rate``, at most 80 % of saturation)."""
    flag = ["--recommend-model", "catalog"]
    out: dict = {}
    server_args = ["--model", "catalog"] if bare else ["--poll-interval", "1", *NO_RECYCLING]
    with ServerProcess(
        registry.root,
        "--processes",
        "2",
        *server_args,
        startup_timeout=600,
        module=BARE_MODULE if bare else "ordrec.service",
    ) as server:
        loadtest(
            server, registry.root, "recommend", flag, 100, 2, "h2load", "staggered", args.connections
        )  # warm up
        sat = loadtest(
            server, registry.root, "recommend", flag, 0, args.seconds, "h2load", "aligned", args.connections
        )
        # A rate far above what the server sustains only measures the queue: offer at most 80 % of it.
        out["rate"] = rate = rate or min(args.rate, max(10.0, round(0.8 * sat["qps"], -1)))
        # Where the machine's CPU goes at that rate: the servers' and the load generator's (same cores).
        pids = server_pids(server.proc.pid)
        server_cpu, load_cpu = cpu_seconds(pids), load_generator_cpu_seconds()
        fixed = loadtest(
            server,
            registry.root,
            "recommend",
            flag,
            rate,
            args.seconds,
            "h2load",
            "staggered",
            args.connections,
        )
        calls = max(1, fixed["requests"])
        out["server_ms"] = (cpu_seconds(pids) - server_cpu) / calls * 1e3
        out["load_ms"] = (load_generator_cpu_seconds() - load_cpu) / calls * 1e3
        out.update(
            qps=sat["qps"],
            sat_p99=sat["p99_ms"],
            rate_p50=fixed["p50_ms"],
            rate_p99=fixed["p99_ms"],
            errors=describe_errors(sat, fixed),
            busiest=max(fixed.get("process_shares") or [float("nan")]),
        )
        out["pss_mb"], out["rss_mb"] = server_memory_mb(server.proc.pid)
        if not bare:
            ask_distinct_users(server, args.distinct_users)
        out["pss_distinct_mb"], _ = server_memory_mb(server.proc.pid)
        if with_reload:
            out.update(reload(server, registry, args, flag))
            out["pss_after_reload_mb"], _ = server_memory_mb(server.proc.pid)
    return out


def ask_distinct_users(server: ServerProcess, count: int) -> None:
    """Top-10 for ``count`` different users (100 a call): the h2load runs repeat one user, so
    memory measured after them would miss the rows that other users' answers touch."""
    from ordrec.client import Client

    with Client(server.target, timeout=60) as client:
        for start in range(0, count, 100):
            client.recommend([f"u{u}" for u in range(start, start + 100)], model="catalog", n=10)


def describe_errors(*runs: dict) -> str:
    """Failed calls of the runs by status code, e.g. "0" or "3 (DEADLINE_EXCEEDED=3)"."""
    codes: dict[str, int] = {}
    for run in runs:
        for code, count in run.get("errors_by_code", {}).items():
            codes[code] = codes.get(code, 0) + count
    total = sum(codes.values())
    return f"{total} ({', '.join(f'{c}={n}' for c, n in sorted(codes.items()))})" if total else "0"


def reload(server: ServerProcess, registry: Registry, args, flag: list[str]) -> dict:
    """Publish a new version under the fixed-rate load; time until every process serves it."""
    seconds = max(20.0, 2 * args.seconds)
    result: dict = {}
    load = threading.Thread(
        target=lambda: result.update(
            loadtest(
                server,
                registry.root,
                "recommend",
                flag,
                args.rate,
                seconds,
                "h2load",
                "staggered",
                args.connections,
            )
        )
    )
    load.start()
    time.sleep(2)
    republish(registry)
    published, newest = time.perf_counter(), registry.versions("catalog")[-1]
    wait_for(lambda: all(v == newest for v in served_versions(server)), timeout=300, what="the reload")
    took = time.perf_counter() - published
    load.join()
    return {"reload_s": took, "reload_errors": describe_errors(result), "reload_p99": result["p99_ms"]}


def bench_size(n_items: int, args) -> None:
    n_users = min(n_items, args.users)
    breadth = args.breadth if args.breadth == "auto" else int(args.breadth)
    params = ann.build_params(
        {"structure": "ivf", "nprobe": breadth}
        if args.structure == "ivf"
        else {
            "M": args.M,
            "ef_construction": args.ef_construction,
            "ef_search": breadth,
            "storage": args.storage,
        }
    )
    key = ann.breadth_key(params)
    dims = 5 * args.rank
    item_mb = n_items * dims * 4 / 2**20
    root = Path(tempfile.mkdtemp(prefix="ordrec-catalog-", dir=args.tmp))
    users = np.random.default_rng(1).integers(0, n_users, args.calls)
    try:
        start = time.perf_counter()
        exact_reg, ann_reg, build_s = publish_pair(root, n_items, n_users, params, users, args.rank)
        print(
            f"# {n_items:,} items x {dims} dims ({item_mb:.0f} MB of item factors), {n_users:,} users, "
            f"20 training items each; published in {time.perf_counter() - start:.0f} s; "
            f"index {ann_reg.load('catalog').indexes['items'].params}; loadavg {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        warm_up()  # compile or load the numba kernels before any row is timed
        exact = in_process(exact_reg, users, args.calls)
        approx = in_process(ann_reg, users, args.calls)
        rows = {"exact": exact, approx["index"].search: approx}
        for b in (int(e) for e in args.sweep.split(",") if e):
            # the same loaded index searched wider or narrower than the published breadth
            approx["index"].ann.breadth = b
            rows[f"  same index, {key}={b}"] = in_process_on(approx["index"], users, args.calls)
        print(
            "| search | build (+ calibration) s | load s | recall@10 | p50 ms | p99 ms | p50 ms, no exclusions |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, r in rows.items():
            built = f"{build_s:.1f}" if r is approx else "-"
            loaded = f"{r['load_s']:.2f}" if "load_s" in r else "-"
            print(
                f"| {name} | {built} | {loaded} | "
                f"{recall(r['answers'], exact['answers']):.3f} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['p50_unfiltered_ms']:.3f} |",
                flush=True,
            )
        for share in (0.5, 0.0) if args.heavy_random else (0.5,):
            if args.heavy:
                print_heavy_rows(approx["index"], users, min(args.calls, 300), args.heavy, share)
        del exact, approx, rows
        if args.skip_grpc:
            return
        print(
            f"| search (gRPC, 2 processes, {args.connections} connections) | saturated QPS | p99 ms there "
            "| offered QPS | p50 / p99 ms there | CPU ms per call there: servers + h2load "
            "| busiest process's share there "
            f"| errors | server PSS MB (x item bytes) | PSS MB after {args.distinct_users:,} distinct users "
            "| RSS MB | reload s | errors in reload | p99 ms in reload |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, reg in (("exact", exact_reg), ("index", ann_reg)):
            g = over_grpc(reg, args, with_reload=name == "index" and not args.skip_reload)
            print_grpc_row(name, g, item_mb)
            # The yardstick beside it, same run, same offered rate: grpcio answering a constant reply.
            bare = over_grpc(reg, args, with_reload=False, bare=True, rate=g["rate"])
            print_grpc_row("  bare grpcio, same rate", bare, item_mb)
            print(
                f"|   ordrec / bare grpcio | {g['qps'] / bare['qps']:.2f} of its saturated QPS "
                f"| | | | {g['server_ms'] / bare['server_ms']:.2f}x its server CPU per call | | | | | | | | |",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_heavy_rows(index, users: np.ndarray, calls: int, excluded: int, best_share: float) -> None:
    """The heavy users' table: recall@10 against exact scoring and latency, exact scoring's in the
    same run."""
    heavy = heavy_exclusions(index, users, calls, excluded, best_share)
    print(
        f"| {excluded} items excluded per user, {best_share:.0%} their own best (exact pass beyond"
        f" {index.ann.max_excluded:,} outranking the answer) | recall@10 | p50 ms | p99 ms |"
        "\n|---|---:|---:|---:|"
    )
    for name, r in heavy.items():
        print(
            f"| {name} | {recall(r['answers'], heavy['exact']['answers']):.3f} | "
            f"{np.percentile(r['times'], 50) * 1e3:.3f} | {np.percentile(r['times'], 99) * 1e3:.3f} |",
            flush=True,
        )


def print_grpc_row(name: str, g: dict, item_mb: float) -> None:
    """One row of the gRPC table."""
    tail = (
        f"{g['reload_s']:.1f} | {g['reload_errors']} | {g['reload_p99']:.2f}"
        if "reload_s" in g
        else "- | - | -"
    )
    print(
        f"| {name} | {g['qps']:.0f} | {g['sat_p99']:.2f} | {g['rate']:.0f} | "
        f"{g['rate_p50']:.2f} / {g['rate_p99']:.2f} | {g['server_ms']:.3f} + {g['load_ms']:.3f} | "
        f"{g['busiest']:.0%} | "
        f"{g['errors']} | {g['pss_mb']:.0f} ({g['pss_mb'] / item_mb:.2f}x) | "
        f"{g['pss_distinct_mb']:.0f} ({g['pss_distinct_mb'] / item_mb:.2f}x) | {g['rss_mb']:.0f} | {tail} |",
        flush=True,
    )


# ----------------------------------------------------------------- training
def planted_ratings(n_users: int, n_items: int, n_ratings: int, seed: int = 0):
    """Ratings 1..6 from clustered low-rank preferences, heavy-tailed activity and popularity.

    Vectorised (no per-user loop), so 10^7 ratings take seconds.
    """
    from ordrec.service.storage.idmap import IdMap
    from ordrec.trainer.data.types import Ratings

    rng = np.random.default_rng(seed)
    activity = rng.lognormal(0.0, 1.0, n_users)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    user_cdf = np.cumsum(activity / activity.sum())
    item_cdf = np.cumsum(popularity / popularity.sum())
    item_order = rng.permutation(n_items)  # popularity is not the item id
    pairs = np.empty(0, np.int64)
    while pairs.size < n_ratings:  # repeated (user, item) pairs are dropped: draw until enough remain
        draw = int((n_ratings - pairs.size) * 1.1) + 16
        user = np.minimum(np.searchsorted(user_cdf, rng.random(draw)), n_users - 1)
        item = item_order[np.minimum(np.searchsorted(item_cdf, rng.random(draw)), n_items - 1)]
        pairs = np.union1d(pairs, user.astype(np.int64) * n_items + item)
    pairs = np.sort(rng.choice(pairs, n_ratings, replace=False))
    user, item = (pairs // n_items).astype(np.int32), (pairs % n_items).astype(np.int32)
    centers = rng.normal(size=(64, 8))
    a = (centers[rng.integers(0, 64, n_users)] + rng.normal(size=(n_users, 8))).astype(np.float32)
    b = (centers[rng.integers(0, 64, n_items)] + rng.normal(size=(n_items, 8))).astype(np.float32)
    x = np.empty(user.size, np.float32)
    for s in range(0, user.size, 1 << 20):
        x[s : s + (1 << 20)] = np.einsum("nk,nk->n", a[user[s : s + (1 << 20)]], b[item[s : s + (1 << 20)]])
    x += rng.normal(size=n_items).astype(np.float32)[item] + rng.normal(size=user.size).astype(np.float32)
    cuts = np.quantile(x, np.cumsum([0.05, 0.08, 0.2, 0.3, 0.22]))
    rating = (np.digitize(x, cuts) + 1).astype(np.float32)
    return Ratings(
        IdMap([str(i) for i in range(n_users)]), IdMap([str(i) for i in range(n_items)]), user, item, rating
    )


class EpochClock:
    """Stands in for the trainer's progress bar: records each epoch's time and memory."""

    log: list[tuple[str, float, float, float]] = []

    def __init__(self, label: str, total: int, enabled: bool = True, stream=None):
        self.label = label

    def __enter__(self):
        self.last = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, steps: int = 1, **stats: float) -> None:
        now = time.perf_counter()
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        EpochClock.log.append((self.label, now - self.last, rss, peak))
        self.last = now


def bench_training(
    spec: str, epochs: int, pairwise_epochs: int, publish: str | None, item_shrinkage: float = 0.0
) -> None:
    import ordrec.trainer.models.dcr as dcr_module
    from ordrec.trainer.models.pipeline import configure

    n_users, n_items, n_ratings = (int(float(x)) for x in spec.split(","))
    start = time.perf_counter()
    data = planted_ratings(n_users, n_items, n_ratings)
    print(
        f"# training: {len(data):,} ratings, {n_users:,} users, {n_items:,} items generated in "
        f"{time.perf_counter() - start:.0f} s; DCR rank 40, 5 levels; loadavg {os.getloadavg()[0]:.2f}"
    )
    dcr_module.Progress = EpochClock
    # As a job configures it: the refinement kept only where it wins on validation.
    model = configure(
        "dcr",
        dict(
            n_components=40,
            max_iter=epochs,
            tol=0.0,
            pairwise=pairwise_epochs > 0,
            pairwise_max_iter=pairwise_epochs,
            item_shrinkage=item_shrinkage,
        ),
    )
    start = time.perf_counter()
    model.fit(data)
    fit = time.perf_counter() - start
    print("| stage | epoch | seconds | RSS GB at its end | peak RSS GB so far |")
    print("|---|---:|---:|---:|---:|")
    counts: dict[str, int] = {}
    for label, seconds, rss, peak in EpochClock.log:
        counts[label] = counts.get(label, 0) + 1
        print(f"| {label} | {counts[label]} | {seconds:.1f} | {rss:.2f} | {peak:.2f} |")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"whole fit {fit:.0f} s (setup included); peak RSS {peak_gb:.2f} GB")
    if publish:
        del data
        start = time.perf_counter()
        version = Registry(publish).publish("trained", model.to_artifact())
        print(
            f"published {publish}/trained/{version} with its item index in {time.perf_counter() - start:.0f} s; "
            f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB"
        )


def bench_trained(root: str, calls: int, sweep: str) -> None:
    """Recall and latency of the index on a trained model's own factors (``--train ... --publish``).

    Users whose folded factors are zero (no training ratings) are left out: every item ties
    for them, so any answer is as good as the exact one.
    """
    start = time.perf_counter()
    index = build_index(Registry(root).load("trained"))
    print(
        f"# trained model in {root}: {len(index.items):,} items, served by {index.search}, "
        f"loaded in {time.perf_counter() - start:.1f} s"
    )
    users = np.random.default_rng(1).integers(0, len(index.users), calls)
    users = users[np.linalg.norm(index.folded(users), axis=1) > 0]
    truth, exact_times = [], []
    for user in users:
        t0 = time.perf_counter()
        rows, _ = index.recommend_exact(int(user), 10, exclude=index.seen(int(user)))
        exact_times.append(time.perf_counter() - t0)
        truth.append(rows)
    print(f"| search ({users.size} users) | recall@10 | p50 ms | p99 ms |\n|---|---:|---:|---:|")
    print(
        f"| exact | 1.000 | {np.percentile(exact_times, 50) * 1e3:.3f} | "
        f"{np.percentile(exact_times, 99) * 1e3:.3f} |"
    )
    key = ann.breadth_key(index.ann.params)
    for breadth in [index.ann.breadth] + [int(e) for e in sweep.split(",") if e]:
        index.ann.breadth = breadth
        r = in_process_on(index, users, users.size)
        print(
            f"| {index.search}, searched at {key}={breadth} | {recall(r['answers'], truth):.3f} | "
            f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000", help="catalogue sizes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="10^5 items only, short runs")
    parser.add_argument("--users", type=int, default=100_000, help="users per catalogue (at most its items)")
    parser.add_argument("--calls", type=int, default=1000, help="in-process Recommend calls per row")
    parser.add_argument("--seconds", type=float, default=10.0, help="each gRPC load run")
    parser.add_argument("--rate", type=float, default=2000.0, help="the fixed offered rate (QPS)")
    parser.add_argument(
        "--connections",
        type=int,
        default=32,
        help="client HTTP/2 connections (the kernel spreads connections, not calls, over the processes)",
    )
    parser.add_argument(
        "--rank", type=int, default=40, help="planted rank per level (5 levels: 40 is 200 dims)"
    )
    parser.add_argument("--M", type=int, default=ann.DEFAULT_PARAMS["M"])
    parser.add_argument("--ef-construction", type=int, default=ann.DEFAULT_PARAMS["ef_construction"])
    parser.add_argument(
        "--structure",
        choices=list(ann.STRUCTURES),
        default="hnsw",
        help="graph (hnsw) or inverted file (ivf)",
    )
    parser.add_argument(
        "--breadth",
        "--ef-search",
        default="auto",
        help='ef_search or nprobe: "auto" (calibrated) or a number',
    )
    parser.add_argument("--storage", choices=ann.STORAGES, default=ann.DEFAULT_PARAMS["storage"])
    parser.add_argument(
        "--sweep",
        "--ef-sweep",
        default="32,64,256",
        help="also search the loaded index at these breadths (ef_search or nprobe)",
    )
    parser.add_argument(
        "--heavy",
        type=int,
        default=500,
        help="exclusions per user of the filtered / over-fetch comparison (0: skip it)",
    )
    parser.add_argument(
        "--heavy-random",
        action="store_true",
        help="also heavy users whose exclusions are all random (a long history that does not crowd the top)",
    )
    parser.add_argument(
        "--distinct-users",
        type=int,
        default=20_000,
        help="users asked once each before the second memory reading",
    )
    parser.add_argument("--skip-grpc", action="store_true")
    parser.add_argument("--skip-reload", action="store_true")
    parser.add_argument("--skip-serve", action="store_true", help="only the training run")
    parser.add_argument("--train", help="USERS,ITEMS,RATINGS: time DCR training at that size")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--pairwise-epochs", type=int, default=2)
    parser.add_argument(
        "--item-shrinkage", type=float, default=0.0, help="with --train: DCR's item_shrinkage"
    )
    parser.add_argument("--publish", help="with --train: publish the fitted model (and its index) here")
    parser.add_argument("--trained", help="measure recall and latency on the model --publish wrote here")
    parser.add_argument("--tmp", default=None, help="where the registries go (needs ~3x the item bytes)")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.calls, args.seconds = "100000", 300, 4.0
    print(f"# {TARGETS}")
    if not args.skip_serve:
        for size in args.sizes.split(","):
            bench_size(int(float(size)), args)
    if args.train:
        bench_training(args.train, args.epochs, args.pairwise_epochs, args.publish, args.item_shrinkage)
    if args.trained:
        bench_trained(args.trained, args.calls, args.sweep)


if __name__ == "__main__":
    main()
