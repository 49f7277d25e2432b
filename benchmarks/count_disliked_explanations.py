"""How often an explanation names an item the user disliked (rated ``--at-most`` or less), on
real ratings: the whole history (``explained`` over every training item, the rule before
explanations were restricted to liked items) against the server's answer (liked items only).

    python benchmarks/count_disliked_explanations.py --registry REGISTRY --ratings u.data \\
        [--models dcr coe] [--users 120] [--n 5]

REGISTRY holds versions trained on the same ratings file (tab-separated user, item, rating, time).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from bench_handler import Context  # run as a script: benchmarks/ is on the path

from ordrec.service.indices.explain import explained
from ordrec.service.live.seen import SeenStore
from ordrec.service.metrics import Metrics
from ordrec.service.serving.servicer import RecommenderServicer
from ordrec.service.serving.store import ModelStore
from ordrec.service.serving.validation import Limits
from ordrec.service.storage.registry import Registry
from ordrec.v1 import recommender_pb2 as pb


def read_ratings(path: str) -> dict[str, dict[str, float]]:
    rated: dict[str, dict[str, float]] = defaultdict(dict)
    with open(path) as lines:
        for line in lines:
            user, item, rating = line.split("\t")[:3]
            rated[user][item] = float(rating)
    return rated


def count(handler, index, model: str, rated, users: list[str], n: int, at_most: float) -> str:
    """One model's line: explanations, and how many name a disliked item under each rule."""
    whole = liked = total = 0
    for user in users:
        request = pb.RecommendRequest(model=model, user_ids=[user], n=n, explain=1)
        items = handler.Recommend(request, Context()).results[0].items
        rows = index.items.rows([item.id for item in items])
        before = explained(index, rows, index.seen(index.users.row(user)), 1).rows[:, 0].tolist()
        total += len(items)
        whole += sum(row >= 0 and rated[user][index.items.external(row)] <= at_most for row in before)
        liked += sum(rated[user][why.id] <= at_most for item in items for why in item.explanations)
    disliked = f"naming an item rated <= {at_most:g}"
    return f"{model}: {total} explanations; {disliked}: whole history {whole}, liked only {liked}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--registry", required=True)
    p.add_argument("--ratings", required=True)
    p.add_argument("--models", nargs="+", default=["dcr", "coe"])
    p.add_argument("--users", type=int, default=120, help="the first users by id")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--at-most", type=float, default=2.0)
    args = p.parse_args()
    rated = read_ratings(args.ratings)
    metrics = Metrics()
    store = ModelStore(Registry(args.registry), metrics)
    store.refresh(args.models)
    handler = RecommenderServicer(store, metrics, Limits(), SeenStore())
    users = sorted(rated, key=lambda u: (len(u), u))[: args.users]
    for model in args.models:
        index = store.snapshot()[model].index
        print(count(handler, index, model, rated, users, args.n, args.at_most))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
