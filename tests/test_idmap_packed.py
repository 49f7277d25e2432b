"""The packed id map (large id spaces the server loads) behaves as the plain one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap, PackedIdMap, numbered_ids
from ordrec.service.storage.registry import Registry

ID = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1, max_size=12
)


def packed(ids: list[str], distinct: bool = False) -> PackedIdMap:
    return PackedIdMap(("".join(f"{x}\n" for x in ids)).encode("utf-8"), distinct=distinct)


@settings(max_examples=200, deadline=None)
@given(st.lists(ID, unique=True, max_size=60), st.lists(ID, max_size=20), st.booleans())
def test_packed_answers_as_the_plain_map(ids, queries, distinct):
    """Checked at load or known distinct (its lookup index built at the first lookup), a packed
    map answers every question as the plain one, its subsets too, packed or not."""
    plain, small = IdMap(ids), packed(ids, distinct)
    assert bytes(small.joined_utf8()) == plain.joined_utf8()
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
    some = np.flatnonzero(np.arange(len(ids)) % 3 != 1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ordrec.service.storage.idmap.PACKED_MIN_IDS", 1)
        assert isinstance(small.subset(some), PackedIdMap) or not some.size
        assert small.subset(some) == plain.subset(some) and small.subset(some[::-1]).ids[:] == [
            ids[r] for r in some[::-1]
        ]


def test_hash_collisions_never_map_a_wrong_row(monkeypatch):
    """Every id hashing alike: lookups walk the equal-hash run and still find the right row."""
    ids = [f"id{i}" for i in range(50)]
    monkeypatch.setattr("builtins.hash", lambda x: 7)
    small = packed(ids)  # built and asked with every id hashing to 7
    assert [small.row(x) for x in ids] == list(range(50))
    assert small.rows(ids + ["nope"]).tolist() == [*range(50), -1]


def test_a_map_known_distinct_builds_no_lookup_index_until_asked():
    ids = packed([f"u{i}" for i in range(1000)], distinct=True)
    assert not ids.indexed and ids.external(7) == "u7" and len(list(ids.ids)) == 1000
    assert not ids.indexed and ids.row("u999") == 999 and ids.indexed


def test_numbered_ids_are_a_packed_map_from_the_threshold(monkeypatch):
    assert type(numbered_ids(5)) is IdMap and numbered_ids(5).ids == ["0", "1", "2", "3", "4"]
    monkeypatch.setattr("ordrec.service.storage.idmap.PACKED_MIN_IDS", 3)
    assert isinstance(numbered_ids(5), PackedIdMap) and numbered_ids(5) == IdMap(list("01234"))


def test_an_extended_map_keeps_its_rows_and_packs_from_the_threshold(monkeypatch):
    """New ids (a training's events) take the next rows; a map that reaches the threshold
    is packed as a read's, with no lookup index until asked."""
    plain = IdMap(["a", "b"])
    assert type(plain.extended(["c"])) is IdMap and plain.extended(["c", "é"]).ids == ["a", "b", "c", "é"]
    monkeypatch.setattr("ordrec.service.storage.idmap.PACKED_MIN_IDS", 4)
    grown = plain.extended(["c", "é"])
    assert isinstance(grown, PackedIdMap) and not grown.indexed
    assert grown == IdMap(["a", "b", "c", "é"]) and grown.rows(["é", "a", "z"]).tolist() == [3, 0, -1]
    again = grown.extended(["d"])
    assert isinstance(again, PackedIdMap) and list(again.ids) == ["a", "b", "c", "é", "d"]


def test_duplicates_are_refused():
    with pytest.raises(ValueError, match="duplicate id 'b'"):
        packed(["a", "b", "c", "b"])


def test_large_id_spaces_load_packed_and_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr("ordrec.service.storage.idmap.PACKED_MIN_IDS", 10)
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
