#!/bin/sh
# Issue 45 items 3 and 4 in one command: Recommend at 10^6 items beside bare grpcio in the same
# run, on a planted catalogue (its index chosen by the publish's calibration) and on a trained
# DCR's version (the default `ordrec-train train dcr` over benchmarks/sparse_ratings.py), two
# server processes, 1,000 and 2,000 QPS, three runs each, and users with 10^4 history items.
#
#     benchmarks/million.sh VERSION_DIR [RESULTS_FILE]
#
# VERSION_DIR: e.g. REG/dcr/<version> after
#     python benchmarks/sparse_ratings.py /tmp/sparse.csv
#     ordrec-train train dcr --data /tmp/sparse.csv --registry REG
# RESULTS_FILE: where the tables go as well as stdout (default million-results.md).
# 932 s on the shared machine at load average 15-28 (a version too slow for the offered rate
# waits out h2load's timeout on each such step); the registries are temporary.
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 VERSION_DIR [RESULTS_FILE]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-$here/../.venv/bin/python}
exec "$python" "$here/bench_versus_bare.py" \
    --catalogues 1000000 --structures auto --trained "$1" \
    --processes 2 --rates 1000,2000 --seconds 4 --runs 3 \
    --heavy 10000 --heavy-users 100 \
    --out "${2:-million-results.md}"
