"""Write the training part of a ``reproduce topn`` split, to choose settings on it without the test part.

    .venv/bin/python benchmarks/training_part.py DATA OUT [--format tsv] [--feedback implicit]
        [--seed 0] [--split random|time] [--test-fraction 0.2]

The rows ``ordrec-train reproduce topn --seed S --split SPLIT`` trains on, as ``user item
[rating|strength] [timestamp]`` tab-separated lines under a header: running ``reproduce topn`` on
OUT with another seed then scores settings on a validation part carved from them (docs/dcr.md,
"Epochs on interaction logs").
"""

from __future__ import annotations

import argparse

import numpy as np

from ordrec.trainer.data.readers import read_input
from ordrec.trainer.data.splits import split_ratings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--format", default="auto")
    p.add_argument("--feedback", default="auto", choices=("auto", "explicit", "implicit"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="random", choices=("random", "time"))
    p.add_argument("--test-fraction", type=float, default=0.2)
    args = p.parse_args()
    data = read_input("ratings", args.data, args.format, feedback=args.feedback)
    train, _ = split_ratings(data, args.test_fraction, args.seed, args.split)
    columns = [np.asarray(data.users.ids)[train.user], np.asarray(data.items.ids)[train.item]]
    header = ["user", "item"]
    if not data.implicit or len(np.unique(train.rating)) > 1:  # a strength worth keeping
        columns.append(train.rating)
        header.append("strength" if data.implicit else "rating")
    if train.time is not None:
        columns.append(train.time)
        header.append("timestamp")
    with open(args.out, "w", encoding="utf-8") as out:
        out.write("\t".join(header) + "\n")
        for row in zip(*columns):
            out.write("\t".join(map(str, row)) + "\n")
    print(f"{args.out}: {len(train.user)} rows of {len(data.user)} ({args.split} split, seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
