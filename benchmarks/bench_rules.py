"""Cost of business rules on Recommend: hidden items and a selective filter.

In process (no gRPC): the Recommend handler on a synthetic DCR version whose
catalogue is large enough to hide 10^5 items, one user per call, n=10, the
user's training items excluded. Rows:

- ``plain``: the handler as before this issue (no hidden-items state at all);
- ``hidden 0 / 10^3 / 10^5``: a registry-backed hidden set of that size for all models;
- ``filter 1 %``: a filter that 1 % of the items pass (no hidden items);
- with ``--ann``: the same rows through the faiss item index (built here; slow to build), with
  each row's recall@10 against the exact search under the same rules.

    python benchmarks/bench_rules.py [--items 200000] [--calls 2000] [--ann]

Rows take turns call by call, so a machine whose speed drifts (shared
cores) biases them alike.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from ordrec.service.indices import ann  # noqa: E402
from ordrec.service.indices.rules import encode_item_attributes  # noqa: E402
from ordrec.service.live.hidden import HiddenState, RegistryBackend  # noqa: E402
from ordrec.service.live.seen import SeenStore  # noqa: E402
from ordrec.service.metrics import Metrics  # noqa: E402
from ordrec.service.serving.servicer import RecommenderServicer  # noqa: E402
from ordrec.service.serving.store import ModelStore  # noqa: E402
from ordrec.service.serving.validation import Limits  # noqa: E402
from ordrec.service.storage.artifact import Artifact  # noqa: E402
from ordrec.service.storage.hidden_items import ALL_MODELS  # noqa: E402
from ordrec.service.storage.idmap import IdMap  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402

LEVELS, RANK, N_USERS = [1.0, 2.0, 3.0, 4.0, 5.0], 10, 1000
# Calls per row whose answers are checked against the exact search (after the warm-up).
RECALL_CALLS = 300


class _Context:
    def time_remaining(self):
        return None

    def is_active(self):
        return True

    def abort(self, code, message):
        raise RuntimeError(f"{code}: {message}")


def artifact(n_items: int, with_index: bool, seed: int = 0) -> Artifact:
    """A DCR version with clustered factors, 20 seen items per user and a 'bucket' attribute
    (0..99, so ``bucket = 7`` lets 1 % of the items through)."""
    rng = np.random.default_rng(seed)
    width = (len(LEVELS) - 1) * RANK
    centers = rng.normal(size=(50, width))
    items = centers[rng.integers(0, 50, n_items)] + 0.7 * rng.normal(size=(n_items, width))
    items *= rng.uniform(0.1, 1.0, (n_items, 1)) / np.linalg.norm(items, axis=1, keepdims=True)
    users = centers[rng.integers(0, 50, N_USERS)] + rng.normal(size=(N_USERS, width))
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    items = items.astype(np.float32)
    arrays, meta = encode_item_attributes(
        [{"name": "bucket", "type": "numeric", "values": rng.integers(0, 100, n_items).astype(float)}],
        n_items,
    )
    arrays.update(
        {
            "user_factors": users.astype(np.float32),
            "item_factors": items,
            "seen_indptr": np.arange(0, N_USERS * 20 + 1, 20, dtype=np.int64),
            "seen_indices": np.sort(rng.choice(n_items, (N_USERS, 20)), axis=1).reshape(-1),
            "item_popularity": rng.random(n_items).astype(np.float32),
        }
    )
    return Artifact(
        kind="dcr",
        arrays=arrays,
        ids={
            "users": IdMap([f"u{i}" for i in range(N_USERS)]),
            "items": IdMap([f"i{i}" for i in range(n_items)]),
        },
        attributes={"levels": LEVELS, "relevance": "linear", "rank": RANK, "item_attributes": meta},
        indexes={"items": ann.item_index(items)} if with_index else {},
    )


def servicers(root: Path, n_items: int, models: list[str]) -> dict[str, tuple[RecommenderServicer, str]]:
    """One servicer per row, all over the same loaded versions; each hidden row has its own registry
    folder for the HIDDEN file (so the sets differ) but shares the model store."""
    metrics = Metrics()
    store = ModelStore(Registry(root / "registry"), metrics)
    store.refresh(models)
    rows = {"plain": (RecommenderServicer(store, metrics, Limits(), SeenStore()), "")}
    rng = np.random.default_rng(1)
    for label, count in (("hidden 0", 0), ("hidden 10^3", 1000), ("hidden 10^5", 100_000)):
        hidden_registry = Registry(root / f"hidden-{count}")
        if count:
            hidden_registry.set_hidden(
                ALL_MODELS, (f"i{i}" for i in rng.choice(n_items, count, replace=False))
            )
        state = HiddenState(RegistryBackend(hidden_registry), 3600)
        rows[label] = (RecommenderServicer(store, metrics, Limits(), SeenStore(), state), "")
    rows["filter 1 %"] = (rows["hidden 0"][0], "bucket = 7")
    return rows


def measure(rows: dict, model: str, calls: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per-call latencies of each row, the rows taking turns call by call (a shared machine's
    drift then biases them alike), and for the graph search each row's recall@10 against the
    exact search under the same rules."""
    context = _Context()
    times: dict[str, list[float]] = {label: [] for label in rows}
    found: dict[str, list[float]] = {label: [] for label in rows}
    for k in range(calls + 50):  # the first 50 warm up (numba, the filter's cache, the masks)
        for r, (label, (servicer, text)) in enumerate(rows.items()):
            # each row its own user at a time: a user just queried by another row would find
            # the caches warm for it (the graph rows measured 35 % apart that way)
            user = f"u{(k * 7 + r * 131) % N_USERS}"
            request = pb.RecommendRequest(model=model, user_ids=[user], n=10, filter=text)
            start = time.perf_counter()
            reply = servicer.Recommend(request, context)
            if k >= 50:
                times[label].append(time.perf_counter() - start)
            assert len(reply.results[0].items) == 10
            if model != "exact" and k < 50 + RECALL_CALLS:
                request.model = "exact"
                truth = {item.id for item in servicer.Recommend(request, context).results[0].items}
                found[label].append(len(truth & {item.id for item in reply.results[0].items}) / 10)
    return times, {label: statistics.mean(values) for label, values in found.items() if values}


def report(title: str, times: dict[str, list[float]], recall: dict[str, float]) -> None:
    base = statistics.median(times["plain"])
    print(f"\n{title}")
    print(f"{'row':<14} {'calls':>6} {'p50 us':>8} {'p99 us':>8} {'p50 vs plain':>13} {'recall@10':>10}")
    for label, values in times.items():
        values = sorted(values)
        p50, p99 = statistics.median(values), values[int(0.99 * (len(values) - 1))]
        hit = f"{recall[label]:.3f}" if label in recall else "exact"
        print(
            f"{label:<14} {len(values):>6} {p50 * 1e6:>8.0f} {p99 * 1e6:>8.0f}"
            f" {100 * (p50 / base - 1):>+12.1f}% {hit:>10}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, default=200_000)
    p.add_argument("--calls", type=int, default=2000, help="per row")
    p.add_argument("--ann", action="store_true", help="also measure through the faiss item index")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        registry = Registry(root / "registry")
        registry.publish("exact", artifact(args.items, with_index=False))
        if args.ann:
            t0 = time.perf_counter()
            registry.publish("graph", artifact(args.items, with_index=True))
            print(f"built the item index over {args.items:,} items in {time.perf_counter() - t0:.0f} s")
        models = ["exact", "graph"] if args.ann else ["exact"]
        for model in models:
            times, recall = measure(servicers(root, args.items, models), model, args.calls)
            report(
                f"Recommend handler, {model} search, {args.items:,} items x {(len(LEVELS) - 1) * RANK} dims,"
                f" n=10",
                times,
                recall,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
