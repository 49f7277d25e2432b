"""The conditional-triplet file reader (``aspect,i,j,k``) and SCORE trained from it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.score import SCOREIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.trainer.data.triplets import ConditionalTriplets, read_triplets, write_triplets
from ordrec.trainer.data.types import DataError
from ordrec.trainer.models.score import SCORE


def test_reads_header_comments_tabs_and_ids(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("aspect,i,j,k\n# a comment\ncolour,apple,cherry,banana\n\nshape\tapple\tbanana\tcherry\n")
    data = read_triplets(str(path))
    assert data.aspects.ids == ["colour", "shape"]
    assert data.objects.ids == ["apple", "cherry", "banana"]
    np.testing.assert_array_equal(data.aspect, [0, 1])
    np.testing.assert_array_equal(np.c_[data.i, data.j, data.k], [[0, 1, 2], [0, 2, 1]])
    assert data.i.dtype == np.int32 and len(data) == 2
    np.testing.assert_array_equal(data.counts(), [1, 1])


@pytest.mark.parametrize(
    "line, message",
    [
        ("a,1,2", "expected 4 fields"),
        ("a,1,1,2", "three different objects"),
        ("a,,2,3", "empty field"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.csv"
    path.write_text(f"a,1,2,3\n{line}\n")
    with pytest.raises(DataError, match=message) as err:
        read_triplets(str(path))
    assert err.value.line == 2 and str(path) in str(err.value)
    data = read_triplets(str(path), skip_bad_lines=True)
    assert len(data) == 1 and data.skipped_lines == 1


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("aspect,i,j,k\n")
    with pytest.raises(DataError, match="no triplets"):
        read_triplets(str(path))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["p", "q", "r s"]), st.permutations(["x1", "x2", "x3", "x4"])),
        min_size=1,
        max_size=30,
    )
)
def test_write_then_read_round_trip(tmp_path_factory, rows):
    aspects, aspect_rows = IdMap.from_values(a for a, _ in rows)
    objects = IdMap(["x1", "x2", "x3", "x4"])
    trip = np.array([objects.rows(p[:3]) for _, p in rows], dtype=np.int32)
    data = ConditionalTriplets(aspects, objects, aspect_rows, trip[:, 0], trip[:, 1], trip[:, 2])
    path = tmp_path_factory.mktemp("rt") / "t.csv"
    write_triplets(str(path), data)
    back = read_triplets(str(path))
    assert back.aspects.ids == data.aspects.ids

    def named(d):
        return [
            (d.aspects.ids[t], d.objects.ids[i], d.objects.ids[j], d.objects.ids[k])
            for t, i, j, k in zip(d.aspect, d.i, d.j, d.k)
        ]

    assert named(back) == named(data)


def test_fit_from_a_triplet_file_learns_the_orders(tmp_path):
    # Planted: 16 objects on a 4x4 grid; aspect "x" compares by column,
    # aspect "y" by row. Triplets drawn from the true orders only.
    rng = np.random.default_rng(0)
    pos = np.array([(c, r) for c in range(4) for r in range(4)], dtype=float)
    lines = ["aspect,i,j,k"]
    for _ in range(3000):
        t = rng.integers(2)
        i, j, k = rng.choice(16, 3, replace=False)
        di, dk = abs(pos[i, t] - pos[j, t]), abs(pos[k, t] - pos[j, t])
        if di == dk:
            continue
        if di > dk:
            i, k = k, i
        lines.append(f"{'xy'[t]},{i},{j},{k}")
    path = tmp_path / "grid.csv"
    path.write_text("\n".join(lines) + "\n")
    data = read_triplets(str(path))
    index = SCOREIndex.from_artifact(SCORE(max_iter=10, random_state=0).fit(data).to_artifact())
    agree = []
    for t, name in enumerate(data.aspects.ids):
        coords = index.map_coordinates(name)
        sel = data.aspect == t
        i, j, k = coords[data.i[sel]], coords[data.j[sel]], coords[data.k[sel]]
        agree.append(np.mean(np.linalg.norm(i - j, axis=1) < np.linalg.norm(j - k, axis=1)))
    # Random maps agree with half; the orders are one-dimensional and consistent.
    assert min(agree) > 0.85, agree
