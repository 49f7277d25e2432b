"""Comparing versions live: a SPLIT file beside PINNED sends a stable share of users to a
candidate version; both stay loaded, each reply says its version, promote makes the
candidate live. The registry part runs on a local folder and on S3 (moto) alike."""

from __future__ import annotations

import hashlib
import urllib.request

import grpc
import numpy as np
import pytest

from ordrec.service.metrics import Metrics
from ordrec.service.serving.store import ModelStore, user_bucket
from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.objectstore import open_registry
from ordrec.service.storage.policy import SPLIT_FILE
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.test_dcr_index import artifact


@pytest.fixture(params=["local", "s3"])
def registry(request, tmp_path):
    if request.param == "local":
        return Registry(tmp_path / "registry")
    return open_registry(request.getfixturevalue("s3_url"), cache_dir=tmp_path / "cache")


def publish_versions(registry, count: int = 3) -> list[str]:
    return [registry.publish("dcr", artifact(n_users=20, n_items=30, seed=seed)) for seed in range(count)]


# ------------------------------------------------------------- the registry
def test_split_promote_and_off_through_the_same_code_on_every_backend(registry):
    v1, v2, v3 = publish_versions(registry)
    registry.pin("dcr", v1)
    assert registry.split("dcr") is None
    split = registry.set_split("dcr", v2, 0.25)
    assert registry.split("dcr") == split and (split.candidate, split.share) == (v2, 0.25)
    assert registry.live_version("dcr") == (v1, "pinned")  # the split leaves the live version alone
    assert registry.prune("dcr", keep=1) == []  # v3 newest, v1 pinned, v2 the candidate: all kept
    assert registry.promote("dcr") == v2
    assert registry.live_version("dcr") == (v2, "pinned") and registry.split("dcr") is None
    registry.set_split("dcr", v3, 1.0)
    registry.clear_split("dcr")
    assert registry.split("dcr") is None
    with pytest.raises(ArtifactError, match="no split to promote"):
        registry.promote("dcr")


@pytest.mark.parametrize(
    "candidate, share, match",
    [("20990101T000000.000000Z", 0.1, "no version"), (None, 0.0, r"\(0, 1\]"), (None, 1.5, r"\(0, 1\]")],
)
def test_a_bad_split_is_refused(tmp_path, candidate, share, match):
    registry = Registry(tmp_path)
    v1, v2 = publish_versions(registry, 2)
    with pytest.raises(ArtifactError, match=match):
        registry.set_split("dcr", candidate or v1, share)
    with pytest.raises(ArtifactError, match="already the live version"):
        registry.set_split("dcr", v2, 0.5)  # unpinned: the newest is live
    assert registry.split("dcr") is None


def test_a_malformed_split_file_names_itself(tmp_path):
    registry = Registry(tmp_path)
    publish_versions(registry, 1)
    (tmp_path / "dcr" / SPLIT_FILE).write_text("candidate=v2\n")
    with pytest.raises(ArtifactError, match="SPLIT: not a split"):
        registry.split("dcr")


# --------------------------------------------------------------- the hash
def test_user_buckets_are_a_stable_hash_with_the_right_shares():
    digest = hashlib.sha256(b"dcr\x00alice").digest()
    assert user_bucket("dcr", "alice") == int.from_bytes(digest[:8], "big") / 2.0**64
    buckets = np.array([user_bucket("dcr", f"user-{k}") for k in range(10_000)])
    for share in (0.01, 0.1, 0.5):
        # binomial: 4 standard deviations of a share measured over 10^4 users
        assert abs((buckets < share).mean() - share) < 4 * np.sqrt(share * (1 - share) / 10_000)
    other = np.array([user_bucket("coe", f"user-{k}") for k in range(10_000)])
    assert abs(np.corrcoef(buckets, other)[0, 1]) < 0.05  # each model splits its own way


# -------------------------------------------------------------- the store
def test_the_store_loads_both_versions_and_promote_reuses_the_candidate(tmp_path):
    registry = Registry(tmp_path)
    v1, v2, _ = publish_versions(registry)
    registry.pin("dcr", v1)
    registry.set_split("dcr", v2, 0.3)
    metrics = Metrics()
    store = ModelStore(registry, metrics)
    assert store.refresh() == ["dcr"]
    live, candidate = store.snapshot()["dcr"], store.candidate("dcr")
    assert (live.version, candidate.model.version, candidate.share) == (v1, v2, 0.3)
    users = [f"user-{k}" for k in range(2000)]
    chosen = {u: store.for_user(live, u).version for u in users}
    assert chosen == {u: store.for_user(live, u).version for u in users}  # a user keeps their version
    assert {u for u, v in chosen.items() if v == v2} == {u for u in users if user_bucket("dcr", u) < 0.3}
    assert _info_versions(metrics) == {(v1, "pinned"), (v2, "candidate")}
    metrics.recommended_users.labels("dcr", v1).inc()
    assert store.refresh() == []  # nothing changed
    registry.promote("dcr")
    assert store.refresh() == ["dcr"]
    promoted = store.snapshot()["dcr"]
    assert promoted.version == v2 and promoted.index is candidate.model.index  # no second load
    assert store.candidate("dcr") is None and store.for_user(promoted, users[0]) is promoted
    assert _info_versions(metrics) == {(v2, "pinned")}
    assert not [
        s for f in metrics.recommended_users.collect() for s in f.samples if s.labels["version"] == v1
    ]


def _info_versions(metrics: Metrics) -> set[tuple[str, str]]:
    return {
        (s.labels["version"], s.labels["reason"]) for f in metrics.model_info.collect() for s in f.samples
    }


# ------------------------------------------------- a real server and the CLI
def _train(registry: Registry, sample_registry) -> tuple[str, str]:
    """Two DCR versions that answer differently (the sample's, and its factors reversed)."""
    base = Registry(sample_registry).load("dcr", mmap=False)
    v1 = registry.publish("dcr", base)
    flipped = Registry(sample_registry).load("dcr", mmap=False)
    flipped.arrays = {**flipped.arrays, "user_factors": -np.asarray(flipped.arrays["user_factors"])}
    return v1, registry.publish("dcr", flipped)


def _versions_of(stub, users: list[str]) -> dict[str, str]:
    reply = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=users, n=5), timeout=10)
    return {r.user_id: r.model_version for r in reply.results}


def test_a_split_against_a_real_server_and_the_cli(sample_registry, tmp_path):
    root = tmp_path / "registry"
    registry = Registry(root)
    v1, v2 = _train(registry, sample_registry)
    cli = ["ordrec.trainer"]
    assert (
        run_cli(
            [*cli, "registry", "pin", "--registry", str(root), "--model", "dcr", "--version", v1]
        ).returncode
        == 0
    )
    bad = run_cli(
        [*cli, "registry", "split", "dcr", "--registry", str(root), "--candidate", v2, "--share", "2"],
        check=False,
    )
    assert bad.returncode == 2 and "--share: must be a finite number in (0, 1], got" in bad.stderr
    none = run_cli([*cli, "registry", "promote", "dcr", "--registry", str(root)], check=False)
    assert none.returncode == 1 and "no split to promote" in none.stderr
    users = Registry(sample_registry).load("dcr").ids["users"].ids[:60] + [f"new-{k}" for k in range(20)]
    expected = {u: v2 if user_bucket("dcr", u) < 0.5 else v1 for u in users}
    assert set(expected.values()) == {v1, v2}
    with (
        ServerProcess(root, "--poll-interval", "0.2") as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        assert set(_versions_of(stub, users).values()) == {v1}
        out = run_cli(
            [*cli, "registry", "split", "dcr", "--registry", str(root), "--candidate", v2, "--share", "0.5"]
        )
        assert "50.0% of users to " + v2 in out.stdout
        listing = run_cli([*cli, "registry", "versions", "--registry", str(root), "--model", "dcr"]).stdout
        assert f"{v2}\tcandidate:0.5" in listing
        wait_for(lambda: _model_info(stub).candidate_version == v2, 20, what="the candidate loaded")
        assert _model_info(stub).candidate_share == 0.5 and _model_info(stub).version == v1
        for _ in range(3):  # the same version for a user, request after request
            assert _versions_of(stub, users) == expected
        one = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=users[:1], n=5), timeout=10)
        assert one.model_version == expected[users[0]]
        mixed = stub.Recommend(pb.RecommendRequest(model="dcr", user_ids=users, n=5), timeout=10)
        assert mixed.model_version == v1  # a batch over both versions names the live one
        text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5).read().decode()
        for version in (v1, v2):
            assert f'ordrec_recommend_users_total{{model="dcr",version="{version}"}}' in text
        out = run_cli([*cli, "registry", "promote", "dcr", "--registry", str(root)])
        assert f"promoted dcr@{v2}" in out.stdout
        wait_for(lambda: _model_info(stub).version == v2, 20, what="the promoted version live")
        assert not _model_info(stub).candidate_version
        assert set(_versions_of(stub, users).values()) == {v2}
        text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5).read().decode()
        assert f'version="{v1}"' not in text  # the unloaded version's series are gone


def _model_info(stub) -> pb.ModelInfo:
    return next(m for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models if m.name == "dcr")


def test_a_refused_candidate_leaves_every_user_on_the_live_version(tmp_path, caplog):
    registry = Registry(tmp_path)
    v1, v2, _ = publish_versions(registry)
    registry.pin("dcr", v1)
    registry.set_split("dcr", v2, 0.5)
    (tmp_path / "dcr" / v2 / "arrays" / "item_factors.npy").write_bytes(b"corrupt")
    metrics = Metrics()
    store = ModelStore(registry, metrics)
    assert store.refresh() == ["dcr"]
    live = store.snapshot()["dcr"]
    assert store.candidate("dcr") is None and {store.for_user(live, f"u{k}").version for k in range(50)} == {
        v1
    }
    assert metrics.registry.get_sample_value("ordrec_model_load_failures_total", {"model": "dcr"}) == 1
    caplog.clear()
    with caplog.at_level("INFO", logger="ordrec.service"):
        assert store.refresh() == []  # refused once, never retried, nothing logged again
    assert not caplog.records
