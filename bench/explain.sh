#!/usr/bin/env bash
# Benchmark of `hbm-doctor explain` on a large log against GNU grep on the same file, same run.
# usage: bench/explain.sh [SIZE_MIB]   (default 1024; the log is generated, not committed)
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1024}
mkdir -p bench-data
log=bench-data/train-${size}MiB.log
[ -f "$log" ] || python3 bench/gen_log.py "$log" "$size"
cargo build --release -q -p hbm_doctor
bin=target/release/hbm-doctor
echo "log: $log ($(du -h "$log" | cut -f1)), $(wc -l < "$log") lines"
"$bin" explain "$log" --format json > /dev/null || [ $? -eq 1 ]
hyperfine --warmup 2 --runs 10 -i --export-markdown bench-data/explain.md \
  "grep -c RESOURCE_EXHAUSTED $log" \
  "$bin explain $log --format json"
echo "peak RSS (KiB):"
for s in 64 $size; do
  f=bench-data/train-${s}MiB.log
  [ -f "$f" ] || python3 bench/gen_log.py "$f" "$s"
  /usr/bin/time -f "  explain ${s} MiB: %M" "$bin" explain "$f" --format json > /dev/null || true
  /usr/bin/time -f "  grep    ${s} MiB: %M" grep -c RESOURCE_EXHAUSTED "$f" > /dev/null || true
done
