"""The storage part's shared pieces: the HIDDEN file format and the registry backends' base."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordrec.service.storage.hidden_items import hidden_file, hidden_ids
from ordrec.service.storage.objectstore import S3Registry
from ordrec.service.storage.policy import LiveVersions
from ordrec.service.storage.registry import Registry

# Item ids as the HIDDEN file holds them: one a line, so no line-break character of any kind.
ITEM_IDS = st.frozensets(
    st.text(st.characters(categories=["L", "N", "P", "S"], exclude_characters="\x85\u2028\u2029"), min_size=1)
)


@given(ITEM_IDS)
def test_hidden_file_round_trips_its_ids(ids):
    assert hidden_ids(hidden_file(ids)) == ids


def test_hidden_file_is_sorted_one_id_a_line_and_blank_lines_are_ignored():
    assert hidden_file(["b", "a"]) == b"a\nb\n"
    assert hidden_ids(b"a\n\nb\r\n") == frozenset({"a", "b"})
    assert hidden_file([]) == b"" and hidden_ids(b"") == frozenset()


def test_a_hidden_file_that_is_not_utf8_is_refused():
    with pytest.raises(UnicodeDecodeError):
        hidden_ids(b"\xff\n")


def test_both_registries_implement_the_one_base():
    assert issubclass(Registry, LiveVersions) and issubclass(S3Registry, LiveVersions)


def test_a_backend_that_leaves_out_a_primitive_cannot_be_made():
    class ListingOnly(LiveVersions):
        root = "nowhere"

        def models(self) -> list[str]:
            return []

        def versions(self, name: str) -> list[str]:
            return []

    with pytest.raises(TypeError, match="abstract"):
        ListingOnly()  # type: ignore[abstract]
