"""Sizing figures for docs/deploy.md: memory per model and per million users / items, and
reload time (download + verify + index + smoke) from a local and an S3 registry.

    python benchmarks/bench_scaleout.py --sizes 100000,300000 [--rank 20] [--levels 5]

A synthetic DCR model of N users and N items (random factors, ``levels - 1`` levels of
``rank`` factors each: ML-100K's shape at the estimator's defaults) is published into a
local registry and, when boto3 and moto are installed, into moto's S3 server on loopback
(a stand-in for S3 or MinIO, so the download figure is a loopback HTTP one, not a
network one). Each load runs in a fresh process, which reports its resident memory
(VmRSS) before and after, and the seconds each step took.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ordrec.service.storage.artifact import Artifact
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry

LOADER = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from ordrec.service.indices.models import build_index
from ordrec.service.storage.objectstore import open_registry
from ordrec.service.indices import topk
topk.warm_up()
registry = open_registry(sys.argv[1], cache_dir=sys.argv[2])
base = rss()
t0 = time.perf_counter()
artifact = registry.load("dcr")
t1 = time.perf_counter()
index = build_index(artifact)  # builds and runs smoke()
t2 = time.perf_counter()
print(json.dumps({"rss_base": base, "rss_loaded": rss(), "load_s": t1 - t0, "index_s": t2 - t1}))
"""


def synthetic_dcr(n: int, rank: int, levels: int, seed: int = 0) -> Artifact:
    rng = np.random.default_rng(seed)
    width = (levels - 1) * rank
    return Artifact(
        kind="dcr",
        arrays={
            "user_factors": rng.normal(0, 0.1, (n, width)).astype(np.float32),
            "item_factors": rng.normal(0, 0.1, (n, width)).astype(np.float32),
            "seen_indptr": np.zeros(n + 1, np.int64),
            "seen_indices": np.zeros(0, np.int64),
            "item_popularity": rng.random(n).astype(np.float32),
        },
        ids={
            "users": IdMap([f"user{i:09d}" for i in range(n)]),
            "items": IdMap([f"item{i:09d}" for i in range(n)]),
        },
        attributes={"levels": [float(v) for v in range(1, levels + 1)], "rank": rank, "relevance": "linear"},
    )


def measure(registry: str, cache: str, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", LOADER, registry, cache],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"},
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def moto_env() -> tuple[subprocess.Popen | None, dict]:
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError:
        return None, {}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(env)
    return proc, env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="100000,300000", help="users = items per model, comma-separated")
    p.add_argument("--rank", type=int, default=20)
    p.add_argument("--levels", type=int, default=5)
    args = p.parse_args()
    proc, env = moto_env()
    try:
        print(
            "| users = items | files MB | RSS growth MB (local) | load s | index+smoke s | S3 fetch+load s |"
        )
        print("|---|---|---|---|---|---|")
        for n in (int(s) for s in args.sizes.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                artifact = synthetic_dcr(n, args.rank, args.levels)
                Registry(Path(tmp) / "reg").publish("dcr", artifact)
                size = sum(f.stat().st_size for f in (Path(tmp) / "reg").rglob("*") if f.is_file())
                local = measure(str(Path(tmp) / "reg"), str(Path(tmp) / "cache"), env)
                s3 = None
                if proc is not None:
                    import boto3

                    from ordrec.service.storage.objectstore import S3Registry

                    bucket = f"bench-{n}"
                    boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
                    S3Registry(f"s3://{bucket}/reg", cache_dir=Path(tmp) / "pub").publish("dcr", artifact)
                    s3 = measure(f"s3://{bucket}/reg", str(Path(tmp) / "cache"), env)
                grow = (local["rss_loaded"] - local["rss_base"]) / 1e6
                s3_text = (
                    f"{s3['load_s'] + s3['index_s']:.2f} ({s3['load_s']:.2f} fetch+verify)" if s3 else "-"
                )
                print(
                    f"| {n:,} | {size / 1e6:.0f} | {grow:.0f} | {local['load_s']:.2f} | {local['index_s']:.2f} "
                    f"| {s3_text} |",
                    flush=True,
                )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
