"""``ordrec-loadtest``: drive a running server and print QPS and latency.

Two engines:

- ``python`` (default): worker processes running grpc.aio clients with a
  mix of RPCs; counts every non-OK status. A Python client costs ~240 us of
  CPU per call (``docs/architecture.md``, "Costs that shaped it"), so on a small
  machine it caps what you see.
- ``h2load``: nghttp2's h2load sends pre-encoded gRPC requests of one RPC
  (~20 us of client CPU per call) and logs every request's latency.
  h2load cannot read gRPC status trailers, so errors are counted from the
  server's own ``grpc_server_handled_total`` before and after the run
  (``--metrics-url``).

Ids for the requests come from the registry the server reads (``--registry``):
the ids files of each model's live version.

Both engines are bounded by ``--duration`` and stop by themselves; targets
must be loopback addresses.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ordrec.service.serving.cli import without_flags

RPCS = ("recommend", "tags", "neighbors", "coordinates", "listmodels")
_PATHS = {
    "recommend": "/ordrec.v1.Recommender/Recommend",
    "tags": "/ordrec.v1.Recommender/Tags",
    "neighbors": "/ordrec.v1.Recommender/Neighbors",
    "listmodels": "/ordrec.v1.Recommender/ListModels",
}


# ------------------------------------------------------------ request makers
def _read_ids(registry: Path, model: str, space: str) -> list[str]:
    from ordrec.service.storage.registry import Registry

    reg = Registry(registry)
    version, _ = reg.live_version(model)
    path = reg.root / model / version / "ids" / f"{space}.txt"
    return path.read_text(encoding="utf-8").split("\n")[:-1]


class RequestMaker:
    """Builds random valid requests of each RPC from the served models' ids."""

    def __init__(self, args: argparse.Namespace, seed: int):
        from ordrec.v1 import recommender_pb2 as pb

        self.pb, self.rng, self.args = pb, random.Random(seed), args
        reg = Path(args.registry)
        self.users = _read_ids(reg, args.recommend_model, "users") if args.recommend_model else []
        if args.tags_model:
            self.tag_users = _read_ids(reg, args.tags_model, "users")
            self.tag_items = _read_ids(reg, args.tags_model, "items")
        if args.neighbors_model:
            spaces = self._neighbor_space_ids(reg, args.neighbors_model)
            self.neighbor_space, self.neighbor_ids = spaces

    @staticmethod
    def _neighbor_space_ids(reg: Path, model: str) -> tuple[str, list[str]]:
        for space in ("items", "objects"):
            try:
                return space, _read_ids(reg, model, space)
            except FileNotFoundError:
                continue
        raise SystemExit(f"model {model} has no items or objects to query")

    def make(self, rpc: str):
        pb, a, pick = self.pb, self.args, self.rng.choice
        if rpc == "recommend":
            return pb.RecommendRequest(model=a.recommend_model, user_ids=[pick(self.users)], n=a.n)
        if rpc == "tags":
            return pb.TagsRequest(
                model=a.tags_model, user_id=pick(self.tag_users), item_id=pick(self.tag_items), n=a.n
            )
        if rpc == "neighbors":
            return pb.NeighborsRequest(model=a.neighbors_model, id=pick(self.neighbor_ids), k=a.n)
        if rpc == "coordinates":
            return pb.CoordinatesRequest(model=a.neighbors_model, ids=[pick(self.neighbor_ids)])
        return pb.ListModelsRequest()


def parse_mix(text: str) -> list[tuple[str, float]]:
    mix = []
    for part in text.split(","):
        name, _, weight = part.partition("=")
        name = name.strip().lower()
        if name not in RPCS:
            raise argparse.ArgumentTypeError(f"unknown RPC {name!r} in --mix (known: {', '.join(RPCS)})")
        mix.append((name, float(weight or 1)))
    return mix


def check_loopback(target: str) -> None:
    host = target.rsplit(":", 1)[0].strip("[]")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise SystemExit(f"cannot resolve {host}: {exc}") from None
    if not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise SystemExit(f"refusing to load-test {target}: only loopback targets are allowed")


# --------------------------------------------------------------- python engine
async def _worker_loop(args, seed: int, deadline: float, rate: float, concurrency: int):
    import grpc

    from ordrec.v1 import recommender_pb2_grpc

    maker = RequestMaker(args, seed)
    names, weights = zip(*parse_mix(args.mix))
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else None
    latencies: list[float] = []
    errors: dict[str, int] = {}
    # Several channels: one HTTP/2 connection each, as several clients would open. Each keeps
    # its own subchannel pool: channels of one process with the same target and options would
    # otherwise share one connection (gRPC's global pool), so one server process took every call.
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.aio.insecure_channel(args.target, options=own_connection)
        for _ in range(max(1, args.connections))
    ]
    stubs = [recommender_pb2_grpc.RecommenderStub(ch) for ch in channels]
    calls = {"recommend": "Recommend", "tags": "Tags", "neighbors": "Neighbors", "listmodels": "ListModels"}
    interval = concurrency / rate if rate else 0.0

    async def one(task: int) -> None:
        rng = random.Random(seed * 1000 + task)
        stub = stubs[task % len(stubs)]
        next_at = time.perf_counter() + rng.random() * interval
        while True:
            if interval:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            start = next_at if interval else time.perf_counter()  # open loop: no coordinated omission
            if start >= deadline:
                return
            rpc = rng.choices(names, weights)[0]
            request = maker.make(rpc)
            try:
                if rpc == "coordinates":
                    async for _ in stub.Coordinates(request, timeout=args.timeout, metadata=metadata):
                        pass
                else:
                    await getattr(stub, calls[rpc])(request, timeout=args.timeout, metadata=metadata)
                latencies.append(time.perf_counter() - start)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
            if interval:
                next_at += rng.expovariate(1.0 / interval)

    await asyncio.gather(*(one(t) for t in range(concurrency)))
    for ch in channels:
        await ch.close()
    return np.asarray(latencies, dtype=np.float64), errors


def run_worker(args: argparse.Namespace) -> int:
    deadline = args.start_at + args.duration
    while time.time() < args.start_at:
        time.sleep(0.001)
    # perf_counter deadline from the shared wall-clock start
    deadline_pc = time.perf_counter() + (deadline - time.time())
    latencies, errors = asyncio.run(
        _worker_loop(args, args.seed, deadline_pc, args.worker_rate, args.worker_concurrency)
    )
    np.save(args.out, latencies, allow_pickle=False)
    Path(args.out + ".json").write_text(json.dumps(errors))
    return 0


def run_python_engine(args: argparse.Namespace) -> tuple[np.ndarray, dict[str, int], float]:
    workers = max(1, args.processes)
    tmp = Path(tempfile.mkdtemp(prefix="ordrec-load-"))
    start_at = time.time() + 1.0 + 0.3 * workers  # let every worker import and connect first
    procs = []
    for w in range(workers):
        out = str(tmp / f"w{w}.npy")
        cmd = [
            sys.executable,
            "-m",
            "ordrec.tools.loadtest",
            "--worker",
            "--out",
            out,
            "--start-at",
            str(start_at),
            "--worker-concurrency",
            str(max(1, args.concurrency // workers)),
            "--worker-rate",
            str(args.rate / workers if args.rate else 0),
            "--seed",
            str(args.seed + w),
            *args.passthrough,
        ]
        procs.append(subprocess.Popen(cmd))
    for p in procs:
        p.wait(timeout=args.duration + 120)
    latencies: list[np.ndarray] = []
    errors: dict[str, int] = {}
    for w in range(workers):
        saved = tmp / f"w{w}.npy"
        if not saved.exists():
            raise SystemExit(f"load worker {w} failed")
        latencies.append(np.load(saved, allow_pickle=False))
        for code, count in json.loads(Path(str(saved) + ".json").read_text()).items():
            errors[code] = errors.get(code, 0) + count
    shutil.rmtree(tmp, ignore_errors=True)
    return np.concatenate(latencies), errors, args.duration


# --------------------------------------------------------------- h2load engine
def _grpc_frame(message) -> bytes:
    body = message.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


def _handled_by_process(metrics_urls: str) -> list[dict[str, float]]:
    """``grpc_server_handled_total`` by code, per server process (``metrics_urls``:
    comma-separated, one per process sharing the port)."""
    out = []
    for url in metrics_urls.split(","):
        text = urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5).read().decode()
        counts: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("grpc_server_handled_total{"):
                code = line.split('grpc_code="', 1)[1].split('"', 1)[0]
                counts[code] = counts.get(code, 0.0) + float(line.rsplit(" ", 1)[1])
        out.append(counts)
    return out


def _handled_counts(metrics_urls: str) -> dict[str, float]:
    """``grpc_server_handled_total`` by code, summed over every server process."""
    total: dict[str, float] = {}
    for counts in _handled_by_process(metrics_urls):
        for code, n in counts.items():
            total[code] = total.get(code, 0.0) + n
    return total


def process_shares(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[float]:
    """Each server process's share of the calls it answered OK between two scrapes: the kernel
    spreads connections, not calls, over processes sharing a port, so a few connections can
    load one process far more than the other."""
    done = [a.get("OK", 0.0) - b.get("OK", 0.0) for a, b in zip(before, after)]
    total = sum(done)
    return [d / total for d in done] if total else []


def _h2load_cmd(
    args: argparse.Namespace, body: Path, log: Path, url: str, connections: int, threads: int, rate: float
) -> list[str]:
    # At a fixed rate, a request count rather than a duration: h2load then waits for every
    # answer, where a duration's end resets the calls still in flight (the server counts
    # them CANCELLED, which is not a failure of the server).
    length = (
        ["-n", str(max(connections, round(rate * args.duration)))]
        if rate
        else ["-D", str(max(1, round(args.duration)))]
    )
    cmd = [
        "h2load",
        *length,
        "-c",
        str(connections),
        "-m",
        str(max(1, args.concurrency // max(1, args.connections))),
        "-t",
        str(threads),
        "-d",
        str(body),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"--log-file={log}",
    ]
    if rate:
        cmd.append(f"--rps={rate / connections:.3f}")
    return cmd + [url]


def _run_h2load(args: argparse.Namespace, body: Path, tmp: Path, url: str) -> tuple[list[Path], int]:
    """Start the load; return the latency logs and how many calls were still in flight when a
    duration-bound run stopped (h2load resets them; the server counts them CANCELLED).

    ``aligned``: one h2load with every connection in one event loop. With
    ``--rps`` its per-connection timers fire together, so requests arrive in
    bursts of ``--connections`` at once: a pessimistic arrival pattern.
    ``staggered``: one h2load per connection, each started at a random point
    of one request period, like independent clients (smooth load).
    """
    clients = max(1, args.connections)
    if args.arrivals == "aligned" or not args.rate:
        log = tmp / "log.tsv"
        cmd = _h2load_cmd(args, body, log, url, clients, max(1, args.processes), args.rate)
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
        logs = [log]
    else:
        period = clients / args.rate  # seconds between two requests of one connection
        offsets = np.sort(np.random.default_rng(args.seed).uniform(0.0, period, clients))
        procs, logs, start = [], [], time.perf_counter()
        for i, offset in enumerate(offsets):
            time.sleep(max(0.0, start + offset - time.perf_counter()))
            logs.append(tmp / f"log{i}.tsv")
            procs.append(
                subprocess.Popen(
                    _h2load_cmd(args, body, logs[-1], url, 1, 1, args.rate / clients),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
    failed, in_flight = [], 0
    for proc in procs:
        output, _ = proc.communicate(timeout=args.duration + 60)
        if proc.returncode != 0:
            failed.append(output)
        in_flight += _started_not_done(output)
    if failed:
        raise SystemExit("h2load failed:\n" + "\n".join(failed))
    return logs, in_flight


def _started_not_done(output: str) -> int:
    """From h2load's "requests: N total, N started, N done, ..." line."""
    found = re.search(r"requests: \d+ total, (\d+) started, (\d+) done", output)
    return int(found.group(1)) - int(found.group(2)) if found else 0


def _read_h2load_log(log: Path) -> np.ndarray:
    """Rows of (start time us, HTTP status, latency us)."""
    if not log.exists() or not log.stat().st_size:
        return np.empty((0, 3))
    return np.loadtxt(log, dtype=np.float64, ndmin=2)


def run_h2load_engine(args: argparse.Namespace) -> tuple[np.ndarray, dict[str, int], float]:
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: apt-get install nghttp2-client (or use --engine python)")
    (rpc, _), *rest = parse_mix(args.mix)
    if rest or rpc not in _PATHS:
        raise SystemExit("the h2load engine sends one unary RPC: --mix recommend|tags|neighbors|listmodels")
    if not args.metrics_url:
        raise SystemExit("the h2load engine needs --metrics-url to count gRPC errors on the server")
    maker = RequestMaker(args, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="ordrec-h2load-"))
    body = tmp / "body.bin"
    body.write_bytes(_grpc_frame(maker.make(rpc)))  # h2load repeats one body: one fixed request
    host, port = args.target.rsplit(":", 1)
    before = _handled_counts(args.metrics_url)
    logs, in_flight = _run_h2load(args, body, tmp, f"http://{host}:{port}{_PATHS[rpc]}")
    after = _handled_counts(args.metrics_url)
    rows = np.concatenate([_read_h2load_log(log) for log in logs])
    latencies = rows[:, 2] / 1e6
    errors = {code: int(after.get(code, 0) - before.get(code, 0)) for code in after if code != "OK"}
    # Calls h2load itself reset at the end of a duration-bound run are not the server's failures
    # (those it had not started count nowhere, so only a surplus is reported).
    errors["CANCELLED"] = max(0, errors.get("CANCELLED", 0) - in_flight)
    errors = {code: n for code, n in errors.items() if n}
    http_errors = int(np.sum(rows[:, 1] != 200))
    if http_errors:
        errors["HTTP_NOT_200"] = http_errors
    shutil.rmtree(tmp, ignore_errors=True)
    return latencies, errors, args.duration


# ------------------------------------------------------------------- report
def summarise(latencies: np.ndarray, errors: dict[str, int], seconds: float) -> dict[str, float]:
    ms = latencies * 1e3
    pct = np.percentile(ms, [50, 90, 99]) if ms.size else [float("nan")] * 3
    return {
        "requests": int(ms.size),
        "errors": int(sum(errors.values())),
        "qps": ms.size / seconds,
        "p50_ms": float(pct[0]),
        "p90_ms": float(pct[1]),
        "p99_ms": float(pct[2]),
        "max_ms": float(ms.max()) if ms.size else float("nan"),
    }


def print_summary(label: str, summary: dict, errors: dict[str, int]) -> None:
    print(
        f"{'run':<28} {'requests':>9} {'QPS':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7}"
    )
    print(
        f"{label:<28} {summary['requests']:>9} {summary['qps']:>8.0f} {summary['p50_ms']:>8.2f} "
        f"{summary['p90_ms']:>8.2f} {summary['p99_ms']:>8.2f} {summary['max_ms']:>8.2f} {summary['errors']:>7}"
    )
    if errors:
        print("errors by status: " + ", ".join(f"{k}={v}" for k, v in sorted(errors.items())))
    if len(summary.get("process_shares") or []) > 1:
        print("calls per server process: " + ", ".join(f"{s:.0%}" for s in summary["process_shares"]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ordrec-loadtest", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--registry", required=True, help="the registry the server reads (for valid ids)")
    p.add_argument("--mix", default="recommend", help="e.g. recommend=8,neighbors=1,tags=1")
    p.add_argument("--recommend-model", default="")
    p.add_argument("--tags-model", default="")
    p.add_argument("--neighbors-model", default="")
    p.add_argument("--n", type=int, default=10, help="n (Recommend, Tags) or k (Neighbors)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--connections", type=int, default=4, help="HTTP/2 connections")
    p.add_argument("--rate", type=float, default=0.0, help="target QPS (open loop); 0 = as fast as possible")
    p.add_argument("--duration", type=float, default=10.0, help="seconds (bounded: at most 600)")
    p.add_argument("--processes", type=int, default=1, help="client processes (python) / threads (h2load)")
    p.add_argument("--engine", choices=("python", "h2load"), default="python")
    p.add_argument(
        "--metrics-url",
        help="server's metrics base URL(s), comma-separated when several processes "
        "share the port (h2load engine: counts errors)",
    )
    p.add_argument(
        "--arrivals",
        choices=("aligned", "staggered"),
        default="aligned",
        help="h2load with --rate: every connection's timer firing together (bursts), or one "
        "h2load per connection started at random phases (smooth load)",
    )
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the summary to this file")
    p.add_argument("--label", default="")
    # internal: one python worker
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--worker-concurrency", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker-rate", type=float, default=0.0, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if not 0 < args.duration <= 600:
        raise SystemExit("--duration must be in (0, 600] seconds")
    check_loopback(args.target)
    if args.worker:
        return run_worker(args)
    internal = {"--out", "--start-at", "--worker-concurrency", "--worker-rate", "--seed"}
    args.passthrough = without_flags(argv, internal)
    engine = run_h2load_engine if args.engine == "h2load" else run_python_engine
    before = _handled_by_process(args.metrics_url) if args.metrics_url else []
    latencies, errors, seconds = engine(args)
    summary: dict[str, Any] = dict(summarise(latencies, errors, seconds))
    if args.metrics_url:
        summary["process_shares"] = process_shares(before, _handled_by_process(args.metrics_url))
    label = args.label or f"{args.engine} {args.mix} c={args.concurrency}" + (
        f" r={args.rate:g}" if args.rate else ""
    )
    print_summary(label, summary, errors)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"label": label, **summary, "errors_by_code": errors}, indent=2)
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    raise SystemExit(main())
