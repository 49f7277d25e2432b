"""Read speed and peak memory of the readers; prints a table.

    .venv/bin/python benchmarks/bench_readers.py [--data $ORDREC_DATA] [--lines 5000000] [--tmp DIR]

Cases: the real MovieLens 100K ``u.data`` and Last.fm tags (when present); a
generated MovieLens-10M-style ``ratings.dat`` (``::``, integer ids, 0.5-step
ratings) of ``--lines`` lines and the same triples as a CSV with string ids
(``u123``), both through the one fast path; and the numeric file read with the
fast path turned off (per-line parser). Each case runs in a fresh
subprocess so its peak RSS (VmHWM, after the first read) is its own; the time
excludes the interpreter start and imports but includes loading the cached
numba kernels ("first"); "again" is a second read in the same process.
Generated files go to ``--keep`` (kept and reused) or to a temporary folder
under ``--tmp`` that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_CHILD = r"""
import json, sys, time
from ordrec.trainer.data import lines as parsing
from ordrec.trainer.data.readers import read_ratings, read_tags
kind, path, fast = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if not fast:
    _real = parsing.parse_records
    parsing.parse_records = lambda *a, **k: _real(*a, **{**k, "fast": False})
    import ordrec.trainer.data.readers as readers
    readers.parse_records = parsing.parse_records
reader = read_tags if kind == "tags" else read_ratings
start = time.perf_counter()
data = reader(path)
seconds = time.perf_counter() - start
# VmHWM is this process's own peak (ru_maxrss would include the parent's, inherited over exec).
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
records = len(data)
del data
start = time.perf_counter()
reader(path)
again = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "again": again, "rss_mb": rss, "records": records}))
"""


def run_case(kind: str, path: Path, fast: bool = True) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(path), "1" if fast else "0"],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def generate(folder: Path, lines: int, seed: int = 0) -> tuple[Path, Path]:
    """A ``ratings.dat`` with ``lines`` unique (user, item) pairs, and the same triples as CSV."""
    rng = np.random.default_rng(seed)
    n_users, n_items = 70_000, 10_700  # ML-10M's counts
    keys = np.unique(rng.integers(0, n_users * n_items, int(lines * 1.05)))
    keys = rng.permutation(keys)[:lines]
    user, item = keys // n_items + 1, keys % n_items + 1
    rating = rng.integers(1, 11, lines) / 2
    stamp = rng.integers(789_652_009, 1_231_131_736, lines)
    dat, csv = folder / "ratings.dat", folder / "ratings.csv"
    block = 1_000_000
    with open(dat, "w") as f_dat, open(csv, "w") as f_csv:
        f_csv.write("user,item,rating\n")
        for s in range(0, lines, block):
            sl = slice(s, s + block)
            f_dat.write(
                "".join(
                    f"{u}::{i}::{r:g}::{t}\n"
                    for u, i, r, t in zip(
                        user[sl].tolist(), item[sl].tolist(), rating[sl].tolist(), stamp[sl].tolist()
                    )
                )
            )
            f_csv.write(
                "".join(
                    f"u{u},i{i},{r:g}\n"
                    for u, i, r in zip(user[sl].tolist(), item[sl].tolist(), rating[sl].tolist())
                )
            )
    return dat, csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("ORDREC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"),
    )
    parser.add_argument("--lines", type=int, default=5_000_000)
    parser.add_argument("--tmp", default=None)
    parser.add_argument(
        "--keep",
        default=None,
        help="folder to write the generated files to and keep (reused when already there)",
    )
    args = parser.parse_args()

    cases = []
    data = Path(args.data)
    if (data / "ml-100k" / "u.data").exists():
        cases.append(("ml-100k u.data", "ratings", data / "ml-100k" / "u.data", True))
    if (data / "lastfm-tags" / "user_taggedartists.dat").exists():
        cases.append(
            ("lastfm user_taggedartists.dat", "tags", data / "lastfm-tags" / "user_taggedartists.dat", True)
        )
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        marker = folder / f"lines-{args.lines}"
        if marker.exists():
            dat, csv = folder / "ratings.dat", folder / "ratings.csv"
            verb = "reused"
        else:
            dat, csv = generate(folder, args.lines)
            marker.touch()
            verb = "generated"
        print(
            f"{verb} {args.lines:,} lines in {time.perf_counter() - start:.1f} s "
            f"({dat.stat().st_size / 1e6:.0f} MB ratings.dat, {csv.stat().st_size / 1e6:.0f} MB csv)"
        )
        cases += [
            (f"generated ratings.dat, {args.lines:,} lines (integer ids)", "ratings", dat, True),
            (f"generated csv, string ids, {args.lines:,} lines (text ids)", "ratings", csv, True),
            (f"generated ratings.dat, {args.lines:,} lines, per-line parser", "ratings", dat, False),
        ]
        print(
            f"{'case':<58} {'records':>11} {'first s':>8} {'again s':>8} {'lines/s':>11} {'peak RSS MB':>12}"
        )
        for name, kind, path, fast in cases:
            r = run_case(kind, path, fast)
            print(
                f"{name:<58} {r['records']:>11,} {r['seconds']:>8.2f} {r['again']:>8.2f} "
                f"{r['records'] / r['again']:>11,.0f} {r['rss_mb']:>12,.0f}"
            )


if __name__ == "__main__":
    main()
