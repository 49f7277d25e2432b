"""What the ``diversity`` setting trades on ML-100K: NDCG@10 against the genre variety a user sees.

The project's top-N protocol (``ordrec-train reproduce topn``, one run): each user's ratings
split 80/20 at random (seed), DCR and COE fitted on the training part with their estimator
defaults as a job configures them, the genres of ``u.item`` published with the version (as
``--item-attributes u.item`` does), and every user with a held-out rating >= 4 asked for the top
10 of all items they did not rate, through the serving index and the same re-ranking
``Recommend`` runs (``service/indices/diversity.py``: MMR over the pool of the model's top 50).
Per setting: NDCG@10 (binary gain, held-out ratings >= 4), genre ILD@10 (mean ``1 - Jaccard`` of
the genres over the list's pairs) and how many of the 10 items differ from the plain list.
With ``--compare`` the same rows with MMR over the model's own similarity (what a version
without attributes does), the genre ILD still measured by ``u.item``. Then what the
re-ranking costs per call at 0.3 (median CPU us of ``rerank`` over the users' pools, in
process): over the genres, and over the model's similarity (the same model published without
attributes).

    python benchmarks/bench_diversity.py --data $ORDREC_DATA/ml-100k/u.data \\
        --item-attributes $ORDREC_DATA/ml-100k/u.item [--kinds dcr,coe] [--seed 0] [--compare] [--json rows.jsonl]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from ordrec.service.indices.diversity import (  # noqa: E402
    POOL_FACTOR,
    Diversify,
    intra_list_attribute_diversity,
    rerank,
)
from ordrec.service.indices.item_attributes import attach_item_attributes  # noqa: E402
from ordrec.service.indices.models import build_index  # noqa: E402
from ordrec.trainer.data.readers import read_input  # noqa: E402
from ordrec.trainer.evaluation.topn import TopN, topn_metrics  # noqa: E402
from ordrec.trainer.models.pipeline import configure  # noqa: E402
from ordrec.trainer.reproduce.topn import make_split  # noqa: E402

WEIGHTS = (0.0, 0.1, 0.3, 0.5, 0.7, 1.0)
N = 10
THRESHOLD = 4.0
COST_WEIGHT = 0.3


def diversified_lists(index, users: np.ndarray, weight: float) -> np.ndarray:
    """Each user's top ``N`` as Recommend serves it with ``diversity = weight``: the pool of the
    model's best unrated items, re-ranked."""
    settings = Diversify(weight)
    lists = np.full((users.size, N), -1, dtype=np.int64)
    for k, user in enumerate(users.tolist()):
        pool = index.recommend(user, settings.pool_size(N), exclude=index.seen(user))
        rows, _ = rerank(index, pool, N, settings)
        lists[k, : rows.size] = rows
    return lists


def tradeoff_rows(index, ranker, truth: TopN, train, kind: str, weights) -> list[dict]:
    """One row per setting: NDCG@10, genre ILD@10 (by ``index``'s genres) and the items changed
    against the plain list, the lists re-ranked by ``ranker`` (``index``, or the same model
    without attributes: MMR over the model's similarity)."""
    plain = diversified_lists(ranker, truth.users, 0.0)
    rows = []
    for weight in weights:
        lists = plain if weight == 0 else diversified_lists(ranker, truth.users, weight)
        rows.append(
            {
                "kind": kind,
                "similarity": "genres" if ranker is index else "model",
                "diversity": weight,
                "ndcg@10": topn_metrics(lists, truth, train)["ndcg@10"],
                "genre_ild@10": float(
                    np.mean([intra_list_attribute_diversity(index, r, "genre") for r in lists])
                ),
                "changed@10": float(np.mean([N - np.intersect1d(a, b).size for a, b in zip(lists, plain)])),
                "users": int(truth.users.size),
            }
        )
    return rows


def rerank_micros(index, users: np.ndarray, weight: float) -> float:
    """Median CPU microseconds of one ``rerank`` of a user's pool (the pools found beforehand)."""
    settings = Diversify(weight)
    pools = [index.recommend(u, settings.pool_size(N), exclude=index.seen(u)) for u in users.tolist()]
    times = []
    for pool in pools:
        started = time.thread_time()
        rerank(index, pool, N, settings)
        times.append(time.thread_time() - started)
    return float(np.median(times) * 1e6)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="ML-100K u.data")
    p.add_argument("--item-attributes", required=True, help="ML-100K u.item (the genres)")
    p.add_argument("--kinds", default="dcr,coe", help="comma-separated recommenders")
    p.add_argument("--weights", default=",".join(map(str, WEIGHTS)), help="diversity settings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the rows here, one JSON object a line")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also the rows of MMR over the model's similarity (the same model without attributes)",
    )
    args = p.parse_args()

    weights = [float(w) for w in args.weights.split(",")]
    split = make_split(read_input("ratings", args.data), 0.2, 0.0, args.seed)
    truth = TopN.from_ratings(split.test, THRESHOLD)
    rows: list[dict] = []
    costs: dict[str, dict[str, float]] = {}
    print(f"{'kind':<5} {'MMR over':<8} {'diversity':>9} {'NDCG@10':>8} {'genre ILD@10':>12} {'changed':>8}")
    for kind in args.kinds.split(","):
        started = time.perf_counter()
        artifact = configure(kind, {"random_state": args.seed}).fit(split.fit).to_artifact()
        latent = build_index(artifact)
        attach_item_attributes(artifact, args.item_attributes)
        index = build_index(artifact)
        fitted = time.perf_counter() - started
        cost = {
            "rerank_us_genres": rerank_micros(index, truth.users, COST_WEIGHT),
            "rerank_us_latent": rerank_micros(latent, truth.users, COST_WEIGHT),
        }
        costs[kind] = cost
        for ranker in (index, latent) if args.compare else (index,):
            for row in tradeoff_rows(index, ranker, truth, split.fit, kind, weights):
                rows.append(dict(row, fit_seconds=fitted, **cost))
                print(
                    f"{kind:<5} {row['similarity']:<8} {row['diversity']:>9.1f} {row['ndcg@10']:>8.4f}"
                    f" {row['genre_ild@10']:>12.4f} {row['changed@10']:>8.1f}"
                )
    print(f"({truth.users.size} users with a held-out rating >= {THRESHOLD:g}, seed {args.seed})")
    for kind, cost in costs.items():
        print(
            f"{kind}: rerank at {COST_WEIGHT} (pool {POOL_FACTOR * N}), median CPU per call:"
            f" {cost['rerank_us_genres']:.0f} us over the genres,"
            f" {cost['rerank_us_latent']:.0f} us over the model's similarity"
        )
    if args.json:
        with open(args.json, "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
