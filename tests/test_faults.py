"""Fault tests: a client runs throughout each and no request may fail.

Bounded in time and loopback only. Kill-the-trainer-mid-publish lives with
the job tests (tests/test_job*.py) and the registry tests.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.v1 import recommender_pb2 as pb
from ordrec.v1 import recommender_pb2_grpc
from tests.background_load import BackgroundLoad
from tests.scrape import metric


class LoadLoop(BackgroundLoad):
    """Threads calling Recommend back to back; records every failure with its start time."""

    def __init__(self, target: str, threads: int = 4, model: str = "dcr"):
        self.target, self.model = target, model
        self.versions: set[str] = set()
        super().__init__(threads)

    def _run(self, i: int) -> None:
        users = [f"u{n:03d}" for n in range(1, 50)]
        with grpc.insecure_channel(self.target) as ch:
            stub = recommender_pb2_grpc.RecommenderStub(ch)
            n = 0
            while not self.stop_event.is_set():
                start = time.monotonic()
                try:
                    reply = stub.Recommend(
                        pb.RecommendRequest(model=self.model, user_ids=[users[n % len(users)]], n=10),
                        timeout=10,
                    )
                    assert len(reply.results[0].items) == 10
                    with self._lock:
                        self.ok += 1
                        self.versions.add(reply.model_version)
                except grpc.RpcError as exc:
                    with self._lock:
                        self.failures.append((start, f"{exc.code().name}: {exc.details()}"))
                n += 1


def _copy_registry(source: Path, target: Path, names=("dcr",)) -> Registry:
    registry = Registry(target)
    for name in names:
        registry.publish(name, Registry(source).load(name, mmap=False))
    return registry


def test_publish_ten_versions_under_load(sample_registry, tmp_path):
    registry = _copy_registry(sample_registry, tmp_path / "reg")
    artifact = registry.load("dcr", mmap=False)
    with ServerProcess(registry.root, "--poll-interval", "0.1") as proc:
        with LoadLoop(proc.target) as load:
            published = []
            for _ in range(10):
                published.append(registry.publish("dcr", artifact, keep=3))
                time.sleep(0.3)
            wait_for(lambda: published[-1] in load.versions, 20, what="the last version served")
        assert load.failures == [], load.failures[:5]
        assert load.ok > 100
        assert len(load.versions & set(published)) >= 3  # really swapped while serving
        assert metric(proc, "ordrec_model_reloads_total") >= 3
        assert proc.terminate() == 0


def test_corrupt_version_under_load_is_refused(sample_registry, tmp_path):
    registry = _copy_registry(sample_registry, tmp_path / "reg")
    good = registry.versions("dcr")[-1]
    with ServerProcess(registry.root, "--poll-interval", "0.1") as proc:
        with LoadLoop(proc.target) as load:
            bad = registry.publish("dcr", registry.load("dcr", mmap=False))
            factors = registry.root / "dcr" / bad / "arrays" / "user_factors.npy"
            data = bytearray(factors.read_bytes())
            data[-3] ^= 0xFF  # corrupt after the atomic publish, before the server looks
            factors.write_bytes(bytes(data))
            wait_for(lambda: metric(proc, "ordrec_model_load_failures_total") >= 1, 20, what="refusal")
            time.sleep(0.5)
        assert load.failures == [], load.failures[:5]
        assert load.versions == {good}
        with grpc.insecure_channel(proc.target) as ch:
            models = (
                recommender_pb2_grpc.RecommenderStub(ch).ListModels(pb.ListModelsRequest(), timeout=5).models
            )
        (dcr,) = [m for m in models if m.name == "dcr"]
        assert (
            dcr.version == good and dcr.reason.startswith(f"kept: {bad} refused") and "checksum" in dcr.reason
        )
        assert any("refused dcr@" + bad in line for line in proc.output)
        # A good version after the bad one is picked up.
        newer = registry.publish("dcr", registry.load("dcr", good, mmap=False))
        with grpc.insecure_channel(proc.target) as ch:
            stub = recommender_pb2_grpc.RecommenderStub(ch)
            wait_for(
                lambda: (
                    stub.Recommend(
                        pb.RecommendRequest(model="dcr", user_ids=["u001"], n=3), timeout=5
                    ).model_version
                    == newer
                ),
                20,
                what="newer good version",
            )


def test_redis_restart_under_load(redis_server, sample_registry, tmp_path):
    registry = _copy_registry(sample_registry, tmp_path / "reg")
    with ServerProcess(registry.root, "--redis", redis_server.url) as proc:
        with LoadLoop(proc.target) as load:
            redis_server.stop()
            time.sleep(1.5)
            redis_server.start()  # same port; the fixture stops it at the end
            wait_for(lambda: metric(proc, "ordrec_redis_up") == 1, 15, what="redis back")
            time.sleep(0.5)
        assert load.failures == [], load.failures[:5]
        assert load.ok > 100


def _exit_code_or_stacks(proc: ServerProcess, timeout: float) -> int:
    """The server's exit code; if it does not exit in time, fail with every thread's stack
    (SIGUSR1, faulthandler) and the end of its log, so a hang says where it waits."""
    try:
        return proc.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        pytest.fail(
            f"the server did not exit {timeout} s after SIGTERM; its last output:\n"
            + "".join(proc.output[-150:])
        )


def test_sigterm_under_load_drains_in_flight_calls(sample_registry, tmp_path):
    registry = _copy_registry(sample_registry, tmp_path / "reg", names=("dcr", "coe"))
    proc = ServerProcess(registry.root, "--grace", "20").start()
    try:
        streamed: list[str] = []
        stream_error: list[Exception] = []
        started = threading.Event()

        def slow_stream():
            # One point per message, read slowly: an in-flight call lasting ~2 s.
            with grpc.insecure_channel(proc.target) as ch:
                stub = recommender_pb2_grpc.RecommenderStub(ch)
                try:
                    for page in stub.Coordinates(
                        pb.CoordinatesRequest(model="coe", entity=pb.ENTITY_ITEM, page_size=1), timeout=60
                    ):
                        streamed.extend(p.id for p in page.points)
                        started.set()
                        time.sleep(0.01)
                except grpc.RpcError as exc:
                    stream_error.append(exc)

        reader = threading.Thread(target=slow_stream)
        with LoadLoop(proc.target) as load:
            reader.start()
            assert started.wait(20)
            sent_at = time.monotonic()
            proc.proc.send_signal(15)
            reader.join(60)
            exit_code = _exit_code_or_stacks(proc, 60)
        assert exit_code == 0
        assert not stream_error, stream_error
        assert len(streamed) == len(Registry(registry.root).load("coe").ids["items"])  # the stream finished
        # Calls started before SIGTERM all succeeded (a call sent within a few
        # milliseconds of the signal may race the shutdown and be refused).
        before = [f for f in load.failures if f[0] < sent_at - 0.1]
        assert before == [], before[:5]
        # New calls are refused cleanly: the server is gone or going, never an error from a handler.
        refused = {msg.split(":")[0] for _, msg in load.failures}
        assert refused <= {"UNAVAILABLE", "CANCELLED"}, refused
    finally:
        proc.kill()


def _signal_thread(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread of another process (tgkill): the kernel may hand a
    process's signal to any thread, and a Python handler runs only in the main one."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_TGKILL[platform.machine()], pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


@pytest.mark.skipif(platform.machine() not in _SYS_TGKILL, reason="tgkill's number is known here")
def test_sigterm_received_by_a_worker_thread_still_stops_the_server(sample_registry, tmp_path):
    registry = _copy_registry(sample_registry, tmp_path / "reg", names=("dcr",))
    proc = ServerProcess(registry.root).start()
    try:
        pid = proc.proc.pid
        workers = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        _signal_thread(pid, max(workers), signal.SIGTERM)
        assert _exit_code_or_stacks(proc, 20) == 0
        assert any("draining" in line for line in proc.output)
    finally:
        proc.kill()


def test_pin_and_unpin_are_picked_up_live_under_load(sample_registry, tmp_path):
    registry = _copy_registry(sample_registry, tmp_path / "reg")
    old = registry.versions("dcr")[-1]
    new = registry.publish("dcr", registry.load("dcr", mmap=False))
    with (
        ServerProcess(registry.root, "--poll-interval", "0.1") as proc,
        grpc.insecure_channel(proc.target) as ch,
    ):
        stub = recommender_pb2_grpc.RecommenderStub(ch)
        served = lambda: {m.name: m for m in stub.ListModels(pb.ListModelsRequest(), timeout=5).models}["dcr"]  # noqa: E731
        assert (served().version, served().reason) == (new, "newest")
        with LoadLoop(proc.target) as load:
            registry.pin("dcr", old)  # rollback
            wait_for(
                lambda: (served().version, served().reason) == (old, "pinned"), 20, what="pinned version"
            )
            registry.unpin("dcr")
            wait_for(lambda: (served().version, served().reason) == (new, "newest"), 20, what="newest again")
        assert load.failures == [] and {old, new} <= load.versions
