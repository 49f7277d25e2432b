"""In-process cost of the Recommend handler (no gRPC): validation, id lookup,
scoring, exclusion, top-k and reply building, for one user per call, through the
dynamic batcher as the server runs it (``--batch-max-size 0``: without it); with
``--unknown-users``, users the version has not seen (the fallback's answer, no Redis).
Wall time per call (mean, p50, p99) and the handler's CPU per call: ``time.thread_time``
over all the calls (the reply's bytes as the server sends them: ``recommend_wire``),
best of ``--repeat`` rounds (CPU is what a loaded server pays).

    python benchmarks/bench_handler.py --registry REGISTRY [--model dcr] [--calls 5000] [--repeat 3]
        [--unknown-users] [--profile 25]

``--profile K``: one more round under cProfile, its K most expensive functions by own time
(where a call's CPU goes).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

from ordrec.service.config import DEFAULT_BATCH_MAX_SIZE  # noqa: E402
from ordrec.service.live.seen import SeenStore  # noqa: E402
from ordrec.service.metrics import Metrics  # noqa: E402
from ordrec.service.serving.batching import RecommendBatcher  # noqa: E402
from ordrec.service.serving.server import batch_observer  # noqa: E402
from ordrec.service.serving.servicer import RecommenderServicer  # noqa: E402
from ordrec.service.serving.store import ModelStore  # noqa: E402
from ordrec.service.serving.validation import Limits  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402


class Context:
    def time_remaining(self):
        return None

    def is_active(self):
        return True

    def abort(self, code, message):
        raise RuntimeError(f"{code}: {message}")


def loaded_store(registry: str, model: str) -> tuple[Metrics, ModelStore]:
    """The server's model store over ``registry`` with ``model`` loaded, and its metrics."""
    metrics = Metrics()
    store = ModelStore(Registry(registry), metrics)
    store.refresh([model])
    return metrics, store


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--registry", required=True)
    p.add_argument("--model", default="dcr")
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--batch-max-size", type=int, default=DEFAULT_BATCH_MAX_SIZE)
    p.add_argument("--repeat", type=int, default=3, help="rounds; the CPU figure is the best")
    p.add_argument(
        "--unknown-users", action="store_true", help="users the version has not seen: the fallback path"
    )
    p.add_argument(
        "--profile", type=int, default=0, help="print the K costliest functions of a profiled round"
    )
    args = p.parse_args()
    metrics, store = loaded_store(args.registry, args.model)
    batcher = (
        RecommendBatcher(args.batch_max_size, observer=batch_observer(metrics))
        if args.batch_max_size
        else None
    )
    servicer = RecommenderServicer(store, metrics, Limits(), SeenStore(), batcher=batcher)
    users = store.snapshot()[args.model].index.users.ids
    if args.unknown_users:
        users = [f"unknown-{k}" for k in range(len(users))]
    requests = [
        pb.RecommendRequest(model=args.model, user_ids=[users[i % len(users)]], n=10)
        for i in range(args.calls)
    ]
    context = Context()
    for request in requests[:500]:  # warm up
        servicer.recommend_wire(request, context)
    times: list[float] = []
    cpu = []
    for _ in range(args.repeat):
        times = []
        cpu_start = time.thread_time()
        for request in requests:
            start = time.perf_counter()
            servicer.recommend_wire(request, context)  # the reply's bytes, as the server sends them
            times.append(time.perf_counter() - start)
        cpu.append((time.thread_time() - cpu_start) / len(requests))
    times.sort()
    pick = lambda q: times[int(q * (len(times) - 1))] * 1e6  # noqa: E731
    print(f"{'model':<10} {'calls':>6} {'mean us':>8} {'p50 us':>7} {'p99 us':>7} {'CPU us':>7}")
    print(
        f"{args.model:<10} {len(times):>6} {sum(times) / len(times) * 1e6:>8.1f} {pick(0.5):>7.1f}"
        f" {pick(0.99):>7.1f} {min(cpu) * 1e6:>7.1f}"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [servicer.recommend_wire(r, context) for r in requests])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
