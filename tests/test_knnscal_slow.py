"""KNNSCAL on the digits 10-NN graph against the issue's reference methods (slow: minutes).

Digits ships with scikit-learn, so no ORDREC_DATA path is needed.
"""

from __future__ import annotations

import argparse

import pytest

from ordrec.service.indices.models.knnscal import KNNSCALIndex
from ordrec.trainer.reproduce.knnscal import load_problem, map_index, map_metrics, reference_map
from tests.test_knnscal_local import fit_knnscal

pytestmark = pytest.mark.slow


def test_digits_order_agreement_and_recall_beat_isomap_and_spectral():
    args = argparse.Namespace(digits=True, n_neighbors=10, seed=0, data=None)
    problem = load_problem(args)
    est = fit_knnscal(problem.graph, random_state=0)
    ours = map_metrics(problem, KNNSCALIndex.from_artifact(est.to_artifact()))
    for method in ("isomap", "spectral"):
        theirs = map_metrics(problem, map_index(problem, reference_map(method, problem, 2, 0)))
        assert ours["order_agreement"] > theirs["order_agreement"], (method, ours, theirs)
        assert ours["recall@10"] > theirs["recall@10"], (method, ours, theirs)


# t-SNE on the digits features (sklearn, init="pca", seed 0): the figures for
# `reproduce knnscal --digits --n-neighbors 5`, and that command's measurement at --n-neighbors 20.
TSNE_DIGITS = {
    5: {"order_agreement": 0.715, "recall@5": 0.588},
    20: {"order_agreement": 0.7008, "recall@20": 0.6028},
}


@pytest.mark.parametrize("k", sorted(TSNE_DIGITS))
def test_digits_order_agreement_and_recall_reach_tsne(k):
    # Issue 21 item 1: the default from the graph alone against t-SNE from the features
    # (at k = 20 the OA margin is 0.0005, reached with several neighbour-embedding starts).
    args = argparse.Namespace(digits=True, n_neighbors=k, seed=0, data=None)
    problem = load_problem(args)
    est = fit_knnscal(problem.graph, random_state=0)
    ours = map_metrics(problem, KNNSCALIndex.from_artifact(est.to_artifact()))
    for metric, tsne in TSNE_DIGITS[k].items():
        assert ours[metric] > tsne, (metric, ours, tsne)
