"""``ordrec-train export`` against ``Recommend`` of the same version on a real server:
every format round-trips to the same answers (hidden items honoured, training items
excluded, unknown users flagged); a bad users file fails naming file and line."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest

from ordrec.client import Client
from ordrec.tools.process import ServerProcess, run_cli
from tests.conftest import train_into

N = 7
DCR = ("dcr", "dcr", "ratings.data", ["--set", "max_iter=3"])


def read_export(path: Path) -> dict[str, tuple[list[str], list[float], bool]]:
    """user -> (items, scores, fallback), whatever the format."""
    rows: dict[str, list] = defaultdict(list)
    flags: dict[str, bool] = {}
    if path.suffix == ".jsonl":
        out = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out[record["user"]] = (record["items"], record["scores"], record["fallback"])
        return out
    if path.suffix == ".csv":
        with path.open(newline="") as fh:
            table = [
                (r["user"], int(r["rank"]), r["item"], float(r["score"]), r["fallback"] == "1")
                for r in csv.DictReader(fh)
            ]
    else:
        import pyarrow.parquet as pq

        data = pq.read_table(path).to_pydict()
        table = list(zip(data["user"], data["rank"], data["item"], data["score"], data["fallback"]))
    for user, rank, item, score, fallback in table:
        rows[user].append((rank, item, score))
        flags[user] = fallback
    return {
        u: ([i for _, i, _ in sorted(r)], [s for _, _, s in sorted(r)], flags[u]) for u, r in rows.items()
    }


@pytest.fixture(scope="module")
def registry(sample_dir, tmp_path_factory) -> Path:
    root = train_into(tmp_path_factory.mktemp("export-registry"), sample_dir, [DCR])
    run_cli(
        ["ordrec.trainer", "hide", "--registry", str(root), "i164", "i043"]
    )  # popular items: in many top-N
    return root


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_every_format_round_trips_to_the_recommend_answers(registry, tmp_path, suffix):
    users = tmp_path / "users.txt"
    users.write_text("u001\nu017\nnot-a-user\nu250\n")
    out = tmp_path / f"recs{suffix}"
    run_cli(
        [
            "ordrec.trainer",
            "export",
            "dcr",
            "--registry",
            str(registry),
            "--n",
            str(N),
            "--out",
            str(out),
            "--users",
            str(users),
        ]
    )
    exported = read_export(out)
    assert list(exported) == ["u001", "u017", "not-a-user", "u250"]
    with ServerProcess(registry) as proc, Client(proc.target, timeout=10) as client:
        reply = client.recommend(list(exported), model="dcr", n=N)
    for result in reply.results:
        items, scores, fallback = exported[result.user_id]
        served = [(i.id, i.score) for i in result.items]
        assert items == [i for i, _ in served], (result.user_id, list(zip(items, scores)), served)
        assert scores == pytest.approx([s for _, s in served])
        assert fallback == (result.fallback != 0)
        assert not {"i164", "i043"} & set(items)  # hidden
    assert exported["not-a-user"][2] and not exported["u001"][2]


def test_every_user_by_default_and_the_file_is_replaced_whole(registry, tmp_path):
    out = tmp_path / "all.jsonl"
    out.write_text("old\n")
    run_cli(["ordrec.trainer", "export", "dcr", "--registry", str(registry), "--n", "3", "--out", str(out)])
    exported = read_export(out)
    assert len(exported) == 300 and all(len(v[0]) == 3 and not v[2] for v in exported.values())
    assert not list(tmp_path.glob(".ordrec-export-*"))  # no temporary file left


@pytest.mark.parametrize(
    "content, line, what",
    [
        (b"u001\n\nu002\n", 2, "empty line"),
        (b"u001\n u002\n", 2, "surrounding spaces"),
        (b"u001\nu002\nu001\n", 3, "repeats the user id of line 1"),
        (b"u001\n" + b"x" * 300 + b"\n", 2, "300 characters long"),
        (b"u001\n\xff\xfe\n", 2, "not UTF-8"),
        (b"u001\ta\n", 1, "control characters"),
    ],
)
def test_a_bad_users_file_fails_naming_file_and_line(registry, tmp_path, content, line, what):
    users = tmp_path / "users.txt"
    users.write_bytes(content)
    out = tmp_path / "recs.csv"
    result = run_cli(
        [
            "ordrec.trainer",
            "export",
            "dcr",
            "--registry",
            str(registry),
            "--out",
            str(out),
            "--users",
            str(users),
        ],
        check=False,
    )
    assert result.returncode == 2 and f"{users}:{line}" in result.stderr and what in result.stderr, (
        result.stderr
    )
    assert not out.exists()


def test_a_bad_extension_fails_before_any_work(registry, tmp_path):
    result = run_cli(
        ["ordrec.trainer", "export", "dcr", "--registry", str(registry), "--out", str(tmp_path / "r.xlsx")],
        check=False,
    )
    assert result.returncode == 2 and "r.xlsx" in result.stderr and ".parquet" in result.stderr
