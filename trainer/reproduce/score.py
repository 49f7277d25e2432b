"""SCORE protocol (Le & Lauw, IJCAI 2019, Section 5): preservation of conditional triplets.

For each aspect set and split ratio r, and each run: per aspect, a fraction r
of the objects (those with a value) is sampled and only triplets among them are
trained on; the three modes (SCORE multi-map, one pooled map, disjoint maps)
are fitted, and every aspect's preservation accuracy (Eq. 10) is measured
exactly over all of its triplets, and over the hidden ones (those with at
least one unsampled object). Distances come from the serving index built from
each fitted artifact. The SCORE runs also report aspect relatedness: per
aspect, the Pearson correlation over the other aspects between angular
similarity on the sphere and the NMI of the attributes' value partitions;
the median over aspects is reported (paper Fig. 6).

Zoo, paper Table 1 (``--aspects type,legs,predator --ratio 1``): multi-map
0.98, single map 0.82. Fig. 5 (all aspects, r = 0.5): SCORE above the
disjoint and pooled baselines; Fig. 6: median relatedness 0.34.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.metrics import normalized_mutual_info_score

from ordrec.service.indices.models.score import SCOREIndex
from ordrec.trainer.data.types import AttributeTable
from ordrec.trainer.evaluation.metrics import preservation
from ordrec.trainer.models.score import SCORE
from ordrec.trainer.reproduce.params import add_param_flags, given_params
from ordrec.trainer.reproduce.report import PaperFigure, Row, print_table, summarise

DEFAULT_RUNS = 5
DATA_REQUIRED = True

METHODS = {"multi": "SCORE (multi-map)", "single": "single map", "disjoint": "disjoint maps"}
TABLE1_ZOO = ("type", "legs", "predator")
# Table 1 of the paper: preservation with three aspects and every triplet (r = 1).
TABLE1: dict[str, dict[str, Any]] = {
    "Zoo": {"aspects": TABLE1_ZOO, "multi": 0.98, "single": 0.82},
    "HouseVote": {"aspects": ("immigration", "education-spending", "crime"), "multi": 0.89, "single": 0.70},
}


# --------------------------------------------------------------- arguments
# The SCORE parameters a flag may change (``--name-with-dashes``, named as the parameter),
# and the protocol's values when a flag is not given (the paper's).
FLAG_HELP = {
    "max_iter": "SGD epochs per fit (default 20)",
    "steps_per_epoch": "SGD steps per epoch (default: the number of training triplets, capped)",
    "n_components": "K, the dimension of each map (default 2)",
    "alpha": "sigmoid scale (paper: 30)",
    "learning_rate": "initial learning rate (paper: 0.05)",
    "kappa": "vMF concentration (paper, Zoo: 0)",
}
PROTOCOL_DEFAULTS = {
    "max_iter": 20,
    "steps_per_epoch": 0,
    "n_components": 2,
    "alpha": 30.0,
    "learning_rate": 0.05,
    "kappa": 0.0,
}


def protocol_params(args: argparse.Namespace) -> dict:
    """The protocol's SCORE parameters: the paper's, with the flags given (checked)."""
    given = given_params(args, "SCORE", SCORE._parameter_constraints, FLAG_HELP)
    return dict(PROTOCOL_DEFAULTS, **given)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--aspects",
        action="append",
        metavar="A,B,C",
        help="comma-separated attribute names to model together (default: all);"
        " repeat the flag for several aspect sets",
    )
    parser.add_argument(
        "--ratio", default="0.5", help="split ratio(s) r, comma-separated (1 = all triplets; default 0.5)"
    )
    parser.add_argument(
        "--modes",
        default="multi,single,disjoint",
        help="which of multi,single,disjoint to fit (default: all three)",
    )
    add_param_flags(parser, SCORE._parameter_constraints, FLAG_HELP, FLAG_HELP)


# -------------------------------------------------------------- data shaping
def select_aspects(table: AttributeTable, names: list[str] | None) -> AttributeTable:
    """The table restricted to ``names`` (all attributes when None), in that order."""
    if not names:
        return table
    try:
        cols = [table.attribute_index(n) for n in names]
    except KeyError as exc:  # a usage error for the CLI, with the names it knows
        raise ValueError(exc.args[0]) from None
    return AttributeTable(
        table.objects,
        [table.attributes[c] for c in cols],
        np.ascontiguousarray(table.codes[:, cols]),
        [table.values[c] for c in cols],
        source=table.source,
        labels=table.labels,
    )


def split_objects(
    table: AttributeTable, ratio: float, rng: np.random.Generator
) -> tuple[AttributeTable, np.ndarray]:
    """Per aspect, keep the values of ``round(ratio * n)`` random objects among
    the ``n`` that have one and mark the rest missing, so only triplets among
    sampled objects can be drawn. Returns the training table and the
    (n_objects, n_aspects) mask of sampled objects."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"split ratio must lie in (0, 1], got {ratio}")
    observed = table.codes >= 0
    if ratio < 1.0:
        for t in range(table.codes.shape[1]):
            have = np.nonzero(observed[:, t])[0]
            keep = rng.choice(have, size=int(round(ratio * have.size)), replace=False)
            observed[:, t] = False
            observed[keep, t] = True
    codes = np.where(observed, table.codes, -1).astype(np.int32)
    train = AttributeTable(
        table.objects, list(table.attributes), codes, table.values, source=table.source, labels=table.labels
    )
    return train, observed


# -------------------------------------------------------------- preservation
def fit_metrics(data, artifact) -> dict[str, float]:
    """Per-aspect preservation (Eq. 10) of a published model on its own
    training table, through the serving index, and their mean."""
    if not isinstance(data, AttributeTable):
        return {}
    per_aspect, _ = preservation(SCOREIndex.from_artifact(artifact), data)
    out = {f"preservation_{name}": float(p) for name, p in zip(data.attributes, per_aspect) if np.isfinite(p)}
    if out:
        out["preservation"] = float(np.nanmean(per_aspect))
    return out


def nmi_matrix(table: AttributeTable) -> np.ndarray:
    """NMI between every two attributes' value partitions (objects with both values)."""
    n = len(table.attributes)
    out = np.eye(n)
    for a in range(n):
        for b in range(a + 1, n):
            both = (table.codes[:, a] >= 0) & (table.codes[:, b] >= 0)
            out[a, b] = out[b, a] = normalized_mutual_info_score(table.codes[both, a], table.codes[both, b])
    return out


def relatedness(index: SCOREIndex, table: AttributeTable) -> np.ndarray:
    """Per aspect: Pearson correlation, over the other aspects, between
    angular similarity on the sphere and NMI (NaN where either is constant)."""
    rows = index.aspects.rows(table.attributes)
    sim = index.aspect_similarity()[np.ix_(rows, rows)]
    nmi = nmi_matrix(table)
    n = len(rows)
    out = np.full(n, np.nan)
    for t in range(n):
        others = np.arange(n) != t
        a, b = sim[t, others], nmi[t, others]
        if n > 3 and a.std() > 0 and b.std() > 0:
            out[t] = float(np.corrcoef(a, b)[0, 1])
    return out


def map_paper_figures(hyperparameters: Mapping, attributes: Mapping) -> list[PaperFigure]:
    """The Table 1 figures a published version is shown beside in its map
    report: those of its mode (the paper has no disjoint-maps figure there)."""
    mode = str(attributes.get("mode", hyperparameters.get("mode", "multi")))
    if mode not in ("multi", "single"):
        return []
    return [
        PaperFigure(
            METHODS[mode],
            {"data": data, "aspects": ", ".join(row["aspects"])},
            "preservation",
            row[mode],
            "Table 1",
        )
        for data, row in TABLE1.items()
    ]


# ------------------------------------------------------------------- runner
def _paper_figures(dataset: str, setting: dict, names: list[str], all_names: list[str]) -> list[PaperFigure]:
    if dataset != "zoo":
        return []
    figs = []
    if tuple(names) == TABLE1_ZOO and setting["r"] == 1.0:
        figs += [
            PaperFigure(METHODS[mode], setting, "preservation", TABLE1["Zoo"][mode], "Table 1")
            for mode in ("multi", "single")
        ]
    if sorted(names) == sorted(all_names):
        figs.append(PaperFigure(METHODS["multi"], setting, "relatedness_median", 0.34, "Fig. 6"))
    return figs


def _load(args) -> AttributeTable:
    from ordrec.trainer.data.readers import read_input

    table = read_input(
        "attributes",
        args.data,
        args.format,
        skip_bad_lines=args.skip_bad_lines,
        column_names=getattr(args, "columns", None),
    )
    if not isinstance(table, AttributeTable):
        raise ValueError(f"the SCORE protocol needs an attribute table, got {type(table).__name__}")
    return table


def run(args: argparse.Namespace) -> list[Row]:
    table = _load(args)
    where = os.path.abspath(args.data)
    dataset = os.path.basename(where if os.path.isdir(where) else os.path.dirname(where)) or "data"
    modes = _modes(args.modes)
    ratios = [float(r) for r in str(args.ratio).split(",") if r.strip()]
    aspect_sets = [[a.strip() for a in spec.split(",") if a.strip()] for spec in (args.aspects or [""])]
    rows: list[Row] = []
    paper: list[PaperFigure] = []
    for names in aspect_sets:
        sub = select_aspects(table, names or None)
        label = ",".join(sub.attributes) if names else f"all({len(sub.attributes)})"
        for ratio in ratios:
            setting = {"data": dataset, "aspects": label, "r": ratio}
            paper += _paper_figures(dataset, setting, sub.attributes, table.attributes)
            rows += _setting_rows(args, sub, modes, ratio, setting)
    print_table(
        rows,
        paper,
        out=sys.stdout,
        title="SCORE: preservation accuracy of conditional triplets (paper: Le & Lauw 2019)",
    )
    return rows


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    for m in modes:
        if m not in METHODS:
            raise ValueError(f"unknown mode {m!r}; known: {', '.join(METHODS)}")
    return modes


@dataclass
class _Measured:
    """One setting's per-run figures: mean preservation (all and hidden triplets)
    and per-aspect preservation by mode, and the SCORE maps' relatedness."""

    per_mode: dict[str, dict[str, list[float]]]
    per_aspect: dict[str, list[np.ndarray]]
    related: list[float] = field(default_factory=list)


def _setting_rows(
    args: argparse.Namespace, sub: AttributeTable, modes: list[str], ratio: float, setting: dict
) -> list[Row]:
    """Every run of one aspect set at one split ratio, summarised per mode and metric."""
    measured = _Measured(
        {m: {"preservation": [], "preservation_hidden": []} for m in modes}, {m: [] for m in modes}
    )
    for run_no in range(args.runs):
        rng = np.random.default_rng([args.seed, run_no])
        train, observed = split_objects(sub, ratio, rng)
        for mode in modes:
            _measure_mode(
                args,
                mode,
                train,
                sub,
                observed if ratio < 1.0 else None,
                int(rng.integers(2**31 - 1)),
                measured,
            )
    dataset = setting["data"]
    rows = [
        summarise(METHODS[mode], dataset, setting, metric, values)
        for mode in modes
        for metric, values in measured.per_mode[mode].items()
        if values
    ]
    if measured.related:
        rows.append(summarise(METHODS["multi"], dataset, setting, "relatedness_median", measured.related))
    if not args.quiet:
        _print_per_aspect(sub.attributes, modes, measured.per_aspect, setting)
        if measured.related:
            print(
                "relatedness median per run: " + " ".join(f"{v:.3f}" for v in measured.related),
                file=sys.stderr,
            )
    return rows


def _measure_mode(
    args: argparse.Namespace,
    mode: str,
    train: AttributeTable,
    sub: AttributeTable,
    observed: np.ndarray | None,
    seed: int,
    measured: _Measured,
) -> None:
    """Fit one mode on the run's training table and measure it through the serving index."""
    est = SCORE(**protocol_params(args), mode=mode, random_state=seed, verbose=not args.quiet)
    index = SCOREIndex.from_artifact(est.fit(train).to_artifact())
    overall, hidden = preservation(index, sub, observed)
    measured.per_mode[mode]["preservation"].append(float(np.nanmean(overall)))
    measured.per_aspect[mode].append(overall)
    if observed is not None:
        measured.per_mode[mode]["preservation_hidden"].append(float(np.nanmean(hidden)))
    if mode == "multi" and len(sub.attributes) > 3:  # Pearson over >= 3 others
        measured.related.append(float(np.nanmedian(relatedness(index, sub))))


def _print_per_aspect(names, modes, per_aspect, setting) -> None:
    print(f"per-aspect preservation (mean over runs), {setting}", file=sys.stderr)
    means = {m: np.nanmean(np.vstack(per_aspect[m]), axis=0) for m in modes}
    width = max(len(n) for n in names)
    print("  ".join(["aspect".ljust(width)] + [METHODS[m] for m in modes]), file=sys.stderr)
    for t, name in enumerate(names):
        print(
            "  ".join([name.ljust(width)] + [f"{means[m][t]:.4f}".ljust(len(METHODS[m])) for m in modes]),
            file=sys.stderr,
        )
