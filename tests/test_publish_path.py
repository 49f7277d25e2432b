"""One publishing path: ``ordrec-train train`` is a one-model job, published by the same
function as ``ordrec-train run`` (no gate unless ``--gate`` asks for one)."""

from __future__ import annotations

import hashlib

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli
from ordrec.trainer import job
from ordrec.trainer.cli import main


def _job_file(tmp_path, registry, data, kind: str, params: str):
    path = tmp_path / "job.toml"
    path.write_text(
        f'[job]\nname = "nightly"\nregistry = "{registry}"\n\n[data.r]\npath = "{data}"\n\n'
        f'[[models]]\nname = "{kind}"\nkind = "{kind}"\ndata = "r"\nparams = {{{params}}}\n'
        "gate.popularity_floor = false\n"
    )
    return path


def _fingerprint(artifact) -> dict[str, str]:
    return {key: hashlib.sha256(array.tobytes()).hexdigest() for key, array in artifact.arrays.items()}


def test_train_and_run_publish_the_same_arrays_and_rating_scale(sample_dir, tmp_path):
    """Same model, data and seed: byte-identical arrays (``run`` refits on all the data, as
    ``train`` fits); both versions carry the fit's metrics and the rating scale recorded
    values are checked against; only the job's carries its held-out figures and its name."""
    data = sample_dir / "ratings.data"
    by_train, by_run = tmp_path / "train", tmp_path / "run"
    flags = ["--set", "max_iter=3", "--set", "n_components=3", "--seed", "7"]
    result = run_cli(
        ["ordrec.trainer", "train", "dcr", "--data", str(data), "--registry", str(by_train), *flags]
    )
    assert result.returncode == 0, result.stderr
    params = "max_iter = 3, n_components = 3, random_state = 7"
    result = run_cli(["ordrec.trainer", "run", str(_job_file(tmp_path, by_run, data, "dcr", params))])
    assert result.returncode == 0, result.stderr
    trained, ran = Registry(by_train).load("dcr", mmap=False), Registry(by_run).load("dcr", mmap=False)
    assert _fingerprint(trained) == _fingerprint(ran)
    fit_metrics = {k for k in trained.metrics if k.startswith("train_loglik")}
    assert fit_metrics and fit_metrics <= set(ran.metrics)
    assert not any(k.startswith(job.METRIC_PREFIX) for k in trained.metrics)
    assert ran.metrics["holdout_refit"] == 1.0
    assert trained.attributes["rating_scale"] == ran.attributes["rating_scale"]
    assert "trained_by" not in trained.attributes and ran.attributes["trained_by"] == "job nightly"


def test_train_and_run_go_through_the_one_publish_function(toy, sample_dir, tmp_path, monkeypatch, capsys):
    published = []
    publish = job.JobRunner.publish

    def counted(runner, model, *args):
        published.append(model.name)
        return publish(runner, model, *args)

    monkeypatch.setattr(job.JobRunner, "publish", counted)
    data, registry = sample_dir / "ratings.data", tmp_path / "reg"
    assert main(["train", "toy", "--data", str(data), "--registry", str(registry), "--name", "by-hand"]) == 0
    assert main(["run", str(_job_file(tmp_path, registry, data, "toy", "shrinkage = 1.0"))]) == 0
    assert published == ["by-hand", "toy"]
    assert f"published by-hand@{Registry(registry).versions('by-hand')[-1]}" in capsys.readouterr().out


def test_train_gate_is_off_unless_asked(toy, sample_dir, tmp_path, capsys):
    """``--gate`` judges as a job's default gate does: the toy kind's served top 10 finds fewer
    held-out liked items than the most-rated items do, so it is refused (exit 3, nothing
    published); without ``--gate`` the same fit is published."""
    data, registry = sample_dir / "ratings.data", tmp_path / "reg"
    train = ["train", "toy", "--data", str(data), "--registry", str(registry)]
    assert main([*train, "--gate"]) == job.EXIT_REJECTED
    assert "toy not published: topn_recall_at_10" in capsys.readouterr().err
    assert not Registry(registry).versions("toy")
    assert main(train) == job.EXIT_PUBLISHED
    assert Registry(registry).versions("toy")
    assert main([*train, "--gate", "f1_at_5"]) == 2 and "not a held-out metric" in capsys.readouterr().err


def test_train_takes_the_model_lock_and_warns_of_a_pin(toy, sample_dir, tmp_path, capsys):
    data, registry = sample_dir / "ratings.data", tmp_path / "reg"
    train = ["train", "toy", "--data", str(data), "--registry", str(registry)]
    with job.job_lock(job.default_lock(registry, "train-toy"), "train-toy"):
        assert main(train) == job.EXIT_FAILED
    assert "is already running" in capsys.readouterr().err
    assert not Registry(registry).versions("toy")
    assert main(train) == 0
    Registry(registry).pin("toy", Registry(registry).versions("toy")[0])
    assert main(train) == 0
    assert "is pinned to" in capsys.readouterr().err
