"""RTFGridSearch: dims and reg chosen on posts carved from the training posts, the
pop-mix fallback, serving the chosen model, and the protocol's RTF-val row."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from ordrec.service.indices.models.rtf import RTFIndex
from ordrec.service.indices.topk import top_k
from ordrec.service.storage.artifact import ArtifactError
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.trainer.data.types import TagAssignments
from ordrec.trainer.models import rtf_selection
from ordrec.trainer.models.knnscal_selection import served_settings
from ordrec.trainer.models.pipeline import configure
from ordrec.trainer.models.rtf import RTF
from ordrec.trainer.models.rtf_selection import RTFGridSearch
from ordrec.trainer.models.rtf_stopping import EarlyStoppedRTF
from ordrec.trainer.reproduce import rtf as ev

# Small and fast: every candidate stops early on its own stopping posts. A larger initial
# scale than the default, so that small dims leave chance level within a few passes.
FAST = dict(max_iter=60, validation_posts=60, patience=8, min_iter=15, init_std=0.5, verbose=False)
PROTOCOL_FAST = ["--max-iter", "60", "--patience", "8", "--min-iter", "15", "--init-std", "0.5"]


def _search(dims, **settings) -> RTFGridSearch:
    model = configure("rtf", dict(random_state=0, **FAST, **settings)).estimator  # RTF, early-stopped
    return RTFGridSearch(model, {"n_components": dims, "reg": (1e-3,)})


def _assignments(users, items, tags) -> TagAssignments:
    user, item, tag = (np.asarray(x, dtype=np.int32) for x in (users, items, tags))
    ids = lambda p, n: IdMap([f"{p}{k}" for k in range(n)])  # noqa: E731
    return TagAssignments(
        ids("u", int(user.max()) + 1),
        ids("i", int(item.max()) + 1),
        ids("t", int(tag.max()) + 1),
        user,
        item,
        tag,
    )


def _three_way_tags(seed: int, n_users=60, n_items=45, posts=14, per_block=4) -> TagAssignments:
    """Tags from block ``(user group + item group) mod 3``: every user and every item uses
    all three blocks alike, so their popularity says nothing about a post, while a Tucker
    model of dims 3 (not 1) represents the table exactly."""
    rng = np.random.default_rng(seed)
    user_group, item_group = np.arange(n_users) % 3, rng.integers(0, 3, n_items)
    users, items, tags = [], [], []
    for u in range(n_users):
        for i in rng.choice(n_items, size=posts, replace=False):
            block = (user_group[u] + item_group[i]) % 3
            for t in rng.choice(per_block, size=2, replace=False):
                users.append(u), items.append(i), tags.append(block * per_block + t)
    return _assignments(users, items, tags)


def _item_only_tags(seed: int, n_users=60, n_items=40, n_tags=30, posts=12) -> TagAssignments:
    """Each item has its own three tags and every post of it carries two of them: the item's
    popularity is the whole signal, so no RTF can clearly beat pop-mix."""
    rng = np.random.default_rng(seed)
    own = [rng.choice(n_tags, size=3, replace=False) for _ in range(n_items)]
    users, items, tags = [], [], []
    for u in range(n_users):
        for i in rng.choice(n_items, size=posts, replace=False):
            for t in rng.choice(own[i], size=2, replace=False):
                users.append(u), items.append(i), tags.append(t)
    return _assignments(users, items, tags)


def _posts(data: TagAssignments) -> set[tuple[str, str]]:
    return set(zip(data.users.externals(data.user), data.items.externals(data.item)))


@pytest.fixture(scope="module")
def three_way():
    data = _three_way_tags(seed=1)
    return data, _search((1, 3)).fit(data)


def test_planted_three_way_tags_choose_dims_3_and_keep_rtf(three_way):
    _, est = three_way
    scores = {c["n_components"]: c["val_f1"] for c in est.grid_scores_}
    assert scores[3] > scores[1]
    assert est.chosen_params_ == {"n_components": 3, "reg": 1e-3}
    rtf_f1, mix_f1, se = est.grid_val_f1_
    assert est.grid_kept_ and rtf_f1 - mix_f1 > 2 * se
    assert est.best_estimator_.estimator_.core_.shape == (3, 3, 3) and est.serves() == "rtf"
    artifact = est.to_artifact()
    assert artifact.attributes["serves"] == "rtf"
    assert artifact.metrics["grid_n_components"] == 3.0 and artifact.metrics["grid_kept"] == 1.0


def test_item_only_tags_fall_back_to_pop_mix_and_the_index_serves_it(tmp_path):
    data = _item_only_tags(seed=2)
    est = _search((2, 4)).fit(data)
    rtf_f1, mix_f1, se = est.grid_val_f1_
    assert not est.grid_kept_ and rtf_f1 - mix_f1 <= 2 * se
    assert est.serves() == "pop-mix" and est.best_estimator_.epochs_run_ == 0  # nothing refitted
    artifact = est.to_artifact()
    assert artifact.attributes["serves"] == "pop-mix"
    assert artifact.attributes["mix_weight"] == est.mix_weight_
    registry = Registry(tmp_path)  # what the server loads: the published version
    index = RTFIndex.from_artifact(registry.load("rtf", registry.publish("rtf", artifact)))
    index.smoke()
    assert index.serves == "pop-mix" and index.mix_weight == est.mix_weight_
    for u, i in [(0, 0), (5, 7), (33, 21)]:
        rows, _, fallback = index.tags(u, i, 5)
        want = top_k(index.popular_scores("mix", u, i, mix_weight=est.mix_weight_), 5)[0]
        assert fallback == "none" and rows.tolist() == want.tolist()
        batch = index.score_posts(np.array([u]), np.array([i]))[0]
        np.testing.assert_array_equal(batch, index.scores(u, i))


def test_a_plain_rtf_serves_itself_at_the_even_mix():
    data = _item_only_tags(seed=3, n_users=20, n_items=15)
    est = RTF(n_components=2, max_iter=2, verbose=False).fit(data)
    assert est.core_.shape == (2, 2, 2) and est.serves() == "rtf"
    artifact = est.to_artifact()
    assert artifact.attributes["serves"] == "rtf" and artifact.attributes["mix_weight"] == 0.5
    assert "grid_kept" not in artifact.metrics


@pytest.mark.parametrize(
    "grid, match",
    [
        ({"n_components": ()}, "param_grid"),
        ({}, "param_grid"),
        ({"n_components": (0,)}, "n_components"),
        ({"reg": (-1.0,)}, "reg"),
        ({"reg": ("a lot",)}, "reg"),
        ({"no_such": (1,)}, "no_such"),
    ],
)
def test_a_bad_grid_is_a_clear_error(grid, match):
    with pytest.raises(ValueError, match=match):
        RTFGridSearch(RTF(), grid).fit(_item_only_tags(seed=3, n_users=20, n_items=15))


@pytest.mark.parametrize("settings", [dict(margin="0"), dict(confidence=-1.0), dict(margin=float("nan"))])
def test_a_bad_margin_or_confidence_is_a_clear_error(settings):
    with pytest.raises(ValueError, match="margin|confidence"):
        RTFGridSearch(RTF(), **settings).fit(_item_only_tags(seed=3, n_users=20, n_items=15))


def test_the_grid_search_refuses_what_rtf_refuses():
    with pytest.raises(TypeError, match="TagAssignments"):
        _search((1,)).fit(np.zeros((3, 3)))


def test_the_artifact_records_the_grid_it_chose_from(three_way):
    artifact = three_way[1].to_artifact()
    assert artifact.attributes["grid_search"] == {
        "param_grid": {"n_components": [1, 3], "reg": [1e-3]},
        "margin": 0.0,
        "confidence": 2.0,
    }
    assert artifact.hyperparameters["n_components"] == 3


def test_the_index_rejects_an_unknown_serves(three_way):
    artifact = three_way[1].to_artifact()
    artifact.attributes["serves"] = "folkrank"
    with pytest.raises(ArtifactError, match="serves"):
        RTFIndex.from_artifact(artifact)


def test_validation_reads_only_training_posts_never_test_posts(monkeypatch):
    """The protocol's RTF-val: every post a candidate is scored on, and every post any fit
    sees, is a training post of the split; the scored posts are in no candidate's fit."""
    scored: list[set] = []
    fitted: list[set] = []

    class Spy(rtf_selection.HeldOutPosts):
        def __init__(self, data, held, index):
            super().__init__(data, held, index)
            scored.append(set(zip(data.users.externals(held[0]), data.items.externals(held[1]))))

    real_fit = RTF.fit

    def spy_fit(self, data, on_epoch=None, **held_out):
        fitted.append(_posts(data))
        return real_fit(self, data, on_epoch, **held_out)

    monkeypatch.setattr(rtf_selection, "HeldOutPosts", Spy)
    monkeypatch.setattr(RTF, "fit", spy_fit)
    data = _three_way_tags(seed=4, n_users=45, n_items=30, posts=10)
    args = argparse.ArgumentParser()
    ev.add_arguments(args)
    args = args.parse_args(
        ["--n-components", "", "--grid-n-components", "1,3", "--grid-reg", "1e-3", *PROTOCOL_FAST]
    )
    args.runs, args.seed, args.quiet, args.data, args.core = 1, 7, True, "planted", 2
    ev.run(args, data=data)

    core = ev.p_core(data, 2)
    train, test = ev.leave_one_post_out(core, np.random.default_rng(7))  # the run's split (seed 7)
    test_posts = set(zip(core.users.externals(test[0]), core.items.externals(test[1])))
    train_posts = _posts(train)
    # two candidates, the refit of the chosen one, then pop-mix-val's popularity counts
    assert len(scored) == 2 and len(fitted) == 4
    for posts in scored:
        assert posts <= train_posts and not posts & test_posts
    for posts in fitted:
        assert not posts & test_posts
    for posts in fitted[:2]:
        assert not posts & scored[0]
    assert fitted[2] == train_posts  # the refit sees every training post


def test_protocol_reports_rtf_val_and_its_fallback_equals_pop_mix_val(capsys):
    data = _item_only_tags(seed=5)
    args = argparse.ArgumentParser()
    ev.add_arguments(args)
    args = args.parse_args(
        ["--n-components", "", "--grid-n-components", "2", "--grid-reg", "1e-3", *PROTOCOL_FAST]
    )
    args.runs, args.seed, args.quiet, args.data, args.core = 2, 0, True, "planted", 2
    rows = ev.run(args, data=data)
    by = {(r.method, r.metric): r.mean for r in rows}
    assert by[(ev.VALIDATED, "kept")] == 0.0
    assert by[(ev.VALIDATED, "mix_weight")] == by[(ev.TUNED_MIX, "mix_weight")]
    for n in range(1, 11):  # the fallback is pop-mix-val itself: same carve, same weight
        assert by[(ev.VALIDATED, f"f1@{n}")] == pytest.approx(by[(ev.TUNED_MIX, f"f1@{n}")], abs=1e-12)
    err = capsys.readouterr().err
    assert err.count("RTF-val: falls back to pop-mix") == 2


def test_train_set_grid_validation_builds_the_grid_search_by_flat_names():
    flat = {"grid_validation": True, "grid_n_components": [1, 3], "grid_reg": [1e-3], "grid_confidence": 3.0}
    configured = configure("rtf", dict(flat, max_iter=7))
    search = configured.estimator
    assert isinstance(search, RTFGridSearch) and configured.selection == ("grid_validation",)
    assert search.param_grid == {"n_components": (1, 3), "reg": (1e-3,)}
    assert (search.margin, search.confidence, search.estimator.estimator.max_iter) == (0.0, 3.0, 7)
    assert type(configure("rtf", {"grid_n_components": [4]}).estimator) is EarlyStoppedRTF  # grid off
    with pytest.raises(ValueError, match="grid_validation"):
        configure("rtf", {"grid_validation": "yes"})


def test_rtfs_pipeline_stops_early_by_default_and_early_stopping_false_turns_it_off():
    """The early stopping is the innermost row of RTF's pipeline, on unless turned off, with its
    settings by their flat names; it adds no fit, and a grid search wraps it."""
    stopped = configure("rtf", {"patience": 9, "max_iter": 7})
    assert isinstance(stopped.estimator, EarlyStoppedRTF) and stopped.selection == ()
    assert (stopped.estimator.patience, stopped.estimator.validation_posts) == (9, 1200)
    assert type(stopped.estimator.estimator) is RTF and stopped.estimator.estimator.max_iter == 7
    assert stopped.describe() == "rtf: 1 fit of the estimator"
    plain = configure("rtf", {"early_stopping": False, "max_iter": 7})
    assert type(plain.estimator) is RTF and plain.recorded["early_stopping"] is False
    assert "patience" not in plain.recorded and plain.planned_fits() == 1
    grid = configure("rtf", {"grid_validation": True, "grid_n_components": [1, 3], "grid_reg": [1e-3, 1e-2]})
    assert type(grid.estimator.estimator) is EarlyStoppedRTF
    assert grid.describe() == "rtf with grid_validation: 5 fits of the estimator"
    shared = grid.estimator.estimator
    candidate = rtf_selection.unfitted_copy(shared, {"n_components": 3, "reg": 1e-2})
    assert type(candidate) is EarlyStoppedRTF and candidate.estimator is not shared.estimator
    assert (candidate.estimator.n_components, candidate.estimator.reg) == (3, 1e-2)


def test_train_set_takes_knnscals_solver_fields_by_flat_name():
    est = served_settings(
        configure("knnscal", {"block_size": 7, "solver": {"reorder": "none"}, "max_iter": 3}).estimator
    )
    assert (est.solver_settings().block_size, est.solver_settings().reorder, est.max_iter) == (7, "none", 3)
    with pytest.raises(ValueError, match="block_size"):
        configure("knnscal", {"block_size": 0})


def test_train_set_takes_rtfs_early_stopping_fields_by_flat_name():
    flat = {"patience": 3, "keep_within": 1e-3, "early_stopping": {"smoothing": 4, "patience": 9}}
    est = configure("rtf", dict(flat, max_iter=7)).estimator
    stopping = est.rule()
    # a field given flat wins over the same field of a given table; the rest keep their defaults
    assert (stopping.patience, stopping.smoothing, stopping.keep_within, stopping.validation_posts) == (
        3,
        4,
        1e-3,
        1200,
    )
    assert est.estimator.max_iter == 7 and len(RTF.param_names()) <= 13
    with pytest.raises(ValueError, match="learning_rate_drop_factor"):
        configure("rtf", {"learning_rate_drop_factor": 1.5})
    with pytest.raises(ValueError, match="early_stopping.*no field"):
        configure("rtf", {"early_stopping": {"patients": 3}})
    with pytest.raises(ValueError, match="patiences"):
        configure("rtf", {"patiences": 3})


def test_rtfs_manifest_records_the_flat_settings_as_before():
    """The manifest's hyperparameters keep the flat names a job table writes (RTF's own, the
    early stopping's eight and its switch, the grid's switch), with the values given, and
    configure takes them back."""
    data = _three_way_tags(seed=0, n_users=20, n_items=15, posts=6)
    fitted = configure(
        "rtf", dict(n_components=2, max_iter=2, validation_posts=0, smoothing=3, verbose=False)
    )
    recorded = fitted.fit(data).to_artifact().hyperparameters
    stopping_names = ["validation_posts", "patience", "min_iter", "val_tol", "smoothing", "keep_within"]
    assert set(RTF.param_names()) | {"early_stopping", "grid_validation", *stopping_names} <= set(recorded)
    assert recorded["early_stopping"] is True and recorded["grid_validation"] is False
    assert (recorded["validation_posts"], recorded["smoothing"], recorded["patience"]) == (0, 3, 5)
    assert configure("rtf", recorded).estimator.rule() == fitted.estimator.rule()  # a round trip
