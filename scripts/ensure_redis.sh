#!/usr/bin/env bash
# redis-server for the Redis tests (they start their own on a free loopback port).
exec "$(dirname "$0")/ensure_package.sh" redis-server redis-server
