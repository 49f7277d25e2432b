"""RTF (Rendle et al., KDD 2009): p-core, leave-one-post-out, F1@1..10 and AUC vs popularity baselines.

Protocol (paper Section 5, ``docs/algorithms.md`` section 2):

1. p-core of the tag assignments by iterated pruning: drop every user, item
   and tag in fewer than ``p`` posts, repeat until nothing changes.
2. Per run, leave-one-post-out: for every user one random post (all of its
   tags) goes to the test set; the rest is the training set.
3. Fit RTF at each of ``--n-components``; publish nothing, but build the serving
   index from the in-memory artifact and ask it ``tags(user, item, 10)`` for
   every test post, so the figures are those of the code that answers Tags.
   AUC comes from the same index's batched scores.
4. Precision and recall of the top-N list (N = 1..10) averaged over test
   posts; F1 is that of the two averages (paper Section 5.2). AUC per test
   post, averaged.
5. Baselines in the same harness, through the same index's popularity
   arrays: most popular tags overall (``pop-global``), of the item
   (``pop-item``), of the user (``pop-user``) and their mix (``pop-mix``:
   mean of the item's and user's tag shares). ``npmax`` (tags by how many
   *test* posts of the item carry them) peeks at the test set and is a
   reference line only, never a practical baseline. ``pop-mix-val`` is
   ``pop-mix`` with the item/user weight chosen per run on validation posts
   carved from the training posts (``choose_mix_weight``), the way RTF's
   settings were chosen; ``pop-mix`` keeps the plain mean (weight 0.5).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import NamedTuple

import numpy as np

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.indices.topk import top_k
from ordrec.trainer.data.types import TagAssignments
from ordrec.trainer.evaluation.metrics import list_metrics
from ordrec.trainer.models.pipeline import configure, flat_constraints, wrapper
from ordrec.trainer.models.rtf import RTF, group_posts
from ordrec.trainer.models.rtf_selection import (
    DEFAULT_GRID,
    MAX_N,
    MIX_GRID,
    HeldOutPosts,
    RTFGridSearch,
    best_mix_weight,
    kept_pass,
    leave_one_post_out,
    popularity_lists,
    served_lists,
    validation_carve,
)
from ordrec.trainer.models.rtf_stopping import EarlyStoppedRTF
from ordrec.trainer.reproduce.params import add_param_flags, given_params
from ordrec.trainer.reproduce.report import PaperFigure, Row, print_table, summarise

DEFAULT_RUNS = 3
DATA_REQUIRED = True
BASELINES = ("pop-global", "pop-item", "pop-user", "pop-mix")
# pop-mix with its item weight chosen per run on validation posts carved from
# the training posts (never the test posts), like RTF's own settings
TUNED_MIX = "pop-mix-val"
# RTF with its dims and reg chosen per run on validation posts (RTFGridSearch)
VALIDATED = "RTF-val"
# Per-dims settings applied before any --per-dims (which override them): the
# tag-factor L2 for RTF-64 was chosen on tuning posts carved from the training
# posts (docs/rtf.md, "Model and training"); smaller dims keep the shared settings.
DEFAULT_PER_DIMS = ("64:reg_tags=3e-6",)

# Paper figures (Section 5, Fig. 8, text): AUC on Last.fm 10-core. The F1
# curves of Fig. 7 are plots without printed values, so none are listed.
PAPER_AUC = {8: 0.993, 64: 0.995}


# RTF's flat settings (its own and its early stopping's) the protocol takes as flags of the same
# names (--learning-rate, --max-iter, ...); n_components is --n-components, a list (one fit per value).
PARAM_FLAGS = (
    "learning_rate",
    "learning_rate_decay",
    "reg",
    "reg_core",
    "reg_tags",
    "max_iter",
    "init_std",
    "validation_posts",
    "patience",
    "min_iter",
    "smoothing",
    "learning_rate_drops",
    "learning_rate_drop_factor",
)
# The protocol's own settings where they differ from RTF's defaults (docs/rtf.md): fewer passes than
# RTF's 100, the smoothed criterion and the latest pass of the plateau (chosen on tuning curves of
# validation posts), and patience that gives keep_within room to find the end of the plateau.
PROTOCOL_PARAMS = {"max_iter": 80, "smoothing": 8, "patience": 20, "keep_within": 1e-4}
PARAM_HELP = {
    "max_iter": "maximum passes over the posts (paper: 600; early stop on validation AUC; protocol: 80)",
    "reg": "gamma, L2 on U and I (paper: 1e-6 on U, I, T)",
    "reg_core": "gamma_C, L2 on the core (paper: 1e-6)",
    "reg_tags": "gamma_T, L2 on the tag factors (paper: the same as gamma)",
    "validation_posts": "training posts held out for early stopping (0: none)",
    "smoothing": "early stop on the moving average of this many validation AUCs (protocol: 8)",
    "patience": "passes without validation-AUC gain before stopping (protocol: 20)",
    "learning_rate_decay": "pass e uses learning_rate / (1 + learning_rate_decay (e - 1))",
    "learning_rate_drops": "plateau learning-rate drops before the early stop",
}


def _keep_within_flag(text: str) -> float | None:
    """``--keep-within``: a number >= 0, or ``none`` for RTF's default rule (the pass of the last gain)."""
    if text.strip().lower() == "none":
        return None
    value = float(text)
    if not np.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or none, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--core", type=int, default=10, help="p of the p-core (paper: 10 on Last.fm)")
    parser.add_argument(
        "--n-components", default="8,16,32,64", help="comma-separated RTF dims, one fit each ('' for none)"
    )
    add_param_flags(parser, flat_constraints("rtf"), PARAM_FLAGS, PARAM_HELP)
    parser.add_argument(
        "--keep-within",
        type=_keep_within_flag,
        default=PROTOCOL_PARAMS["keep_within"],
        help="keep the latest pass whose smoothed validation AUC is within this of its best "
        "(1e-4, chosen on tuning curves, docs/rtf.md; none: the pass of the last val_tol gain)",
    )
    parser.add_argument(
        "--per-dims",
        action="append",
        default=[],
        metavar="DIMS:KEY=VALUE,...",
        help="override settings for one dims, e.g. 64:reg_core=1e-6,learning_rate=0.25 "
        "(repeatable; keys are RTF hyperparameters; applied after the built-in "
        f"{', '.join(DEFAULT_PER_DIMS)})",
    )
    parser.add_argument(
        "--compare-first-pass",
        action="store_true",
        help="with --keep-within, also report each RTF at the pass the default rule "
        "keeps (method 'RTF-<dims>/first'): same training run, paired comparison",
    )
    parser.add_argument(
        "--grid-search",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"also report {VALIDATED}: RTFGridSearch, dims and reg chosen per run on "
        "validation posts carved from the training posts, pop-mix served where no candidate "
        "clearly beats it",
    )
    parser.add_argument(
        "--grid-n-components",
        default=",".join(str(d) for d in DEFAULT_GRID["n_components"]),
        help=f"{VALIDATED}'s candidate n_components",
    )
    parser.add_argument(
        "--grid-reg",
        default=",".join(f"{r:g}" for r in DEFAULT_GRID["reg"]),
        help=f"{VALIDATED}'s candidate reg (L2 on U and I)",
    )


def parse_per_dims(specs: list[str]) -> dict[int, dict[str, float]]:
    """``["64:reg_core=1e-6,learning_rate=0.25"]`` -> ``{64: {"reg_core": 1e-6, "learning_rate": 0.25}}``
    (keys: RTF's flat settings, its early-stopping fields included)."""
    defaults = dict(RTF().get_params(), **wrapper("rtf", "early_stopping").recorded({}))
    allowed = set(defaults) - {"n_components", "random_state", "verbose", "dtype"}
    out: dict[int, dict[str, float]] = {}
    for spec in specs:
        dims, _, pairs = spec.partition(":")
        settings = out.setdefault(int(dims), {})
        for pair in filter(None, pairs.split(",")):
            key, _, value = pair.partition("=")
            if key not in allowed:
                raise ValueError(f"--per-dims: unknown RTF setting {key!r} (known: {sorted(allowed)})")
            number = float(value)
            # counts (their defaults are ints) stay ints; every other setting is a float
            settings[key] = int(number) if type(defaults[key]) is int else number
    return out


# --------------------------------------------------------------- data prep
def p_core(data: TagAssignments, p: int) -> TagAssignments:
    """The largest subset in which every user, item and tag occurs in at least
    ``p`` posts, by iterated pruning (a tag's posts are its distinct (user, item)
    pairs; duplicate triples count once)."""
    post_user, post_item, indptr, tags = group_posts(data.user, data.item, data.tag)
    per_post = np.diff(indptr)
    user = np.repeat(post_user, per_post).astype(np.int64)
    item = np.repeat(post_item, per_post).astype(np.int64)
    tag = tags.astype(np.int64)
    post = np.repeat(np.arange(post_user.size), per_post)
    keep = np.ones(tag.size, dtype=bool)
    while True:
        alive_posts = np.unique(post[keep])
        bad = np.zeros(tag.size, dtype=bool)
        for column, owner in ((post_user, user), (post_item, item)):
            counts = np.bincount(column[alive_posts], minlength=int(owner.max(initial=-1)) + 1)
            bad |= counts[owner] < p
        tag_counts = np.bincount(tag[keep], minlength=int(tag.max(initial=-1)) + 1)
        bad |= tag_counts[tag] < p
        bad &= keep
        if not bad.any():
            break
        keep &= ~bad
    core = TagAssignments(
        data.users,
        data.items,
        data.tags,
        user[keep].astype(np.int32),
        item[keep].astype(np.int32),
        tag[keep].astype(np.int32),
        data.source,
        tag_names=data.tag_names,
    )
    return core.compact()


# ---------------------------------------------------------------- metrics
def evaluate_rtf(index: RTFIndex, tests: HeldOutPosts) -> dict[str, float]:
    """Top-10 lists from ``RTFIndex.tags`` (the RPC's code) and AUC from ``RTFIndex.score_posts``."""
    out = list_metrics(served_lists(index, tests), tests.truth, MAX_N)
    known = (tests.user_rows >= 0) & (tests.item_rows >= 0)
    rows = np.flatnonzero(known)
    scores = index.score_posts(tests.user_rows[rows], tests.item_rows[rows])
    indptr = np.zeros(rows.size + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([tests.known_truth[r].size for r in rows])
    pos = np.concatenate([tests.known_truth[r] for r in rows]) if rows.size else np.empty(0, np.int64)
    out["auc"] = float(np.nanmean(RTF.posts_auc(scores, indptr, pos)))
    out["cold_posts"] = float((~known).sum())
    return out


def evaluate_first_pass(stopped: EarlyStoppedRTF, core: TagAssignments, test) -> dict[str, float]:
    """``evaluate_rtf`` at the pass the default stopping rule keeps (``stopped.first_plateau_``),
    through its own serving index; the fitted model is left as it was."""
    epoch, params = stopped.first_plateau_
    est = stopped.estimator_
    live = (est.core_, est.user_factors_, est.item_factors_, est.tag_factors_)
    est.core_, est.user_factors_, est.item_factors_, est.tag_factors_ = params
    try:
        index = RTFIndex.from_artifact(est.to_artifact())
    finally:
        est.core_, est.user_factors_, est.item_factors_, est.tag_factors_ = live
    metrics = evaluate_rtf(index, HeldOutPosts(core, test, index))
    metrics["kept_pass"] = float(epoch)
    return metrics


def evaluate_baseline(
    index: RTFIndex, tests: HeldOutPosts, kind: str, mix_weight: float = 0.5
) -> dict[str, float]:
    """Top-10 lists of a popularity baseline from the index's popularity arrays
    (``rtf_selection.popularity_lists``); ``mix_weight`` is the item's share in ``pop-mix``."""
    return list_metrics(popularity_lists(index, tests, kind, mix_weight), tests.truth, MAX_N)


def evaluate_npmax(index: RTFIndex, tests: HeldOutPosts) -> dict[str, float]:
    """npmax (paper Section 5.4.3): tag t scores |{u*: (u*, i, t) in S_test}|,
    ties by global training popularity. Peeks at the test set: reference only."""
    n_tags = len(index.tags_ids)
    lists = []
    by_item: dict[int, np.ndarray] = {}
    for item, truth in zip(tests.item_ext, tests.known_truth):
        counts = by_item.setdefault(int(item), np.zeros(n_tags, dtype=np.float32))
        counts[truth] += 1.0
    tiebreak = index.popular_scores("global")
    tiebreak = tiebreak / (tiebreak.max() + 1.0)
    for item in tests.item_ext:
        lists.append(top_k(by_item[int(item)] + tiebreak, MAX_N)[0])
    return list_metrics(lists, tests.truth, MAX_N)


def choose_mix_weight(train: TagAssignments, seed: int, grid: tuple[float, ...] = MIX_GRID) -> float:
    """The item weight of ``pop-mix`` with the best mean F1@1..10 on validation posts.

    One more post per user is carved out of the *training* posts
    (``validation_carve``, the carve ``RTFGridSearch`` makes for the
    same seed, so its fallback is this baseline); popularity is counted on the
    rest and the grid is scored on the carved posts. The test posts are never
    read. The popularity arrays come from the serving index of a one-pass,
    one-dimensional RTF fitted on the rest: only its popularity arrays are
    used, so the counting code is the one that serves.
    """
    train, fit_part, val = validation_carve(train, seed)
    est = RTF(n_components=1, max_iter=1, random_state=seed, verbose=False).fit(fit_part)
    index = RTFIndex.from_artifact(est.to_artifact())
    return best_mix_weight(index, HeldOutPosts(train, val, index), grid)


# -------------------------------------------------------------------- run
def load(args: argparse.Namespace) -> TagAssignments:
    from ordrec.trainer.data.readers import read_input

    data = read_input("tags", args.data, args.format, skip_bad_lines=args.skip_bad_lines)
    if getattr(data, "skipped_lines", 0):
        print(f"skipped {data.skipped_lines} malformed line(s) of {args.data}", file=sys.stderr)
    return data


def run(args: argparse.Namespace, data: TagAssignments | None = None) -> list[Row]:
    """Run the protocol, print the table beside the paper's figures, return the rows."""
    dims_list = [int(x) for x in str(args.n_components).split(",") if x.strip()]
    if not dims_list and not getattr(args, "grid_search", False):
        raise ValueError("nothing to fit: give --n-components or --grid-search")
    if data is None:
        data = load(args)
    core = p_core(data, int(args.core))
    if len(core) == 0:
        raise ValueError(f"the {args.core}-core of {args.data} is empty")
    dataset = f"{getattr(args, 'data', '') or data.source} {args.core}-core"
    _print_core_sizes(core, args.core)
    per_method: dict[str, dict[str, list[float]]] = {}
    for run_no in range(int(args.runs)):
        _protocol_run(args, core, run_no, dims_list, per_method)
    order = (
        [f"RTF-{d}" for d in dims_list]
        + [f"RTF-{d}/first" for d in dims_list]
        + [VALIDATED]
        + list(BASELINES)
        + [TUNED_MIX, "npmax"]
    )
    per_method = {m: per_method[m] for m in order if m in per_method}
    setting = {"core": int(args.core)}
    rows = [
        summarise(method, dataset, setting, metric, values)
        for method, metrics in per_method.items()
        for metric, values in metrics.items()
        if not (metric == "cold_posts" and not any(values))
    ]
    paper = [
        PaperFigure(f"RTF-{d}", setting, "auc", v, "Last.fm 10-core, Fig. 8 (read off the plot)")
        for d, v in PAPER_AUC.items()
        if d in dims_list
    ]
    _print_f1_grid(per_method)
    shown = [r for r in rows if r.metric == "auc" or r.metric in ("f1@1", "f1@5", "f1@10")]
    print_table(shown, paper, out=sys.stdout, title=f"RTF on {dataset}: F1 and AUC (mean over runs)")
    return rows


def _print_core_sizes(core: TagAssignments, p: int) -> None:
    n_posts = group_posts(core.user, core.item, core.tag)[0].size
    print(
        f"{p}-core: |S| {len(core):,}  |U| {len(core.users):,}  |I| {len(core.items):,}  "
        f"|T| {len(core.tags):,}  |P_S| {n_posts:,}  (paper Last.fm 10-core: |S| 219,702, |U| 2,917, "
        f"|I| 1,853, |T| 2,045, |P_S| 75,565)"
    )


def _record(per_method: dict[str, dict[str, list[float]]], method: str, metrics: dict[str, float]) -> None:
    bucket = per_method.setdefault(method, {})
    for key, value in metrics.items():
        bucket.setdefault(key, []).append(value)


def _say(args: argparse.Namespace, run_no: int, text: str) -> None:
    if not args.quiet:
        print(f"run {run_no + 1}/{args.runs} {text}", file=sys.stderr)


def _fit_settings(args: argparse.Namespace, dims: int) -> dict:
    """RTF's settings from the command line, then the per-dims overrides."""
    per_dims = parse_per_dims(list(DEFAULT_PER_DIMS) + list(getattr(args, "per_dims", []) or []))
    return dict(_shared_settings(args), **per_dims.get(dims, {}))


def _shared_settings(args: argparse.Namespace) -> dict:
    """RTF's settings for every dims: the protocol's, then those given on the command line."""
    given = given_params(args, "RTF", flat_constraints("rtf"), PARAM_FLAGS)
    return dict(
        PROTOCOL_PARAMS, keep_within=getattr(args, "keep_within", PROTOCOL_PARAMS["keep_within"]), **given
    )


def _protocol_run(
    args: argparse.Namespace, core: TagAssignments, run_no: int, dims_list: list[int], per_method: dict
) -> None:
    """One leave-one-post-out split: RTF at every dims, the validated RTF, then the baselines."""
    seed = int(args.seed) + run_no
    train, test = leave_one_post_out(core, np.random.default_rng(seed))
    split = Split(core, train, test, run_no, seed)
    for dims in dims_list:
        index, tests = _measure_rtf(args, split, dims, per_method)
    if getattr(args, "grid_search", False):
        index, tests = _measure_validated(args, split, per_method)
    # popularity arrays do not depend on the factors: any index of this split serves
    _measure_baselines(args, train, run_no, seed, index, tests, per_method)


class Split(NamedTuple):
    """One run's leave-one-post-out split of the p-core, and its seed."""

    core: TagAssignments
    train: TagAssignments
    test: tuple
    run_no: int
    seed: int


def _measure_rtf(args: argparse.Namespace, split: Split, dims: int, per_method: dict):
    """Fit RTF-dims on the split and record it (and its first pass when asked); returns its index and posts."""
    core, test, run_no = split.core, split.test, split.run_no
    settings = _fit_settings(args, dims)
    flat = dict(settings, n_components=dims, random_state=split.seed, verbose=not args.quiet)
    est = configure("rtf", flat).estimator
    index, tests, metrics, seconds = _fit_and_serve(est, split)
    _record(per_method, f"RTF-{dims}", metrics)
    if getattr(args, "compare_first_pass", False) and getattr(est, "first_plateau_", None):
        first = evaluate_first_pass(est, core, test)
        _record(per_method, f"RTF-{dims}/first", first)
        _say(
            args,
            run_no,
            f"RTF-{dims}/first: auc {first['auc']:.4f} f1@1 {first['f1@1']:.4f} "
            f"f1@10 {first['f1@10']:.4f} (pass {est.first_plateau_[0]})",
        )
    _say(
        args,
        run_no,
        f"RTF-{dims}: auc {metrics['auc']:.4f} f1@1 {metrics['f1@1']:.4f} "
        f"f1@5 {metrics['f1@5']:.4f} f1@10 {metrics['f1@10']:.4f} "
        f"({est.epochs_run_} epochs, best {est.best_epoch_}, {seconds:.0f}s)",
    )
    return index, tests


def _fit_and_serve(est: EarlyStoppedRTF | RTFGridSearch, split: Split):
    """Fit ``est`` on the split's training posts, build its serving index, score the test posts through it."""
    started = time.perf_counter()
    est.fit(split.train)
    seconds = time.perf_counter() - started
    index = RTFIndex.from_artifact(est.to_artifact())
    tests = HeldOutPosts(split.core, split.test, index)
    served = est.best_estimator_ if isinstance(est, RTFGridSearch) else est
    metrics = dict(
        evaluate_rtf(index, tests),
        train_seconds=seconds,
        epochs=float(served.epochs_run_),
        seconds_per_epoch=seconds / max(served.epochs_run_, 1),
        kept_pass=float(kept_pass(served)),
    )
    return index, tests, metrics, seconds


def _measure_validated(args: argparse.Namespace, split: Split, per_method: dict):
    """Fit RTFGridSearch on the split, record it and print its choice."""
    grid = {
        "n_components": tuple(int(x) for x in str(args.grid_n_components).split(",") if x.strip()),
        "reg": tuple(float(x) for x in str(args.grid_reg).split(",") if x.strip()),
    }
    model = configure(
        "rtf", dict(_shared_settings(args), random_state=split.seed, verbose=not args.quiet)
    ).estimator
    est = RTFGridSearch(model, grid)
    index, tests, metrics, seconds = _fit_and_serve(est, split)
    rtf_f1, mix_f1, se = est.grid_val_f1_
    chosen = est.chosen_params_
    metrics.update(
        kept=float(est.grid_kept_),
        chosen_dims=float(chosen["n_components"]),
        chosen_reg=float(chosen["reg"]),
        mix_weight=float(est.mix_weight_),
    )
    _record(per_method, VALIDATED, metrics)
    candidates = ", ".join(f"{c['n_components']}/{c['reg']:g}: {c['val_f1']:.4f}" for c in est.grid_scores_)
    verdict = (
        f"serves RTF-{chosen['n_components']} reg {chosen['reg']:g}"
        if est.grid_kept_
        else f"falls back to pop-mix at item weight {est.mix_weight_:g} "
        f"(best RTF-{chosen['n_components']} reg {chosen['reg']:g} not clearly better)"
    )
    # printed even with --quiet: the choice is part of the result
    print(
        f"run {split.run_no + 1}/{args.runs} {VALIDATED}: {verdict}; validation F1@1..10 "
        f"(dims/reg: F1) {candidates}; pop-mix {mix_f1:.4f}; gain {rtf_f1 - mix_f1:+.4f} "
        f"(2 SE {2 * se:.4f}); test f1@1 {metrics['f1@1']:.4f} f1@10 {metrics['f1@10']:.4f} "
        f"({seconds:.0f}s)",
        file=sys.stderr,
    )
    return index, tests


def _measure_baselines(
    args: argparse.Namespace,
    train: TagAssignments,
    run_no: int,
    seed: int,
    index: RTFIndex,
    tests: HeldOutPosts,
    per_method: dict,
) -> None:
    for kind in BASELINES:
        _record(per_method, kind, evaluate_baseline(index, tests, kind))
    weight = choose_mix_weight(train, seed)
    tuned = evaluate_baseline(index, tests, "pop-mix", mix_weight=weight)
    tuned["mix_weight"] = weight
    _record(per_method, TUNED_MIX, tuned)
    _say(
        args, run_no, f"{TUNED_MIX}: item weight {weight:g} (chosen on validation posts of the training set)"
    )
    _record(per_method, "npmax", evaluate_npmax(index, tests))


def _print_f1_grid(per_method: dict[str, dict[str, list[float]]], out=None) -> None:
    """The layout of the paper's Fig. 7: F1 at N = 1..10 per method (and AUC)."""
    out = out or sys.stdout
    head = "method".ljust(12) + "".join(f"F1@{n:<5}" for n in range(1, MAX_N + 1)) + "AUC"
    print(head, file=out)
    for method, metrics in per_method.items():
        cells = "".join(f"{np.mean(metrics[f'f1@{n}']):<8.4f}" for n in range(1, MAX_N + 1))
        auc = f"{np.mean(metrics['auc']):.4f}" if "auc" in metrics else "-"
        print(method.ljust(12) + cells + auc, file=out)
    out.flush()
