"""Recommend over gRPC and over the HTTP/JSON API of one ``ordrec-serve`` process: one
client, sequential calls on one connection each (keep-alive for HTTP), p50/p99 latency.

    python benchmarks/bench_http_json.py --registry REGISTRY [--model dcr] [--calls 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
from pathlib import Path

import grpc
import numpy as np

from ordrec.tools.process import ServerProcess
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_foldin import timed  # noqa: E402 - warm-up, then one time per call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--model", default="dcr")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    args.user = "u001"  # a user of the built-in sample
    body = {"model": args.model, "userIds": [args.user], "n": 10}
    with ServerProcess(args.registry) as server:
        with grpc.insecure_channel(server.target) as channel:
            stub = recommender_pb2_grpc.RecommenderStub(channel)
            request = pb.RecommendRequest(model=args.model, user_ids=[args.user], n=10)
            grpc_seconds = timed(lambda: stub.Recommend(request, timeout=5), args.calls)
        port = int(server.metrics_url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        data = json.dumps(body).encode()

        def post() -> None:
            conn.request("POST", "/v1/Recommend", data, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}")

        http_seconds = timed(post, args.calls)
        conn.close()
    for name, seconds in (("gRPC", grpc_seconds), ("HTTP/JSON keep-alive", http_seconds)):
        p50, p99 = np.quantile(seconds, [0.5, 0.99]) * 1e3
        print(
            f"{name:22s} {args.calls} calls: p50 {p50:.2f} ms, p99 {p99:.2f} ms,"
            f" {args.calls / sum(seconds):.0f} calls/s"
        )


if __name__ == "__main__":
    main()
