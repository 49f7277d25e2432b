"""``ordrec-train run JOB.toml``: schema validation, the quality gate, exit codes
through the real CLI, the lock, dry runs. Data: the built-in planted sample."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordrec.service.indices.models import build_index
from ordrec.service.storage.registry import Registry
from ordrec.trainer import job as job_module
from ordrec.trainer.data.types import RatingScale
from ordrec.trainer.job import (
    EXIT_FAILED,
    EXIT_PUBLISHED,
    EXIT_REJECTED,
    EXIT_USAGE,
    JobError,
    gate_passes,
    job_lock,
    load_job,
    lock_failure,
    run_job,
)
from ordrec.trainer.sample import write_samples

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GOOD = "n_components = 5, max_iter = 8"
BAD = "n_components = 5, max_iter = 0"  # random factors: a deliberately worse model


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    write_samples(out)
    return out


def job_text(
    sample: Path,
    registry: Path,
    params: str = GOOD,
    margin: float = 0.0,
    extra_job: str = "",
    name: str = "dcr",
    kind: str = "dcr",
    gate_extra: str = "",
    popularity_floor: bool = False,
) -> str:
    # The floor is off unless asked: the sample's picks follow popularity alone, so on it the
    # best model only ties the most-rated items (tests/test_topn.py tests the floor on data
    # with tastes to find). These jobs test the other rules.
    return f"""
[job]
name = "test-job"
registry = "{registry}"
{extra_job}

[data.ratings]
path = "{sample / "ratings.data"}"
format = "ml-100k"

[[models]]
name = "{name}"
kind = "{kind}"
data = "ratings"
params = {{ {params} }}

[models.gate]
metric = "ndcg_at_10"
margin = {margin}
holdout = 0.2
seed = 1
popularity_floor = {str(popularity_floor).lower()}
{gate_extra}
"""


def write_job(tmp_path: Path, text: str, filename: str = "job.toml") -> Path:
    path = tmp_path / filename
    path.write_text(text)
    return path


# ------------------------------------------------------------------ schema
VALID = """
[job]
name = "nightly"
registry = "reg"

[data.r]
path = "ratings.data"

[[models]]
name = "dcr"
kind = "dcr"
data = "r"
params = { n_components = 4 }
gate = { metric = "hit_rate_at_10", margin = 0.05, holdout = 0.3, seed = 7 }
"""


def test_valid_job_parses_with_defaults_and_relative_paths(tmp_path):
    config = load_job(write_job(tmp_path, VALID))
    assert config.name == "nightly"
    assert config.registry == tmp_path.resolve() / "reg"  # relative to the job file, not the cwd
    assert config.data["r"].path == tmp_path.resolve() / "ratings.data"
    assert config.data["r"].format == "auto"
    assert config.lock == config.registry / ".job-nightly.lock"
    (model,) = config.models
    assert model.params == {"n_components": 4, "verbose": False}
    assert (model.gate.metric, model.gate.margin, model.gate.holdout, model.gate.seed) == (
        "hit_rate_at_10",
        0.05,
        0.3,
        7,
    )
    assert model.refit is True and model.keep is None and config.redis is None


@pytest.mark.parametrize(
    "old, new, key, words",
    [
        ('name = "nightly"', 'name = "nightly"\nregsitry = "x"', "job.regsitry", "unknown key"),
        ('registry = "reg"\n', 'registry = "reg"\nkeep = "5"\n', "job.keep", "must be an integer"),
        ('registry = "reg"\n', 'registry = "reg"\nkeep = true\n', "job.keep", "must be an integer"),
        (
            'registry = "reg"\n',
            'registry = "reg"\nkeep = 0\n',
            "job.keep",
            "must be an int in [1, inf), got 0",
        ),
        ('registry = "reg"\n', 'registry = "reg"\nredis = "http://x"\n', "job.redis", "redis://"),
        ('registry = "reg"\n', "", "job.registry", "missing"),
        ('path = "ratings.data"', "path = 3", "data.r.path", "must be a string"),
        ('path = "ratings.data"', 'path = "x"\nfromat = "csv"', "data.r.fromat", "unknown key"),
        ('path = "ratings.data"', 'path = "x"\nrating_scale = "5..1"', "data.r.rating_scale", "empty"),
        ('path = "ratings.data"', 'path = "x"\nrating_scale = "1-5"', "data.r.rating_scale", "LOW..HIGH"),
        ('path = "ratings.data"', 'path = "x"\nrating_scale = 5', "data.r.rating_scale", "must be a string"),
        (
            'path = "ratings.data"',
            'path = "x"\nformat = "triples"\nrating_scale = "1..5"',
            "data.r.rating_scale",
            "not triples",
        ),
        ('kind = "dcr"', 'kind = "svd"', "models[1] ('dcr').kind", "must be one of 'dcr', 'coe'"),
        ('data = "r"', 'data = "ratings"', "models[1] ('dcr').data", "no [data.ratings]"),
        ("n_components = 4", "rnak = 4", "models[1] ('dcr').params.rnak", "unknown key"),
        ('metric = "hit_rate_at_10"', 'metric = "f1_at_5"', "models[1] ('dcr').gate.metric", "ndcg_at_10"),
        (
            "margin = 0.05",
            "margin = -0.1",
            "models[1] ('dcr').gate.margin",
            "must be a finite number in [0, inf), got -0.1",
        ),
        ("margin = 0.05", 'margin = "0.05"', "models[1] ('dcr').gate.margin", "must be a number"),
        ("holdout = 0.3", "holdout = 1.0", "models[1] ('dcr').gate.holdout", "(0, 1)"),
        ("seed = 7", "seed = 7.5", "models[1] ('dcr').gate.seed", "must be an integer"),
        ("seed = 7", "sede = 7", "models[1] ('dcr').gate.sede", "unknown key"),
        ('name = "dcr"', 'name = "Bad Name"', "models[1] ('Bad Name').name", "model name"),
        ('name = "dcr"', 'name = "dcr"\nrefit = "yes"', "models[1] ('dcr').refit", "true or false"),
        ('name = "dcr"', 'name = "dcr"\nlabels = "u.item"', "models[1] ('dcr').labels", "map models"),
    ],
)
def test_schema_errors_name_the_file_and_key(tmp_path, old, new, key, words):
    assert old in VALID
    path = write_job(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(JobError) as err:
        load_job(path)
    message = str(err.value)
    assert str(path) in message and key in message and words in message, message


def test_schema_structural_errors(tmp_path):
    cases = {
        "unknown top-level": (VALID + "\n[extra]\nx = 1\n", "extra"),
        "not toml": ("[job\nname=", "not valid TOML"),
        "no models": (VALID.split("[[models]]")[0], "models: missing"),
        "duplicate names": (VALID + VALID[VALID.index("[[models]]") :], "share this registry name"),
        "models not an array": ("models = 3\n" + VALID.split("[[models]]")[0], "models: must be"),
    }
    for what, (text, words) in cases.items():
        with pytest.raises(JobError, match=None) as err:
            load_job(write_job(tmp_path, text))
        assert words in str(err.value), (what, str(err.value))
    with pytest.raises(JobError, match="not found"):
        load_job(tmp_path / "missing.toml")


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_examples_are_valid_job_files(example):
    config = load_job(example)
    assert config.models
    for model in config.models:
        assert model.data in config.data


# -------------------------------------------------------------------- gate
def test_gate_rule():
    assert gate_passes(0.80, None, 0.0)  # no live version: publish
    assert gate_passes(0.80, 0.80, 0.0)  # no worse
    assert gate_passes(0.79, 0.80, 0.01)  # worse, but within the margin
    assert not gate_passes(0.789, 0.80, 0.01)
    assert not gate_passes(math.nan, None, 0.0)  # an undefined figure never passes
    assert gate_passes(0.5, math.nan, 0.0)


def versions(registry: Path, name: str = "dcr") -> list[str]:
    return Registry(registry).versions(name)


def test_gate_accepts_good_rejects_bad_and_margin_admits_it(sample, tmp_path, capsys):
    registry = tmp_path / "registry"
    good = write_job(tmp_path, job_text(sample, registry, GOOD), "good.toml")
    bad = write_job(tmp_path, job_text(sample, registry, BAD), "bad.toml")

    assert run_job(good) == EXIT_PUBLISHED
    (first,) = versions(registry)
    live = Registry(registry).load("dcr")
    assert live.metrics["holdout_ndcg_at_10"] > 0.5
    assert live.metrics["holdout_fraction"] == 0.2 and live.metrics["holdout_seed"] == 1
    assert live.metrics["holdout_refit"] == 1.0
    build_index(live)  # the published version serves
    # refit on all the data: the published seen items are the whole data set
    assert live.array("seen_indices").size == len((sample / "ratings.data").read_bytes().splitlines())

    capsys.readouterr()
    assert run_job(bad) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert "result=rejected" in err and f"live_version={first}" in err
    assert versions(registry) == [first]  # nothing published

    # The same bad model passes when the operator allows a large enough margin.
    lax = write_job(tmp_path, job_text(sample, registry, BAD, margin=1.0), "lax.toml")
    assert run_job(lax) == EXIT_PUBLISHED
    assert len(versions(registry)) == 2

    # ... and the good model is then compared with that (bad) live version and wins.
    assert run_job(good) == EXIT_PUBLISHED
    newest = Registry(registry).load("dcr")
    assert (
        newest.metrics["holdout_ndcg_at_10"]
        > Registry(registry).load("dcr", versions(registry)[1]).metrics["holdout_ndcg_at_10"]
    )


def test_live_version_without_metric_is_replaced_with_a_warning(sample, tmp_path, capsys):
    from ordrec.trainer.data.readers import read_ratings
    from ordrec.trainer.models.dcr import DCR

    registry = tmp_path / "registry"
    artifact = (
        DCR(n_components=3, max_iter=1).fit(read_ratings(sample / "ratings.data", "ml-100k")).to_artifact()
    )
    outside = Registry(registry).publish("dcr", artifact)  # e.g. `ordrec-train train`
    assert run_job(write_job(tmp_path, job_text(sample, registry))) == EXIT_PUBLISHED
    assert "has no holdout_ndcg_at_10" in capsys.readouterr().err
    assert versions(registry)[0] == outside and len(versions(registry)) == 2


def test_dry_run_and_no_refit(sample, tmp_path, capsys):
    registry = tmp_path / "registry"
    path = write_job(
        tmp_path,
        job_text(sample, registry, gate_extra="").replace(
            'data = "ratings"\n', 'data = "ratings"\nrefit = false\nkeep = 1\n'
        ),
    )
    assert run_job(path, dry_run=True) == EXIT_PUBLISHED
    assert "result=would_publish" in capsys.readouterr().err
    assert versions(registry) == []
    assert run_job(path) == EXIT_PUBLISHED
    published = Registry(registry).load("dcr")
    assert published.metrics["holdout_refit"] == 0.0
    n_ratings = len((sample / "ratings.data").read_bytes().splitlines())
    # the model measured on the training part is what was published: the held-out ratings are unseen
    assert published.array("seen_indices").size < n_ratings
    assert run_job(path) == EXIT_PUBLISHED
    assert len(versions(registry)) == 1  # keep = 1 pruned the older one


def test_failed_model_does_not_stop_the_others(sample, tmp_path, capsys):
    registry = tmp_path / "registry"
    text = job_text(sample, registry, 'n_components = 5, max_iter = 2, relevance = "bogus"', name="broken")
    text += (
        text[text.index("[[models]]") :]
        .replace('"broken"', '"dcr"')
        .replace('relevance = "bogus"', "random_state = 3")
    )
    path = write_job(tmp_path, text)
    assert run_job(path) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "model=broken result=failed" in err and "relevance" in err
    assert "model=dcr result=published" in err
    assert versions(registry, "broken") == [] and len(versions(registry)) == 1


def test_rating_scale_is_only_for_models_reading_ratings(tmp_path):
    text = VALID.replace('path = "ratings.data"', 'path = "tags.csv"\nrating_scale = "1..5"')
    with pytest.raises(
        JobError, match=r"data\.r\.rating_scale: is for ratings data; model 'dcr' \(rtf\) reads tags"
    ):
        load_job(write_job(tmp_path, text.replace('kind = "dcr"', 'kind = "rtf"')))
    assert load_job(write_job(tmp_path, text)).data["r"].rating_scale == RatingScale(1, 5)


def test_rating_scale_in_the_data_section(sample, tmp_path, capsys):
    registry = tmp_path / "registry"
    text = job_text(sample, registry).replace(
        'format = "ml-100k"\n', 'format = "ml-100k"\nrating_scale = "1..4"\n'
    )
    path = write_job(tmp_path, text)
    assert load_job(path).data["ratings"].rating_scale == RatingScale(1, 4)
    assert run_job(path) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "result=data_error" in err and "rating '5' is outside the rating scale 1..4" in err
    assert f"{sample / 'ratings.data'}:" in err and versions(registry) == []
    skipping = text.replace('rating_scale = "1..4"', 'rating_scale = "1..4"\nskip_bad_lines = true')
    assert run_job(write_job(tmp_path, skipping, "skip.toml")) == EXIT_PUBLISHED
    published = Registry(registry).load("dcr").attributes
    # the scale's values, below them "not rated" (the top-N model's lowest level)
    assert published["levels"] == [0.0, 1.0, 2.0, 3.0, 4.0] and published["unrated_level"] is True


def test_missing_data_is_a_data_error(sample, tmp_path, capsys):
    path = write_job(tmp_path, job_text(tmp_path / "nowhere", tmp_path / "registry"))
    assert run_job(path) == EXIT_USAGE
    assert "result=data_error" in capsys.readouterr().err
    assert run_job(path, only=["nope"]) == EXIT_USAGE


def test_lock_prevents_overlapping_runs(sample, tmp_path, capsys):
    registry = tmp_path / "registry"
    path = write_job(tmp_path, job_text(sample, registry))
    config = load_job(path)
    with job_lock(config.lock, config.name):
        assert run_job(path) == EXIT_FAILED
        assert "already running" in capsys.readouterr().err
        assert versions(registry) == []
    assert run_job(path) == EXIT_PUBLISHED  # released: the next run proceeds

    blocked = write_job(
        tmp_path,
        job_text(sample, registry).replace(
            f'registry = "{registry}"', f'registry = "{registry}"\nlock = "{path}/not-a-folder/x.lock"'
        ),
        "b.toml",
    )
    assert run_job(blocked) == EXIT_FAILED  # the lock's folder cannot exist under a file
    assert "cannot take the lock" in capsys.readouterr().err


def test_a_lock_refused_for_permissions_says_what_to_do(sample, tmp_path, capsys, monkeypatch):
    """A registry made on the host by another user: the error names the uid, the folder and the fixes."""
    registry = tmp_path / "registry"
    registry.mkdir()
    path = write_job(tmp_path, job_text(sample, registry))
    lock = load_job(path).lock

    @contextlib.contextmanager
    def refused(path, name):  # the tests run as root here, which no permission bit stops
        raise PermissionError(13, "Permission denied", str(path))
        yield

    monkeypatch.setattr(job_module, "job_lock", refused)
    assert run_job(path) == EXIT_FAILED
    err = capsys.readouterr().err
    owner = f"{registry.stat().st_uid}:{registry.stat().st_gid}"
    assert f"cannot take the lock {lock}: [Errno 13] Permission denied" in err
    assert f"runs as uid {os.getuid()} (gid {os.getgid()}), which cannot write in {registry}" in err
    assert (
        f"docker run --user {owner} ..." in err and f"chown -R {os.getuid()}:{os.getgid()} {registry}" in err
    )
    assert versions(registry) == []


def test_other_lock_failures_keep_the_plain_message(tmp_path):
    text = lock_failure(tmp_path / "x.lock", FileNotFoundError(2, "No such file or directory"))
    assert text == f"cannot take the lock {tmp_path / 'x.lock'}: [Errno 2] No such file or directory"


# --------------------------------------------------------- through the CLI
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordrec.trainer", *args], capture_output=True, text=True, timeout=300
    )


def test_exit_codes_through_the_real_cli(sample, tmp_path):
    registry = tmp_path / "registry"
    good = write_job(tmp_path, job_text(sample, registry, GOOD), "good.toml")
    bad = write_job(tmp_path, job_text(sample, registry, BAD), "bad.toml")
    broken = write_job(tmp_path, job_text(sample, registry).replace("margin = 0.0", 'margin = "x"'), "x.toml")

    result = cli("run", str(broken))
    assert result.returncode == 2, result.stderr
    assert "gate.margin" in result.stderr and str(broken) in result.stderr

    result = cli("run", str(good))
    assert result.returncode == 0, result.stderr
    assert "result=published" in result.stderr and "done exit=0" in result.stderr

    result = cli("run", str(bad))
    assert result.returncode == 3, result.stderr
    assert "result=rejected" in result.stderr

    config = load_job(good)
    with job_lock(config.lock, config.name):  # another run holds the lock
        result = cli("run", str(good))
    assert result.returncode == 1, result.stderr
    assert "already running" in result.stderr
    assert len(versions(registry)) == 1
