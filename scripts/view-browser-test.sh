#!/usr/bin/env bash
# Browser test of `hbm-doctor view` (crates/hbm_doctor/tests/view_browser.rs): loads pages made
# from real TPU dumps in Debian's headless Chromium, driven over the DevTools protocol by Node's
# built-in WebSocket (no npm package, no downloaded browser). Installs Debian's chromium with
# apt-get when it is missing and we are root; fails (instead of skipping) when no browser can be
# had. Screenshots are kept in target/view-browser/*.png.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${HBM_DOCTOR_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== view-browser-test: installing Debian's chromium"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "view-browser-test: chromium not found; install it with: sudo apt-get install -y chromium" >&2
    exit 1
  fi
fi
if ! node --experimental-websocket -e "process.exit(typeof WebSocket === 'function' ? 0 : 3)" >/dev/null 2>&1; then
  echo "view-browser-test: needs Node.js 20.10 or newer (for its built-in WebSocket)" >&2
  exit 1
fi
echo "== view-browser-test: $( (${HBM_DOCTOR_CHROMIUM:-chromium} --version) 2>/dev/null | tail -n 1), node $(node --version)"
VIEW_BROWSER_REQUIRED=1 cargo test -p hbm_doctor --test view_browser -- --nocapture --test-threads=2
echo "== view-browser-test: screenshots"
ls -1 target/view-browser/*.png
