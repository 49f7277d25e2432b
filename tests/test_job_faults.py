"""Killing ``ordrec-train run`` at any point leaves the registry as it was.

- SIGKILL in the middle of writing a version (made deterministic by a child
  that pauses inside ``service.storage.checksums._write_array``): the registry lists
  and loads only complete versions, the lock dies with the process, and the
  next run publishes normally.
- SIGTERM at the same point: the job unwinds, removes its temporary folder
  and exits 1.
- SIGKILL of the real CLI at seeded random moments of its work (after the
  interpreter start: reading, fitting, evaluating, refitting, publishing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ordrec.service.indices.models import build_index
from ordrec.service.storage.names import is_version
from ordrec.service.storage.registry import Registry
from ordrec.trainer.job import EXIT_FAILED, EXIT_PUBLISHED, run_job
from ordrec.trainer.sample import write_samples

# A child that runs a job but stalls inside the second array write of a
# publish, after announcing it on stdout: the test then kills it right there.
PAUSING_CHILD = """
import sys, time
import ordrec.service.storage.registry as artifacts
real_write, calls = artifacts._write_array, [0]
def stalling_write(path, array):
    calls[0] += 1
    if calls[0] == 2:
        print("MID-PUBLISH", flush=True)
        time.sleep(120)
    return real_write(path, array)
artifacts._write_array = stalling_write
from ordrec.trainer.job import run_job
sys.exit(run_job(sys.argv[1]))
"""


@pytest.fixture
def setup(tmp_path):
    sample = tmp_path / "sample"
    write_samples(sample)
    registry = tmp_path / "registry"
    job = tmp_path / "job.toml"
    job.write_text(f"""
[job]
name = "fault-job"
registry = "{registry}"

[data.ratings]
path = "{sample / "ratings.data"}"
format = "ml-100k"

[[models]]
name = "dcr"
kind = "dcr"
data = "ratings"
params = {{ n_components = 4, max_iter = 3 }}
gate = {{ metric = "ndcg_at_10", margin = 1.0, popularity_floor = false }}
""")
    assert run_job(job) == EXIT_PUBLISHED  # a live version to protect
    return job, registry


def assert_intact(registry: Path, name: str = "dcr") -> list[str]:
    """Every listed version loads, verifies and serves; nothing else looks like a version."""
    reg = Registry(registry)
    versions = reg.versions(name)
    assert versions, "the live version disappeared"
    for version in versions:
        build_index(reg.load(name, version))
    for entry in os.listdir(registry / name):
        assert is_version(entry) or entry.startswith((".tmp-", ".trash-")), entry
    live, _ = reg.live_version(name)
    assert live == versions[-1]
    return versions


def start_paused_child(job: Path) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSING_CHILD, str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = threading.Event()

    def watch():
        for line in child.stdout:
            if "MID-PUBLISH" in line:
                seen.set()
                return

    threading.Thread(target=watch, daemon=True).start()
    if not seen.wait(120):
        child.kill()
        pytest.fail("the child never reached the publish: " + child.stderr.read())
    return child


def test_sigkill_mid_publish_leaves_only_complete_versions(setup):
    job, registry = setup
    before = assert_intact(registry)
    child = start_paused_child(job)
    assert list((registry / "dcr").glob(".tmp-*")), "the kill must land while a version is half written"
    child.kill()
    child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert assert_intact(registry) == before  # the half-written version is invisible
    # The lock died with the process and the stale temporary folder is harmless.
    assert run_job(job) == EXIT_PUBLISHED
    after = assert_intact(registry)
    assert after[:-1] == before and len(after) == len(before) + 1


def test_sigterm_mid_publish_cleans_up_and_exits_1(setup):
    job, registry = setup
    before = assert_intact(registry)
    child = start_paused_child(job)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == EXIT_FAILED, err
    assert "terminated by SIGTERM" in err
    assert not list((registry / "dcr").glob(".tmp-*"))
    assert assert_intact(registry) == before


class CliRun:
    """The real CLI as a child; ``wait_started`` returns once the job has its lock and began."""

    def __init__(self, job: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ordrec.trainer", "run", str(job)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            if "model=dcr start" in line:
                self.started.set()

    def wait_started(self) -> float:
        assert self.started.wait(120), "the job never started"
        return time.monotonic()


def test_sigkill_at_random_moments_of_real_cli_runs(setup):
    job, registry = setup
    # One undisturbed run measures how long the job's own work takes (reading,
    # fitting, evaluating, refitting, publishing), after the interpreter start.
    run = CliRun(job)
    t0 = run.wait_started()
    assert run.proc.wait(300) == EXIT_PUBLISHED
    work = time.monotonic() - t0
    count = len(assert_intact(registry))
    rng = np.random.default_rng(20261125)
    outcomes = []
    for fraction in rng.uniform(0.0, 1.1, 5):
        run = CliRun(job)
        run.wait_started()
        time.sleep(fraction * work)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(30)
        versions = assert_intact(registry)
        # killed before the rename: nothing new; finished first: exactly one new version
        assert len(versions) in (count, count + 1)
        outcomes.append("killed" if run.proc.returncode == -signal.SIGKILL else "finished")
        count = len(versions)
    assert "killed" in outcomes, outcomes
    assert run_job(job) == EXIT_PUBLISHED  # never a stale lock
