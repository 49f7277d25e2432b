"""``ordrec-train export`` against ``Recommend`` of the same version on a real server:
every format round-trips to the same answers (hidden items honoured, training items
excluded, unknown users flagged); a bad users file fails naming file and line."""

from __future__ import annotations

import csv
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from ordrec.client import Client
from ordrec.tools.process import ServerProcess, run_cli
from tests.conftest import free_port, train_into

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
        ["ordrec.trainer", "registry", "hide", "--registry", str(root), "i164", "i043"]
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


@pytest.mark.redis
def test_with_redis_the_items_recorded_since_training_are_excluded_as_recommend_does(
    registry, redis_server, tmp_path
):
    users = tmp_path / "users.txt"
    users.write_text("u001\nu017\n")
    with (
        ServerProcess(registry, *redis_server.serve_flags) as proc,
        Client(proc.target, timeout=10) as client,
    ):
        top = [i.id for i in client.recommend("u001", model="dcr", n=N).results[0].items[:3]]
        client.record("u001", top, model="dcr")
        reply = client.recommend(["u001", "u017"], model="dcr", n=N)
    exports = {}
    for flags in (["--redis", redis_server.url], []):
        out = tmp_path / f"recs{len(flags)}.jsonl"
        args = ["export", "dcr", "--registry", str(registry), "--n", str(N), "--out", str(out)]
        run_cli(["ordrec.trainer", *args, "--users", str(users), *flags])
        exports[bool(flags)] = read_export(out)
    for result in reply.results:
        items, scores, _ = exports[True][result.user_id]
        assert items == [i.id for i in result.items] and scores == pytest.approx(
            [i.score for i in result.items]
        )
    assert not set(top) & set(exports[True]["u001"][0])
    assert set(top) <= set(exports[False]["u001"][0])  # without Redis nothing recorded is known


def test_an_unreadable_redis_fails_open_with_a_warning(registry, tmp_path):
    import redis

    from ordrec.service.storage.registry import Registry
    from ordrec.trainer.export import export

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    plain, degraded = tmp_path / "plain.jsonl", tmp_path / "degraded.jsonl"
    export(Registry(registry), "dcr", N, plain, ["u001", "u017"], progress=False)
    summary = export(
        Registry(registry), "dcr", N, degraded, ["u001", "u017"], progress=False, redis_client=dead
    )
    assert summary.seen_degraded and degraded.read_text() == plain.read_text()


def test_forgotten_users_are_left_out_even_when_listed(registry, tmp_path):
    copy = tmp_path / "registry"
    shutil.copytree(registry, copy)
    run_cli(["ordrec.trainer", "registry", "forget", "--registry", str(copy), "--user", "u017"])
    users = tmp_path / "users.txt"
    users.write_text("u001\nu017\nnot-a-user\n")
    out = tmp_path / "recs.csv"
    result = run_cli(
        ["ordrec.trainer", "export", "dcr", "--registry", str(copy), "--out", str(out), "--users", str(users)]
    )
    assert list(read_export(out)) == ["u001", "not-a-user"] and "u017" not in out.read_text()
    assert "1 forgotten left out" in result.stdout
