"""The bundled load generator against real server processes on loopback.

It is what the load benchmark's figures come from, so it must count what it
sent, honour the offered rate, and count gRPC errors on every process that
shares the port (h2load cannot read status trailers; the counts come from
each server's ``/metrics``).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ordrec.service.config import ServerConfig
from ordrec.service.serving.cli import build_parser, config_from_args
from ordrec.tools import loadtest
from ordrec.tools.process import ServerProcess, run_cli


@pytest.fixture
def h2load() -> None:
    """Skip without h2load, unless CI requires it (ORDREC_REQUIRE_H2LOAD)."""
    if shutil.which("h2load") is None:
        if os.environ.get("ORDREC_REQUIRE_H2LOAD"):
            pytest.fail("ORDREC_REQUIRE_H2LOAD is set but h2load is not installed (scripts/ensure_h2load.sh)")
        pytest.skip("h2load (Debian nghttp2-client) not installed")


def run_loadtest(server: ServerProcess, registry, tmp_path, *extra: str) -> dict:
    out = tmp_path / "summary.json"
    result = run_cli(
        [
            "ordrec.tools.loadtest",
            "--target",
            server.target,
            "--registry",
            str(registry),
            "--recommend-model",
            "dcr",
            "--json",
            str(out),
            *extra,
        ],
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "p99 ms" in result.stdout  # the printed table
    return json.loads(out.read_text())


def test_python_engine_paces_open_loop_and_sees_no_errors(sample_registry, tmp_path):
    with ServerProcess(sample_registry) as server:
        summary = run_loadtest(
            server,
            sample_registry,
            tmp_path,
            "--engine",
            "python",
            "--rate",
            "100",
            "--duration",
            "2",
            "--concurrency",
            "4",
            "--connections",
            "2",
        )
    assert summary["errors"] == 0
    assert 150 <= summary["requests"] <= 210  # 100 QPS for 2 s, open loop
    assert 0 < summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"] <= summary["max_ms"]


def test_python_engine_counts_error_statuses(sample_registry, tmp_path):
    with ServerProcess(sample_registry) as server:
        # n above the server's bound: every call is INVALID_ARGUMENT
        summary = run_loadtest(
            server,
            sample_registry,
            tmp_path,
            "--engine",
            "python",
            "--rate",
            "50",
            "--duration",
            "1",
            "--n",
            "100000",
        )
    assert summary["errors_by_code"].get("INVALID_ARGUMENT", 0) == summary["errors"] > 0


def python_engine_run(server, registry, tmp_path, seconds: int, concurrency: int, connections: int, *extra):
    """The python engine for ``seconds`` over ``connections``, each process's share counted."""
    flags = ("--engine", "python", "--duration", str(seconds), "--concurrency", str(concurrency))
    more = ("--connections", str(connections), "--metrics-url", server.metrics_urls, *extra)
    return run_loadtest(server, registry, tmp_path, *flags, *more)


def test_python_engine_opens_one_connection_per_channel(sample_registry, tmp_path):
    # 16 connections, never recycled within the run, spread by the kernel over two processes:
    # all of them on one process has odds 2^-15. (Channels sharing gRPC's global subchannel
    # pool were one connection, and one process took every call.)
    with ServerProcess(sample_registry, "--processes", "2", "--max-connection-age", "600") as server:
        summary = python_engine_run(server, sample_registry, tmp_path, 2, 16, 16)
    assert summary["errors"] == 0, summary["errors_by_code"]
    assert len(summary["process_shares"]) == 2 and min(summary["process_shares"]) > 0


def test_recycled_connections_fail_no_call_and_reach_both_processes(sample_registry, tmp_path):
    # Eight client connections under load (32 calls in flight), each recycled about every 0.5 s
    # (some 100 GOAWAYs in the run). The calls open at a GOAWAY finish within the grace, and grpc
    # retries those the server refused on the new connection, so none fails; with a grace too
    # short for the calls in flight (1 ms) dozens fail UNAVAILABLE. Each reconnect is hashed anew
    # over the two processes sharing the port, so both answer calls.
    with ServerProcess(
        sample_registry, "--processes", "2", "--max-connection-age", "0.5", "--max-connection-age-grace", "5"
    ) as server:
        summary = python_engine_run(server, sample_registry, tmp_path, 8, 32, 8)
    assert summary["errors"] == 0, summary["errors_by_code"]
    assert summary["requests"] > 1000
    assert len(summary["process_shares"]) == 2 and min(summary["process_shares"]) > 0


def test_processes_sharing_a_port_recycle_connections_by_default(sample_registry, tmp_path):
    # One client connection, no --max-connection-age: processes sharing the port recycle it
    # every 2 s or so (a 30 s age kept it on one process for the whole run), and each reconnect
    # is hashed anew, so both processes answer: all ~10 ages on one has odds of about 2^-9.
    with ServerProcess(sample_registry, "--processes", "2") as server:
        summary = python_engine_run(server, sample_registry, tmp_path, 20, 4, 1, "--rate", "100")
    assert summary["errors"] == 0, summary["errors_by_code"]
    assert len(summary["process_shares"]) == 2 and min(summary["process_shares"]) > 0


def test_one_process_keeps_the_long_connection_age():
    # One process per pod balances by replicas (client round_robin): no need to reconnect often.
    args = build_parser().parse_args(["--registry", "r"])
    assert config_from_args(args).max_connection_age == ServerConfig(registry="r").max_connection_age >= 30
    given = build_parser().parse_args(["--registry", "r", "--processes", "2", "--max-connection-age", "7"])
    assert config_from_args(given).max_connection_age == 7


@pytest.mark.parametrize("arrivals", ["aligned", "staggered"])
def test_h2load_counts_errors_on_every_process(h2load, sample_registry, tmp_path, arrivals):
    # h2load's clients stop at a GOAWAY (no reconnect): no recycling within the run.
    with ServerProcess(sample_registry, "--processes", "2", "--max-connection-age", "600") as server:
        assert len(server.metrics_ports) == 2
        summary = run_loadtest(
            server,
            sample_registry,
            tmp_path,
            "--engine",
            "h2load",
            "--rate",
            "200",
            "--duration",
            "2",
            "--connections",
            "8",
            "--concurrency",
            "8",
            "--metrics-url",
            server.metrics_urls,
            "--arrivals",
            arrivals,
            "--n",
            "100000",
        )
    # Every request failed; only the sum over both processes can account for all of them.
    assert summary["errors_by_code"]["INVALID_ARGUMENT"] == summary["requests"]
    assert 300 <= summary["requests"] <= 420  # 200 QPS for 2 s


def test_h2load_staggered_rate_is_the_offered_rate(h2load, sample_registry, tmp_path):
    with ServerProcess(sample_registry) as server:
        summary = run_loadtest(
            server,
            sample_registry,
            tmp_path,
            "--engine",
            "h2load",
            "--rate",
            "400",
            "--duration",
            "2",
            "--connections",
            "4",
            "--concurrency",
            "8",
            "--metrics-url",
            server.metrics_urls,
            "--arrivals",
            "staggered",
        )
    assert summary["errors"] == 0
    assert 600 <= summary["requests"] <= 840


def test_refuses_non_loopback_targets(sample_registry):
    with pytest.raises(SystemExit):
        loadtest.main(["--target", "192.0.2.1:50051", "--registry", str(sample_registry), "--duration", "1"])
