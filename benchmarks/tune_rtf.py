"""Validation-only tuning of RTF on a split of the *training* posts.

Reproduces the tuning protocol of ``docs/rtf.md``: the protocol's seed-``S``
split (one test post per user) is made exactly as ``ordrec-train reproduce rtf``
makes it, the test posts are thrown away, and one more post per user is carved
out of the training posts as the validation set. RTF is trained on the rest
(its own early stopping holds out a further ``--validation-posts`` of those)
and the validation posts are answered through the serving ``RTFIndex`` built from
the in-memory artifact, with the popularity baselines on the same posts.
The test posts are never read.

    .venv/bin/python benchmarks/tune_rtf.py --data $ORDREC_DATA/lastfm-tags/user_taggedartists.dat \
        --dims 64 --learning-rate 0.5 --lr-decay 0 --reg 1e-3 --iterations 60 --patience 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.models.pipeline import configure
from ordrec.trainer.models.rtf import RTF
from ordrec.trainer.reproduce.rtf import (
    BASELINES,
    MAX_N,
    HeldOutPosts,
    evaluate_baseline,
    evaluate_rtf,
    leave_one_post_out,
    p_core,
    validation_carve,
)


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
    ap.add_argument("--min-iterations", type=int, default=10)
    ap.add_argument(
        "--smoothing", type=int, default=1, help="stop on the moving average of this many validation AUCs"
    )
    ap.add_argument("--init-std", type=float, default=0.1)
    ap.add_argument(
        "--lr-drops", type=int, default=0, help="plateau learning-rate drops before stopping (RTF lr_drops)"
    )
    ap.add_argument("--lr-drop-factor", type=float, default=0.5)
    ap.add_argument(
        "--keep-within",
        type=float,
        default=None,
        help="keep the latest pass whose smoothed validation AUC is within this of the best",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="record the per-pass curve like --curve, but keep the early-stopping rule",
    )
    ap.add_argument(
        "--curve",
        action="store_true",
        help="no early stop: run --iterations passes and record, after every pass, the "
        "F1@1..10 and AUC of the tuning posts (for comparing stopping rules offline)",
    )
    ap.add_argument(
        "--mix-weights",
        default="",
        help="comma-separated item weights of pop-mix to score on the tuning posts",
    )
    ap.add_argument("--baselines", action="store_true", help="also print the popularity baselines")
    ap.add_argument("--json", help="append one JSON line with the settings and validation metrics")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    core = p_core(read_input("tags", args.data, args.format), args.core)
    train, _test = leave_one_post_out(core, np.random.default_rng(args.seed))  # test posts: discarded
    train, fit_part, val = validation_carve(train, args.seed)

    flat = dict(
        n_components=args.dims,
        learning_rate=args.learning_rate,
        learning_rate_decay=args.lr_decay,
        reg=args.reg,
        reg_core=args.reg_core,
        reg_tags=args.reg_tags,
        max_iter=args.iterations,
        patience=args.iterations if args.curve else args.patience,
        validation_posts=args.validation_posts,
        min_iter=args.min_iterations,
        smoothing=args.smoothing,
        init_std=args.init_std,
        learning_rate_drops=args.lr_drops,
        learning_rate_drop_factor=args.lr_drop_factor,
        keep_within=args.keep_within,
        random_state=args.seed,
        verbose=not args.quiet,
    )
    est = configure("rtf", flat).estimator  # RTF and its early stopping, as a job builds them
    curve: list[dict] = []
    started = time.perf_counter()
    est.fit(fit_part, on_epoch=_curve_recorder(train, val, curve) if args.curve or args.trace else None)
    seconds = time.perf_counter() - started
    index = RTFIndex.from_artifact(est.to_artifact())
    posts = HeldOutPosts(train, val, index)
    results = {f"RTF-{args.dims}": evaluate_rtf(index, posts)}
    if args.baselines:
        for kind in BASELINES:
            results[kind] = evaluate_baseline(index, posts, kind)
    for w in [float(x) for x in args.mix_weights.split(",") if x.strip()]:
        results[f"pop-mix-{w:g}"] = evaluate_baseline(index, posts, "pop-mix", mix_weight=w)
    setting = {
        k: getattr(args, k)
        for k in (
            "dims",
            "learning_rate",
            "lr_decay",
            "reg",
            "reg_core",
            "reg_tags",
            "iterations",
            "patience",
            "seed",
            "smoothing",
            "validation_posts",
            "min_iterations",
            "init_std",
            "lr_drops",
            "lr_drop_factor",
            "keep_within",
        )
    }
    print(json.dumps(setting), f"passes {est.epochs_run_} (best {est.best_epoch_}), {seconds:.0f}s")
    print("method".ljust(12) + "".join(f"F1@{n:<5}" for n in range(1, MAX_N + 1)) + "AUC")
    for method, m in results.items():
        cells = "".join(f"{m[f'f1@{n}']:<8.4f}" for n in range(1, MAX_N + 1))
        print(method.ljust(12) + cells + (f"{m['auc']:.4f}" if "auc" in m else "-"))
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "setting": setting,
                        "passes": est.epochs_run_,
                        "best": est.best_epoch_,
                        "seconds": seconds,
                        "history": est.history_,
                        "results": results,
                        "curve": curve,
                    }
                )
                + "\n"
            )


def _curve_recorder(train, val, curve: list[dict]):
    """An ``on_epoch`` hook: F1@1..10 and AUC of the tuning posts after every pass.

    Uses the serving code's ``score_posts`` and ``top_k`` on the live
    parameters (what ``RTFIndex.tags`` does, without building an index per pass);
    tuning posts whose user or item the fit part lacks are left out here (the
    final table above includes them through the index's fallbacks).
    """
    from ordrec.service.indices.models.rtf import score_posts
    from ordrec.service.indices.topk import top_k
    from ordrec.trainer.evaluation.metrics import list_metrics

    post_user, post_item, indptr, tags = val
    state: dict = {}

    def hook(epoch: int, est: RTF, record: dict) -> None:
        if not state:
            u = est.users_.rows(train.users.externals(post_user))
            i = est.items_.rows(train.items.externals(post_item))
            known = np.flatnonzero((u >= 0) & (i >= 0))
            truth = []
            for p in known:
                rows = est.tags_.rows(train.tags.externals(tags[indptr[p] : indptr[p + 1]]))
                truth.append(np.where(rows >= 0, rows, -1 - np.arange(rows.size)))
            t_indptr = np.zeros(known.size + 1, dtype=np.int64)
            t_indptr[1:] = np.cumsum([(t >= 0).sum() for t in truth])
            state.update(
                u=u[known],
                i=i[known],
                truth=truth,
                t_indptr=t_indptr,
                t_pos=np.concatenate([t[t >= 0] for t in truth]),
            )
        scores = score_posts(
            est.core_, est.user_factors_[state["u"]], est.item_factors_[state["i"]], est.tag_factors_
        )
        lists = [top_k(row, MAX_N)[0] for row in scores]
        metrics = list_metrics(lists, state["truth"])
        auc = float(np.nanmean(RTF.posts_auc(scores, state["t_indptr"], state["t_pos"])))
        curve.append(
            {
                "epoch": epoch,
                "val_auc": record.get("val_auc"),
                "tune_auc": auc,
                "lr": record.get("lr"),
                **{f"f1@{n}": metrics[f"f1@{n}"] for n in range(1, MAX_N + 1)},
            }
        )

    return hook


if __name__ == "__main__":
    sys.exit(main())
