"""Fresh items on planted data: how many held-out interactions with new items Recommend catches,
with and without the overlay, and what the overlay costs.

The planted data (``tests/fresh_planted.py``): 3 groups x 100 users, each group liking its own
block of 50 items; the last 10 items of every block are withheld from training (30 fresh
items). Half of the known users' interactions with them are recorded after training, the
other half held out. Trains DCR (the default, top-N-aware estimator) and COE, publishes them to
a throwaway registry and calls the in-process Recommend handler (no gRPC), the users' recorded
items excluded:

- caught@10 / caught@20: the share of liked (4-5) held-out interactions with fresh items whose
  item is in the user's top n; without the overlay, with it, and with the overlay's factors
  shuffled among the fresh items (the fold-in's part, not just the merge's);
- p50 of a plain call with no fresh-items reader, with a reader that has no fresh items (the
  cost for a version with none), and with the 30 fresh items.

    python benchmarks/bench_fresh.py [--calls 3000]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from bench_handler import Context  # noqa: E402  (run as a script: benchmarks/ is on the path)

from ordrec.service.config import Limits  # noqa: E402
from ordrec.service.live.fresh import FreshEvidence, FreshItems, FreshOverlay  # noqa: E402
from ordrec.service.live.seen import SeenStore  # noqa: E402
from ordrec.service.metrics import Metrics  # noqa: E402
from ordrec.service.serving.servicer import RecommenderServicer  # noqa: E402
from ordrec.service.serving.store import ModelStore  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.trainer.models.coe import COE  # noqa: E402
from ordrec.trainer.models.dcr import DCR  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402
from tests.fresh_planted import PlantedFresh, caught, planted_fresh, stream_entries  # noqa: E402


class ShuffledFresh(FreshItems):
    """The control: the same fresh items with their folded factors permuted among them."""

    def overlay(self, index) -> FreshOverlay | None:
        found = super().overlay(index)
        if found is None:
            return None
        order = np.random.default_rng(0).permutation(len(found))
        return FreshOverlay(found.ids, found.factors[order], found.base, found.attributes)


def handler(store: ModelStore, fresh: FreshItems | None) -> RecommenderServicer:
    return RecommenderServicer(store, Metrics(), Limits(), SeenStore(), fresh=fresh)


def evidence_of(planted: PlantedFresh | None) -> FreshEvidence:
    evidence = FreshEvidence(None, known=lambda item: False)
    if planted is not None:
        evidence.add_entries(stream_entries(planted.recorded))
    return evidence


def top_n(servicer: RecommenderServicer, model: str, planted: PlantedFresh):
    """``recommend(user, n)`` for :func:`caught`: item ids, the user's recorded items excluded."""

    def top(user: str, n: int) -> list[str]:
        request = pb.RecommendRequest(
            model=model, user_ids=[user], n=n, exclude_item_ids=planted.recorded_by(user)
        )
        return [i.id for i in servicer.Recommend(request, Context()).results[0].items]

    return top


def catch_table(store: ModelStore, planted: PlantedFresh) -> None:
    settings = {
        "without the overlay": None,
        "with the overlay": FreshItems(evidence_of(planted)),
        "overlay, factors shuffled": ShuffledFresh(evidence_of(planted)),
    }
    print(
        f"{len(planted.liked_held_out())} liked held-out interactions with {len(planted.fresh_ids)} fresh items"
    )
    print(f"{'model':<6} {'setting':<28} {'caught@10':>10} {'caught@20':>10}")
    for model in ("dcr", "coe"):
        for label, fresh in settings.items():
            top = top_n(handler(store, fresh), model, planted)
            print(
                f"{model:<6} {label:<28} {caught(planted, top, 10):>10.3f} {caught(planted, top, 20):>10.3f}"
            )


def cost_table(store: ModelStore, planted: PlantedFresh, calls: int) -> None:
    users = [f"u{u}" for u in range(300)]
    settings = {
        "no fresh-items reader": None,
        "reader, no fresh items": FreshItems(evidence_of(None)),
        "30 fresh items": FreshItems(evidence_of(planted)),
    }
    print(f"\nRecommend p50, DCR, n = 10, one user per call, {calls} calls (in-process handler)")
    print(f"{'setting':<26} {'p50 us':>8} {'vs none':>8}")
    base = None
    for label, fresh in settings.items():
        servicer = handler(store, fresh)
        requests = [pb.RecommendRequest(model="dcr", user_ids=[users[i % 300]], n=10) for i in range(calls)]
        for request in requests[:200]:
            servicer.Recommend(request, Context())
        times = []
        for request in requests:
            start = time.perf_counter()
            servicer.Recommend(request, Context())
            times.append(time.perf_counter() - start)
        p50 = sorted(times)[len(times) // 2] * 1e6
        base = base or p50
        print(f"{label:<26} {p50:>8.0f} {100 * (p50 / base - 1):>+7.1f}%")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    planted = planted_fresh(seed=0)
    with tempfile.TemporaryDirectory() as folder:
        registry = Registry(folder)
        registry.publish(
            "dcr", DCR(n_components=8, max_iter=30, random_state=0).fit(planted.training).to_artifact()
        )
        registry.publish("coe", COE(random_state=0).fit(planted.training).to_artifact())
        store = ModelStore(registry, Metrics())
        store.refresh()
        catch_table(store, planted)
        cost_table(store, planted, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
