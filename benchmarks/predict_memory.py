"""The memory the check before a fit predicts (DCR, COE), beside what fits measure.

    python benchmarks/predict_memory.py            # the rows docs/dcr.md measured at 10^8
    python benchmarks/predict_memory.py --measure  # small shapes, predicted and measured

Without ``--measure``: the prediction for the rows of docs/dcr.md "Memory at scale", per
phase, in bytes a rating, to set beside each row's peak less its ratings and id maps (what
the process held before the fit). No data is generated: the predictor reads only the shape,
and the five rating values are given as ``levels``.

``--measure``: each shape of :data:`MEASURED` fitted (two epochs, :data:`SHORT`) and its artifact written
in a fresh process on generated ratings (uniform users, items and ratings 1..5): the
prediction and the peak resident memory above the start of the fit (VmHWM, reset just
before it). ``--child SPEC`` is one such process (tests/test_fit_memory.py runs it too);
with ``cap`` in the spec it fits under an RLIMIT_AS of exactly the address space mapped
at the start plus the prediction.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

from ordrec.service.storage.idmap import numbered_ids
from ordrec.trainer.data.types import Ratings
from ordrec.trainer.models.dcr_memory import predicted_memory
from ordrec.trainer.models.memory import predict_fit_memory
from ordrec.trainer.models.pipeline import configure

SHAPES = {"netflix": (480_000, 17_770), "shop": (10_000_000, 1_000_000)}
# The measured rows: shape, ratings, what was fitted (flat settings), as mem_dcr's models.
ROWS = [
    ("netflix", 10**8, "inplace", {"pairwise": True, "pairwise_validation": False}),
    ("netflix", 10**8, "pairwise (validated, 1 fold)", {"pairwise": True, "validation_folds": 1}),
    ("shop", 10**8, "dcr", {}),
    ("shop", 10**8, "inplace", {"pairwise": True, "pairwise_validation": False}),
    (
        "shop",
        10**8,
        "pairwise (validated, 1 fold, 10,000 scored users)",
        {"pairwise": True, "validation_folds": 1, "pairwise_validation_max_users": 10_000},
    ),
]


@dataclass
class Shape:
    """The sizes a predictor reads from a data set, without its arrays."""

    n_users: int
    n_items: int
    n_ratings: int

    def __len__(self) -> int:
        return self.n_ratings


# kind, users, items, ratings, flat settings.
MEASURED = [
    ("dcr", 20_000, 2_000, 200_000, {}),
    ("dcr", 100_000, 5_000, 200_000, {"n_components": 60}),
    ("dcr", 200_000, 10_000, 2_000_000, {}),
    ("dcr", 200_000, 10_000, 2_000_000, {"unrated_share": 0, "init": "marginal"}),
    ("dcr", 100_000, 5_000, 1_000_000, {"n_components": 8, "levels": list(range(1, 101))}),
    ("dcr", 50_000, 3_000, 300_000, {"early_stopping": True, "validation_folds": 1}),
    (
        "dcr",
        50_000,
        3_000,
        300_000,
        {"pairwise": True, "validation_folds": 1, "pairwise_validation_max_users": 2000},
    ),
    ("coe", 100_000, 10_000, 2_000_000, {}),
    ("coe", 300_000, 20_000, 300_000, {"n_components": 128}),
]
# Each kind's settings for a short fit: two epochs (COE: of 10,000 steps).
SHORT = {"dcr": {"max_iter": 2}, "coe": {"max_iter": 2, "steps_per_epoch": 10_000}}


def _status(key: str) -> int:
    return next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith(key + ":"))


def child(spec: str) -> None:
    """One fit of ``[kind, users, items, ratings, settings, cap]`` in this process; prints the
    prediction and the measured peak (bytes) as JSON."""
    kind, users, items, n, params, cap = json.loads(spec)
    rng = np.random.default_rng(0)
    data = Ratings(
        numbered_ids(users),
        numbered_ids(items),
        rng.integers(0, users, n, dtype=np.int32),
        rng.integers(0, items, n, dtype=np.int32),
        rng.integers(1, 6, n).astype(np.float32),
    )
    configured = configure(kind, dict(params, **SHORT[kind]))
    prediction = predict_fit_memory(kind, configured.estimator, data)
    assert prediction is not None, f"{kind} registers no memory prediction"
    if cap:
        limit = _status("VmSize") + prediction.peak + prediction.reserved
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM starts again from VmRSS
    start = _status("VmRSS")
    configured.fit(data, check_memory=not cap)
    configured.to_artifact()
    print(json.dumps({"predicted": prediction.peak, "actual": _status("VmHWM") - start}))


def measure() -> None:
    print("| kind | users x items | ratings | settings | predicted MB | measured MB | ratio |")
    print("|---|---|---:|---|---:|---:|---:|")
    for kind, users, items, n, params in MEASURED:
        spec = json.dumps([kind, users, items, n, params, False])
        done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True)
        row = json.loads(done.stdout)
        shown = json.dumps(params) if "levels" not in params else '{"n_components": 8, "levels": 1..100}'
        print(
            f"| {kind} | {users:,} x {items:,} | {n:,} | {shown} | {row['predicted'] / 1e6:.1f}"
            f" | {row['actual'] / 1e6:.1f} | {row['predicted'] / row['actual']:.2f} |",
            flush=True,
        )


def at_scale() -> None:
    print("| shape | model | ratings | phase | predicted B/rating | factors B/rating |")
    print("|---|---|---:|---|---:|---:|")
    for shape, n, name, params in ROWS:
        users, items = SHAPES[shape]
        estimator = configure("dcr", dict(params, levels=[1, 2, 3, 4, 5])).estimator
        prediction = predicted_memory(estimator, Shape(users, items, n))
        factors = prediction.parts["the factors"] / n
        for phase, size in prediction.phases.items():
            print(f"| {shape} | {name} | {n:.0e} | {phase} | {size / n:.1f} | {factors:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true", help="fit the small shapes and measure them")
    parser.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
    elif args.measure:
        measure()
    else:
        at_scale()


if __name__ == "__main__":
    main()
