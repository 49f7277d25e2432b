"""Resident memory of an id space: a packed map, before and after its first lookup, beside
the dict ``IdMap`` of the same ids (numbered ids ``0`` to ``n - 1``).

    python benchmarks/mem_idmap.py 1e7
"""

from __future__ import annotations

import gc
import sys

from mem_dcr import rss

from ordrec.service.storage.idmap import IdMap, PackedIdMap, numbered_ids


def grown(build) -> tuple[object, int]:
    """What ``build()`` returns and the resident bytes it added."""
    gc.collect()
    base = rss()
    made = build()
    gc.collect()
    return made, rss() - base


def packed_sizes(n: int) -> tuple[int, int]:
    """Bytes of the packed map of ``n`` numbered ids, and what its first lookup adds."""
    packed, packed_bytes = grown(lambda: numbered_ids(n))
    if not isinstance(packed, PackedIdMap):
        raise SystemExit(f"{n:,} ids are fewer than the packed map's threshold")
    _, index_bytes = grown(lambda: packed.row("0"))
    return packed_bytes, index_bytes


def main() -> None:
    n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 10_000_000
    packed_bytes, index_bytes = packed_sizes(n)
    _, plain_bytes = grown(lambda: IdMap([str(i) for i in range(n)]))
    print(f"{'id map':<32} {'MB':>8} {'bytes/id':>9}")
    for name, size in (
        ("packed", packed_bytes),
        ("packed, after a lookup", packed_bytes + index_bytes),
        ("dict IdMap", plain_bytes),
    ):
        print(f"{name:<32} {size / 1e6:8.0f} {size / n:9.1f}")


if __name__ == "__main__":
    main()
