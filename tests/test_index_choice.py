"""Choosing the item index's structure at publish (issue 31, item 4): ``structure="auto"``
builds and calibrates both the graph and the inverted file on the version's own users, keeps
the cheaper one that reaches the recall target, and records both in the manifest, which
``ordrec-train versions`` shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordrec.service.indices import ann
from ordrec.service.indices.models import build_index
from ordrec.service.storage.artifact import Artifact, SearchIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli

LEVELS = [1.0, 2.0, 3.0, 4.0, 5.0]  # four learned levels; linear relevance: every weight 0.5
N_USERS = 200


def _artifact(items: np.ndarray, users: np.ndarray, recall_target: float) -> Artifact:
    """A DCR version over planted factors whose item index chooses its structure."""
    n_items, width = items.shape
    rank = width // (len(LEVELS) - 1)
    queries = ann.Queries((users * 0.5).astype(np.float32))  # the users as served: level weights folded
    return Artifact(
        kind="dcr",
        arrays={
            "user_factors": users.astype(np.float32),
            "item_factors": items,
            "seen_indptr": np.zeros(N_USERS + 1, dtype=np.int64),
            "seen_indices": np.zeros(0, dtype=np.int32),
            "item_popularity": np.ones(n_items, dtype=np.float32),
        },
        ids={
            "users": IdMap([f"u{i}" for i in range(N_USERS)]),
            "items": IdMap([f"i{i}" for i in range(n_items)]),
        },
        attributes={"levels": LEVELS, "relevance": "linear", "rank": rank, "pairwise": False},
        indexes={"items": ann.item_index(items, {"recall_target": recall_target}, queries)},
    )


def spread_low_dimensional(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """4,000 items spread evenly over 8 dimensions: the graph finds the top-10 at its narrowest
    breadth, while the inverted file's 4-bit codes of two dimensions each cannot rank them
    (recall about 0.92 even scanning every list, measured)."""
    rng = np.random.default_rng(seed)
    items = rng.normal(size=(4000, 8))
    items *= 0.9 / np.linalg.norm(items, axis=1, keepdims=True)
    return items.astype(np.float32), rng.normal(size=(N_USERS, 8)).astype(np.float32)


def near_copies(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """3,000 items in groups of 30 near-copies (variants of one product): the graph's 8-bit
    codes cannot tell a group's members apart and re-score only 2n candidates (recall about
    0.75 at any breadth), the inverted file re-scores 10n (about 0.93, measured)."""
    rng = np.random.default_rng(seed)
    heads = rng.normal(size=(100, 16))
    heads /= np.linalg.norm(heads, axis=1, keepdims=True)
    items = np.repeat(heads, 30, axis=0) + 3e-4 * rng.normal(size=(3000, 16))
    items *= 0.9 / np.linalg.norm(items, axis=1, keepdims=True)
    return items.astype(np.float32), rng.normal(size=(N_USERS, 16)).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factors", "recall_target", "winner"),
    [(spread_low_dimensional, 0.97, "hnsw"), (near_copies, 0.85, "ivf")],
)
def test_publish_keeps_the_structure_that_reaches_the_target_and_records_both(
    tmp_path, factors, recall_target, winner
):
    items, users = factors()
    registry = Registry(tmp_path)
    artifact = _artifact(items, users, recall_target)
    version = registry.publish("big", artifact)
    manifest = json.loads((tmp_path / "big" / version / "manifest.json").read_text())
    (entry,) = manifest["indexes"]
    compared = entry["params"]["compared"]
    assert set(compared) == {"hnsw", "ivf"}
    for structure, figures in compared.items():
        breadth = ann.STRUCTURES[structure].breadth_param
        assert figures[breadth] >= 1 and 0.0 < figures["recall"] <= 1.0 and figures["us_per_query"] > 0
        assert figures["seconds"] >= 0.0
    assert entry["params"]["build_seconds"] >= max(f["seconds"] for f in compared.values())
    assert ann.cheaper(compared, recall_target) == winner
    assert entry["library"] == ann.STRUCTURES[winner].library
    assert entry["params"]["structure"] == winner
    assert entry["params"]["calibrated_recall"] == compared[winner]["recall"] >= recall_target
    assert [p.name for p in (tmp_path / "big" / version / "indexes").iterdir()] == [
        f"items.{entry['library']}"
    ]  # the other structure's file is not kept
    # The loaded version answers from the chosen file, and says so.
    served = build_index(registry.load("big"))
    assert served.ann is not None and served.ann.structure == winner
    rows, scores = served.recommend(0, 10)
    assert rows.size == 10 and np.all(np.diff(scores) <= 0)
    # The operator sees both structures' figures in the version list.
    listed = run_cli(["ordrec.trainer", "versions", "--registry", str(tmp_path)]).stdout
    assert f"index items: {entry['library']}" in listed
    for structure, figures in compared.items():
        assert f"{structure} " in listed and f"recall {figures['recall']:.3f}" in listed
        assert f"{figures['us_per_query']:.1f} us/query" in listed


figures_strategy = st.fixed_dictionaries(
    {
        "recall": st.floats(0.01, 1.0),
        "us_per_query": st.floats(0.1, 1e4),
    }
)


@given(hnsw=figures_strategy, ivf=figures_strategy, target=st.floats(0.01, 1.0))
def test_the_cheaper_structure_meeting_the_target_is_kept_else_the_better_recall(hnsw, ivf, target):
    figures = {"hnsw": hnsw, "ivf": ivf}
    chosen = ann.cheaper(figures, target)
    meeting = {s for s, f in figures.items() if f["recall"] >= target}
    if meeting:
        assert chosen in meeting
        assert figures[chosen]["us_per_query"] == min(figures[s]["us_per_query"] for s in meeting)
    else:
        assert figures[chosen]["recall"] == max(hnsw["recall"], ivf["recall"])


def test_auto_is_the_default_and_graph_parameters_alone_still_mean_the_graph():
    budget = ann.AUTO_DEFAULT_PARAMS["budget_seconds"]
    assert ann.build_params(None) == {"structure": "auto", "recall_target": 0.97, "budget_seconds": budget}
    assert ann.build_params({"recall_target": 0.9, "budget_seconds": 30}) == {
        "structure": "auto",
        "recall_target": 0.9,
        "budget_seconds": 30.0,
    }
    assert ann.build_params({"M": 12})["structure"] == "hnsw"
    assert ann.build_params({"structure": "ivf"})["structure"] == "ivf"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"structure": "auto", "M": 12}, "unknown index parameter 'M' for structure auto"),
        ({"structure": "auto", "recall_target": 0}, "recall_target must be in"),
        ({"structure": "auto", "recall_target": "high"}, "recall_target must be in"),
        ({"structure": "lsh"}, "structure must be one of hnsw, ivf, auto"),
        ({"budget_seconds": 0}, "budget_seconds must be a number > 0"),
        ({"budget_seconds": "1m"}, "budget_seconds must be a number > 0"),
    ],
)
def test_bad_auto_parameters_are_refused_naming_them(params, message):
    with pytest.raises(ValueError, match=message):
        ann.build_params(params)


def test_without_queries_auto_builds_the_uncalibrated_graph(tmp_path):
    items, _ = spread_low_dimensional()
    params = ann.build_params({})
    library = ann.write_index(items[:500], tmp_path / "index", params)
    assert library == ann.LIBRARY and params["structure"] == "hnsw"
    assert params["ef_search"] == ann.UNCALIBRATED_EF_SEARCH and "compared" not in params


def test_the_graph_is_not_built_when_its_predicted_build_exceeds_the_budget_left(tmp_path):
    # More items than the sample graph that predicts the build, so the prediction is measured;
    # a budget the inverted file alone uses up leaves the graph none.
    rng = np.random.default_rng(0)
    items = rng.normal(size=(ann.GRAPH_PROBE_ITEMS + 2000, 8)).astype(np.float32)
    queries = ann.Queries(rng.normal(size=(50, 8)).astype(np.float32))
    params = ann.build_params({"budget_seconds": 1e-3})
    library = ann.write_index(items, tmp_path / "index", params, queries)
    assert library == ann.IVF_LIBRARY and params["structure"] == "ivf"
    skipped = params["compared"]["hnsw"]
    assert skipped["skipped"] is True and skipped["predicted_seconds"] > skipped["left_seconds"]
    assert params["compared"]["ivf"]["seconds"] <= params["build_seconds"]
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # no graph file was written
    assert "hnsw not built: predicted" in ann.describe_choice(library, params)
    # The file serves: the version's items, its calibrated breadth.
    search = ann.AnnSearch.open(SearchIndex(library, params, path=tmp_path / "index"), items)
    rows, _ = search.search(queries.vectors[0], 10, None)
    assert rows.size == 10


def test_the_auto_build_records_wall_and_cpu_seconds_of_each_phase(tmp_path):
    # Issue 45 item 1: the version says where a publish's time went, each phase in order.
    rng = np.random.default_rng(0)
    items = rng.normal(size=(ann.GRAPH_PROBE_ITEMS + 2000, 8)).astype(np.float32)
    queries = ann.Queries(rng.normal(size=(50, 8)).astype(np.float32))
    params = ann.build_params({})
    ann.write_index(items, tmp_path / "index", params, queries)
    phases = params["build_phases"]
    assert list(phases) == [
        "exact tops",
        "ivf build",
        "ivf calibration",
        "ivf exclusions",
        "ivf cost",
        "hnsw prediction",
        "hnsw build",
        "hnsw calibration",
        "hnsw exclusions",
        "hnsw cost",
    ]
    for took in phases.values():
        assert took["seconds"] >= 0.0 and took["cpu_seconds"] >= 0.0
    assert sum(t["seconds"] for t in phases.values()) <= params["build_seconds"] + 0.05 * len(phases)
    # The manifest keeps them (JSON) and the published parameters still pass the check.
    assert ann.build_params(json.loads(json.dumps(params)))["build_phases"] == phases


def test_predicted_graph_build_is_measured_only_above_the_sample():
    rng = np.random.default_rng(0)
    params = ann.build_params({})
    small = rng.normal(size=(500, 8)).astype(np.float32)
    assert ann.predicted_graph_seconds(small, params, sample=500) == 0.0
    assert ann.predicted_graph_seconds(small, params, sample=100) > 0.0


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_faiss_threads_sleep_when_idle_unless_told_otherwise(tmp_path, given, seen):
    # Spinning OpenMP threads on a busy machine made faiss's PQ training 16x slower on two
    # threads than on one (docs/catalog.md); the policy is read when faiss loads, so it is
    # checked in a fresh process that builds an index.
    code = (
        "import os, pathlib, numpy as np\n"
        "from ordrec.service.indices import ann\n"
        "items = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)\n"
        f"path = pathlib.Path({str(tmp_path / 'index')!r})\n"
        "ann.write_index(items, path, ann.build_params({'M': 8}))\n"
        "print(os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == seen
