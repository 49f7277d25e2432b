"""The data-parallel DCR fit (DSGD on Dask): strata, blocks, equality with the sequential
kernel on the same visiting order, and a real local cluster (two single-threaded worker
processes) fitting planted data as well as one process does, even when a worker is killed."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.dcr import DCRIndex
from ordrec.trainer.evaluation.holdout import split_ratings
from ordrec.trainer.models.dcr import DCR, PairwiseDCR
from ordrec.trainer.models.dcr_distributed import (
    DistributedFit,
    InProcess,
    balanced_blocks,
    cluster_client,
    local_cluster_size,
    split_blocks,
    strata,
)
from ordrec.trainer.models.dcr_kernels import pointwise_epoch_by_user, shuffle_segments
from ordrec.trainer.models.pipeline import configure
from ordrec.trainer.models.ranking import ndcg_values, served_recall_values
from ordrec.trainer.sample import planted_ratings

# A few epochs: the quality comparison needs a fit that has learnt the planted structure.
PARAMS = dict(n_components=10, max_iter=25, random_state=3)
# Held-out NDCG@10 and recall@10 of the distributed fit may differ from the single-process
# fit's by at most this much (absolute): DSGD visits the ratings in another order and draws
# other unrated items, as a single-process fit with another seed does.
TOLERANCE = 0.03


# ------------------------------------------------------------------ strata and blocks
@given(st.integers(1, 9))
def test_the_strata_of_a_sub_epoch_share_no_user_or_item_block_and_an_epoch_covers_every_pair(W):
    seen = set()
    for s in range(W):
        pairs = strata(W, s)
        assert len({w for w, _ in pairs}) == W and len({b for _, b in pairs}) == W
        seen.update(pairs)
    assert seen == {(w, b) for w in range(W) for b in range(W)}


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2**31 - 2))
def test_split_blocks_places_every_rating_once_in_the_stratum_of_its_user_and_item(W, seed):
    rng = np.random.default_rng(seed)
    n_users, n_items = 15, 11
    pairs = np.unique(rng.integers(0, [n_users, n_items], size=(60, 2)), axis=0)
    user, item = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    level = rng.integers(0, 5, user.size).astype(np.int32)
    user_block = balanced_blocks(np.bincount(user, minlength=n_users), W, rng)
    item_block = balanced_blocks(np.bincount(item, minlength=n_items), W, rng)
    assert set(np.unique(user_block)) <= set(range(W))
    users, items, blocks = split_blocks(user, item, level, user_block, item_block, np.ones(n_items), W)
    found = set()
    for (w, b), block in blocks.items():
        for u_local in range(users[w].size):
            for p in range(block.indptr[u_local], block.indptr[u_local + 1]):
                u, i = int(users[w][u_local]), int(items[b][block.items[p]])
                assert user_block[u] == w and item_block[i] == b
                found.add((u, i, int(block.levels[p])))
    assert found == set(zip(user.tolist(), item.tolist(), level.tolist()))
    assert sum(block.items.size for block in blocks.values()) == user.size


def test_balanced_blocks_even_out_the_ratings():
    counts = np.random.default_rng(0).integers(1, 50, 1000)
    block = balanced_blocks(counts, 4, np.random.default_rng(1))
    per_block = np.bincount(block, weights=counts, minlength=4)
    assert per_block.max() - per_block.min() <= 2 * counts.max()


def test_local_cluster_addresses_are_parsed_and_bad_ones_named():
    assert local_cluster_size("local:2") == 2
    assert local_cluster_size("tcp://10.0.0.1:8786") is None
    for bad in ("local:0", "local:x", "local:"):
        with pytest.raises(ValueError, match="local:N"):
            local_cluster_size(bad)


# ------------------------------------------------------------------ the sequential algorithm
def data_and_split(seed=0):
    data = planted_ratings(n_users=240, n_items=150, per_user=(15, 45), seed=seed)
    return data, *split_ratings(data, 0.2, seed)


def test_one_block_is_the_sequential_kernel_on_the_same_visiting_order():
    """W = 1, paper DCR (no unrated draws): every epoch is one stratum, the whole CSR, so the
    blocked fit must equal running the single-process kernel over the same order."""
    data, train, _ = data_and_split()
    params = dict(PARAMS, max_iter=4, unrated_share=0.0)
    start = DCR(**dict(params, max_iter=0)).fit(train)
    U, V = start.U_.copy(), start.V_.copy()
    blocked = DistributedFit(DCR(**params), InProcess(), blocks=1).fit(train)
    # The stratum's visiting order: users shuffled within, users permuted, each from the
    # stratum seed's own generator (train_stratum's documented contract).
    indptr = start.seen_indptr_
    active = np.flatnonzero(np.diff(indptr) > 0)
    for epoch in range(params["max_iter"]):
        seed = int(
            np.random.default_rng([params["random_state"], 4, epoch]).integers(2**31 - 1, size=(1, 1))[0, 0]
        )
        items, levels = start.seen_indices_.astype(np.int64), start.seen_levels_.copy()
        rng = np.random.default_rng(seed)
        shuffle_segments(indptr, items, levels, int(rng.integers(2**31 - 1)))
        lr = params.get("learning_rate", 0.05) / (1.0 + 0.02 * epoch)
        pointwise_epoch_by_user(
            U, V, indptr, items, levels, rng.permutation(active), lr, 0.001, 1e-3, 0, 1.0, False,
            np.arange(U.shape[1], dtype=np.int64),
        )  # fmt: skip
    np.testing.assert_allclose(blocked.U_, U, rtol=0, atol=1e-6)
    np.testing.assert_allclose(blocked.V_, V, rtol=0, atol=1e-6)


def test_unsupported_options_are_refused_by_name():
    _, train, _ = data_and_split()
    with pytest.raises(ValueError, match="pairwise"):
        DistributedFit(PairwiseDCR(DCR()), InProcess()).fit(train)
    # model selection wraps the estimator, so it never reaches the cluster
    for option in ("pairwise", "early_stopping"):
        with pytest.raises(ValueError, match=option):
            configure("dcr", {option: True}).fit_on_cluster(train, "local:1")


# ------------------------------------------------------------------ a real cluster
def held_out(model: DCR, test) -> tuple[float, float]:
    index = DCRIndex.from_artifact(model.to_artifact())
    ndcg = float(np.mean(ndcg_values(index.score_items, test, 10)))
    recall = float(np.mean(served_recall_values(index, test, 4.0)))
    return ndcg, recall


@pytest.fixture(scope="module")
def client():
    with cluster_client("local:2") as client:
        yield client


def worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def test_the_cluster_fit_is_the_in_process_strata_and_as_good_as_one_process(client):
    _, train, test = data_and_split()
    assert len(worker_pids(client)) == 2
    assert set(client.nthreads().values()) == {1}
    single = DCR(**PARAMS).fit(train)
    on_cluster = DistributedFit(DCR(**PARAMS), client, blocks=2).fit(train)
    in_process = DistributedFit(DCR(**PARAMS), InProcess(), blocks=2).fit(train)
    # Parallel strata share no rows: the cluster's result is the sequential one on that order.
    np.testing.assert_allclose(on_cluster.U_, in_process.U_, rtol=0, atol=1e-6)
    np.testing.assert_allclose(on_cluster.V_, in_process.V_, rtol=0, atol=1e-6)
    assert on_cluster.epochs_run_ == PARAMS["max_iter"]
    (n1, r1), (n2, r2) = held_out(single, test), held_out(on_cluster, test)
    assert abs(n1 - n2) <= TOLERANCE and abs(r1 - r2) <= TOLERANCE, (n1, n2, r1, r2)
    # The same artifact: same arrays and hyperparameters.
    a, b = single.to_artifact(), on_cluster.to_artifact()
    assert a.hyperparameters == b.hyperparameters and set(a.arrays) == set(b.arrays)


def test_a_worker_killed_mid_fit_does_not_lose_the_fit(client):
    _, train, _ = data_and_split()
    before = worker_pids(client)
    victim = sorted(before.values())[0]

    killed = []

    def kill_once(epoch: int, sub_epoch: int) -> None:
        if (epoch, sub_epoch) == (3, 1) and not killed:  # the epoch redone calls again
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    fit = DistributedFit(DCR(**PARAMS), client, blocks=2, on_sub_epoch=kill_once)
    model = fit.fit(train)
    assert killed and victim not in worker_pids(client).values()
    # The worker took rating blocks scattered to it, which the engine cannot recompute: the
    # driver redid the epoch from its factors, with the epoch's own seeds, so the fit is the
    # undisturbed one (which is the strata run in order, as the test above shows).
    assert fit.restarts_ >= 1 and model.epochs_run_ == PARAMS["max_iter"]
    undisturbed = DistributedFit(DCR(**PARAMS), InProcess(), blocks=2).fit(train)
    np.testing.assert_allclose(model.U_, undisturbed.U_, rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.V_, undisturbed.V_, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ the CLI and the cron job
def test_the_cli_refuses_a_bad_cluster_or_a_kind_it_cannot_fit(tmp_path, capsys):
    from ordrec.trainer.cli import EXIT_USAGE, main
    from ordrec.trainer.sample import write_samples

    write_samples(tmp_path)
    common = ["--data", str(tmp_path / "ratings.data"), "--registry", str(tmp_path / "reg")]
    assert main(["train", "dcr", *common, "--cluster", "local:0"]) == EXIT_USAGE
    assert "local:N needs a positive worker count" in capsys.readouterr().err
    assert main(["train", "rtf", *common, "--cluster", "local:1"]) == EXIT_USAGE
    assert "is for dcr models, not rtf" in capsys.readouterr().err
    assert not (tmp_path / "reg").exists() or not any((tmp_path / "reg").iterdir())


@pytest.mark.parametrize(
    "kind, cluster, words",
    [("rtf", "local:2", "is for dcr models, not rtf"), ("dcr", "local:zero", "local:N needs a positive")],
)
def test_a_job_cluster_key_is_checked_when_the_file_is_read(tmp_path, kind, cluster, words):
    from ordrec.trainer.job import JobError, load_job
    from tests.test_job import VALID

    text = VALID.replace('kind = "dcr"', f'kind = "{kind}"\ncluster = "{cluster}"')
    (tmp_path / "job.toml").write_text(text)
    with pytest.raises(JobError, match=r"models\[1\] \('dcr'\)\.cluster") as err:
        load_job(tmp_path / "job.toml")
    assert words in str(err.value)
    (tmp_path / "job.toml").write_text(
        text.replace(f'"{kind}"', '"dcr"').replace(cluster, "tcp://sched:8786")
    )
    assert load_job(tmp_path / "job.toml").models[0].cluster == "tcp://sched:8786"


@pytest.mark.slow  # starts its own cluster (about 20 s here)
def test_the_cron_job_fits_on_the_cluster_and_publishes(tmp_path):
    from ordrec.service.storage.registry import Registry
    from ordrec.trainer.job import EXIT_PUBLISHED, run_job
    from ordrec.trainer.sample import write_samples
    from tests.test_job import job_text

    write_samples(tmp_path)
    text = job_text(tmp_path, tmp_path / "reg", "n_components = 8, max_iter = 8")
    cluster = 'refit = false\ncluster = "local:2"\n\n[models.gate]'
    (tmp_path / "job.toml").write_text(text.replace("[models.gate]", cluster))
    assert run_job(tmp_path / "job.toml") == EXIT_PUBLISHED
    version = Registry(tmp_path / "reg").load("dcr")
    assert version.metrics["epochs_run"] == 8 and version.metrics["holdout_ndcg_at_10"] > 0.5


@pytest.mark.parametrize("option, value", [("blocks", 0), ("blocks", True), ("checkpoint_every", 0)])
def test_bad_fit_settings_are_refused_by_name(option, value):
    _, train, _ = data_and_split()
    with pytest.raises(ValueError, match=f"{option} must be a positive int"):
        DistributedFit(DCR(max_iter=1), InProcess(), **{option: value}).fit(train)
