"""Shared fixtures: the built-in sample trained into a registry, a real server
process, a real redis-server on a free loopback port, and the data path."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ordrec.tools.process import ChildProcess, RedisServer, free_port, run_cli
from tests.admin_token import ADMIN_ENV, ADMIN_TOKEN

os.environ.setdefault(ADMIN_ENV, ADMIN_TOKEN)  # server processes inherit it (tests/admin_token.py)
# The FORGOTTEN list's key (service/live/forgotten.py), read alike by the tests, their servers and
# their trainer processes: erasures end to end run keyed, as a deployment does.
os.environ.setdefault("ORDREC_FORGOTTEN_KEY", "tests-forgotten-list-key-0123456789abcdef")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist there is one worker per core: each runs one thread of numba, BLAS and
    # OpenMP (faiss), here and in the processes it starts, so parallel kernels do not spin against
    # each other. ``TEST_WORKERS=0`` and ``make test-slow`` run one process with every thread.
    for variable in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # in case numpy's BLAS was loaded before these were set

DATA_ROOT = Path(os.environ.get("ORDREC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))

# Models trained on the built-in sample for end-to-end tests:
# (registry name, kind, sample file, trainer flags)
SAMPLE_MODELS = [
    ("dcr", "dcr", "ratings.data", ["--set", "max_iter=10"]),
    ("pairwise_dcr", "dcr", "ratings.data", ["--set", "max_iter=10", "--set", "pairwise=true"]),
    ("coe", "coe", "ratings.data", ["--set", "max_iter=5"]),
    (
        "rtf",
        "rtf",
        "tags.csv",
        ["--set", "n_components=8", "--set", "max_iter=5", "--set", "min_iter=1", "--set", "verbose=false"],
    ),
    ("score", "score", "attributes.csv", ["--set", "max_iter=3", "--set", "max_steps_per_epoch=20000"]),
    ("knnscal", "knnscal", "neighbors.csv", ["--set", "max_iter=20"]),
]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fill numba's cache once before any test: a server process compiles every serving kernel
    before it listens, which on a cold cache (a clean clone) takes longer than the tests'
    start-up limit; loading them from the cache takes about a second."""
    from ordrec.service.serving.server import warm_up_kernels

    warm_up_kernels()


def data_file(*parts: str) -> Path:
    """A real data file. Skips when the data sets are not here at all; fails when they are but
    this file is missing (a renamed or lost file must not turn a claim's test into a skip)."""
    path = DATA_ROOT.joinpath(*parts)
    if not DATA_ROOT.is_dir():
        pytest.skip(f"real data not found at {DATA_ROOT} (set ORDREC_DATA)")
    if not path.exists():
        pytest.fail(f"{path} is missing from the data sets at {DATA_ROOT}")
    return path


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    run_cli(["ordrec.trainer", "sample", "--out", str(out)])
    return out


def train_into(registry: Path, sample_dir: Path, models=SAMPLE_MODELS) -> Path:
    for name, kind, sample, flags in models:
        result = run_cli(
            [
                "ordrec.trainer",
                "train",
                kind,
                "--data",
                str(sample_dir / sample),
                "--registry",
                str(registry),
                "--name",
                name,
                *flags,
            ],
            check=False,
        )
        assert result.returncode == 0, result.stderr
    return registry


@pytest.fixture(scope="session")
def sample_registry(sample_dir, tmp_path_factory) -> Path:
    """A registry holding every sample model, trained through the real CLI."""
    return train_into(tmp_path_factory.mktemp("registry"), sample_dir)


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A throw-away key and certificate for ``localhost`` (openssl), as ``(key, cert)``."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


def wait_until(check, seconds: float = 5.0):
    """``check()``'s first truthy value, polled every 0.1 s; its last value after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def require_redis_server() -> None:
    """Skip the test when redis-server is not installed (fail where it is required)."""
    if shutil.which("redis-server") is None:
        if os.environ.get("ORDREC_REQUIRE_REDIS"):
            pytest.fail("redis-server is required (ORDREC_REQUIRE_REDIS is set) but not installed")
        pytest.skip("redis-server not installed (make test installs it)")


@pytest.fixture
def redis_server():
    require_redis_server()
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def aof_redis(tmp_path):
    """A redis-server writing an append-only file synced on every write (in ``tmp_path/aof``)."""
    require_redis_server()
    folder = tmp_path / "aof"
    folder.mkdir()
    server = RedisServer(aof_dir=folder).start()
    yield server
    server.stop()


class MotoServer(ChildProcess):
    """moto's standalone S3 server on loopback: a real S3 HTTP endpoint standing in for
    S3 or MinIO (neither can be installed here). boto3 reaches it through the standard
    ``AWS_ENDPOINT_URL`` variable, as a deployment would reach MinIO."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: the endpoint and throwaway credentials."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> MotoServer:
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("moto server exited") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto server did not start")


@pytest.fixture(scope="session")
def moto_server():
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("boto3 and moto[server] are dev dependencies and must be installed in CI")
        pytest.skip("boto3/moto not installed (pip install -e '.[dev]')")
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3_url(moto_server, monkeypatch, request) -> str:
    """A fresh bucket on the moto server as ``s3://bucket/registry``; the AWS variables
    are set for this process and every child it starts."""
    import boto3

    for key, value in moto_server.env.items():
        monkeypatch.setenv(key, value)
    bucket = "ordrec-" + uuid.uuid4().hex[:12]
    boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/registry"


@pytest.fixture
def toy():
    """The toy kind (``tests/toy_kind.py``) registered for one test."""
    from ordrec.service.indices.models import kinds
    from tests import toy_kind

    kinds.register(toy_kind.TOY)
    try:
        yield toy_kind.TOY
    finally:
        kinds.unregister("toy")
