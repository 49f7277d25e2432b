#!/usr/bin/env bash
# Makes sure a headless-capable Chromium exists for the map report browser
# test (tests/test_report_browser.py). Installs Debian's `chromium` package
# when missing and we are root; otherwise warns (the browser test then skips,
# unless ORDREC_REQUIRE_BROWSER is set, in which case it fails).
set -euo pipefail
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "chromium missing: installing Debian's chromium" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
    echo "warning: chromium is not installed and cannot be installed here; browser tests will skip" >&2
fi
