"""The reproduce contract shared by every model's protocol.

A protocol produces :class:`Row` objects. ``print_table`` shows ours beside
the paper's figures; ``write_json`` writes the rows as a JSON list of
``{"method", "dataset", "setting", "metric", "mean", "std", "runs"}`` with
lower-case metric names (``ndcg@10``, ``f1@5``, ``auc``, ``preservation_h``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TextIO

import numpy as np


@dataclass(frozen=True)
class Row:
    method: str
    dataset: str
    setting: dict
    metric: str
    mean: float
    std: float
    runs: int

    def __post_init__(self):
        if self.metric != self.metric.lower():
            raise ValueError(f"metric names are lower-case: {self.metric!r}")


def summarise(method: str, dataset: str, setting: dict, metric: str, values: Sequence[float]) -> Row:
    """One row from per-run values: mean and (population) standard deviation."""
    runs = np.asarray(values, dtype=np.float64)
    return Row(
        method,
        dataset,
        dict(setting),
        metric.lower(),
        float(runs.mean()),
        float(runs.std()),
        int(runs.size),
    )


@dataclass
class PaperFigure:
    """A figure the paper reports, for printing beside ours."""

    method: str
    setting: dict
    metric: str
    value: float
    note: str = ""


@dataclass
class Comparison:
    rows: list[Row]
    paper: list[PaperFigure] = field(default_factory=list)


def _setting_text(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def _fmt(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"


def print_table(
    rows: Iterable[Row], paper: Iterable[PaperFigure] = (), out: TextIO | None = None, title: str = ""
) -> None:
    """Rows grouped by setting and metric, the paper's figure (when it has one) beside ours."""
    out = out or sys.stdout  # looked up per call, so captured or redirected stdout works
    rows = list(rows)
    paper_by_key = {(p.method, _setting_text(p.setting), p.metric): p for p in paper}
    header = ("method", "setting", "metric", "ours (mean ± std, runs)", "paper")
    lines = []
    for r in rows:
        key = (r.method, _setting_text(r.setting), r.metric)
        p = paper_by_key.pop(key, None)
        ours = f"{_fmt(r.mean)} ± {_fmt(r.std)} ({r.runs})"
        lines.append((r.method, _setting_text(r.setting), r.metric, ours, _fmt(p.value) if p else ""))
    for p in paper_by_key.values():  # paper figures we did not compute
        lines.append((p.method, _setting_text(p.setting), p.metric, "not run", _fmt(p.value)))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    if title:
        print(title, file=out)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for line in lines:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)), file=out)
    out.flush()


def write_json(rows: Iterable[Row], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump([asdict(r) for r in rows], fh, indent=2)
        fh.write("\n")


def read_json(path: str) -> list[Row]:
    with open(path, encoding="utf-8") as fh:
        return [Row(**row) for row in json.load(fh)]
