#!/bin/sh
# Installs Debian's chromium for tests/test_html.py (the headless-browser test) if it is missing.
# Idempotent: does nothing when `chromium` is already on PATH. Needs root (or run it with sudo).
set -eu
if command -v chromium >/dev/null 2>&1; then
    echo "browser_setup: chromium present ($(command -v chromium)), nothing to do"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "browser_setup: chromium is missing and this is not root; run: sudo apt-get update && sudo apt-get install -y chromium" >&2
    exit 1
fi
echo "browser_setup: installing chromium: apt-get update && apt-get install -y chromium"
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
echo "browser_setup: installed $(command -v chromium)"
