"""`make demo`: train on the built-in generated sample, serve it, query it, stop.

Everything lands under .demo/ (data, registry, server log); run it again to
publish a new version next to the old ones.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from service.process import ServerProcess, run_cli

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
DATA, REGISTRY = DEMO / "data", DEMO / "registry"

# (model name, kind, sample file, extra trainer flags)
MODELS = [
    ("dcr", "dcr", "ratings.data", []),
]
# (title, client arguments) — one query per model, shown to the user.
QUERIES = [
    ("Top 5 items for user u001 (DCR), with the predicted rating distribution",
     ["recommend", "--model", "dcr", "--user", "u001", "--n", "5", "--distribution"]),
    ("An unknown user gets the popularity fallback",
     ["recommend", "--model", "dcr", "--user", "new-user", "--n", "3"]),
]


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(args: list[str]) -> str:
    result = run_cli(args, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"demo failed: python -m {' '.join(args)}")
    return result.stdout


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    step("Writing the built-in sample data")
    print(run(["trainer", "sample", "--out", str(DATA)]), end="")
    for name, kind, sample, extra in MODELS:
        step(f"Training {kind} on {sample} and publishing it as '{name}'")
        print(run(["trainer", "train", kind, "--data", str(DATA / sample), "--registry", str(REGISTRY),
                   "--name", name, "--keep", "3", *extra]), end="")
    step("Starting ordrec-serve on a free loopback port")
    with ServerProcess(REGISTRY, log_path=DEMO / "server.log") as server:
        print(f"serving on {server.target}, metrics on {server.metrics_url}/metrics")
        client = ["service.client", "--target", server.target]
        step("ListModels")
        print(run([*client, "models"]), end="")
        for title, query in QUERIES:
            step(title)
            print(run([*client, *query]), end="")
        step("Stopping the server (SIGTERM drains in-flight calls)")
    print(f"server exited with code {server.proc.returncode}; log in {DEMO / 'server.log'}")
    return server.proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
