"""Peak RSS of a one-epoch DCR fit (top-N defaults) on generated ratings, per rating.

    python benchmarks/mem_dcr.py RATINGS USERS ITEMS      e.g. 1000000 50000 5000

Prints what the generated ratings hold, the process's peak above its start while generating
and after the fit, and the factors' share (issue 35, item 1: where the memory goes).
"""

from __future__ import annotations

import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_dcr import generated_ratings  # noqa: E402

from ordrec.trainer.models.dcr import DCR  # noqa: E402


def rss() -> int:
    """Resident bytes now (Linux)."""
    with open(f"/proc/{os.getpid()}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) * 1024


def peak() -> int:
    """The process's peak resident bytes so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    n, users, items = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    base = rss()
    data = generated_ratings(users, items, n)
    after_data = rss()
    peak_data = peak()
    t = time.perf_counter()
    model = DCR(max_iter=1).fit(data)
    fit_s = time.perf_counter() - t
    factors = model.U_.nbytes + model.V_.nbytes
    top = peak() - base
    print(f"ratings {n:,}  users {users:,}  items {items:,}  process start {base / 1e6:.0f} MB")
    held, generating = (after_data - base) / n, (peak_data - base) / 1e6
    print(f"generated ratings hold {held:.1f} B/rating; peak while generating {generating:.0f} MB")
    print(f"fit of 1 epoch {fit_s:.1f} s; peak {top / 1e6:.0f} MB = {top / n:.0f} B/rating")
    print(
        f"factors U+V {factors / 1e6:.0f} MB = {factors / n:.0f} B/rating; the rest {(top - factors) / n:.0f} B/rating"
    )


if __name__ == "__main__":
    main()
