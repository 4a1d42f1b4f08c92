#!/usr/bin/env bash
# The whole test suite: the Rust workspace (unit, corpus, CLI, monitor, viewer-in-browser tests),
# then the Python package (wheel built with maturin, installed in a fresh venv with jax[tpu]).
# CI runs it from .ci/run after installing Prometheus and Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
ls -1 target/view-browser/*.png 2>/dev/null | sed 's/^/screenshot: /' || true
bash scripts/python-tests.sh
