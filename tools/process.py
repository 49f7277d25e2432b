"""Run ``ordrec-serve`` and ``redis-server`` as real subprocesses: used by the demo, the
end-to-end and fault tests, and the load and replay benchmarks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ordrec.service.serving.supervisor import READY_LINE

_METRICS_PORTS = re.compile(r"metrics_ports=([\d,]+)")


class ServerProcess:
    """``with ServerProcess(registry) as server: ... server.target ...``"""

    def __init__(
        self,
        registry: str | os.PathLike,
        *extra_args: str,
        startup_timeout: float = 60.0,
        log_path: str | os.PathLike | None = None,
        env: dict | None = None,
        module: str = "ordrec.service",
    ):
        # ``module``: another server speaking ordrec-serve's flags and ready line
        # (``ordrec.tools.bare_server``, the benchmarks' yardstick).
        self.args = [
            sys.executable,
            "-m",
            module,
            "--registry",
            str(registry),
            "--port",
            "0",
            "--metrics-port",
            "0",
            *extra_args,
        ]
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else None
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.port = self.metrics_port = 0
        self.metrics_ports: list[int] = []  # one per process (``--processes N``)
        self.output: list[str] = []

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def metrics_urls(self) -> str:
        """Every process's metrics URL, comma-separated (``ordrec-loadtest --metrics-url``)."""
        return ",".join(f"http://127.0.0.1:{p}" for p in self.metrics_ports or [self.metrics_port])

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env, bufsize=1
        )
        ready = threading.Event()
        if self.proc.stdout is None:  # stdout=PIPE always gives one
            raise RuntimeError("ordrec-serve's output is not piped")
        threading.Thread(target=self._pump, args=(self.proc.stdout, ready), daemon=True).start()
        if not ready.wait(self.startup_timeout) or not self.port:
            self.kill()
            raise RuntimeError("ordrec-serve did not start:\n" + "".join(self.output[-40:]))
        return self

    def _pump(self, stdout: IO[str], ready: threading.Event) -> None:
        """Read the server's output: keep it, copy it to the log, find the ready line."""
        with open(self.log_path, "a") if self.log_path else contextlib.nullcontext() as sink:
            for line in stdout:
                self.output.append(line)
                if sink:
                    sink.write(line)
                    sink.flush()
                match = READY_LINE.search(line)
                if match:
                    self.port, self.metrics_port = int(match.group(1)), int(match.group(2))
                    ports = _METRICS_PORTS.search(line)
                    self.metrics_ports = (
                        [int(p) for p in ports.group(1).split(",")] if ports else [self.metrics_port]
                    )
                    ready.set()
        ready.set()  # the process exited

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the graceful exit; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        try:
            self.terminate()
        finally:
            self.kill()


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def run_cli(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m <module> ...`` in this interpreter and capture its output."""
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=check)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildProcess:
    """A helper process started on loopback (``proc``), stopped or killed at will."""

    proc: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: what a crash or an OOM kill does."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class RedisServer(ChildProcess):
    """A throwaway redis-server on loopback: no persistence, or with ``aof_dir`` an
    append-only file synced on every write (``appendfsync always``), so a SIGKILL
    (:meth:`kill`) loses nothing acknowledged and :meth:`start` replays it."""

    def __init__(self, port: int | None = None, aof_dir: Path | None = None):
        self.port = port or free_port()
        self.aof_dir = aof_dir
        self.proc: subprocess.Popen | None = None

    def _persistence(self) -> list[str]:
        if self.aof_dir is None:
            return ["--appendonly", "no"]
        return ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.aof_dir)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def serve_flags(self) -> tuple[str, ...]:
        """``ordrec-serve``'s flags for tests of what Redis holds: a second per Redis call, not
        the 50 ms budget (a slower call fails open, and a loaded CI machine has some)."""
        return ("--redis", self.url, "--redis-timeout", "1")

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *self._persistence(),
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")
