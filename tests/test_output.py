"""What the trainer prints: progress drawn as a bar only on a terminal and as
plain lines elsewhere, fit metrics after ``train``, each version's metrics in
``versions``, and manifests that write whole numbers as integers."""

from __future__ import annotations

import io
import json

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli
from ordrec.trainer.progress import Progress


def train_dcr(sample_dir, registry, *settings: str):
    """``ordrec-train train dcr`` on the sample into ``registry`` with ``--set`` each of ``settings``."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    data = ["--data", str(sample_dir / "ratings.data"), "--registry", str(registry)]
    return run_cli(["ordrec.trainer", "train", "dcr", *data, *sets])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_into_a_pipe_is_plain_lines():
    stream = io.StringIO()
    with Progress("COE", total=5, stream=stream, interval=0.0) as bar:
        for step in range(5):
            bar.update(1, loss=1.0 / (step + 1))
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 6 and lines[-1].startswith("COE: 5/5 ") and "loss=0.2" in lines[-1]


def test_progress_lines_are_rate_limited():
    stream = io.StringIO()
    with Progress("DCR", total=1000, stream=stream, interval=3600.0) as bar:
        for _ in range(1000):
            bar.update(1)
    assert stream.getvalue().splitlines() == [stream.getvalue().strip()]  # the final line only
    assert stream.getvalue().startswith("DCR: 1000/1000 ")


def test_progress_on_a_terminal_is_a_bar():
    stream = _Terminal()
    with Progress("KNNSCAL", total=3, stream=stream) as bar:
        for _ in range(3):
            bar.update(1, stress=0.5)
    text = stream.getvalue()
    assert "\r" in text and "KNNSCAL" in text and "3/3" in text and "stress=0.5" in text


def test_disabled_progress_writes_nothing():
    for stream in (io.StringIO(), _Terminal()):
        with Progress("X", total=3, enabled=False, stream=stream) as bar:
            bar.update(3)
        assert stream.getvalue() == ""


def test_train_prints_metrics_and_versions_lists_them(sample_dir, tmp_path):
    registry = tmp_path / "reg"
    result = run_cli(
        [
            "ordrec.trainer",
            "train",
            "coe",
            "--data",
            str(sample_dir / "ratings.data"),
            "--registry",
            str(registry),
            "--set",
            "max_iter=2",
            "--set",
            "n_components=2",
        ]
    )
    artifact = Registry(registry).load("coe")
    assert artifact.metrics
    published, metrics = result.stdout.splitlines()[:2]
    assert published == f"published coe@{artifact.version} to {registry}"
    for name, value in artifact.metrics.items():
        assert f"{name}={value:.4g}" in metrics
    listing = run_cli(["ordrec.trainer", "registry", "versions", "--registry", str(registry)]).stdout
    name, version, marks, shown, tuned = listing.rstrip("\n").split("\t")
    assert (name, version, marks) == ("coe", artifact.version, "live:newest")
    assert shown == metrics.strip()
    assert tuned.startswith("tuning: kept defaults: nothing to tune")  # the settings given are kept


def test_train_shows_the_fits_epochs_and_the_index_build(sample_dir, tmp_path):
    # Issue 45: a fit and publish of minutes says what it is doing (plain lines off a terminal).
    result = train_dcr(sample_dir, tmp_path / "reg", "n_components=2", "max_iter=2", "ann_min_items=1")
    version = Registry(tmp_path / "reg").load("dcr").version
    lines = result.stderr.splitlines()
    assert any(line.startswith("DCR: 2/2 ") for line in lines), result.stderr
    building = next(i for i, line in enumerate(lines) if "publishing: building index 'items'" in line)
    published = next(i for i, line in enumerate(lines) if f"published version {version} in " in line)
    chosen = next(i for i, line in enumerate(lines) if "index 'items': faiss-" in line)
    assert building < published < chosen


def test_manifest_writes_whole_numbers_as_integers(sample_dir, tmp_path):
    registry = tmp_path / "reg"
    train_dcr(sample_dir, registry, "n_components=3", "max_iter=2", "learning_rate=0.5")
    artifact = Registry(registry).load("dcr")
    text = (artifact.path / "manifest.json").read_text()
    assert '"n_components": 3,' in text or '"n_components": 3\n' in text, text
    raw = json.loads(text)
    assert raw["hyperparameters"]["n_components"] == 3 and isinstance(
        raw["hyperparameters"]["n_components"], int
    )
    assert raw["hyperparameters"]["learning_rate"] == 0.5
    assert artifact.hyperparameters["n_components"] == 3


def test_a_manifest_written_with_floats_still_loads(sample_dir, tmp_path):
    """Manifests published before integers were written as integers ("n_components": 3.0) load the same."""
    registry = tmp_path / "reg"
    run_cli(
        [
            "ordrec.trainer",
            "train",
            "dcr",
            "--data",
            str(sample_dir / "ratings.data"),
            "--registry",
            str(registry),
            "--set",
            "n_components=3",
            "--set",
            "max_iter=2",
        ]
    )
    path = Registry(registry).load("dcr").path / "manifest.json"
    path.write_text(path.read_text().replace('"n_components": 3', '"n_components": 3.0'))
    assert '"n_components": 3.0' in path.read_text()
    artifact = Registry(registry).load("dcr")
    hyperparameters = artifact.hyperparameters
    assert hyperparameters["n_components"] == 3 and isinstance(hyperparameters["n_components"], int)
