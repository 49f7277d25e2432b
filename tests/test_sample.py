"""The built-in sample: deterministic per seed, planted structure present, and
the files it writes read back through the readers equal the in-memory data."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ordrec.trainer.data.readers import read_attributes, read_neighbors, read_ratings, read_tags
from ordrec.trainer.sample import (
    planted_attributes,
    planted_attributes_with_truth,
    planted_neighbors,
    planted_ratings,
    planted_ratings_with_truth,
    planted_tags,
    planted_tags_with_truth,
    write_samples,
)


def same_ratings(a, b):
    return (
        a.users == b.users
        and a.items == b.items
        and np.array_equal(a.user, b.user)
        and np.array_equal(a.item, b.item)
        and np.array_equal(a.rating, b.rating)
    )


def same_tags(a, b):
    return (
        a.users == b.users
        and a.items == b.items
        and a.tags == b.tags
        and np.array_equal(a.user, b.user)
        and np.array_equal(a.item, b.item)
        and np.array_equal(a.tag, b.tag)
    )


def same_attributes(a, b):
    return (
        a.objects == b.objects
        and a.attributes == b.attributes
        and a.values == b.values
        and np.array_equal(a.codes, b.codes)
    )


def same_neighbors(a, b):
    return (
        a.vertices == b.vertices
        and np.array_equal(a.source, b.source)
        and np.array_equal(a.neighbor, b.neighbor)
        and np.array_equal(a.rank, b.rank)
    )


def test_deterministic_per_seed_and_different_across_seeds():
    assert same_ratings(planted_ratings(seed=4), planted_ratings(seed=4))
    assert not same_ratings(planted_ratings(seed=4), planted_ratings(seed=5))
    assert same_tags(planted_tags(seed=4), planted_tags(seed=4))
    assert not same_tags(planted_tags(seed=4), planted_tags(seed=5))
    assert same_attributes(planted_attributes(seed=4), planted_attributes(seed=4))
    assert not same_attributes(planted_attributes(seed=4), planted_attributes(seed=5))
    assert same_neighbors(planted_neighbors(seed=4)[0], planted_neighbors(seed=4)[0])
    assert not same_neighbors(planted_neighbors(seed=4)[0], planted_neighbors(seed=5)[0])


def test_ratings_shape_and_planted_truth():
    r, truth = planted_ratings_with_truth(n_users=300, n_items=200, rank=3, per_user=(20, 60), seed=0)
    assert r.n_users == 300 and r.n_items <= 200
    per_user = np.bincount(r.user, minlength=r.n_users)
    assert per_user.min() >= 20 and per_user.max() <= 60
    assert set(np.unique(r.rating).tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert r.users.ids[0] == "u001" and all(x.startswith("i") for x in r.items.ids)
    assert len(set(zip(r.user.tolist(), r.item.tolist()))) == len(r)  # no duplicate pairs
    # The truth is indexed by the data's rows: the noiseless rating explains
    # most of the observed rating, and a shuffled truth does not.
    expected = truth.expected_rating()[r.user, r.item]
    assert truth.user_factors.shape == (r.n_users, 3) and truth.item_factors.shape == (r.n_items, 3)
    corr = np.corrcoef(expected, r.rating)[0, 1]
    shuffled = np.corrcoef(
        truth.expected_rating()[np.random.default_rng(0).permutation(r.user), r.item], r.rating
    )[0, 1]
    assert corr > 0.6 and corr > shuffled + 0.3


def test_tags_posts_and_truth():
    t, truth = planted_tags_with_truth(seed=1)
    posts = {}
    for u, i, g in zip(t.user.tolist(), t.item.tolist(), t.tag.tolist()):
        posts.setdefault((u, i), []).append(g)
    sizes = np.array([len(v) for v in posts.values()])
    assert sizes.min() >= 1 and sizes.max() <= 4
    assert all(len(set(v)) == len(v) for v in posts.values())
    assert 40 <= len(t.tags) <= 50
    # A post's tags score higher under the planted tensor than its other tags.
    ranks = []
    for (u, i), tags in posts.items():
        order = np.argsort(-truth.scores(u, i))
        position = np.empty(order.size, dtype=int)
        position[order] = np.arange(order.size)
        ranks.extend(position[tags])
    assert np.mean(ranks) < len(t.tags) / 4


def test_attributes_related_aspects():
    a, truth = planted_attributes_with_truth(seed=2)
    assert a.codes.shape == (80, 6) and (a.codes >= 0).all()
    assert all(len(v) >= 2 for v in a.values)

    def agreement(x, y):
        # Mutual information (nats) between two categorical columns.
        cx, cy = a.codes[:, a.attribute_index(x)], a.codes[:, a.attribute_index(y)]
        joint = np.zeros((cx.max() + 1, cy.max() + 1))
        np.add.at(joint, (cx, cy), 1)
        joint /= joint.sum()
        px, py = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
        nz = joint > 0
        return float((joint[nz] * np.log(joint[nz] / (px @ py)[nz])).sum())

    for x, y in truth.related:
        assert agreement(x, y) > 2 * agreement(x, "colour")


def test_neighbors_are_exact_knn_of_the_points():
    n, points = planted_neighbors(n=120, k=7, seed=3)
    assert len(n) == 120 * 7 and len(n.vertices) == 120
    assert n.labels is not None and n.labels.shape == (120,)
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    for s in range(len(n.vertices)):
        mine = n.source == s
        listed = n.neighbor[mine][np.argsort(n.rank[mine])]
        others = np.delete(np.arange(len(n.vertices)), s)
        truth = others[np.argsort(d[s, others], kind="stable")][:7]
        assert listed.tolist() == truth.tolist()
    with pytest.raises(ValueError):
        planted_neighbors(n=5, k=5)


def test_fast():
    start = time.perf_counter()
    planted_ratings(), planted_tags(), planted_attributes(), planted_neighbors()
    assert time.perf_counter() - start < 1.0


def test_written_files_read_back_equal(tmp_path):
    paths = write_samples(tmp_path, seed=7)
    names = [p.name for p in paths]
    assert names == ["ratings.data", "items.txt", "tags.csv", "attributes.csv", "neighbors.csv"]
    assert same_ratings(read_ratings(tmp_path / "ratings.data"), planted_ratings(seed=7))
    assert same_tags(read_tags(tmp_path / "tags.csv"), planted_tags(seed=7))
    assert same_attributes(read_attributes(tmp_path / "attributes.csv"), planted_attributes(seed=7))
    assert same_neighbors(read_neighbors(tmp_path / "neighbors.csv"), planted_neighbors(seed=7)[0])
    items = read_ratings(tmp_path / "ratings.data").items.ids
    titles = [line.split("|")[0] for line in (tmp_path / "items.txt").read_text().splitlines()]
    assert titles == items
    # Same seed, same bytes.
    again = write_samples(tmp_path / "again", seed=7)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
