"""`make demo`: train on the built-in generated sample, serve it, query it, stop.

Everything lands under .demo/ (data, registry, server log); run it again to
publish a new version next to the old ones.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ordrec.tools.process import ServerProcess, run_cli

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
DATA, REGISTRY = DEMO / "data", DEMO / "registry"

# (model name, kind, sample file, extra trainer flags)
MODELS = [
    ("dcr", "dcr", "ratings.data", []),
    ("coe", "coe", "ratings.data", ["--labels", "items.txt"]),
    ("rtf", "rtf", "tags.csv", ["--set", "n_components=16", "--set", "max_iter=30", "--set", "verbose=false"]),
    ("score", "score", "attributes.csv", ["--set", "max_iter=5"]),
    ("knnscal", "knnscal", "neighbors.csv", []),
]
# (title, client arguments) — one query per model, shown to the user.
QUERIES = [
    ("Top 5 items for user u001 (DCR), with the predicted rating distribution",
     ["recommend", "--model", "dcr", "--user", "u001", "--n", "5", "--distribution"]),
    ("An unknown user gets the popularity fallback",
     ["recommend", "--model", "dcr", "--user", "new-user", "--n", "3"]),
    ("Items nearest user u001 on the COE map (negative distances)",
     ["recommend", "--model", "coe", "--user", "u001", "--n", "5"]),
    ("Users who would like item i001 (COE: users nearest the item)",
     ["neighbors", "--model", "coe", "--id", "i001", "--from", "item", "--to", "user", "--k", "5"]),
    ("Top 5 tags for user u001 tagging item i001 (RTF fast path)",
     ["tags", "--model", "rtf", "--user", "u001", "--item", "i001", "--n", "5"]),
    ("Objects nearest o001 on SCORE's 'habitat' map", ["neighbors", "--model", "score", "--space", "habitat",
                                                      "--id", "o001", "--k", "5"]),
    ("Aspects related to 'habitat' (SCORE, angular closeness on the sphere)",
     ["neighbors", "--model", "score", "--from", "aspect", "--id", "habitat", "--k", "3"]),
    ("Vertices nearest v001 on the KNNSCAL map", ["neighbors", "--model", "knnscal", "--id", "v001", "--k", "5"]),
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
    print(run(["ordrec.trainer", "sample", "--out", str(DATA)]), end="")
    for name, kind, sample, extra in MODELS:
        step(f"Training {kind} on {sample} and publishing it as '{name}'")
        extra = [str(DATA / x) if x.endswith(".txt") else x for x in extra]
        print(run(["ordrec.trainer", "train", kind, "--data", str(DATA / sample), "--registry", str(REGISTRY),
                   "--name", name, "--keep", "3", *extra]), end="")
    step("Starting ordrec-serve on a free loopback port")
    with ServerProcess(REGISTRY, log_path=DEMO / "server.log") as server:
        print(f"serving on {server.target}, metrics on {server.metrics_url}/metrics")
        client = ["ordrec.service.client", "--target", server.target]
        step("ListModels")
        print(run([*client, "models"]), end="")
        for title, query in QUERIES:
            step(title)
            print(run([*client, *query]), end="")
        step("Map reports of the live versions (open in a browser while the server runs)")
        for name in ("coe", "score", "knnscal"):
            print(f"{server.metrics_url}/maps/{name}")
        step("Stopping the server (SIGTERM drains in-flight calls)")
    print(f"server exited with code {server.proc.returncode}; log in {DEMO / 'server.log'}")
    return server.proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
