"""A bare grpcio server answering Recommend with a constant reply: the benchmarks' yardstick.

    python -m ordrec.tools.bare_server --registry REG [--model dcr] [--n 10] [--processes 2]

What ordrec costs per call is measured against it in the same run: the same
grpcio sync server, options and layout as ``ordrec-serve`` (worker threads,
message limits, ``--processes N`` pinned processes sharing the port through the
same supervisor), but no interceptors and a handler that returns one prebuilt
``RecommendResponse`` (``--n`` of the model's item ids, so the reply is as
large as a real one). The request is still decoded, as grpcio does for any
handler. It counts answered calls for ``/metrics``
(``grpc_server_handled_total{grpc_code="OK"}``), which the load generator reads
to count errors and each process's share, and prints ordrec-serve's ready line,
so ``ServerProcess(..., module="ordrec.tools.bare_server")`` runs it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODULE = "ordrec.tools.bare_server"


def constant_reply(registry: Path, model: str, n: int):
    """A RecommendResponse of the first ``n`` item ids of ``model``'s live version, scored."""
    from ordrec.service.storage.registry import Registry
    from ordrec.v1 import recommender_pb2 as pb

    reg = Registry(registry)
    version, _ = reg.live_version(model)
    items = (reg.root / model / version / "ids" / "items.txt").read_text(encoding="utf-8").split("\n")[:n]
    reply = pb.RecommendResponse(model=model, model_version=version)
    result = reply.results.add(user_id="u0", model_version=version)
    for rank, item in enumerate(items):
        result.items.add(id=item, score=float(n - rank))
    return reply


class _Count:
    """Answered calls; ``+=`` under the GIL is one bytecode's worth, so no lock."""

    def __init__(self) -> None:
        self.ok = 0


def _metrics_server(host: str, port: int, count: _Count) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = f'grpc_server_handled_total{{grpc_code="OK"}} {count.ok}\n'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve(args: argparse.Namespace) -> int:
    import grpc

    from ordrec.service.config import Limits, ServerConfig
    from ordrec.v1 import recommender_pb2 as pb

    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    reply = constant_reply(Path(args.registry), args.model, args.n)
    count = _Count()

    def recommend(request, context):
        count.ok += 1
        return reply

    limit, same = Limits().max_message_bytes, ServerConfig(registry="")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[  # ordrec-serve's options (service/serving/server.py)
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 1 if args.reuse_port else 0),
            ("grpc.max_connection_age_ms", int(same.max_connection_age * 1000)),
            ("grpc.max_connection_age_grace_ms", int(same.max_connection_age_grace * 1000)),
            ("grpc.max_concurrent_streams", same.max_streams_per_connection_http2),
        ],
    )
    handler = grpc.unary_unary_rpc_method_handler(
        recommend,
        request_deserializer=pb.RecommendRequest.FromString,
        response_serializer=pb.RecommendResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("ordrec.v1.Recommender", {"Recommend": handler}),)
    )
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    metrics = _metrics_server(args.host, max(args.metrics_port, 0), count)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    print(f"ordrec-serve ready port={port} metrics_port={metrics.server_address[1]}", flush=True)
    while not stopped.wait(0.2):  # sliced, as Server.wait: a signal may land on another thread
        pass
    server.stop(1).wait()
    metrics.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m " + MODULE, description=__doc__.split("\n")[0])
    p.add_argument("--registry", required=True, help="where the reply's item ids come from")
    p.add_argument("--model", default="dcr")
    p.add_argument("--n", type=int, default=10, help="items in the constant reply")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--reuse-port", action="store_true")
    p.add_argument("--cpu", type=int)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.processes == 0:
        args.processes = len(os.sched_getaffinity(0))
    if args.processes > 1:
        from ordrec.service.serving.cli import without_flags
        from ordrec.service.serving.supervisor import Supervisor

        passed_on = without_flags(argv, {"--processes", "--port", "--metrics-port", "--cpu"})
        return Supervisor(
            passed_on, args.processes, args.host, args.port, args.metrics_port, module=MODULE
        ).run()
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
