#!/usr/bin/env bash
# Regenerates the Python gRPC/protobuf modules under ordrec/v1/ from proto/
# (the wheel gets the .proto files too: setup.py copies them at build time).
# `scripts/gen_proto.sh --check` fails when the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$PY" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" \
    --grpc_python_out="$out" proto/ordrec/v1/*.proto
touch "$out/ordrec/v1/__init__.py"
if [ "${1:-}" = "--check" ]; then
    if ! diff -r -q "$out/ordrec/v1" ordrec/v1 -x __pycache__; then
        echo "generated code in ordrec/v1/ is stale: run scripts/gen_proto.sh" >&2
        exit 1
    fi
    echo "generated code is up to date"
else
    rm -rf ordrec/v1
    cp -r "$out/ordrec/v1" ordrec/v1
    echo "generated ordrec/v1/ from proto/"
fi
