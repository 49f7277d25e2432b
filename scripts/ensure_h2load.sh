#!/usr/bin/env bash
# h2load (nghttp2-client) for the load generator's h2load engine tests and the service benchmark.
exec "$(dirname "$0")/ensure_package.sh" nghttp2-client h2load
