#!/usr/bin/env bash
# Overhead of `fit` over the bare deviceless compile it wraps (BENCHMARKS.md).
# usage: bench/fit.sh [RUNS]    env: PYTHON (default .venv-tpu/bin/python, with jax[tpu]==0.10.2)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv-tpu/bin/python}
cargo build --release -q -p hbm_doctor
export HBM_DOCTOR_BIN=$PWD/target/release/hbm-doctor PYTHONPATH=$PWD/python
export TPU_ACCELERATOR_TYPE=${TPU_ACCELERATOR_TYPE:-v5litepod-4} TPU_WORKER_HOSTNAMES=localhost
"$python" bench/fit_bench.py "${1:-5}" 2> >(grep -v '^[WIE][0-9]' >&2)
