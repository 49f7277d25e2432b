#!/usr/bin/env bash
# Headless-capable Chromium for the map report browser test (tests/test_report_browser.py).
exec "$(dirname "$0")/ensure_package.sh" chromium chromium chromium-browser
