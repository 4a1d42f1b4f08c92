#!/usr/bin/env bash
# The accuracy harness: scores every labelled real case in tests/corpus (posted messages and
# generated TPU compiler failures) and prints category accuracy, cause@1, cause@3, confusion
# tables and the misses. Fails when a figure falls below ACCURACY.md's ratchet.
# Labels and scoring: docs/accuracy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q -p hbm_doctor --test accuracy -- --nocapture 2>&1 | sed -n '/^Accuracy/,/^test result/p'
