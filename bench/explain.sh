#!/usr/bin/env bash
# Benchmark of `hbm-doctor explain` on a large log against GNU grep on the same file, same run.
# usage: bench/explain.sh [SIZE_MIB] [plain|warn] [RUNS]
#   plain: bench/gen_log.py (training noise, one TPU OOM near the end; few anchor hits)
#   warn:  bench/gen_warn_log.py (one line in five a rematerialization warning, OOM at the end)
# Logs are generated under $BENCH_DATA (default bench-data/), never committed.
# With hyperfine installed it is used; otherwise grep and explain alternate RUNS times under
# /usr/bin/time and the medians are compared.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1024}
kind=${2:-plain}
runs=${3:-10}
data=${BENCH_DATA:-bench-data}
mkdir -p "$data"
gen() { # SIZE -> path
  local f
  if [ "$kind" = warn ]; then
    f=$data/warn-$1MiB.log
    [ -f "$f" ] || python3 bench/gen_warn_log.py "$f" "$1"
  else
    f=$data/train-$1MiB.log
    [ -f "$f" ] || python3 bench/gen_log.py "$f" "$1"
  fi
  echo "$f"
}
log=$(gen "$size")
cargo build --release -q -p hbm_doctor
bin=target/release/hbm-doctor
echo "log: $log ($(du -hL "$log" | cut -f1)), $(wc -l < "$log") lines, $(grep -c "Can't reduce memory use" "$log" || true) remat warnings"
"$bin" explain "$log" --format json > /dev/null || [ $? -eq 1 ]
if command -v hyperfine > /dev/null; then
  hyperfine --warmup 2 --runs "$runs" -i --export-markdown "$data/explain-$kind.md" \
    "grep -c RESOURCE_EXHAUSTED $log" \
    "$bin explain $log --format json"
else
  grep -c RESOURCE_EXHAUSTED "$log" > /dev/null
  g=() e=()
  for _ in $(seq "$runs"); do
    # wall,user+sys per run (explain exits 1: it found an OOM)
    g+=("$( { /usr/bin/time -f %e,%U,%S grep -c RESOURCE_EXHAUSTED "$log" > /dev/null || true; } 2>&1 | tail -1)")
    e+=("$( { /usr/bin/time -f %e,%U,%S "$bin" explain "$log" --format json > /dev/null || true; } 2>&1 | tail -1)")
  done
  python3 - "${g[*]}" "${e[*]}" <<'PY'
import statistics, sys
def parse(arg):
    runs = [[float(v) for v in x.split(",")] for x in arg.split()]
    return [r[0] for r in runs], [r[1] + r[2] for r in runs]
gw, gc = parse(sys.argv[1])
ew, ec = parse(sys.argv[2])
for name, g, e in (("wall", gw, ew), ("cpu (user+sys)", gc, ec)):
    r = sorted(b / a for a, b in zip(g, e) if a > 0)
    print(f"{name}: grep -c median {statistics.median(g):.3f} s [{min(g):.2f}, {max(g):.2f}], "
          f"explain median {statistics.median(e):.3f} s [{min(e):.2f}, {max(e):.2f}] ({len(g)} runs)")
    print(f"  ratio explain/grep: of medians {statistics.median(e) / statistics.median(g):.2f}; "
          f"per pair median {statistics.median(r):.2f} [{r[0]:.2f}, {r[-1]:.2f}]")
PY
fi
echo "peak RSS (KiB):"
for s in 64 "$size"; do
  f=$(gen "$s")
  /usr/bin/time -f "  explain ${s} MiB: %M" "$bin" explain "$f" --format json > /dev/null || true
  /usr/bin/time -f "  grep    ${s} MiB: %M" grep -c RESOURCE_EXHAUSTED "$f" > /dev/null || true
done
