"""Explanations and diversity on ML-100K: what they cost and what diversity trades.

Trains DCR (the default, top-N-aware estimator; ``--kind coe``: COE) on a per-user 80/20 split, publishes it to a
throwaway registry and calls the in-process Recommend handler (no gRPC), one user per call:

- p50 / p99 of the bare scorer (the index's answer and its reply, no handler: the yardstick a
  plain call is compared with), a plain call, a plain call with a fresh-items reader that has
  no fresh items (``service/live/fresh.py``), with ``explain = 3``, with ``diversity = 0.3`` and
  both, n = 10;
- the trade-off table: NDCG@10 (binary gain: held-out ratings >= 4, ranked over every item the
  user did not rate in training) and intra-list diversity (mean ``1 - cosine`` under the
  level-weighted inner product, ``service/indices/similar.py``) at several diversity settings;
- the same four rows over gRPC against an ``ordrec-serve`` process, with the server process's
  CPU per call (user + system time of all its threads over each row's calls);
- SimilarItems p50 (one item, n = 10);
- the same four rows again, interleaved call by call (plain, explain, diversity, both, then
  the next user; each round starts one variant later), in process and over gRPC: drift on a
  noisy machine then hits every variant alike. Each row gives its p50, the p50 ratio to plain
  with a 95 % interval from a paired bootstrap over the rounds, and (in process) the handler's
  CPU per call (``time.thread_time``, median); in process also the general Recommend path
  with no feature work (an unknown id excluded), what a feature request pays before its feature.

    python benchmarks/bench_features.py --data $ORDREC_DATA/ml-100k/u.data [--kind dcr] [--max-iter 100] [--calls 2000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from bench_handler import Context, loaded_store  # noqa: E402  (run as a script: benchmarks/ is on the path)

from ordrec.service.indices.similar import intra_list_diversity  # noqa: E402
from ordrec.service.live.fresh import FreshEvidence, FreshItems  # noqa: E402
from ordrec.service.live.seen import SeenStore  # noqa: E402
from ordrec.service.serving.servicer import RecommenderServicer  # noqa: E402
from ordrec.service.serving.validation import Limits  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.tools.process import ServerProcess  # noqa: E402
from ordrec.trainer.data.readers import read_input  # noqa: E402
from ordrec.trainer.evaluation.holdout import split_ratings  # noqa: E402
from ordrec.trainer.models.coe import COE  # noqa: E402
from ordrec.trainer.models.dcr import DCR  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402
from ordrec.v1 import recommender_pb2_grpc  # noqa: E402

DIVERSITIES = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
BOOTSTRAP = 1000  # resamples of the rounds for the interval of a p50 ratio
PROBE = "general path, no feature"


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


def bare_scorer(index, users: list[str], calls: int) -> list[float]:
    """The index's own answer and a reply built from it, no handler: what any Recommend code
    path costs at least (the same-run yardstick for the plain row)."""

    def call(user: str) -> None:
        row = index.users.row(user)
        rows, scores = index.recommend(row, 10, exclude=index.seen(row))
        result = pb.RecommendResponse().results.add(user_id=user)
        for r, score in zip(rows.tolist(), scores.tolist()):
            result.items.add(id=index.items.ids[r], score=score)

    return timed(call, [users[i % len(users)] for i in range(calls)])


def interleaved(calls: dict, requests: dict, rounds: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Wall and thread-CPU seconds per call of each variant, calls taken in turn round by
    round (round ``r`` starts at variant ``r mod V``, so none always follows the same one)."""
    labels = list(calls)
    for r in range(min(200, rounds)):  # warm up
        for label in labels:
            calls[label](requests[label][r])
    wall = {label: np.empty(rounds) for label in labels}
    cpu = {label: np.empty(rounds) for label in labels}
    for r in range(rounds):
        for k in range(len(labels)):
            label = labels[(r + k) % len(labels)]
            call, request = calls[label], requests[label][r]
            started, started_cpu = time.perf_counter(), time.thread_time()
            call(request)
            cpu[label][r] = time.thread_time() - started_cpu
            wall[label][r] = time.perf_counter() - started
    return {label: (wall[label], cpu[label]) for label in labels}


def ratio_interval(times: np.ndarray, plain: np.ndarray, seed: int) -> tuple[float, float]:
    """95 % interval of ``p50(times) / p50(plain) - 1`` from a paired bootstrap over rounds."""
    picks = np.random.default_rng(seed).integers(0, times.size, (BOOTSTRAP, times.size))
    ratios = np.median(times[picks], axis=1) / np.median(plain[picks], axis=1) - 1.0
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def print_interleaved(title: str, measured: dict[str, tuple[np.ndarray, np.ndarray]], with_cpu: bool) -> None:
    """One row per variant: p50, p99, p50 vs plain with its bootstrap interval, CPU per call."""
    print(f"\n{title}")
    header = f"{'setting':<28} {'p50 us':>8} {'p99 us':>8} {'p50 vs plain':>13} {'95 % interval':>17}"
    print(header + (f" {'CPU p50 us':>11}" if with_cpu else ""))
    plain = measured["plain"][0]
    for label, (wall, cpu) in measured.items():
        row = f"{label:<28} {np.median(wall) * 1e6:>8.0f} {np.quantile(wall, 0.99) * 1e6:>8.0f}"
        if label == "plain":
            row += f" {'':>13} {'':>17}"
        else:
            low, high = ratio_interval(wall, plain, seed=len(label))
            ratio = np.median(wall) / np.median(plain) - 1.0
            row += f" {100 * ratio:>+12.0f}% {f'{100 * low:+.0f} .. {100 * high:+.0f} %':>17}"
        print(row + (f" {np.median(cpu) * 1e6:>11.0f}" if with_cpu else ""))


def feature_requests(model: str, users: list[str], settings: dict, calls: int) -> dict[str, list]:
    """Each setting's requests, call ``i`` for user ``i`` (the same users for every setting)."""
    return {
        label: [
            pb.RecommendRequest(model=model, user_ids=[users[i % len(users)]], n=10, **extra)
            for i in range(calls)
        ]
        for label, extra in settings.items()
    }


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def grpc_table(registry: str, model: str, users: list[str], settings: dict, calls: int) -> None:
    """The same settings through a real server process over gRPC (one connection, sequential calls)."""
    print("\nRecommend over gRPC (ordrec-serve process, sequential calls), n = 10")
    print(f"{'setting':<28} {'p50 us':>8} {'p99 us':>8} {'p50 vs plain':>13}")
    with ServerProcess(registry) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        plain = None
        by_setting = feature_requests(model, users, settings, calls)
        server_cpu = {}
        for label, requests in by_setting.items():
            before = process_cpu_seconds(server.proc.pid)
            times = timed(lambda request: stub.Recommend(request, timeout=10), requests)
            server_cpu[label] = (process_cpu_seconds(server.proc.pid) - before) / (
                len(times) + min(200, calls)
            )
            p50 = quantile(times, 0.5)
            plain = plain or p50
            print(f"{label:<28} {p50:>8.0f} {quantile(times, 0.99):>8.0f} {100 * (p50 / plain - 1):>+12.0f}%")
        print("server process CPU per call (all its threads), us: ", end="")
        print(", ".join(f"{label} {1e6 * seconds:.0f}" for label, seconds in server_cpu.items()))
        call = functools.partial(stub.Recommend, timeout=10)
        measured = interleaved(dict.fromkeys(settings, call), by_setting, calls)
        print_interleaved("Recommend over gRPC, interleaved call by call, n = 10", measured, with_cpu=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="ML-100K u.data")
    p.add_argument("--kind", choices=("dcr", "coe"), default="dcr", help="the recommender measured")
    p.add_argument("--max-iter", type=int, default=100, help="epochs (DCR's default: 100)")
    p.add_argument("--calls", type=int, default=2000, help="calls per latency row")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    data = read_input("ratings", args.data)
    train, test = split_ratings(data, 0.2, args.seed)
    started = time.perf_counter()
    kind = args.kind
    model = (DCR if kind == "dcr" else COE)(max_iter=args.max_iter, random_state=args.seed).fit(train)
    print(
        f"{kind} fit on {len(train):,} ratings in {time.perf_counter() - started:.0f} s (max_iter={args.max_iter})"
    )
    with tempfile.TemporaryDirectory() as folder:
        Registry(folder).publish(kind, model.to_artifact())
        metrics, store = loaded_store(folder, kind)
        servicer = RecommenderServicer(store, metrics, Limits(), SeenStore())
        index = store.snapshot()[kind].index
        context = Context()
        recommend = lambda request: servicer.Recommend(request, context)  # noqa: E731
        users = index.users.ids

        print("\nRecommend, in-process handler, one user per call, n = 10")
        print(f"{'setting':<28} {'p50 us':>8} {'p99 us':>8} {'p50 vs plain':>13}")
        bare = bare_scorer(index, users, args.calls)
        print(f"{'bare scorer (no handler)':<28} {quantile(bare, 0.5):>8.0f} {quantile(bare, 0.99):>8.0f}")
        settings = {
            "plain": {},
            "explain = 3": {"explain": 3},
            "diversity = 0.3": {"diversity": 0.3},
            "explain = 3, diversity = 0.3": {"explain": 3, "diversity": 0.3},
        }
        plain = None
        by_setting = feature_requests(kind, users, settings, args.calls)
        for label, requests in by_setting.items():
            times = timed(recommend, requests)
            p50 = quantile(times, 0.5)
            plain = plain or p50
            print(f"{label:<28} {p50:>8.0f} {quantile(times, 0.99):>8.0f} {100 * (p50 / plain - 1):>+12.0f}%")
            if label == "plain":  # the same call with a fresh-items reader that has none
                idle = RecommenderServicer(
                    store,
                    metrics,
                    Limits(),
                    SeenStore(),
                    fresh=FreshItems(FreshEvidence(None, lambda i: False)),
                )
                times = timed(functools.partial(idle.Recommend, context=context), requests)
                p50 = quantile(times, 0.5)
                label = "plain, fresh reader, none"
                print(
                    f"{label:<28} {p50:>8.0f} {quantile(times, 0.99):>8.0f} {100 * (p50 / plain - 1):>+12.0f}%"
                )
        # The general Recommend path with no feature work (an id no version knows excluded): what
        # a feature request pays before its feature, beside the straight-line plain path.
        probe = {**settings, PROBE: {"exclude_item_ids": ["not-an-item"]}}
        by_setting = feature_requests(kind, users, probe, args.calls)
        measured = interleaved(dict.fromkeys(probe, recommend), by_setting, args.calls)
        print_interleaved("Recommend, in-process handler, interleaved call by call, n = 10", measured, True)
        grpc_table(folder, kind, users, settings, args.calls)
        items = index.items.ids
        similar = [
            pb.SimilarItemsRequest(model=kind, item_ids=[items[i % len(items)]], n=10)
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
                    pb.RecommendRequest(model=kind, user_ids=[uid], n=10, diversity=weight), context
                )
                ranked = [item.id for item in reply.results[0].items]
                ndcg.append(ndcg_at_10(ranked, liked[uid]))
                ild.append(intra_list_diversity(index, index.items.rows(ranked)))
            print(f"{weight:>9.1f} {np.mean(ndcg):>8.4f} {np.mean(ild):>7.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
