"""Redacted copies of versions naming forgotten users (``service/live/redaction.py``): every file
of the copy is free of the user's id, every other user gets exactly the original's answers,
the copy takes the original's place (newest stays live, pins and splits follow), and the
per-user lists lose exactly the user's rows (a property test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models import build_index
from ordrec.service.live.forgotten import user_digest
from ordrec.service.live.redaction import (
    UserLists,
    redact_artifact,
    redact_version,
    successor_version,
    without_list_rows,
)
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.registry import Registry
from tests.conftest import SAMPLE_MODELS, train_into

USER = "u001"
QUICK = [
    ("dcr", "dcr", "ratings.data", ["--set", "max_iter=2"]),
    ("coe", "coe", "ratings.data", ["--set", "max_iter=2"]),
    next(m for m in SAMPLE_MODELS if m[0] == "rtf"),
]


@pytest.fixture(scope="module")
def trained(sample_dir, tmp_path_factory) -> Path:
    """The sample's recommenders and tag model, trained briefly (one version each)."""
    return train_into(tmp_path_factory.mktemp("redaction") / "registry", sample_dir, QUICK)


@pytest.fixture
def registry(trained, tmp_path) -> Registry:
    """A private copy of the trained registry."""
    shutil.copytree(trained, tmp_path / "registry")
    return Registry(tmp_path / "registry")


def every_file(folder: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()]


def test_each_kind_naming_users_gets_a_copy_without_the_user_and_same_answers_for_the_rest(registry):
    for name in ("dcr", "coe", "rtf"):
        (version,) = registry.versions(name)
        before = registry.load(name, version, mmap=False)  # the original is deleted below
        assert USER in before.ids["users"].ids
        copy = redact_version(registry, name, version, {user_digest(USER)})
        assert copy is not None and registry.versions(name) == [copy] and copy > version
        files = every_file(registry.root / name / copy)
        assert files and not [p for p, body in files if f"{USER}\n".encode() in body or USER.encode() in body]
        after = registry.load(name, copy)
        assert after.attributes["redacted_from"] == version
        assert after.ids["users"].ids == [u for u in before.ids["users"].ids if u != USER]
        old, new = build_index(before), build_index(after)
        for user in after.ids["users"].ids[:40]:
            r_old, r_new = int(old.users.rows([user])[0]), int(new.users.rows([user])[0])
            if name == "rtf":
                item = 0
                assert np.array_equal(old.tags(r_old, item, 5)[1], new.tags(r_new, item, 5)[1])
                assert np.array_equal(old.own_tags(r_old, item), new.own_tags(r_new, item))
                continue
            assert np.array_equal(old.seen(r_old), new.seen(r_new))
            a = old.recommend(r_old, 10, exclude=old.seen(r_old))
            b = new.recommend(r_new, 10, exclude=new.seen(r_new))
            assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1])


def test_versions_not_naming_the_user_are_left_alone(registry):
    (version,) = registry.versions("dcr")
    assert redact_version(registry, "dcr", version, {user_digest("nobody-here")}) is None
    assert registry.versions("dcr") == [version]
    a_map = Artifact("knnscal", {"coordinates": np.zeros((3, 2))}, {})  # names objects, not users
    assert redact_artifact(a_map, {user_digest(USER)}) is None


def test_pins_and_splits_follow_the_copy(registry):
    first = registry.versions("dcr")[0]
    shutil.copytree(registry.root / "dcr" / first, registry.root / "dcr" / "tmp-second")
    # a second version: the same files under a later name (its manifest names it)
    second = first
    for _ in range(10):  # ten microseconds later: room between them for the first's copy
        second = successor_version([second], second)
    manifest = (registry.root / "dcr" / "tmp-second" / "manifest.json").read_text()
    (registry.root / "dcr" / "tmp-second" / "manifest.json").write_text(manifest.replace(first, second))
    (registry.root / "dcr" / "tmp-second").rename(registry.root / "dcr" / second)
    registry.pin("dcr", first)
    registry.set_split("dcr", second, 0.25)
    digests = {user_digest(USER)}
    pinned_copy = redact_version(registry, "dcr", first, digests)
    candidate_copy = redact_version(registry, "dcr", second, digests)
    assert registry.versions("dcr") == [pinned_copy, candidate_copy]
    assert first < pinned_copy < second < candidate_copy
    assert registry.pinned("dcr") == pinned_copy and registry.live_version("dcr") == (pinned_copy, "pinned")
    split = registry.split("dcr")
    assert split is not None and (split.candidate, split.share) == (candidate_copy, 0.25)


def test_no_room_for_a_successor_is_an_error():
    assert (
        successor_version(["20261127T101307.000001Z"], "20261127T101307.000001Z") == "20261127T101307.000002Z"
    )
    taken = ["20261127T101307.000001Z", "20261127T101307.000002Z"]
    with pytest.raises(ArtifactError, match="no free version name"):
        successor_version(taken, taken[0])


def test_an_unknown_per_user_array_is_refused_not_copied(registry):
    artifact = registry.load("dcr")
    artifact.arrays = {**artifact.arrays, "user_secrets": np.zeros(len(artifact.ids["users"]))}
    with pytest.raises(ArtifactError, match="user_secrets"):
        redact_artifact(artifact, {user_digest(USER)})


@st.composite
def nested_lists(draw):
    """Per-user posts, each a list of tags, as CSR arrays, and which users go."""
    posts = draw(
        st.lists(st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3), min_size=1, max_size=8)
    )
    gone = np.array(draw(st.lists(st.booleans(), min_size=len(posts), max_size=len(posts))))
    return posts, gone


def csr(rows: list[list]) -> tuple[np.ndarray, list]:
    return np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64), [
        x for r in rows for x in r
    ]


@given(nested_lists())
@settings(max_examples=200, deadline=None)
def test_without_list_rows_keeps_exactly_the_other_users_lists(case):
    posts, gone = case
    post_indptr, flat_posts = csr(posts)
    tag_indptr, tags = csr(flat_posts)
    arrays = {
        "post_indptr": post_indptr,
        "post_items": np.arange(len(flat_posts)),  # each post's own number
        "post_tag_indptr": tag_indptr,
        "post_tags": np.array(tags, dtype=np.int64),
    }
    lists = UserLists("post_indptr", ("post_items",), (UserLists("post_tag_indptr", ("post_tags",)),))
    out = without_list_rows(arrays, lists, gone)
    kept = [p for p, g in zip(posts, gone) if not g]
    want_indptr, want_posts = csr(kept)
    want_tag_indptr, want_tags = csr(want_posts)
    assert out["post_indptr"].tolist() == want_indptr.tolist()
    assert out["post_tag_indptr"].tolist() == want_tag_indptr.tolist()
    assert out["post_tags"].tolist() == want_tags
    numbered = [n for n, g in zip(np.split(np.arange(len(flat_posts)), post_indptr[1:-1]), gone) if not g]
    assert out["post_items"].tolist() == [int(x) for n in numbered for x in n]


def test_the_cli_fails_when_a_version_could_not_be_redacted(tmp_path):
    from ordrec.service.storage.idmap import IdMap
    from ordrec.tools.process import run_cli

    registry = Registry(tmp_path)
    version = registry.publish(
        "dcr", Artifact("dcr", {"user_secrets": np.zeros(2)}, {"users": IdMap(["a", "b"])})
    )
    result = run_cli(
        ["ordrec.trainer", "registry", "forget", "--registry", str(tmp_path), "--user", "a"], check=False
    )
    assert result.returncode == 1 and "run the erasure again" in result.stderr
    assert f"dcr@{version}" in result.stdout and "user_secrets" in result.stdout
    assert registry.versions("dcr") == [version]  # left as it was, reported
