"""RTF benchmarks: in-process Tags latency and training time per iteration.

Latency (``RTFIndex.tags``, top-10, |T| = 2,045 as in the paper's Last.fm 10-core)
for three ways of scoring one post:

- ``fast``: ``q = I[i] @ (U[u] @ C.reshape(kU, kI*kT)).reshape(kI, kT)``, ``T @ q``,
  numba top-k; the user cache is off, so every call pays ``C x1 U[u]``;
- ``fast+cache``: the same with the per-user ``C x1 U[u]`` already cached;
- ``naive``: every tag's score by the full sum of Eq. 4 (numba loop,
  O(|T| kU kI kT)) plus the same top-k.

Paper (2009 hardware, Object Pascal): 1.1 ms (RTF16) and 12.4 ms (RTF64) per
list on Last.fm. The target is the fast path at least 100x faster than
12.4 ms at RTF64.

Training (``--data`` Last.fm ``user_taggedartists.dat``): seconds per SGD pass
over the 10-core posts at each dims, timed over ``--epochs`` passes after a
warm-up.

    .venv/bin/python benchmarks/bench_rtf.py
    .venv/bin/python benchmarks/bench_rtf.py --data $ORDREC_DATA/lastfm-tags/user_taggedartists.dat
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.indices.topk import top_k
from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.models import rtf_kernels as K


def synthetic_index(dims: int, n_users: int, n_items: int, n_tags: int, seed: int = 0) -> RTFIndex:
    """An RTF index of the given size with random factors (latency does not depend on values)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.normal(0, 0.3, shape).astype(np.float32)  # noqa: E731
    arrays = {
        "core": f(dims, dims, dims),
        "user_factors": f(n_users, dims),
        "item_factors": f(n_items, dims),
        "tag_factors": f(n_tags, dims),
        "tag_popularity": rng.integers(1, 100, n_tags).astype(np.float32),
        "user_tag_indptr": np.zeros(n_users + 1, np.int64),
        "user_tag_indices": np.zeros(0, np.int32),
        "user_tag_counts": np.zeros(0, np.float32),
        "item_tag_indptr": np.zeros(n_items + 1, np.int64),
        "item_tag_indices": np.zeros(0, np.int32),
        "item_tag_counts": np.zeros(0, np.float32),
        "post_indptr": np.zeros(n_users + 1, np.int64),
        "post_items": np.zeros(0, np.int32),
        "post_tag_indptr": np.zeros(1, np.int64),
        "post_tags": np.zeros(0, np.int32),
    }
    ids = {
        "users": IdMap([f"u{k}" for k in range(n_users)]),
        "items": IdMap([f"i{k}" for k in range(n_items)]),
        "tags": IdMap([f"t{k}" for k in range(n_tags)]),
    }
    return RTFIndex.from_artifact(Artifact("rtf", arrays, ids))


def _percentiles(samples: list[float]) -> tuple[float, float]:
    arr = np.asarray(samples) * 1e6
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def bench_latency(dims_list, n_tags: int, requests: int, naive_requests: int, seed: int) -> None:
    print(
        f"Tags latency, in-process, top-10, |T| = {n_tags:,} (microseconds; 2 shared cores, other jobs running)"
    )
    print(
        f"{'model':<8}{'fast p50':>10}{'fast p99':>10}{'cache p50':>11}{'cache p99':>11}"
        f"{'naive p50':>12}{'naive p99':>12}{'naive/fast':>12}{'paper':>9}"
    )
    paper = {16: "1.1 ms", 64: "12.4 ms"}
    paper_us = {16: 1100.0, 64: 12400.0}
    rng = np.random.default_rng(seed)
    for dims in dims_list:
        index = synthetic_index(dims, 2000, 2000, n_tags, seed)
        users = rng.integers(0, 2000, requests)
        items = rng.integers(0, 2000, requests)
        index.smoke()
        # fast path, cold: no user cache at all
        index.cache.capacity = 0
        index.cache.clear()
        fast = []
        for u, i in zip(users, items):
            t0 = time.perf_counter()
            index.tags(int(u), int(i), 10)
            fast.append(time.perf_counter() - t0)
        # fast path, warm: the user's C x1 U[u] is in the cache
        index.cache.capacity = 64
        hot_users = users[:32]
        for u in hot_users:
            index.user_core(int(u))
        warm = []
        for k, i in enumerate(items):
            u = int(hot_users[k % hot_users.size])
            t0 = time.perf_counter()
            index.tags(u, int(i), 10)
            warm.append(time.perf_counter() - t0)
        # naive full sum per tag
        naive = []
        K.naive_tag_scores(index.core, index.user_factors[0], index.item_factors[0], index.tag_factors[:2])
        for u, i in zip(users[:naive_requests], items[:naive_requests]):
            t0 = time.perf_counter()
            scores = K.naive_tag_scores(
                index.core, index.user_factors[u], index.item_factors[i], index.tag_factors
            )
            top_k(scores, 10)
            naive.append(time.perf_counter() - t0)
        f50, f99 = _percentiles(fast)
        w50, w99 = _percentiles(warm)
        n50, n99 = _percentiles(naive)
        print(
            f"RTF-{dims:<4}{f50:>10.1f}{f99:>10.1f}{w50:>11.1f}{w99:>11.1f}{n50:>12.0f}{n99:>12.0f}"
            f"{n50 / f50:>11.0f}x{paper.get(dims, '-'):>9}"
        )
        if dims in paper_us:
            print(
                f"  RTF-{dims}: paper / ours (p50) = {paper_us[dims] / f50:.0f}x cold, "
                f"{paper_us[dims] / w50:.0f}x with a warm user cache"
            )


def bench_training(path: str, dims_list, epochs: int, core: int, seed: int) -> None:
    from ordrec.trainer.data.readers import read_input
    from ordrec.trainer.models.rtf import group_posts
    from ordrec.trainer.reproduce.rtf import p_core

    data = p_core(read_input("tags", path, "auto"), core)
    post_user, post_item, indptr, tags = group_posts(data.user, data.item, data.tag)
    rng = np.random.default_rng(seed)
    print(
        f"\nTraining, {core}-core of {path}: {post_user.size:,} posts, {len(data.tags):,} tags "
        f"(float32, one thread, 2 shared cores)"
    )
    print(f"{'model':<8}{'s/iteration':>13}{'us/post':>10}")
    for dims in dims_list:
        C = rng.normal(0, 0.1, (dims, dims, dims)).astype(np.float32)
        U = rng.normal(0, 0.1, (len(data.users), dims)).astype(np.float32)
        I = rng.normal(0, 0.1, (len(data.items), dims)).astype(np.float32)
        T = rng.normal(0, 0.1, (len(data.tags), dims)).astype(np.float32)
        K.sgd_epoch(C, U, I, T, post_user, post_item, indptr, tags, np.arange(2), 0.1, 1e-6, 1e-6, 1e-6)
        times = []
        for _ in range(epochs):
            order = rng.permutation(post_user.size)
            t0 = time.perf_counter()
            K.sgd_epoch(C, U, I, T, post_user, post_item, indptr, tags, order, 1.0, 1e-6, 1e-6, 1e-6)
            times.append(time.perf_counter() - t0)
        best = min(times)
        print(f"RTF-{dims:<4}{best:>13.2f}{best / post_user.size * 1e6:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", default="8,16,32,64")
    parser.add_argument("--tags", type=int, default=2045)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--naive-requests", type=int, default=20)
    parser.add_argument("--data", help="Last.fm user_taggedartists.dat, for training time per iteration")
    parser.add_argument("--core", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dims_list = [int(x) for x in args.dims.split(",")]
    bench_latency(dims_list, args.tags, args.requests, args.naive_requests, args.seed)
    if args.data:
        bench_training(args.data, dims_list, args.epochs, args.core, args.seed)


if __name__ == "__main__":
    main()
