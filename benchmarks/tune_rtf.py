"""Validation-only tuning of RTF on a split of the *training* posts.

Reproduces the tuning protocol of ``docs/rtf.md``: the protocol's seed-``S``
split (one test post per user) is made exactly as ``ordrec-train reproduce rtf``
makes it, the test posts are thrown away, and one more post per user is carved
out of the training posts as the validation set. RTF is trained on the rest
(its own early stopping holds out a further ``--validation-posts`` of those)
and the validation posts are answered through the serving ``Index`` built from
the in-memory artifact, with the popularity baselines on the same posts.
The test posts are never read.

    .venv/bin/python benchmarks/tune_rtf.py --data /work/shared/data/lastfm-tags/user_taggedartists.dat \
        --dims 64 --learning-rate 0.5 --lr-decay 0 --reg 1e-3 --iterations 60 --patience 10
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from service.models.rtf import Index
from trainer.data.readers import read_input
from trainer.evaluation.rtf import (BASELINES, MAX_N, _TestSet, evaluate_baseline, evaluate_rtf,
                                    leave_one_post_out, p_core)
from trainer.models.rtf import RTF

VALIDATION_SEED_OFFSET = 10_000  # the validation carve uses its own stream, not the test split's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--format", default="auto")
    ap.add_argument("--core", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="the protocol split whose training posts are used")
    ap.add_argument("--dims", type=int, default=64)
    ap.add_argument("--learning-rate", type=float, default=1.0)
    ap.add_argument("--lr-decay", type=float, default=0.0)
    ap.add_argument("--reg", type=float, default=1e-3)
    ap.add_argument("--reg-core", type=float, default=0.0)
    ap.add_argument("--reg-tags", type=float, default=0.0)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--patience", type=int, default=10)
    ap.add_argument("--validation-posts", type=int, default=500)
    ap.add_argument("--baselines", action="store_true", help="also print the popularity baselines")
    ap.add_argument("--json", help="append one JSON line with the settings and validation metrics")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    core = p_core(read_input("tags", args.data, args.format), args.core)
    train, _test = leave_one_post_out(core, np.random.default_rng(args.seed))  # test posts: discarded
    fit_part, val = leave_one_post_out(train.compact(), np.random.default_rng(args.seed + VALIDATION_SEED_OFFSET))
    train = train.compact()

    est = RTF(dims=args.dims, learning_rate=args.learning_rate, lr_decay=args.lr_decay, reg=args.reg,
              reg_core=args.reg_core, reg_tags=args.reg_tags, iterations=args.iterations,
              patience=args.patience, validation_posts=args.validation_posts, seed=args.seed,
              verbose=not args.quiet)
    started = time.perf_counter()
    est.fit(fit_part)
    seconds = time.perf_counter() - started
    index = Index.from_artifact(est.to_artifact())
    posts = _TestSet(train, val, index)
    results = {f"RTF-{args.dims}": evaluate_rtf(index, posts)}
    if args.baselines:
        for kind in BASELINES:
            results[kind] = evaluate_baseline(index, posts, kind)
    setting = {k: getattr(args, k) for k in ("dims", "learning_rate", "lr_decay", "reg", "reg_core",
                                             "reg_tags", "iterations", "patience", "seed")}
    print(json.dumps(setting), f"passes {est.epochs_run_} (best {est.best_epoch_}), {seconds:.0f}s")
    print("method".ljust(12) + "".join(f"F1@{n:<5}" for n in range(1, MAX_N + 1)) + "AUC")
    for method, m in results.items():
        cells = "".join(f"{m[f'f1@{n}']:<8.4f}" for n in range(1, MAX_N + 1))
        print(method.ljust(12) + cells + (f"{m['auc']:.4f}" if "auc" in m else "-"))
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps({"setting": setting, "passes": est.epochs_run_, "best": est.best_epoch_,
                                 "seconds": seconds, "history": est.history_, "results": results}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
