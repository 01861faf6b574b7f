#!/usr/bin/env bash
# Debian's chromium and chromium-driver for the chat page's browser test (tests/serve/test_server.py).
# `make test` runs this; it installs nothing when both are already on PATH.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "The browser test needs Debian's chromium and chromium-driver: sudo apt-get install chromium chromium-driver" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
