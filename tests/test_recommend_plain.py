"""The straight-line Recommend path (one known user, nothing asked but ``n`` and
``exclude_seen``) answers exactly what the general path does: the same ids, scores, order
and reply fields, for random requests, hidden items, recorded items and forgotten users."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.config import Limits
from ordrec.service.live.forgotten import SCOPE, ForgottenUsers, user_digest
from ordrec.service.live.hidden import HiddenState
from ordrec.service.metrics import Metrics
from ordrec.service.serving.servicer import RecommenderServicer
from ordrec.service.storage.hidden_items import ALL_MODELS
from ordrec.v1 import recommender_pb2 as pb
from tests.servicer_fakes import FixedSet, NoDeadlineContext, RecordedSeen, dcr_store

N_USERS, N_ITEMS = 10, 300
USERS = [f"u{i}" for i in range(N_USERS)]
ITEMS = [f"i{i}" for i in range(N_ITEMS)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return dcr_store(tmp_path_factory.mktemp("plain-registry"), N_USERS, N_ITEMS, seed=5)


def _servicer(store, hidden, forgotten, recent, degraded) -> RecommenderServicer:
    return RecommenderServicer(
        store,
        Metrics(),
        Limits(),
        RecordedSeen(recent, degraded),
        HiddenState(FixedSet(ALL_MODELS, hidden), interval=3600),
        forgotten=ForgottenUsers(FixedSet(SCOPE, frozenset(user_digest(u) for u in forgotten)), 3600),
    )


@settings(max_examples=80, deadline=None)
@given(
    user=st.sampled_from(USERS + ["nobody"]),
    other=st.sampled_from(USERS),
    n=st.integers(1, 160),  # past the fused kernel's 128: the sort path
    exclude_seen=st.sampled_from([None, True, False]),
    hidden=st.sets(st.sampled_from(ITEMS), max_size=40).map(frozenset),
    forgotten=st.sets(st.sampled_from(USERS), max_size=3),
    recent=st.dictionaries(st.sampled_from(USERS), st.lists(st.sampled_from(ITEMS + ["i999"]), max_size=8)),
    degraded=st.booleans(),
)
def test_the_plain_request_answers_what_the_general_path_does(
    store, user, other, n, exclude_seen, hidden, forgotten, recent, degraded
):
    servicer = _servicer(store, hidden, forgotten, recent, degraded)
    plain = pb.RecommendRequest(model="dcr", user_ids=[user], n=n)
    if exclude_seen is not None:
        plain.exclude_seen = exclude_seen
    got = servicer.Recommend(plain, NoDeadlineContext())
    # The general path answers the same request with an exclusion of no known item ...
    general = pb.RecommendRequest()
    general.CopyFrom(plain)
    general.exclude_item_ids.append("not-an-item")
    assert got == servicer.Recommend(general, NoDeadlineContext())
    # ... and the same user beside another one, in that user's result.
    pair = pb.RecommendRequest()
    pair.CopyFrom(plain)
    pair.user_ids.append(other)
    with_other = servicer.Recommend(pair, NoDeadlineContext())
    assert got.results[0] == with_other.results[0]
    assert len(got.results[0].items) == min(n, N_ITEMS)  # a full answer: enough items remain
    scores = [item.score for item in got.results[0].items]
    assert scores == sorted(scores, reverse=True)  # higher is better on the wire
    ids = [item.id for item in got.results[0].items]
    assert not set(ids) & hidden


def test_a_plain_request_with_a_bad_n_is_refused_naming_the_field(store):
    servicer = _servicer(store, frozenset(), set(), {}, False)
    context = NoDeadlineContext()
    for n in (0, -3, 10**6):
        with pytest.raises(AssertionError, match="INVALID_ARGUMENT.*n must be between"):
            servicer.Recommend(pb.RecommendRequest(model="dcr", user_ids=["u1"], n=n), context)


class _AskedSeen(RecordedSeen):
    """Records which users' recorded items were read."""

    def __init__(self, recent: dict[str, list[str]]):
        super().__init__(recent, False)
        self.asked: list[str] = []

    def lookup(self, seen_for: Sequence[str], ratings_for: Sequence[str] = ()):
        self.asked += [*seen_for, *ratings_for]
        return super().lookup(seen_for, ratings_for)


def test_a_servicer_given_a_forgotten_list_never_reads_a_forgotten_users_recorded_items(store):
    # The wrapping is the servicer's own, so the JSON API's servicer forgets as gRPC's does.
    seen = _AskedSeen({"u1": ["i1"], "u2": ["i2"]})
    forgotten = ForgottenUsers(FixedSet(SCOPE, frozenset({user_digest("u1")})), 3600)
    servicer = RecommenderServicer(store, Metrics(), Limits(), seen, forgotten=forgotten)
    for users in (["u1"], ["u1", "u2", "newcomer"]):
        servicer.Recommend(pb.RecommendRequest(model="dcr", user_ids=users, n=5), NoDeadlineContext())
    assert "u1" not in seen.asked and "u2" in seen.asked
