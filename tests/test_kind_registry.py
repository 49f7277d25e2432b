"""One list of model kinds: a sixth kind added by registration alone is
trained, published, served and evaluated by the unchanged CLI, job, server
and protocol runner."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from ordrec.service.indices.models import index_class, kinds
from ordrec.service.serving.server import Server, ServerConfig
from ordrec.service.storage.registry import Registry
from ordrec.trainer.cli import build_parser, main
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.job import EXIT_PUBLISHED, run_job
from ordrec.trainer.models import estimator_class
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests import toy_kind


def test_builtin_kinds_and_what_each_registers():
    assert kinds.names() == ("dcr", "coe", "rtf", "score", "knnscal")
    assert kinds.map_names() == ("coe", "score", "knnscal")
    for name in kinds.names():
        kind = kinds.get(name)
        assert kind.estimator_class().kind == kind.index_class().kind == name
        assert callable(kind.protocol_module().run) and kind.summary


def test_unknown_kinds_are_refused_on_both_sides():
    with pytest.raises(kinds.UnknownKind, match="unknown model kind 'toy'"):
        index_class("toy")
    with pytest.raises(ValueError, match="known: dcr, coe, rtf, score, knnscal"):
        estimator_class("toy")
    with pytest.raises(ValueError, match="already registered differently"):
        kinds.register(kinds.ModelKind("dcr", index="x:Index", estimator="x:E", protocol="x", summary=""))


def test_a_registered_kind_is_known_everywhere(toy):
    assert "toy" in kinds.names() and "toy" not in kinds.map_names()
    assert estimator_class("toy") is toy_kind.Estimator and index_class("toy") is toy_kind.Index
    assert toy.input_shape == "ratings"
    args = build_parser().parse_args(["train", "toy", "--data", "x", "--registry", "r"])
    assert args.kind == "toy"


def test_a_sixth_kind_trains_publishes_serves_and_evaluates(toy, sample_dir, tmp_path, capsys):
    data_path = sample_dir / "ratings.data"
    registry = tmp_path / "registry"

    # trained and published by the CLI
    assert (
        main(
            ["train", "toy", "--data", str(data_path), "--registry", str(registry), "--set", "shrinkage=2.0"]
        )
        == 0
    )
    artifact = Registry(registry).load("toy")
    assert artifact.kind == "toy" and artifact.hyperparameters["shrinkage"] == 2.0

    # evaluated on a held-out part and published by the cron job (the floor off: the sample's
    # picks follow popularity alone, which a toy item-mean model does not beat)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nname = "toy"\nregistry = "{registry}"\n\n[data.r]\npath = "{data_path}"\n\n'
        '[[models]]\nname = "toy-job"\nkind = "toy"\ndata = "r"\ngate = { popularity_floor = false }\n'
    )
    assert run_job(job) == EXIT_PUBLISHED, capsys.readouterr().err
    metrics = Registry(registry).load("toy-job").metrics
    assert 0.0 < metrics["holdout_ndcg_at_10"] <= 1.0 and 0.0 <= metrics["holdout_hit_rate_at_10"] <= 1.0

    # the paper-style protocol through `ordrec-train reproduce`
    out = tmp_path / "rows.json"
    assert main(["reproduce", "toy", "--data", str(data_path), "--quiet", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["method"] == "toy" and row["runs"] == 2 and 0.0 < row["mean"] <= 1.0

    # served by a real gRPC server: the best-scored items the user has not rated
    server = Server(ServerConfig(registry=str(registry), port=0, metrics_port=-1, poll_interval=0)).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = recommender_pb2_grpc.RecommenderStub(channel)
            user = artifact.ids["users"].ids[0]
            reply = stub.Recommend(pb.RecommendRequest(model="toy", user_ids=[user], n=5), timeout=10)
    finally:
        server.stop(grace=1)
    data = read_input("ratings", str(data_path), "auto")
    rated = {data.items.ids[i] for i in data.item[data.user == data.users.row(user)]}
    assert rated.isdisjoint(item.id for item in reply.results[0].items)
    scores = toy_kind.Estimator(shrinkage=2.0).fit(data).item_score_
    unrated = np.array([i for i in range(data.n_items) if data.items.ids[i] not in rated])
    best = unrated[np.argsort(-scores[unrated], kind="stable")[:5]]
    assert [item.id for item in reply.results[0].items] == [data.items.ids[i] for i in best]
