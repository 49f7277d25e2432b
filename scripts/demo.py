"""`make demo`: train on the built-in generated sample, serve it, query it.

On a terminal the server then keeps serving (the map URLs it printed stay
live) until Ctrl-C; elsewhere (CI, a pipe) it stops at once and prints the
command that serves the same registry. ``--serve`` / ``--no-serve`` choose.

Everything lands under .demo/ (data, registry, server log); run it again to
publish a new version next to the old ones.
"""

from __future__ import annotations

import argparse
import contextlib
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
    (
        "rtf",
        "rtf",
        "tags.csv",
        ["--set", "n_components=16", "--set", "max_iter=30", "--set", "verbose=false"],
    ),
    ("score", "score", "attributes.csv", ["--set", "max_iter=5"]),
    ("knnscal", "knnscal", "neighbors.csv", []),
]
# (title, client arguments) — one query per model, shown to the user.
QUERIES = [
    (
        "Top 5 items for user u001 (DCR), with the predicted rating distribution",
        ["recommend", "--model", "dcr", "--user", "u001", "--n", "5", "--distribution"],
    ),
    (
        "An unknown user gets the popularity fallback",
        ["recommend", "--model", "dcr", "--user", "new-user", "--n", "3"],
    ),
    (
        "Items nearest user u001 on the COE map (negative distances)",
        ["recommend", "--model", "coe", "--user", "u001", "--n", "5"],
    ),
    (
        "Users who would like item i001 (COE: users nearest the item)",
        ["neighbors", "--model", "coe", "--id", "i001", "--from", "item", "--to", "user", "--k", "5"],
    ),
    (
        "Top 5 tags for user u001 tagging item i001 (RTF fast path)",
        ["tags", "--model", "rtf", "--user", "u001", "--item", "i001", "--n", "5"],
    ),
    (
        "Objects nearest o001 on SCORE's 'habitat' map",
        ["neighbors", "--model", "score", "--space", "habitat", "--id", "o001", "--k", "5"],
    ),
    (
        "Aspects related to 'habitat' (SCORE, angular closeness on the sphere)",
        ["neighbors", "--model", "score", "--from", "aspect", "--id", "habitat", "--k", "3"],
    ),
    (
        "Vertices nearest v001 on the KNNSCAL map",
        ["neighbors", "--model", "knnscal", "--id", "v001", "--k", "5"],
    ),
]


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(args: list[str]) -> str:
    result = run_cli(args, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"demo failed: python -m {' '.join(args)}")
    return result.stdout


def keep_serving(server: ServerProcess) -> None:
    """Block until Ctrl-C (or the server exits by itself)."""
    print(
        f"\nServing until Ctrl-C. Try, in another shell:\n"
        f"  .venv/bin/ordrec-client --target {server.target} models\n"
        f"  .venv/bin/ordrec-client --target {server.target} recommend --model dcr --user u002 --n 5",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C also reaches the server, which drains and exits
        server.proc.wait()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--serve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep serving after the queries until Ctrl-C (default: when on a terminal)",
    )
    args = p.parse_args(argv)
    if args.serve is None:
        args.serve = sys.stdin.isatty() and sys.stdout.isatty()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    shutil.rmtree(DATA, ignore_errors=True)
    step("Writing the built-in sample data")
    print(run(["ordrec.trainer", "sample", "--out", str(DATA)]), end="")
    for name, kind, sample, extra in MODELS:
        step(f"Training {kind} on {sample} and publishing it as '{name}'")
        extra = [str(DATA / x) if x.endswith(".txt") else x for x in extra]
        print(
            run(
                [
                    "ordrec.trainer",
                    "train",
                    kind,
                    "--data",
                    str(DATA / sample),
                    "--registry",
                    str(REGISTRY),
                    "--name",
                    name,
                    "--keep",
                    "3",
                    *extra,
                ]
            ),
            end="",
        )
    step("Starting ordrec-serve on a free loopback port")
    with ServerProcess(REGISTRY, log_path=DEMO / "server.log") as server:
        print(f"serving on {server.target}, metrics on {server.metrics_url}/metrics")
        client = ["ordrec.client_cli", "--target", server.target]
        step("ListModels")
        print(run([*client, "models"]), end="")
        for title, query in QUERIES:
            step(title)
            print(run([*client, *query]), end="")
        step("Map reports of the live versions (open in a browser while the server runs)")
        for name in ("coe", "score", "knnscal"):
            print(f"{server.metrics_url}/maps/{name}")
        if args.serve:
            keep_serving(server)
        else:
            print(
                f"\n(not on a terminal (or --no-serve), so the server stops now and these URLs with it;\n"
                f" `make demo` on a terminal keeps serving until Ctrl-C, or serve the registry yourself:\n"
                f"  .venv/bin/ordrec-serve --registry {REGISTRY.relative_to(ROOT)} --port 50051 "
                f"--metrics-port 9095\n"
                f"  then http://127.0.0.1:9095/maps/coe )"
            )
        step("Stopping the server (SIGTERM drains in-flight calls)")
    print(f"server exited with code {server.proc.returncode}; log in {DEMO / 'server.log'}")
    return server.proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
