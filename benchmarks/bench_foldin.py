"""What fold-in adds to a Recommend call for a user the version has not seen.

In-process handler (no gRPC) with the Redis seen store, one user per call. Rows:

- ``popularity (reference)``: a new user answered from the popularity list with no
  ratings lookup: what such a user cost before fold-in;
- ``no ratings``: the same user now (the seen lookup's round trip also asks for ratings);
- ``fold-in, R recorded``: a new user with R recorded ratings (read at most
  ``MAX_FOLD_IN_RATINGS`` of them, solve, score);
- ``solve only, R ratings``: ``index.fold_in`` alone (what a per-user cache could save).

    python benchmarks/bench_foldin.py --registry REGISTRY [--model dcr] [--redis URL] [--calls 3000]

Without ``--redis`` a throwaway redis-server is started on a free port.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import numpy as np  # noqa: E402
import redis  # noqa: E402
from bench_handler import _Context, loaded_store  # noqa: E402  (run as a script: benchmarks/ is on the path)

from ordrec.service.live.redis_state import RATINGS_KEY, RedisSeenStore  # noqa: E402
from ordrec.service.serving.servicer import RecommenderServicer  # noqa: E402
from ordrec.service.serving.validation import Limits  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402

RATING_COUNTS = (10, 50, 200)


@contextmanager
def redis_url(given: str | None):
    """``given``, or a throwaway redis-server on a free loopback port."""
    if given:
        yield given
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def timed(call, repeats: int) -> list[float]:
    for _ in range(min(200, repeats)):  # warm up
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)


def row(label: str, times: list[float], reference: float | None) -> str:
    pick = lambda q: times[int(q * (len(times) - 1))] * 1e6  # noqa: E731
    added = f"{pick(0.5) - reference:>+9.1f}" if reference is not None else f"{'':>9}"
    mean = sum(times) / len(times) * 1e6
    return f"{label:<28} {len(times):>6} {mean:>8.1f} {pick(0.5):>7.1f} {pick(0.99):>7.1f} {added}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--registry", required=True)
    p.add_argument("--model", default="dcr")
    p.add_argument("--redis", help="redis://host:port/db (default: start a throwaway redis-server)")
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    metrics, store = loaded_store(args.registry, args.model)
    index = store.snapshot()[args.model].index
    rng = np.random.default_rng(0)
    context = _Context()
    with redis_url(args.redis) as url:
        seen = RedisSeenStore(url, metrics, timeout=1.0)
        servicer = RecommenderServicer(store, metrics, Limits(), seen)
        client = redis.Redis.from_url(url, decode_responses=True)

        def recommend(user: str):
            request = pb.RecommendRequest(model=args.model, user_ids=[user], n=10)
            return lambda: servicer.Recommend(request, context)

        lookup = seen.lookup
        # the reference: the seen lookup without the ratings read
        seen.lookup = lambda seen_for, ratings_for=(): lookup(seen_for, ())
        reference = timed(recommend("bench-new-user"), args.calls)
        seen.lookup = lookup
        ref_p50 = reference[len(reference) // 2] * 1e6
        print(f"{'path':<28} {'calls':>6} {'mean us':>8} {'p50 us':>7} {'p99 us':>7} {'+p50 us':>9}")
        print(row("popularity (reference)", reference, None))
        print(row("no ratings", timed(recommend("bench-new-user"), args.calls), ref_p50))
        levels = np.asarray(getattr(index, "levels", [1, 2, 3, 4, 5]), dtype=np.float64)
        for count in RATING_COUNTS:
            items = rng.choice(len(index.items), min(count, len(index.items)), replace=False)
            values = rng.choice(levels, items.size)
            user = f"bench-fold-{count}"
            client.delete(RATINGS_KEY.format(user))
            client.hset(
                RATINGS_KEY.format(user),
                mapping={index.items.ids[i]: f"{x:g}" for i, x in zip(items.tolist(), values.tolist())},
            )
            assert recommend(user)().results[0].folded_in
            print(row(f"fold-in, {items.size} recorded", timed(recommend(user), args.calls), ref_p50))
            print(
                row(
                    f"solve only, {items.size} ratings",
                    timed(lambda items=items, values=values: index.fold_in(items, values), args.calls),
                    None,
                )
            )
        seen.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
