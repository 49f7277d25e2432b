"""Every model kind through ``ordrec-train run``: its data shape, its serving
index and its held-out family (tiny hyperparameters: this checks the
plumbing, not the quality). The whole ``examples/nightly.toml`` with its real
hyperparameters runs under ``-m slow``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ordrec.service.indices.models import build_index
from ordrec.service.storage.registry import Registry
from ordrec.trainer.evaluation.holdout import METRICS
from ordrec.trainer.job import EXIT_PUBLISHED, load_job, run_job
from ordrec.trainer.sample import write_samples

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# kind: (sample file, tiny params, gate holdout)
KINDS = {
    "coe": ("ratings.data", "n_components = 2, max_iter = 2", 0.2),
    "rtf": ("tags.csv", "n_components = 4, max_iter = 3", 0.5),
    "score": ("attributes.csv", "n_components = 2, max_iter = 2, steps_per_epoch = 2000", 0.1),
    "knnscal": ("neighbors.csv", "n_components = 2, max_iter = 3", 0.2),
}


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    write_samples(out)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_publishes_with_its_held_out_metrics(kind, sample, tmp_path, capsys):
    filename, params, share = KINDS[kind]
    # a 2-D COE is published for its map: its top 10 need not beat the most-rated items
    floor = "" if kind != "coe" else ", popularity_floor = false"
    registry = tmp_path / "registry"
    job = tmp_path / "job.toml"
    job.write_text(f"""
[job]
name = "kind-{kind}"
registry = "{registry}"

[data.d]
path = "{sample / filename}"

[[models]]
name = "{kind}"
kind = "{kind}"
data = "d"
params = {{ {params} }}
gate = {{ holdout = {share}{floor} }}
{'labels = "' + str(sample / "items.txt") + '"' if kind == "coe" else ""}
""")
    assert run_job(job) == EXIT_PUBLISHED, capsys.readouterr().err
    (model,) = load_job(job).models
    artifact = Registry(registry).load(kind)
    build_index(artifact)
    assert model.gate.metric == METRICS[_shape(kind)][0]  # the family default
    for metric in METRICS[_shape(kind)]:
        value = artifact.metrics[f"holdout_{metric}"]
        assert 0.0 <= value <= 1.0, (metric, value)
    assert artifact.metrics["holdout_fraction"] == share
    # map models carry their map report, published in the same rename, showing this version
    report = artifact.views.get("report.html")  # listed in the manifest and verified at load
    assert (report is not None) == (kind in ("coe", "score", "knnscal"))
    if report is not None:
        assert artifact.version in report.data.decode()
    if kind == "coe":  # display names from the sample's items.txt ("i001|Sample item 1")
        assert "Sample item 1" in report.data.decode()
        assert "labels.tsv" in artifact.views


def _shape(kind: str) -> str:
    from ordrec.trainer.models import estimator_class

    return estimator_class(kind).input_shape


@pytest.mark.slow
def test_nightly_example_runs_every_model(tmp_path):
    sample, registry = tmp_path / "sample", tmp_path / "registry"
    write_samples(sample)
    text = (EXAMPLES / "nightly.toml").read_text()
    text = text.replace("/tmp/ordrec-sample", str(sample)).replace("/tmp/ordrec-registry", str(registry))
    job = tmp_path / "nightly.toml"
    job.write_text(text)
    assert run_job(job) == EXIT_PUBLISHED
    reg = Registry(registry)
    names = [m.name for m in load_job(job).models]
    assert reg.models() == sorted(names)
    for name in names:
        build_index(reg.load(name))
    # Same data, same seeds: a dry rerun reproduces the figures, so every gate passes.
    assert run_job(job, dry_run=True) == EXIT_PUBLISHED
