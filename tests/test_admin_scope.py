"""The admin scope on a real server: who may erase users and hide items, over gRPC and HTTP.

The server with tokens and an admin token is ``tests/test_http_api.py``'s; here, the
servers with no ordinary tokens: with an admin token, without one (admin calls refused),
and with ``--admin-open`` (any caller, as before the scope existed).
"""

from __future__ import annotations

import json

import grpc
import pytest

from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.admin_token import ADMIN_FLAGS, ADMIN_METADATA, ADMIN_TOKEN
from tests.test_http_api import curl

# an erasure of nobody (refused by the servicer) and a hide of nothing: no state changes
ADMIN_CALLS = {
    "ForgetUser": pb.ForgetUserRequest(user_id=""),
    "HideItems": pb.HideItemsRequest(model="dcr"),
    "UnhideItems": pb.HideItemsRequest(model="dcr"),
}


def codes(server: ServerProcess, metadata=None, token: str | None = None) -> dict[str, tuple]:
    """Per admin call: (gRPC status code, HTTP status) with the given credentials."""
    found = {}
    with grpc.insecure_channel(server.target) as channel:
        stub = recommender_pb2_grpc.RecommenderStub(channel)
        for rpc, request in ADMIN_CALLS.items():
            with pytest.raises(grpc.RpcError) as err:
                getattr(stub, rpc)(request, timeout=10, metadata=metadata)
            body = json.dumps({"userId": ""} if rpc == "ForgetUser" else {"model": "dcr"})
            found[rpc] = (err.value.code(), curl(f"{server.metrics_url}/v1/{rpc}", body, token=token).status)
    return found


def expect(code: grpc.StatusCode, http: int) -> dict[str, tuple]:
    return {rpc: (code, http) for rpc in ADMIN_CALLS}


def test_without_an_admin_token_admin_calls_are_refused(sample_registry):
    """No tokens at all: ordinary calls are open, admin calls are not (PERMISSION_DENIED)."""
    with ServerProcess(sample_registry, "--poll-interval", "0") as server:
        assert codes(server) == expect(grpc.StatusCode.PERMISSION_DENIED, 403)
        assert curl(f"{server.metrics_url}/v1/ListModels", "{}").status == 200


def test_an_admin_token_alone_guards_the_admin_calls_only(sample_registry):
    with ServerProcess(sample_registry, "--poll-interval", "0", *ADMIN_FLAGS) as server:
        assert codes(server) == expect(grpc.StatusCode.UNAUTHENTICATED, 401)
        assert codes(server, ADMIN_METADATA, ADMIN_TOKEN) == expect(grpc.StatusCode.INVALID_ARGUMENT, 400)
        assert curl(f"{server.metrics_url}/v1/ListModels", "{}").status == 200


def test_admin_open_lets_any_caller_make_admin_calls(sample_registry):
    with ServerProcess(sample_registry, "--poll-interval", "0", "--admin-open") as server:
        assert codes(server) == expect(grpc.StatusCode.INVALID_ARGUMENT, 400)
