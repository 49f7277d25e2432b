"""Fit metrics recorded with every version ``ordrec-train train`` publishes.

For the map models the papers' *preservation* is a fit measure: the share of
the training judgements the map reproduces (COE Eq. 5.5, SCORE Table 1). It
is computed exactly, through the serving index built from the artifact, and
shown in the map report beside the paper's figure. Held-out quality is the
cron job's gate (``trainer/evaluation/holdout.py``) and each paper's protocol
(``ordrec-train reproduce``).
"""
from __future__ import annotations

import numpy as np

from ordrec.service.artifacts import Artifact
from ordrec.service.models import index_class
from ordrec.trainer.data.types import AttributeTable, Ratings


def fit_metrics(kind: str, data, artifact: Artifact) -> dict[str, float]:
    """Metrics of the fitted model on its own training data ({} when none apply)."""
    if kind == "coe" and isinstance(data, Ratings):
        from ordrec.trainer.evaluation.coe import evaluate_index, protocol_values

        observed = np.ones(len(data), dtype=bool)
        index = index_class(kind).from_artifact(artifact)
        metrics = evaluate_index(index, data, protocol_values(data, observed), observed)
        keep = ("preservation_a", "preservation_b", "preservation_h", "knn1_h", "knn5_h")
        return {k: float(metrics[k]) for k in keep if np.isfinite(metrics[k])}
    if kind == "score" and isinstance(data, AttributeTable):
        from ordrec.trainer.evaluation.score import preservation

        per_aspect, _ = preservation(index_class(kind).from_artifact(artifact), data)
        out = {f"preservation_{name}": float(p) for name, p in zip(data.attributes, per_aspect) if np.isfinite(p)}
        if out:
            out["preservation"] = float(np.nanmean(per_aspect))
        return out
    return {}
