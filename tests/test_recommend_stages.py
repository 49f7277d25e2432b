"""Recommend's plan holds the stages a request needs, in order, and no others."""

from __future__ import annotations

from ordrec.service.indices.diversity import POOL_FACTOR, AttributeCap, Diversify
from ordrec.service.serving.stages import (
    RecommendCall,
    VersionGroup,
    distributions,
    explain,
    fall_back,
    fold_in,
    merge_fresh_items,
    plan,
    rerank,
    sample,
    score_known,
    write_items,
)


def _call(**features) -> RecommendCall:
    plain = dict(n=5, candidate_ids=[], exclude_ids=[], exclude_seen=True, with_distribution=False, filter="")
    return RecommendCall(**{**plain, **features})


_PLAIN = _call()


def _group(fresh=None) -> VersionGroup:
    return VersionGroup(model=None, positions=[0], candidates=None, eligible=None, fresh=fresh)  # type: ignore[arg-type]


def test_a_plain_request_scores_falls_back_writes_and_samples():
    assert plan(_PLAIN, _group()) == (score_known, fold_in, fall_back, write_items, sample)


def test_each_feature_adds_its_stage_in_its_place():
    call = _call(with_distribution=True, explain=2, diversify=Diversify(0.3))
    fresh = object()  # a version with fresh items
    assert plan(call, _group(fresh)) == (
        score_known,
        fold_in,
        fall_back,
        merge_fresh_items,
        rerank,
        write_items,
        explain,
        distributions,
        sample,
    )


def test_a_cap_alone_reranks():
    call = _call(diversify=Diversify(0.0, AttributeCap("genre", 1)))
    assert rerank in plan(call, _group()) and call.fetch_n == POOL_FACTOR * call.n
