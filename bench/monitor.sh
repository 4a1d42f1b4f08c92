#!/usr/bin/env bash
# Reproduces the "Live monitor" section of BENCHMARKS.md: hbm-doctor top/record vs tpu-info.
# Builds release binaries, installs tpu-info from PyPI into a venv under target/, runs
# bench/monitor_bench.py and prints a Markdown section. Loopback only.
# Usage: bench/monitor.sh [DURATION_SECONDS]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${1:-30}"
cargo build --release -q -p hbm_doctor
FAKE="$(cargo test --release -q -p hbm_doctor --test monitor_libtpu --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "monitor_libtpu":
        print(m["executable"])' | tail -1)"
VENV=target/bench-tpu-info-venv
if [[ ! -x "$VENV/bin/tpu-info" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q tpu-info
fi
python3 bench/monitor_bench.py target/release/hbm-doctor "$FAKE" "$VENV/bin/tpu-info" "$DURATION"
