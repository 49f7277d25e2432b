#!/usr/bin/env bash
# Makes sure a redis-server binary exists (tests start their own on a free
# loopback port). Installs Debian's package when missing and we are root.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server missing: installing Debian's redis-server" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
else
    echo "warning: redis-server is not installed and cannot be installed here; Redis tests will skip" >&2
fi
