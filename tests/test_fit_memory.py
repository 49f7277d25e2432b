"""A fit's memory is predicted from the data's shape before it starts: a fit that cannot fit
the process's memory stops with the predicted figure (never a traceback, a MemoryError or the
kernel's OOM killer), a fit that can completes within it, and the prediction bounds the
measured peak."""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest

from ordrec.service.indices.models import kinds
from ordrec.trainer.data.readers import read_input
from ordrec.trainer.job import EXIT_PUBLISHED, run_job
from ordrec.trainer.models.memory import MemoryPrediction, cgroup_limit, gigabytes, predict_fit_memory
from ordrec.trainer.models.pipeline import configure
from tests import toy_kind

# Every subprocess here runs under this address-space limit: a fit the check failed to stop
# fails its allocation instead of growing towards the machine's memory.
LIMIT = 4 << 30
# 10^7 dimensions a level: about 50 GB of factors for a few hundred users and items.
HUGE = "n_components=10000000"


def _limited(limit: int = LIMIT):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _ratings_file(folder: Path, users: int = 300, items: int = 60, n: int = 3000) -> Path:
    """A tab-separated file of ``n`` ratings 1..5 (user, item, rating)."""
    rng = np.random.default_rng(0)
    pairs = rng.choice(users * items, n, replace=False)
    rows = [f"u{p // items}\ti{p % items}\t{rng.integers(1, 6)}" for p in pairs]
    path = folder / "ratings.tsv"
    path.write_text("user\titem\trating\n" + "\n".join(rows) + "\n")
    return path


def _train(data: Path, registry: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ordrec.trainer", "train", "dcr", "--data", str(data), "--format", "tsv"]
    return subprocess.run(
        [*command, "--registry", str(registry), *flags],
        capture_output=True,
        text=True,
        preexec_fn=_limited(),
        timeout=300,
    )


def _predicted_need(data: Path, params: dict) -> str:
    """The figure the check names for a fit under RLIMIT_AS: the prediction and the kernels'
    reserved address space, computed here from the same file and settings."""
    ratings = read_input("ratings", str(data), "tsv")
    prediction = predict_fit_memory("dcr", configure("dcr", params).estimator, ratings)
    assert prediction is not None
    return gigabytes(prediction.peak + prediction.reserved)


def _clean(stderr: str) -> None:
    for bad in ("Traceback", "MemoryError", "OSError", "Cannot allocate"):
        assert bad not in stderr, stderr


def test_a_fit_too_large_for_the_address_space_stops_with_its_predicted_figure(tmp_path):
    data = _ratings_file(tmp_path)
    done = _train(data, tmp_path / "reg", "--set", HUGE)
    assert done.returncode == 2, done.stderr
    _clean(done.stderr)
    need = _predicted_need(data, {"n_components": 10_000_000, "random_state": 0})
    assert f"needs about {need} of memory" in done.stderr
    assert "RLIMIT_AS" in done.stderr and "n_components" in done.stderr and "--cluster" in done.stderr
    assert "--no-memory-check" in done.stderr
    assert not (tmp_path / "reg" / "dcr").exists()


def test_a_fit_that_fits_under_the_same_limit_completes(tmp_path):
    done = _train(_ratings_file(tmp_path), tmp_path / "reg", "--set", "n_components=8")
    assert done.returncode == 0, done.stderr
    assert "published dcr@" in done.stdout


def test_the_override_fits_anyway_and_an_allocation_that_fails_is_a_message(tmp_path):
    done = _train(_ratings_file(tmp_path), tmp_path / "reg", "--set", HUGE, "--no-memory-check")
    assert done.returncode == 1, done.stderr
    assert "ordrec-train: out of memory" in done.stderr
    assert "needs about" not in done.stderr
    _clean(done.stderr)


def test_the_cron_job_checks_its_fits_too(tmp_path):
    data = _ratings_file(tmp_path)
    job = tmp_path / "job.toml"
    job.write_text(
        textwrap.dedent(
            f"""
            [job]
            name = "nightly"
            registry = "reg"

            [data.r]
            path = "{data.name}"
            format = "tsv"

            [[models]]
            name = "dcr"
            kind = "dcr"
            data = "r"
            params = {{ n_components = 10000000 }}
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "ordrec.trainer", "run", str(job)],
        capture_output=True,
        text=True,
        preexec_fn=_limited(),
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "FitTooLarge" in done.stderr and "needs about" in done.stderr and "RLIMIT_AS" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_limits_include_the_address_space_left_under_rlimit_as():
    code = textwrap.dedent(
        """
        import json, resource
        from ordrec.trainer.models.memory import memory_limits
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        print(json.dumps({"size": size, "limits": [[x.name, x.available] for x in memory_limits()]}))
        """
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    limits = dict(out["limits"])
    left = limits["address space left under RLIMIT_AS"]
    assert abs(left - ((6 << 30) - out["size"])) < (16 << 20)
    assert "MemAvailable" in limits


def _cgroup_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cgroup_headroom_is_the_least_of_the_process_group_and_its_parents(tmp_path):
    membership = tmp_path / "cgroup"
    membership.write_text("0::/jobs/trainer\n")
    _cgroup_tree(
        tmp_path,
        {
            "jobs/trainer/memory.max": "max\n",
            "jobs/trainer/memory.current": "100\n",
            "jobs/memory.max": "5000000000\n",
            "jobs/memory.current": "3000000000\n",
            "memory.max": "max\n",
        },
    )
    limit = cgroup_limit(tmp_path, membership)
    assert limit is not None and limit.available == 2_000_000_000 and "memory.max" in limit.name
    membership.write_text("4:memory:/box\n0::/\n")  # v1's memory controller, a v2 root beside it
    _cgroup_tree(
        tmp_path,
        {
            "memory/box/memory.limit_in_bytes": "3000000000\n",
            "memory/box/memory.usage_in_bytes": "1000000000\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "unlimited"
            "memory/memory.usage_in_bytes": "8000000000\n",
        },
    )
    limit = cgroup_limit(tmp_path, membership)
    assert limit is not None and limit.available == 2_000_000_000 and "limit_in_bytes" in limit.name
    (tmp_path / "memory/box/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_limit(tmp_path, membership) is None


# The child (benchmarks/predict_memory.py --child) fits generated ratings of one shape
# and prints the prediction and its peak resident memory above the start of the fit (VmHWM,
# reset just before it): the fit and the artifact a train command writes.
CHILD = Path(__file__).resolve().parent.parent / "benchmarks" / "predict_memory.py"

SHAPES = [
    ("dcr", 20_000, 2_000, 200_000, {}),
    ("dcr", 100_000, 5_000, 200_000, {"n_components": 60}),
    # The validated refinement a job runs: a hold-out fit, its scoring, the full fit.
    (
        "dcr",
        50_000,
        3_000,
        300_000,
        {"pairwise": True, "validation_folds": 1, "pairwise_validation_max_users": 2000},
    ),
    ("coe", 100_000, 10_000, 2_000_000, {}),
]


def _measure(kind: str, users: int, items: int, n: int, params: dict, cap: bool) -> dict:
    done = subprocess.run(
        [sys.executable, str(CHILD), "--child", json.dumps([kind, users, items, n, params, cap])],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=None if cap else _limited(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("kind,users,items,n,params", SHAPES)
def test_the_prediction_bounds_the_measured_peak_within_three_times(kind, users, items, n, params):
    measured = _measure(kind, users, items, n, params, cap=False)
    assert measured["actual"] <= measured["predicted"] <= 3 * measured["actual"], measured


@pytest.mark.parametrize("kind,users,items,n,params", [*SHAPES[:2], SHAPES[-1]])
def test_the_fit_completes_in_the_address_space_it_predicts(kind, users, items, n, params):
    _measure(kind, users, items, n, params, cap=True)


# The toy kind with a memory predictor that records, at each check, how many fitted models
# are still alive: a job's refit must not sit on top of the measured model it will not publish.
FITTED: weakref.WeakSet = weakref.WeakSet()
ALIVE_AT_CHECK: list[int] = []


class TrackedEstimator(toy_kind.Estimator):
    def fit(self, data):
        FITTED.add(self)
        return super().fit(data)


def alive_models(estimator, data) -> MemoryPrediction:
    gc.collect()
    ALIVE_AT_CHECK.append(len(FITTED))
    return MemoryPrediction(peak=1 << 20, shape=f"{len(data)} ratings", remedies="none needed")


TRACKED = kinds.ModelKind(
    "toy",
    index="tests.toy_kind:Index",
    estimator="tests.test_fit_memory:TrackedEstimator",
    protocol="tests.toy_kind",
    summary="toy, its fitted models tracked",
    memory="tests.test_fit_memory:alive_models",
)


def test_a_jobs_refit_starts_without_the_measured_model(tmp_path):
    kinds.register(TRACKED)
    try:
        data = _ratings_file(tmp_path)
        job = tmp_path / "job.toml"
        job.write_text(
            f'[job]\nname = "toy"\nregistry = "reg"\n\n[data.r]\npath = "{data.name}"\nformat = "tsv"\n\n'
            '[[models]]\nname = "toy-job"\nkind = "toy"\ndata = "r"\n'
            "gate = { popularity_floor = false }\n"  # an item-mean toy ties popularity: not tested here
        )
        ALIVE_AT_CHECK.clear()
        assert run_job(job) == EXIT_PUBLISHED
    finally:
        kinds.unregister("toy")
    assert ALIVE_AT_CHECK == [0, 0]  # the fit on the training part, then the refit on all
