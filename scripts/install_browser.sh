#!/usr/bin/env bash
# Install the browser the admin UI tests drive: Debian's Chromium (Playwright's Python package, from
# requirements-test.txt, brings its driver; no browser is downloaded from anywhere else).
# Idempotent: does nothing when /usr/bin/chromium is already there.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "scripts/install_browser.sh: please install Debian's chromium package (needs root and apt-get)" >&2
  exit 1
fi
