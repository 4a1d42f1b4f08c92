#!/bin/sh
# Simulation study of the trend detector (BENCHMARKS.md "trend: simulation study").
# Deterministic: seeded xorshift; same numbers on every machine. Usage: bench/trend_sim.sh [RUNS]
set -eu
cd "$(dirname "$0")/.."
cargo run --release -q -p hbm_doctor_trend --example trend_sim -- "${1:-100}"
