"""The packed id map (large id spaces the server loads) behaves as the plain one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap, PackedIdMap
from ordrec.service.storage.registry import Registry

ID = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1, max_size=12
)


def packed(ids: list[str]) -> PackedIdMap:
    return PackedIdMap(("".join(f"{x}\n" for x in ids)).encode("utf-8"))


@settings(max_examples=200, deadline=None)
@given(st.lists(ID, unique=True, max_size=60), st.lists(ID, max_size=20))
def test_packed_answers_as_the_plain_map(ids, queries):
    plain, small = IdMap(ids), packed(ids)
    assert len(small) == len(plain) and small == plain and plain == small
    assert list(small.ids) == ids and [small.ids[r] for r in range(len(ids))] == ids
    asked = queries + ids[::2]
    assert small.rows(asked).tolist() == plain.rows(asked).tolist()
    assert [small.row(x) for x in asked] == [plain.row(x) for x in asked]
    assert [small.rows([x]).tolist() for x in asked] == [[plain.row(x)] for x in asked]  # one id
    assert [x in small for x in asked] == [x in plain for x in asked]
    assert small.max_bytes == plain.max_bytes
    rows = np.arange(len(ids))[::-1]
    assert small.externals(rows) == plain.externals(rows) and small.subset(rows) == plain.subset(rows)


def test_hash_collisions_never_map_a_wrong_row(monkeypatch):
    """Every id hashing alike: lookups walk the equal-hash run and still find the right row."""
    ids = [f"id{i}" for i in range(50)]
    monkeypatch.setattr("builtins.hash", lambda x: 7)
    small = packed(ids)  # built and asked with every id hashing to 7
    assert [small.row(x) for x in ids] == list(range(50))
    assert small.rows(ids + ["nope"]).tolist() == [*range(50), -1]


def test_duplicates_are_refused():
    with pytest.raises(ValueError, match="duplicate id 'b'"):
        packed(["a", "b", "c", "b"])


def test_large_id_spaces_load_packed_and_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr("ordrec.service.storage.format.PACKED_MIN_IDS", 10)
    ids = [f"item-{i}-é" for i in range(25)]
    artifact = Artifact(kind="toy", arrays={"x": np.zeros((25, 2), np.float32)}, ids={"items": IdMap(ids)})
    reg = Registry(tmp_path)
    reg.publish("m", artifact)
    loaded = reg.load("m").ids["items"]
    assert isinstance(loaded, PackedIdMap) and list(loaded.ids) == ids and loaded.row("item-3-é") == 3
    reg.publish("m", reg.load("m"))  # a loaded (packed) version publishes again, unchanged
    assert list(reg.load("m").ids["items"].ids) == ids


def test_an_id_list_that_is_not_utf8_or_unterminated_is_refused():
    with pytest.raises(UnicodeDecodeError):
        PackedIdMap(b"i1\n\xff3\ni4\n")
    with pytest.raises(ValueError, match="line break"):
        PackedIdMap(b"i1\ni2")
