#!/usr/bin/env bash
# Python front end, end to end: a fresh venv, the wheel built by maturin from this checkout,
# installed with jax[tpu] (deviceless TPU compiles need only the wheel, no TPU), then pytest on
# python/tests against the INSTALLED package and binary (not the source tree).
#
# usage: scripts/python-tests.sh [PYTEST ARGS...]
# env:   PYTHON (default python3), HBM_DOCTOR_VENV (default: a temporary directory, removed after),
#        JAX_VERSION (default 0.10.2, the newest that installs on Python 3.11 here).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}
jax_version=${JAX_VERSION:-0.10.2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv=${HBM_DOCTOR_VENV:-$work/venv}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

stamp "venv at $venv ($($python --version))"
"$python" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }

stamp "pip install maturin pytest jax[tpu]==$jax_version"
pip install "maturin>=1.5,<2" pytest "jax[tpu]==$jax_version"

stamp "maturin build --release (bindings = bin)"
# `--compatibility linux`: this wheel is for this machine's tests; release wheels are built
# manylinux by the release job.
"$venv/bin/maturin" build --release --quiet --compatibility linux --out "$work/wheels"
ls -l "$work"/wheels/*.whl

stamp "pip install the wheel"
pip install "$work"/wheels/*.whl
"$venv/bin/hbm-doctor" --version
"$venv/bin/python" -m hbm_doctor --version

stamp "pytest python/tests"
# From outside the source tree, so `import hbm_doctor` is the installed package.
cd "$work"
HBM_DOCTOR_REQUIRE_TPU=1 HBM_DOCTOR_TEST_INSTALLED=1 ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=10 "$repo/python/tests" "$@"
stamp "done"
