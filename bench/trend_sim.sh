#!/bin/sh
# Simulation study of the trend detector (BENCHMARKS.md "trend: simulation study").
# Deterministic: seeded xorshift; same numbers on every machine.
# Usage: bench/trend_sim.sh [RUNS] [FILES_PER_SCENARIO]: RUNS per-step series per scenario (the
# first two tables), then FILES_PER_SCENARIO files per scenario of series as real runs write
# them (hbm_doctor_trend::simulate). TREND_SECTION=real runs only the latter.
set -eu
cd "$(dirname "$0")/.."
cargo run --release -q -p hbm_doctor_trend --example trend_sim -- "${1:-100}" "${2:-30}"
