"""``benchmarks/replay.py`` end to end: a real redis-server, real ``ordrec-serve`` processes and real
``ordrec-train run`` jobs replaying a tiny generated log (three simulated days), then the report's
invariants; on ML-100K (slow) the claims of docs/operations.md "A shop's weeks, replayed"."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import data_file, require_redis_server

pytestmark = pytest.mark.redis

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "replay.py"
DAY = 86400


def planted_log(path: Path, users: int = 45, seed: int = 0) -> list[tuple[int, int, int, int]]:
    """Three taste groups of users over 90 items, six days of ratings in ml-100k format: each user
    rates 16 items of their group's 30 with 4-5 and 4 others with 1-2, at random times."""
    rng = random.Random(seed)
    rows = []
    for user in range(1, users + 1):
        group = user % 3
        liked = rng.sample(range(group * 30, group * 30 + 30), 16)
        others = rng.sample([i for i in range(90) if i // 30 != group], 4)
        for item in liked + others:
            rating = rng.choice([4, 5]) if item in liked else rng.choice([1, 2])
            rows.append((user, item + 1, rating, 10**9 + rng.randrange(6 * DAY)))
    path.write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows))
    return rows


def run_replay(*args: str) -> dict:
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = Path(args[args.index("--out") + 1])
    return {arm["arm"]: arm for arm in json.loads((out / "replay.json").read_text())["arms"]}


def replayed(rows) -> list:
    """The interactions of the newest half of the log's time span (what is replayed)."""
    first, last = min(r[3] for r in rows), max(r[3] for r in rows)
    return [r for r in rows if r[3] >= first + 0.5 * (last - first)]


def assert_counts_add_up(arm: dict, trials: int) -> None:
    days = arm["days"]
    assert arm["trials"] == sum(d["trials"] for d in days) == trials
    assert arm["hits"] == sum(d["hits"] for d in days) <= trials
    assert all(d["hits"] <= d["trials"] and d["new_item_hits"] <= d["new_item_trials"] for d in days)
    errors = sum(n for d in days for code, n in d["errors"].items() if code.startswith("Recommend"))
    assert errors == arm["recommend_errors"] == 0
    assert all(sum(d["served"].values()) == d["events"] for d in days)  # every answer was counted once


def tiny(tmp_path) -> tuple[str, ...]:
    """The tiny log's replay: a simulated day a second, the job every day, a small fit; the gate
    (and its popularity floor) still judges, with a margin the tiny data's noise does not cross."""
    return (
        "--data", str(tmp_path / "log.data"),
        "--day-seconds", "1",
        "--job-every", "1",
        "--params", "n_components = 4, max_iter = 5, random_state = 0",
        "--gate-margin", "1",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip


def test_a_tiny_replay_loses_nothing_and_its_counts_add_up(tmp_path):
    require_redis_server()
    rows = planted_log(tmp_path / "log.data")
    report = run_replay(*tiny(tmp_path), "--arms", "full,static", "--plot", str(tmp_path / "replay.png"))
    events = replayed(rows)
    trials = sum(1 for _, _, rating, _ in events if rating >= 4)
    full, static = report["full"], report["static"]
    for arm in (full, static):
        assert_counts_add_up(arm, trials)
    assert full["acknowledged"] == full["in_stream"] == len(events) and full["acknowledged_lost"] == 0
    # the loop: versions published, the last job read every acknowledged event and the live
    # version's checkpoint holds them all
    assert full["published"] >= 1
    assert full["jobs"][-1]["outcome"] == "published"
    assert full["read_by_last_job"] == full["trained_events"] == full["acknowledged"]
    # the static arm: nothing recorded, no job, no fold-in, one version
    assert static["acknowledged"] == static["in_stream"] == 0
    assert static["jobs"] == [] and static["trained_events"] is None
    assert all(d["served"]["fold_in"] == 0 and len(d["versions"]) == 1 for d in static["days"])
    assert (tmp_path / "replay.png").stat().st_size > 0


def test_killing_redis_and_the_job_mid_replay_loses_no_acknowledged_event(tmp_path):
    require_redis_server()
    rows = planted_log(tmp_path / "log.data")
    report = run_replay(*tiny(tmp_path), "--arms", "full", "--faults")
    full = report["full"]
    assert_counts_add_up(full, sum(1 for _, _, rating, _ in replayed(rows) if rating >= 4))
    faults = [fault for day in full["days"] for fault in day["faults"]]
    assert len(faults) == 2 and any("redis" in f for f in faults) and "job killed" in faults
    assert full["record_retries"] > 0  # calls met Redis down and were retried until acknowledged
    assert "killed" in [job["outcome"] for job in full["jobs"]]
    assert full["acknowledged"] == full["in_stream"] == len(replayed(rows)) and full["acknowledged_lost"] == 0
    assert full["jobs"][-1]["outcome"] == "published"
    assert full["read_by_last_job"] == full["trained_events"] == full["acknowledged"]


@pytest.mark.slow
def test_on_ml100k_the_loop_beats_every_other_arm_and_loses_nothing(tmp_path):
    """docs/operations.md's claims on a shorter replay of ML-100K (a third of the users, the
    first 30 simulated days; the documented run takes about half an hour here)."""
    require_redis_server()
    report = run_replay(
        "--data", str(data_file("ml-100k", "u.data")),
        "--user-share", "0.3",
        "--max-days", "30",
        "--job-every", "3",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    full = report["full"]
    assert full["hit_rate"] > max(report[arm]["hit_rate"] for arm in ("static", "popularity", "trending"))
    assert full["acknowledged_lost"] == 0 and full["read_by_last_job"] == full["acknowledged"]
    assert full["published"] >= 1 and full["recommend_errors"] == 0
