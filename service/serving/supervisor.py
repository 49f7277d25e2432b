"""``ordrec-serve --processes N``: N server processes sharing one port.

Each child is a full server (own models, reloader, metrics port) bound with
SO_REUSEPORT, so the kernel spreads connections over them, and pinned to its
own core: on small VMs waking a thread on the other core costs more than the
work (docs/service.md, Scaling, has the measured figures). The parent only
supervises: it restarts a child that dies, forwards SIGTERM so every child
drains its in-flight calls, and exits 0 when they all did.

SO_REUSEPORT balances per connection, not per request, so the children's
``--max-connection-age`` is short by default (2 s, ``cli.connection_age``): clients
reconnect, each connection hashed anew, and the calls even out over several ages
(docs/deploy.md has the measured shares and what reconnecting costs).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

log = logging.getLogger("ordrec.supervisor")
READY_LINE = re.compile(r"ordrec-serve ready port=(\d+) metrics_port=(-?\d+)")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Supervisor:
    def __init__(
        self,
        argv: list[str],
        processes: int,
        host: str,
        port: int,
        metrics_port: int,
        module: str = "ordrec.service",
    ):
        self.argv, self.processes, self.module = argv, processes, module
        self.port = port or _free_port(host)
        self.metrics_port = metrics_port
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
        self.cpus = [cpus[i % len(cpus)] for i in range(processes)]
        self.children: list[subprocess.Popen] = []
        self.metrics_ports = [0] * processes
        self._stopping = threading.Event()
        self._ready = [threading.Event() for _ in range(processes)]

    def child_args(self, i: int) -> list[str]:
        metrics = self.metrics_port + i if self.metrics_port > 0 else self.metrics_port
        args = [
            sys.executable,
            "-m",
            self.module,
            *self.argv,
            "--processes",
            "1",
            "--reuse-port",
            "--port",
            str(self.port),
            "--metrics-port",
            str(metrics),
        ]
        if self.cpus[i] is not None:
            args += ["--cpu", str(self.cpus[i])]
        return args

    def _spawn(self, i: int) -> None:
        child = subprocess.Popen(
            self.child_args(i), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        if i < len(self.children):
            self.children[i] = child
        else:
            self.children.append(child)
        threading.Thread(target=self._pump, args=(i, child), daemon=True).start()

    def _pump(self, i: int, child: subprocess.Popen) -> None:
        assert child.stdout is not None  # spawned with stdout=PIPE
        for line in child.stdout:
            match = READY_LINE.search(line)
            if match:
                self.metrics_ports[i] = int(match.group(2))
                self._ready[i].set()
            else:
                sys.stderr.write(f"[{i}] {line}")

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopping.set())
        for i in range(self.processes):
            self._spawn(i)
        for i, ready in enumerate(self._ready):
            while not ready.wait(0.2):
                if self.children[i].poll() is not None:
                    self._terminate_all()
                    print(f"ordrec-serve: process {i} failed to start", file=sys.stderr)
                    return 1
        ports = ",".join(str(p) for p in self.metrics_ports)
        print(
            f"ordrec-serve ready port={self.port} metrics_port={self.metrics_ports[0]} "
            f"processes={self.processes} metrics_ports={ports}",
            flush=True,
        )
        while not self._stopping.wait(0.5):
            for i, child in enumerate(self.children):
                if child.poll() is not None:
                    log.error("process %d exited with %s: restarting it", i, child.returncode)
                    time.sleep(1.0)
                    self._spawn(i)
        return self._terminate_all()

    def _terminate_all(self) -> int:
        for child in self.children:
            if child and child.poll() is None:
                child.send_signal(signal.SIGTERM)
        codes = [child.wait() for child in self.children if child]
        return 0 if all(code == 0 for code in codes) else 1
