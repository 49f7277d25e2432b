"""Large catalogues (issue 17): the approximate item index published with a DCR
version, verified at load, and answering Recommend with exact scoring's semantics."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import faiss
import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordrec.service.indices import ann
from ordrec.service.indices.models import build_index
from ordrec.service.storage.artifact import Artifact, ArtifactError, SearchIndex
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli
from ordrec.trainer import sample
from ordrec.trainer.models.pipeline import configure
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

N_ITEMS, N_USERS, RANK, LEVELS = 3000, 200, 6, [1.0, 2.0, 3.0, 4.0, 5.0]
SMALL_GRAPH = {"M": 12, "ef_construction": 40, "ef_search": 32}
SMALL_GRAPH_SERVES = "faiss-hnsw-ip M=12 ef_search=32 storage=sq8"  # ListModels' and the metric's text
SMALL_IVF = {"structure": "ivf", "nlist": 32, "nprobe": 6}


def clustered_artifact(seed: int = 0, with_index: bool = True, graph: dict | None = None) -> Artifact:
    """A DCR artifact whose item factors form clusters (as trained ones do), inside the unit ball."""
    rng = np.random.default_rng(seed)
    width = (len(LEVELS) - 1) * RANK
    centers = rng.normal(size=(20, width))
    items = centers[rng.integers(0, 20, N_ITEMS)] + 0.7 * rng.normal(size=(N_ITEMS, width))
    items *= rng.uniform(0.1, 1.0, (N_ITEMS, 1)) / np.linalg.norm(items, axis=1, keepdims=True)
    users = centers[rng.integers(0, 20, N_USERS)] + rng.normal(size=(N_USERS, width))
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    seen = np.sort(rng.choice(N_ITEMS, (N_USERS, 10)), axis=1)
    items = items.astype(np.float32)
    return Artifact(
        kind="dcr",
        arrays={
            "user_factors": users.astype(np.float32),
            "item_factors": items,
            "seen_indptr": np.arange(0, N_USERS * 10 + 1, 10, dtype=np.int64),
            "seen_indices": seen.reshape(-1).astype(np.int32),
            "item_popularity": rng.random(N_ITEMS).astype(np.float32),
        },
        ids={
            "users": IdMap([f"u{i}" for i in range(N_USERS)]),
            "items": IdMap([f"i{i}" for i in range(N_ITEMS)]),
        },
        attributes={"levels": LEVELS, "relevance": "linear", "rank": RANK, "pairwise": False},
        indexes={"items": ann.item_index(items, graph or SMALL_GRAPH)} if with_index else {},
    )


def served_clustered(folder: Path):
    """The default clustered catalogue published into ``folder`` and loaded, with its item index."""
    registry = Registry(folder)
    registry.publish("big", clustered_artifact())
    served = build_index(registry.load("big"))
    assert served.ann is not None
    return served


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("catalog"))
    reg.publish("big", clustered_artifact())
    reg.publish("big_flat", clustered_artifact(graph={**SMALL_GRAPH, "storage": "flat"}))
    reg.publish("big_ivf", clustered_artifact(graph=SMALL_IVF))
    reg.publish("small", clustered_artifact(with_index=False))
    return reg


@pytest.fixture(scope="module", params=["sq8", "flat", "ivf"])
def served(registry, request):
    """The graph over 8-bit codes re-scored exactly (the default), over float vectors, and the
    inverted file of 4-bit codes re-scored exactly."""
    return build_index(registry.load({"sq8": "big", "flat": "big_flat", "ivf": "big_ivf"}[request.param]))


def test_publish_lists_the_index_with_its_checksum_and_load_opens_it(registry):
    served = build_index(registry.load("big"))
    folder = registry.root / "big" / registry.versions("big")[-1]
    manifest = json.loads((folder / "manifest.json").read_text())
    (entry,) = manifest["indexes"]
    assert entry["name"] == "items" and entry["library"] == ann.LIBRARY and len(entry["sha256"]) == 64
    assert (folder / entry["path"]).stat().st_size == int(entry["size_bytes"])
    published = ann.build_params(SMALL_GRAPH)  # the defaults of what the test leaves out, e.g. storage
    assert entry["params"] == {k: v if isinstance(v, str) else float(v) for k, v in published.items()}
    assert served.ann is not None and served.search == SMALL_GRAPH_SERVES
    assert build_index(registry.load("small")).search == "exact"


def test_index_answers_close_to_exact(served):
    hits = 0
    for user in range(N_USERS):
        rows, scores = served.recommend(user, 10, exclude=served.seen(user))
        exact_rows, _ = served.recommend_exact(user, 10, exclude=served.seen(user))
        hits += np.intersect1d(rows, exact_rows).size
        # the scores are the model's scores of those items, best first
        np.testing.assert_allclose(scores, served.score_items(user, rows), rtol=1e-5, atol=1e-5)
    assert hits / (10 * N_USERS) >= 0.9


def test_excluding_a_users_best_items_widens_the_search_so_recall_holds(served):
    # The excluded items crowd the region the search starts from (the graph's entry, the
    # inverted file's nearest lists): the search must reach past them.
    hits = 0
    for user in range(0, N_USERS, 4):
        best, _ = served.recommend_exact(user, 60)
        rows, _ = served.recommend(user, 10, exclude=best)
        exact_rows, _ = served.recommend_exact(user, 10, exclude=best)
        hits += np.intersect1d(rows, exact_rows).size
    assert hits / (10 * len(range(0, N_USERS, 4))) >= 0.9


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    user=st.integers(0, N_USERS - 1),
    n=st.integers(1, 120),
    excluded=st.one_of(st.integers(0, 140), st.integers(140, N_ITEMS)),
    seed=st.integers(0, 2**31),
)
def test_no_excluded_item_and_n_results_whenever_n_are_eligible(served, user, n, excluded, seed):
    # Exclusions from the user's own best items (the hardest case for a graph walk) and at random,
    # from none up to the whole catalogue (beyond MAX_EXCLUDED_FRACTION the exact pass answers).
    rng = np.random.default_rng(seed)
    best, _ = served.recommend_exact(user, min(excluded, N_ITEMS))
    pool = np.concatenate([best[: excluded // 2], rng.integers(0, N_ITEMS, excluded)])
    exclude = rng.permutation(pool)[:excluded]
    rows, scores = served.recommend(user, n, exclude=exclude)
    eligible = N_ITEMS - np.unique(exclude).size
    assert rows.size == min(n, eligible)
    assert not np.isin(rows, exclude).any()
    assert np.unique(rows).size == rows.size
    assert np.all(np.diff(scores) <= 1e-6)
    np.testing.assert_allclose(scores, served.score_items(user, rows), rtol=1e-5, atol=1e-5)
    many = served.recommend_many(np.array([user, user]), n, excludes=[exclude, None])
    np.testing.assert_array_equal(many[0][0], rows)
    assert many[1][0].size == min(n, N_ITEMS)


def test_threads_searching_at_once_answer_as_one_thread_does_each_on_one_faiss_thread(served):
    # A server's worker threads share one opened index. OpenMP counts threads per calling
    # thread: a worker whose count is the core count must still search on one.
    users = np.arange(0, N_USERS, 5)
    alone = [served.recommend(int(u), 10, exclude=served.seen(int(u)))[0] for u in users]
    answers: dict[int, list[np.ndarray]] = {}
    threads_after: dict[int, int] = {}

    def worker(k: int) -> None:
        faiss.omp_set_num_threads(2)  # what a new thread inherits on a two-core machine
        answers[k] = [served.recommend(int(u), 10, exclude=served.seen(int(u)))[0] for u in users]
        threads_after[k] = faiss.omp_get_max_threads()

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert threads_after == {k: 1 for k in range(4)}
    for k in range(4):
        for got, want in zip(answers[k], alone):
            np.testing.assert_array_equal(got, want)


def test_a_thread_makes_its_search_parameters_once_per_breadth(served, monkeypatch):
    # Issue 45 item 3: faiss's parameter objects cost more to make than the search they steer.
    made = []
    for name in ("SearchParametersHNSW", "SearchParametersIVF"):
        original = getattr(faiss, name)
        monkeypatch.setattr(faiss, name, lambda original=original: made.append(1) or original())
    first, _ = served.recommend(7, 10, exclude=served.seen(7))
    for _ in range(20):
        rows, _ = served.recommend(7, 10, exclude=served.seen(7))
        np.testing.assert_array_equal(rows, first)
    assert len(made) <= 2  # the first call's (graph; or lists and their centroids' walk), if any


def test_the_graph_answers_small_exclusions_and_the_exact_pass_large_ones(served, monkeypatch):
    calls = []

    def counted_exact(self, *args, **kwargs):
        calls.append(1)
        return np.empty(0, np.int64), np.empty(0, np.float32)

    monkeypatch.setattr(type(served), "recommend_exact", counted_exact)
    served.recommend(0, 10, exclude=np.arange(10))
    assert calls == []
    served.recommend(0, 10, exclude=np.arange(int(ann.MAX_EXCLUDED_FRACTION * N_ITEMS) + 1))
    assert calls == [1]


def test_a_folded_in_user_is_answered_by_the_graph_close_to_exact(served, monkeypatch):
    full_scans = []  # scoring every item is what the graph avoids
    score_vector = type(served).score_vector

    def counted(self, vector, item_rows=None):
        if item_rows is None:
            full_scans.append(1)
        return score_vector(self, vector, item_rows)

    monkeypatch.setattr(type(served), "score_vector", counted)
    hits = 0
    for user in range(N_USERS):
        rated = served.seen(user)
        vector = served.fold_in(rated, np.full(rated.size, served.levels[-1]))
        rows, scores = served.recommend_for(vector, 10, exclude=rated)
        exact = score_vector(served, vector)
        exact[rated] = -np.inf
        hits += np.intersect1d(rows, np.argsort(-exact, kind="stable")[:10]).size
        np.testing.assert_allclose(scores, score_vector(served, vector, rows), rtol=1e-5, atol=1e-5)
    assert full_scans == []  # the graph answered every time
    assert hits / (10 * N_USERS) >= 0.9


def test_candidate_lists_are_scored_exactly(served):
    candidates = np.arange(0, N_ITEMS, 7)
    rows, scores = served.recommend(3, 5, exclude=candidates[:2], candidates=candidates)
    exact = served.score_items(3, candidates)
    exact[:2] = -np.inf
    np.testing.assert_array_equal(rows, candidates[np.argsort(-exact, kind="stable")[:5]])


def test_tampered_index_file_is_refused_at_load(tmp_path):
    reg = Registry(tmp_path)
    version = reg.publish("big", clustered_artifact())
    path = next((tmp_path / "big" / version / "indexes").iterdir())
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        reg.load("big")


def _other_vectors(items: np.ndarray, how: str) -> np.ndarray:
    if how == "fewer rows":
        return items[:-1]
    other = items.copy()
    other[::7] *= 0.5  # every 7th row: the spot check of a spread of rows meets some
    return other


@pytest.mark.parametrize(
    "how, error",
    [("fewer rows", "indexes 2999"), ("other values", "does not hold the version's item factors")],
)
@pytest.mark.parametrize("storage", ["sq8", "flat", "ivf"])
def test_index_over_other_items_is_refused(tmp_path, how, error, storage):
    artifact = clustered_artifact()
    graph = SMALL_IVF if storage == "ivf" else {**SMALL_GRAPH, "storage": storage}
    artifact.indexes = {"items": ann.item_index(_other_vectors(artifact.arrays["item_factors"], how), graph)}
    reg = Registry(tmp_path)
    reg.publish("big", artifact)
    with pytest.raises(ArtifactError, match=error):
        build_index(reg.load("big"))


def test_exact_scoring_reads_the_float_vectors_the_index_holds_or_re_scores_with(served):
    """Held once: a flat graph's exact path scores from the graph's own memory-mapped vectors;
    a quantised graph holds one byte per dimension and both paths read the version's factor file."""
    version = served.artifact.array("item_factors")
    assert np.array_equal(served.item_factors, version)
    assert not served.item_factors.flags.writeable
    if served.ann.structure == "ivf":  # 4-bit codes: half a byte per dimension, floats from the version
        assert (
            np.shares_memory(served.item_factors, version) and served.ann.index.code_size <= version.shape[1]
        )
        return
    storage = faiss.downcast_index(served.ann.index.storage)
    if served.ann.quantised:
        assert np.shares_memory(served.item_factors, version) and storage.code_size == version.shape[1]
    else:
        assert not np.shares_memory(served.item_factors, version)
        assert served.item_factors.ctypes.data == storage.get_xb().__int__()


def test_calibration_picks_the_narrowest_breadth_that_reaches_the_recall_target(tmp_path):
    artifact = clustered_artifact(with_index=False)
    items = artifact.arrays["item_factors"]
    users, seen = _served_queries(artifact)
    params = ann.build_params({"M": 8, "ef_construction": 40, "recall_target": 0.99})
    ann.write_index(items, tmp_path / "g", params, ann.Queries(users, seen))
    chosen, recall = params["ef_search"], params["calibrated_recall"]
    assert chosen in ann.EF_LADDER and recall >= 0.99
    search = ann.AnnSearch.open(SearchIndex(ann.LIBRARY, params, path=tmp_path / "g"), items)
    assert _recall(search, users, seen) == pytest.approx(recall, abs=1e-4)  # what it measured is what serves
    narrower = ann.EF_LADDER.index(chosen) - 1
    assert narrower >= 0  # a target above the narrowest breadth's recall, so the next check means something
    search.breadth = ann.EF_LADDER[narrower]
    assert _recall(search, users, seen) < 0.99  # one step narrower misses the target
    search.breadth = chosen
    assert search.description.endswith(f"ef_search={chosen} storage=sq8 recall@10={recall:.3f}")


def test_the_inverted_file_calibrates_the_lists_it_scans_like_the_graph_its_breadth(tmp_path):
    artifact = clustered_artifact(with_index=False)
    items = artifact.arrays["item_factors"]
    users, seen = _served_queries(artifact)
    params = ann.build_params({"structure": "ivf", "recall_target": 0.99})
    ann.write_index(items, tmp_path / "f", params, ann.Queries(users, seen))
    assert params["nlist"] == ann.auto_nlist(N_ITEMS) == 64  # 4 sqrt(3000) = 219, but 39 items a list
    chosen, recall = params["nprobe"], params["calibrated_recall"]
    assert recall >= 0.99
    search = ann.AnnSearch.open(SearchIndex(ann.IVF_LIBRARY, params, path=tmp_path / "f"), items)
    assert _recall(search, users, seen) == pytest.approx(recall, abs=1e-4)
    ladder = search.ladder()
    assert ladder[-1] == 64 and chosen in ladder and ladder.index(chosen) > 0
    search.breadth = ladder[ladder.index(chosen) - 1]
    assert _recall(search, users, seen) < 0.99  # one step fewer lists misses the target
    search.breadth = chosen
    assert (
        search.description
        == f"faiss-ivf-ip nlist=64 nprobe={chosen} storage=pq4 rerank=10 recall@10={recall:.3f}"
    )


def test_an_inverted_file_over_items_with_zero_factors_loads(tmp_path):
    # A trained model leaves never-rated items at zero: the load check must still verify them.
    artifact = clustered_artifact(with_index=False)
    items = artifact.arrays["item_factors"]
    items[::7] = 0.0
    artifact.indexes = {"items": ann.item_index(items, SMALL_IVF)}
    reg = Registry(tmp_path)
    reg.publish("big", artifact)
    served = build_index(reg.load("big"))
    assert served.search.startswith("faiss-ivf-ip") and served.recommend(0, 10)[0].size == 10


def test_an_index_file_of_the_other_structure_is_refused(tmp_path):
    artifact = clustered_artifact(with_index=False)
    items = artifact.arrays["item_factors"]
    params = ann.build_params(SMALL_IVF)
    ann.write_index(items, tmp_path / "f", params)
    with pytest.raises(ArtifactError, match="not a faiss-hnsw-ip index"):
        ann.AnnSearch.open(
            SearchIndex(ann.LIBRARY, ann.build_params(SMALL_GRAPH), path=tmp_path / "f"), items
        )


def test_calibration_that_cannot_reach_the_target_keeps_the_widest_breadth_and_says_its_recall(
    tmp_path, monkeypatch
):
    artifact = clustered_artifact(with_index=False)
    users, seen = _served_queries(artifact)
    monkeypatch.setattr(ann, "EF_LADDER", (1, 2))
    params = ann.build_params({"M": 4, "ef_construction": 8, "recall_target": 1.0})
    ann.write_index(artifact.arrays["item_factors"], tmp_path / "g", params, ann.Queries(users, seen))
    assert params["ef_search"] == 2 and params["calibrated_recall"] < 1.0
    (warning,) = ann.calibration_warnings({"items": SearchIndex(ann.LIBRARY, params)})
    assert f"recall@10 {params['calibrated_recall']:.3f}" in warning and "recall_target 1.0" in warning
    met = {**params, "recall_target": params["calibrated_recall"]}
    assert ann.calibration_warnings({"items": SearchIndex(ann.LIBRARY, met)}) == []
    assert ann.calibration_warnings({"items": SearchIndex(ann.LIBRARY, ann.build_params(SMALL_GRAPH))}) == []


def test_an_index_built_without_queries_searches_at_the_uncalibrated_breadth(tmp_path):
    params = ann.build_params({"M": 8, "ef_construction": 40})
    ann.write_index(clustered_artifact(with_index=False).arrays["item_factors"], tmp_path / "g", params)
    assert params["ef_search"] == ann.UNCALIBRATED_EF_SEARCH and "calibrated_recall" not in params


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"storage": "pq"}, "storage must be one of flat, sq8"),
        ({"ef_search": "wide"}, "ef_search must be an integer"),
        ({"ef_search": 1.5}, "ef_search must be an integer"),
        ({"recall_target": 0.0}, "recall_target must be in"),
        ({"M": True}, "M must be an integer"),
        ({"structure": "lsh"}, "structure must be one of hnsw, ivf"),
        ({"structure": "ivf", "M": 32}, "unknown index parameter 'M' for structure ivf"),
        ({"structure": "ivf", "nprobe": 0}, "nprobe must be an integer >= 1"),
        ({"structure": "ivf", "rerank": "auto"}, "rerank must be an integer"),
    ],
)
def test_bad_index_parameters_are_refused_by_name(bad, error):
    with pytest.raises(ValueError, match=error):
        ann.build_params(bad)


@pytest.mark.parametrize("structure", ["hnsw", "ivf"])
def test_loading_maps_the_float_factors_only_where_the_index_re_scores_from_the_mapping(tmp_path, structure):
    """The graph re-scores a few rows per request: the load must not page the factor file into
    the server (finiteness and the spot check read it with file reads and a few rows). The
    inverted file re-scores ten times more rows from the mapping: it maps them all at load, so
    no request pays for a page's first touch."""
    rng = np.random.default_rng(0)
    artifact = clustered_artifact(with_index=False)
    # 19 MB: the kernel maps up to 64 KiB around each page a read faults in, so a smaller file
    # would be mapped whole by the spot check alone.
    items = rng.normal(size=(200_000, artifact.arrays["item_factors"].shape[1])).astype(np.float32)
    items /= 2 * np.linalg.norm(items, axis=1, keepdims=True)
    artifact.arrays["item_factors"] = items
    artifact.arrays["item_popularity"] = rng.random(len(items)).astype(np.float32)
    artifact.ids["items"] = IdMap([f"i{i}" for i in range(len(items))])
    params = (
        {"structure": "ivf", "nprobe": 4}
        if structure == "ivf"
        else {"M": 8, "ef_construction": 20, "ef_search": 16}
    )
    artifact.indexes = {"items": ann.item_index(items, params)}
    reg = Registry(tmp_path)
    reg.publish("big", artifact)
    served = build_index(reg.load("big"))
    if structure == "ivf":  # every page of the file resident at load, before any request
        assert _resident_kib("item_factors.npy") >= 0.99 * items.nbytes / 1024
        return
    served.recommend(0, 10, exclude=served.seen(0))
    resident = _resident_kib("item_factors.npy")
    assert 0 < resident <= 0.5 * items.nbytes / 1024, resident  # a spread of rows, not the file


def _resident_kib(file_name: str) -> int:
    total, current = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
            current = len(head) > 5 and head[5].endswith(file_name)
        elif current and head[0] == "Rss:":
            total += int(head[1])
    return total


def _served_queries(artifact: Artifact) -> tuple[np.ndarray, list[np.ndarray]]:
    """Folded user factors and each user's training items, as the DCR index searches."""
    index = build_index(artifact)
    users = artifact.arrays["user_factors"] * index.level_scale
    return users, [index.seen(u) for u in range(len(users))]


def _recall(search, users: np.ndarray, seen: list[np.ndarray]) -> float:
    truth = ann.exact_tops(search.vectors(), ann.Queries(users, seen), 10)
    found = [search.search(q, 10, ex) for q, ex in zip(users, seen)]
    hits = [t.size if f is None else np.intersect1d(f[0], t).size for f, t in zip(found, truth)]
    return float(np.sum(hits)) / sum(t.size for t in truth)


def test_trainer_publishes_an_index_from_ann_min_items(sample_dir, tmp_path):
    # Through the CLI's publish path (and out of process: a fit here would start numba's
    # thread pool inside the test session).
    calibrated = {"M": 12, "ef_construction": 40}  # ef_search "auto", recall_target 0.97
    for name, min_items, graph in (
        ("big", 10, SMALL_GRAPH),
        ("small", 10**6, SMALL_GRAPH),
        ("auto", 10, calibrated),
        ("ivf", 10, {"structure": "ivf"}),
    ):
        result = run_cli(
            [
                "ordrec.trainer",
                "train",
                "dcr",
                "--data",
                str(sample_dir / "ratings.data"),
                "--registry",
                str(tmp_path),
                "--name",
                name,
                "--set",
                "max_iter=2",
                "--set",
                f"ann_min_items={min_items}",
                "--set",
                f"ann_params={json.dumps(graph)}",
            ],
            check=False,
        )
        assert result.returncode == 0, result.stderr
    reg = Registry(tmp_path)
    (entry,) = reg.load("big").indexes.values()
    # A breadth given is kept; the exclusions the index answers are measured all the same.
    own = ann.build_params(SMALL_GRAPH)
    assert entry.library == ann.LIBRARY and {k: entry.params[k] for k in own} == own
    assert entry.params["max_excluded"] >= entry.params["calibrated_excluded"] > 0
    assert build_index(reg.load("big")).search == SMALL_GRAPH_SERVES
    assert reg.load("small").indexes == {}
    # Calibrated on the trained users: the breadth chosen and the recall it measured are published.
    (entry,) = reg.load("auto").indexes.values()
    assert entry.params["ef_search"] in ann.EF_LADDER and 0.0 < entry.params["calibrated_recall"] <= 1.0
    served = build_index(reg.load("auto"))
    assert served.search.endswith(f"recall@10={entry.params['calibrated_recall']:.3f}")
    if entry.params["ef_search"] > ann.EF_LADDER[0]:
        assert entry.params["calibrated_recall"] >= ann.DEFAULT_PARAMS["recall_target"]
    (entry,) = reg.load("ivf").indexes.values()
    assert entry.library == ann.IVF_LIBRARY and entry.params["nlist"] == ann.auto_nlist(
        len(reg.load("ivf").ids["items"])
    )
    assert 0.0 < entry.params["calibrated_recall"] <= 1.0
    assert build_index(reg.load("ivf")).search.startswith(
        f"faiss-ivf-ip nlist={entry.params['nlist']} nprobe="
    )
    with pytest.raises(ValueError, match="unknown index parameter"):  # refused before any fitting
        configure("dcr", {"ann_params": {"efSearch": 3}}).fit(sample.planted_ratings(seed=1))


def test_list_models_and_metrics_say_which_index_serves(registry):
    with ServerProcess(registry.root) as server, grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models}
        assert models["big"].index == SMALL_GRAPH_SERVES
        assert models["small"].index == "exact"
        reply = stub.Recommend(pb.RecommendRequest(model="big", user_ids=["u1", "u2"], n=10), timeout=10)
        assert [len(r.items) for r in reply.results] == [10, 10]
        metrics = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10).read().decode()
        assert f'ordrec_model_search_info{{model="big",search="{SMALL_GRAPH_SERVES}"}} 1.0' in metrics
        assert 'ordrec_model_search_info{model="small",search="exact"} 1.0' in metrics
