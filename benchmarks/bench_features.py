"""Explanations and diversity on ML-100K: what they cost and what diversity trades.

Trains DCR (the default, top-N-aware estimator) on a per-user 80/20 split, publishes it to a
throwaway registry and calls the in-process Recommend handler (no gRPC), one user per call:

- p50 / p99 of a plain call, with ``explain = 3``, with ``diversity = 0.3`` and both, n = 10;
- the trade-off table: NDCG@10 (binary gain: held-out ratings >= 4, ranked over every item the
  user did not rate in training) and intra-list diversity (mean ``1 - cosine`` under the
  level-weighted inner product, ``service/indices/similar.py``) at several diversity settings;
- the same four rows over gRPC against an ``ordrec-serve`` process;
- SimilarItems p50 (one item, n = 10).

    python benchmarks/bench_features.py --data $ORDREC_DATA/ml-100k/u.data [--max-iter 100] [--calls 2000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from bench_handler import _Context, loaded_store  # noqa: E402  (run as a script: benchmarks/ is on the path)

from ordrec.service.indices.similar import intra_list_diversity  # noqa: E402
from ordrec.service.live.seen import SeenStore  # noqa: E402
from ordrec.service.serving.servicer import RecommenderServicer  # noqa: E402
from ordrec.service.serving.validation import Limits  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.tools.process import ServerProcess  # noqa: E402
from ordrec.trainer.data.readers import read_input  # noqa: E402
from ordrec.trainer.evaluation.holdout import split_ratings  # noqa: E402
from ordrec.trainer.models.dcr import DCR  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402
from ordrec.v1 import recommender_pb2_grpc  # noqa: E402

DIVERSITIES = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def timed(call, requests: list) -> list[float]:
    for request in requests[: min(200, len(requests))]:  # warm up
        call(request)
    times = []
    for request in requests:
        start = time.perf_counter()
        call(request)
        times.append(time.perf_counter() - start)
    return sorted(times)


def quantile(times: list[float], q: float) -> float:
    return times[int(q * (len(times) - 1))] * 1e6


def ndcg_at_10(ranked: list[str], liked: set[str]) -> float:
    gains = [1.0 / np.log2(rank + 2) for rank, item in enumerate(ranked[:10]) if item in liked]
    ideal = sum(1.0 / np.log2(rank + 2) for rank in range(min(10, len(liked))))
    return float(sum(gains) / ideal)


def grpc_table(registry: str, users: list[str], settings: dict, calls: int) -> None:
    """The same settings through a real server process over gRPC (one connection, sequential calls)."""
    print("\nRecommend over gRPC (ordrec-serve process, sequential calls), n = 10")
    print(f"{'setting':<28} {'p50 us':>8} {'p99 us':>8} {'p50 vs plain':>13}")
    with ServerProcess(registry) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        plain = None
        for label, extra in settings.items():
            requests = [
                pb.RecommendRequest(model="dcr", user_ids=[users[i % len(users)]], n=10, **extra)
                for i in range(calls)
            ]
            times = timed(lambda request: stub.Recommend(request, timeout=10), requests)
            p50 = quantile(times, 0.5)
            plain = plain or p50
            print(f"{label:<28} {p50:>8.0f} {quantile(times, 0.99):>8.0f} {100 * (p50 / plain - 1):>+12.0f}%")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="ML-100K u.data")
    p.add_argument("--max-iter", type=int, default=100, help="DCR epochs (the estimator's default: 100)")
    p.add_argument("--calls", type=int, default=2000, help="calls per latency row")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    data = read_input("ratings", args.data)
    train, test = split_ratings(data, 0.2, args.seed)
    started = time.perf_counter()
    model = DCR(max_iter=args.max_iter, random_state=args.seed).fit(train)
    print(
        f"DCR fit on {len(train):,} ratings in {time.perf_counter() - started:.0f} s (max_iter={args.max_iter})"
    )
    with tempfile.TemporaryDirectory() as folder:
        Registry(folder).publish("dcr", model.to_artifact())
        metrics, store = loaded_store(folder, "dcr")
        servicer = RecommenderServicer(store, metrics, Limits(), SeenStore())
        index = store.snapshot()["dcr"].index
        context = _Context()
        recommend = lambda request: servicer.Recommend(request, context)  # noqa: E731
        users = index.users.ids

        print("\nRecommend, in-process handler, one user per call, n = 10")
        print(f"{'setting':<28} {'p50 us':>8} {'p99 us':>8} {'p50 vs plain':>13}")
        settings = {
            "plain": {},
            "explain = 3": {"explain": 3},
            "diversity = 0.3": {"diversity": 0.3},
            "explain = 3, diversity = 0.3": {"explain": 3, "diversity": 0.3},
        }
        plain = None
        for label, extra in settings.items():
            requests = [
                pb.RecommendRequest(model="dcr", user_ids=[users[i % len(users)]], n=10, **extra)
                for i in range(args.calls)
            ]
            times = timed(recommend, requests)
            p50 = quantile(times, 0.5)
            plain = plain or p50
            print(f"{label:<28} {p50:>8.0f} {quantile(times, 0.99):>8.0f} {100 * (p50 / plain - 1):>+12.0f}%")
        grpc_table(folder, users, settings, args.calls)
        items = index.items.ids
        similar = [
            pb.SimilarItemsRequest(model="dcr", item_ids=[items[i % len(items)]], n=10)
            for i in range(args.calls)
        ]
        times = timed(lambda r: servicer.SimilarItems(r, context), similar)
        print(f"{'SimilarItems (1 item)':<28} {quantile(times, 0.5):>8.0f} {quantile(times, 0.99):>8.0f}")

        liked: dict[str, set[str]] = {}
        for u, i, r in zip(test.user.tolist(), test.item.tolist(), test.rating.tolist()):
            if r >= 4:
                liked.setdefault(test.users.ids[u], set()).add(test.items.ids[i])
        evaluated = sorted(liked)
        print(f"\nTrade-off on {len(evaluated)} users with a held-out rating >= 4 (seed {args.seed})")
        print(f"{'diversity':>9} {'NDCG@10':>8} {'ILD@10':>7}")
        for weight in DIVERSITIES:
            ndcg, ild = [], []
            for uid in evaluated:
                reply = servicer.Recommend(
                    pb.RecommendRequest(model="dcr", user_ids=[uid], n=10, diversity=weight), context
                )
                ranked = [item.id for item in reply.results[0].items]
                ndcg.append(ndcg_at_10(ranked, liked[uid]))
                ild.append(intra_list_diversity(index, index.items.rows(ranked)))
            print(f"{weight:>9.1f} {np.mean(ndcg):>8.4f} {np.mean(ild):>7.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
