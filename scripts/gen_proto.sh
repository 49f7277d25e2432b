#!/usr/bin/env bash
# Regenerates the Python gRPC/protobuf modules under ordrec/ from proto/.
# `scripts/gen_proto.sh --check` fails when the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$PY" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" \
    --grpc_python_out="$out" proto/ordrec/v1/*.proto
for d in "$out/ordrec" "$out/ordrec/v1"; do touch "$d/__init__.py"; done
if [ "${1:-}" = "--check" ]; then
    if ! diff -r -q "$out/ordrec" ordrec -x __pycache__; then
        echo "generated code in ordrec/ is stale: run scripts/gen_proto.sh" >&2
        exit 1
    fi
    echo "generated code is up to date"
else
    rm -rf ordrec
    cp -r "$out/ordrec" ordrec
    echo "generated ordrec/ from proto/"
fi
