#!/usr/bin/env bash
# Makes sure a system tool the tests use exists; installs Debian's package
# when it is missing and we are root, otherwise warns (the tests that need
# it then skip, unless CI's ORDREC_REQUIRE_* variable makes them fail).
#
#   scripts/ensure_package.sh PACKAGE COMMAND [COMMAND...]
#   (any one of the COMMANDs on PATH is enough)
set -euo pipefail
package="$1"
shift
for name in "$@"; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "$1 missing: installing Debian's $package" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
else
    echo "warning: $1 is not installed and cannot be installed here; tests that need it will skip" >&2
fi
