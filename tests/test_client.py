"""``ordrec.client`` and ``ordrec-client`` against real server processes: waiting
for a server that is not listening yet, every subcommand with --json, exit codes
that are the gRPC status, tokens and TLS, and retries on UNAVAILABLE."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
import redis

from ordrec.client import Client, entity
from ordrec.client_cli import build_parser, main
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.conftest import free_port, self_signed_cert

TOKEN = "client-test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def server(sample_registry):
    with ServerProcess(sample_registry) as proc:
        yield proc


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``ordrec-client`` in this process; (exit code, stdout, stderr)."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_json(capsys, server, *argv: str) -> dict:
    code, out, err = cli(capsys, "--target", server.target, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------ waiting
def test_a_client_started_before_the_server_waits_for_it(sample_registry):
    port = free_port()
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordrec.client_cli",
            "--target",
            f"127.0.0.1:{port}",
            "--wait",
            "90",
            "models",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)  # the client is up and finds nothing listening
        assert client.poll() is None, client.communicate()
        with ServerProcess(sample_registry, "--port", str(port)):
            out, err = client.communicate(timeout=90)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err
    assert "waiting up to 90 s" in err
    assert {m["name"] for m in json.loads(out)["models"]} == set(Registry(sample_registry).models())


def test_without_waiting_a_missing_server_is_unavailable_at_once(capsys):
    started = time.monotonic()
    code, _, err = cli(
        capsys,
        "--target",
        f"127.0.0.1:{free_port()}",
        "--wait",
        "0",
        "--retries",
        "0",
        "--timeout",
        "20",
        "models",
    )
    assert code == grpc.StatusCode.UNAVAILABLE.value[0] == 14
    assert "UNAVAILABLE" in err and "is ordrec-serve running" in err and time.monotonic() - started < 10


def test_wait_ready_returns_false_when_nothing_listens():
    with Client(f"127.0.0.1:{free_port()}") as client:
        started = time.monotonic()
        assert client.wait_ready(0.5) is False
        assert time.monotonic() - started < 5


# -------------------------------------------------------- every subcommand
def test_health_and_models(server, capsys, sample_registry):
    assert cli_json(capsys, server, "health") == {"status": "SERVING"}
    models = cli_json(capsys, server, "models")["models"]
    assert {m["name"] for m in models} == set(Registry(sample_registry).models())
    dcr = next(m for m in models if m["name"] == "dcr")
    assert "Recommend" in dcr["rpcs"] and dcr["metrics"]
    code, out, _ = cli(capsys, "--target", server.target, "models")
    assert code == 0 and "dcr" in out and "metrics:" in out


def test_recommend(server, capsys):
    reply = cli_json(
        capsys,
        server,
        "recommend",
        "--model",
        "dcr",
        "--user",
        "u001",
        "--user",
        "nobody",
        "--n",
        "3",
        "--distribution",
    )
    known, unknown = reply["results"]
    assert len(known["items"]) == 3 and known["fallback"] == "FALLBACK_NONE"
    assert len(known["items"][0]["rating_distribution"]) == len(reply["levels"]) > 1
    assert unknown["fallback"] == "FALLBACK_POPULAR_GLOBAL"
    candidates = cli_json(
        capsys,
        server,
        "recommend",
        "--model",
        "dcr",
        "--user",
        "u001",
        "--candidate",
        "i001",
        "--candidate",
        "i002",
        "--include-seen",
    )
    assert {i["id"] for i in candidates["results"][0]["items"]} == {"i001", "i002"}


def test_similar_and_recommend_features(server, capsys):
    similar = cli_json(
        capsys, server, "similar", "--model", "coe", "--item", "i001", "--item", "i002", "--n", "4"
    )
    assert len(similar["items"]) == 4 and not {"i001", "i002"} & {i["id"] for i in similar["items"]}
    explained = cli_json(
        capsys,
        server,
        "recommend",
        "--model",
        "dcr",
        "--user",
        "u001",
        "--n",
        "3",
        "--explain",
        "2",
        "--diversity",
        "0.3",
    )
    assert len(explained["results"][0]["items"]) == 3
    assert any(item["explanations"] for item in explained["results"][0]["items"])
    code, out, _ = cli(
        capsys,
        "--target",
        server.target,
        "recommend",
        "--model",
        "dcr",
        "--user",
        "u001",
        "--n",
        "2",
        "--explain",
        "1",
    )
    assert code == 0 and "because of" in out
    with pytest.raises(SystemExit) as bad:  # a bad command line: argparse's exit 2
        main(["--target", server.target, "similar", "--item", "i001", "--max-per-attribute", "genre"])
    assert bad.value.code == 2 and "NAME=M" in capsys.readouterr().err


def test_tags_neighbors_coordinates_place(server, capsys):
    tags = cli_json(capsys, server, "tags", "--model", "rtf", "--user", "u001", "--item", "i001", "--n", "2")
    assert len(tags["tags"]) == 2
    near = cli_json(
        capsys,
        server,
        "neighbors",
        "--model",
        "coe",
        "--id",
        "i001",
        "--from",
        "item",
        "--to",
        "user",
        "--k",
        "4",
    )
    assert len(near["neighbors"]) == 4 and all(n["id"].startswith("u") for n in near["neighbors"])
    coords = cli_json(capsys, server, "coordinates", "--model", "knnscal", "--limit", "5")
    assert len(coords["points"]) == 5 and coords["dim"] == len(coords["points"][0]["coords"]) > 0
    some = cli_json(capsys, server, "coordinates", "--model", "knnscal", "--id", "v001", "--id", "v002")
    assert [p["id"] for p in some["points"]] == ["v001", "v002"]
    placed = cli_json(
        capsys, server, "place", "--model", "knnscal", "--neighbor", "v001", "--neighbor", "v002", "--k", "3"
    )
    assert len(placed["coords"]) == coords["dim"] and len(placed["neighbors"]) == 3
    code, out, _ = cli(capsys, "--target", server.target, "coordinates", "--model", "knnscal", "--limit", "2")
    assert code == 0 and len(out.splitlines()) == 2


# ------------------------------------------------------- exit code = status
@pytest.mark.parametrize(
    "argv, status",
    [
        (["neighbors", "--model", "coe", "--id", "no-such-item"], grpc.StatusCode.NOT_FOUND),
        (["recommend", "--model", "no-such-model", "--user", "u001"], grpc.StatusCode.NOT_FOUND),
        (["recommend", "--model", "dcr", "--user", "u001", "--n", "0"], grpc.StatusCode.INVALID_ARGUMENT),
        (["tags", "--model", "dcr", "--user", "u001", "--item", "i001"], grpc.StatusCode.FAILED_PRECONDITION),
        (["record", "--user", "u001", "--item", "i001"], grpc.StatusCode.FAILED_PRECONDITION),  # no Redis
    ],
)
def test_exit_code_is_the_grpc_status(server, capsys, argv, status):
    code, out, err = cli(capsys, "--target", server.target, *argv)
    assert code == status.value[0] and status.name in err and not out


def test_leaving_out_model_names_the_candidates(server, capsys):
    code, _, err = cli(capsys, "--target", server.target, "recommend", "--user", "u001")
    assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "coe" in err and "dcr" in err and "--model" in err
    # One model answers Tags, so --model may be left out.
    assert cli_json(capsys, server, "tags", "--user", "u001", "--item", "i001")["model"] == "rtf"


def test_the_console_script_exits_with_the_status(server):
    result = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ordrec-client"),
            "--target",
            server.target,
            "neighbors",
            "--model",
            "coe",
            "--id",
            "no-such-item",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 5, result.stderr


def test_record_with_redis(redis_server, sample_registry, capsys):
    with ServerProcess(sample_registry, *redis_server.serve_flags, "--poll-interval", "0") as proc:
        first = cli_json(capsys, proc, "recommend", "--model", "dcr", "--user", "u001", "--n", "1")
        top = first["results"][0]["items"][0]["id"]
        assert cli_json(capsys, proc, "record", "--user", "u001", "--item", top) == {"recorded": 1}
        after = cli_json(capsys, proc, "recommend", "--model", "dcr", "--user", "u001", "--n", "5")
        assert top not in [i["id"] for i in after["results"][0]["items"]]
        rated = cli_json(capsys, proc, "record", "--user", "u002", "--rating", "i001=4", "--model", "dcr")
        assert rated == {"recorded": 1}
        ratings = redis.Redis.from_url(redis_server.url, decode_responses=True).hgetall("ordrec:ratings:u002")
        assert ratings == {"i001": "4.0"}
        with pytest.raises(SystemExit) as info:
            cli(capsys, "--target", proc.target, "record", "--user", "u002", "--rating", "i001")
        assert info.value.code == 2 and "'i001' is not ITEM=VALUE" in capsys.readouterr().err


# ------------------------------------------------------------- token, TLS
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_token_and_tls(sample_registry, tmp_path, capsys, monkeypatch):
    key, cert = self_signed_cert(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    monkeypatch.setenv("ORDREC_TEST_TOKEN", TOKEN)
    with ServerProcess(
        sample_registry, "--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(tokens)
    ) as proc:
        tls = ["--tls-ca", str(cert), "--tls-server-name", "localhost", "--target", proc.target]
        code, _, err = cli(capsys, *tls, "models")
        assert code == grpc.StatusCode.UNAUTHENTICATED.value[0], err
        code, out, err = cli(capsys, *tls, "--token-env", "ORDREC_TEST_TOKEN", "models", "--json")
        assert code == 0 and json.loads(out)["models"], err
        # Without TLS the call cannot get through: UNAVAILABLE, not a hang.
        code, _, _ = cli(
            capsys,
            "--target",
            proc.target,
            "--wait",
            "0",
            "--retries",
            "0",
            "--timeout",
            "3",
            "--token",
            TOKEN,
            "models",
        )
        assert code in (grpc.StatusCode.UNAVAILABLE.value[0], grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        # The Python API: the same options.
        with Client(f"localhost:{proc.port}", token=TOKEN, tls_ca=cert.read_bytes()) as client:
            assert client.wait_ready(10)
            assert client.recommend("u001", model="dcr", n=2).results[0].items
            assert [p.id for page in client.coordinates(["v001"], model="knnscal") for p in page.points] == [
                "v001"
            ]


def test_an_unset_token_variable_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.delenv("ORDREC_NO_SUCH_TOKEN", raising=False)
    with pytest.raises(SystemExit) as info:
        main(["--token-env", "ORDREC_NO_SUCH_TOKEN", "models"])
    assert info.value.code == 2 and "ORDREC_NO_SUCH_TOKEN" in capsys.readouterr().err


# ----------------------------------------------------------------- retries
class _Flaky(recommender_pb2_grpc.RecommenderServicer):
    """Answers ListModels with ``failures`` errors of ``code`` first, then an empty list."""

    def __init__(self, failures: int, code: grpc.StatusCode):
        self.failures, self.code, self.calls = failures, code, 0

    def ListModels(self, request, context):
        self.calls += 1
        if self.calls <= self.failures:
            context.abort(self.code, f"failure {self.calls}")
        return pb.ListModelsResponse()


@pytest.fixture
def flaky():
    def start(failures: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE):
        servicer = _Flaky(failures, code)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        recommender_pb2_grpc.add_RecommenderServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return servicer, f"127.0.0.1:{port}"

    started: list[grpc.Server] = []
    yield start
    for server in started:
        server.stop(None)


def test_unavailable_is_retried_with_backoff(flaky):
    servicer, target = flaky(2)
    with Client(target, retries=3, backoff=0.01) as client:
        assert client.models() == pb.ListModelsResponse()
    assert servicer.calls == 3


def test_retries_run_out(flaky):
    servicer, target = flaky(5)
    with Client(target, retries=1, backoff=0.01) as client, pytest.raises(grpc.RpcError) as info:
        client.models()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and servicer.calls == 2


def test_other_errors_are_not_retried(flaky):
    servicer, target = flaky(1, grpc.StatusCode.NOT_FOUND)
    with Client(target, retries=3, backoff=0.01) as client, pytest.raises(grpc.RpcError) as info:
        client.models()
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and servicer.calls == 1


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="unknown entity"):
        entity("planet")
    with pytest.raises(ValueError, match="timeout"):
        Client(timeout=0)


# -------------------------------------------------------------------- help
def _subparsers(parser):
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices, action


def test_every_subcommand_and_option_has_help(monkeypatch):
    monkeypatch.delenv("ORDREC_TARGET", raising=False)
    parser = build_parser()
    choices, action = _subparsers(parser)
    assert set(choices) == {
        "health",
        "models",
        "recommend",
        "tags",
        "neighbors",
        "coordinates",
        "place",
        "record",
        "hide",
        "unhide",
        "hidden",
        "similar",
        "forget",
    }
    assert all(c.help for c in action._choices_actions)
    for name, sub in choices.items():
        for option in sub._actions:
            assert option.help, (name, option.option_strings)
            assert "" not in (option.choices or ()), (name, option.option_strings)  # no empty choice
        text = sub.format_help()
        assert "--json" in text and "(default: 127.0.0.1:50051)" in text, name
    assert "ordrec-loadtest" in parser.format_help()
    assert "(default: 10)" in choices["recommend"].format_help()


def test_the_target_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ORDREC_TARGET", "example.org:1234")
    assert build_parser().parse_args(["models"]).target == "example.org:1234"
    assert build_parser().parse_args(["models", "--target", "h:1"]).target == "h:1"
    assert build_parser().parse_args(["--target", "h:2", "models"]).target == "h:2"
