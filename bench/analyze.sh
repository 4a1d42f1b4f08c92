#!/usr/bin/env bash
# Benchmark of `hbm-doctor analyze` end to end on a large XLA dump against the time jaxlib's own
# C++ HLO parser (`jaxlib._hlo.hlo_module_from_text`, exposed as
# `jax._src.lib.xla_client.hlo.hlo_module_from_text` in jax 0.10.2) needs only to parse the same
# after-optimizations text, measured alternately in the same run; and peak RSS vs file size.
#
# usage: bench/analyze.sh [DUMP_DIR] [ROUNDS]
#   DUMP_DIR defaults to bench-data/dump-transformer-tpu-100L (made by bench/gen_dump.py when
#   missing; not committed). ROUNDS (default 7) alternations of analyze and the XLA parse.
set -euo pipefail
cd "$(dirname "$0")/.."
dump=${1:-bench-data/dump-transformer-tpu-100L}
rounds=${2:-7}
py=${PYTHON:-.venv-tpu/bin/python}
if [ ! -d "$dump" ]; then
  layers=$(basename "$dump" | sed -n 's/.*-\([0-9]*\)L$/\1/p')
  "$py" bench/gen_dump.py --layers "${layers:-100}" --out "$dump"
fi
cargo build --release -q -p hbm_doctor
bin=$PWD/target/release/hbm-doctor
hlo=$(ls "$dump"/*jit_train_step*.after_optimizations.txt | head -1)
echo "dump: $dump"
for f in "$dump"/*jit_train_step*after_optimizations{.txt,-buffer-assignment.txt,-live-range.txt,-memory-usage-report.txt}; do
  printf '  %12d  %s\n' "$(stat -c %s "$f")" "$(basename "$f")"
done
echo "  instructions: $(grep -c ' = ' "$hlo")"
"$bin" analyze "$dump" --format json > /dev/null

# Alternate: one end-to-end `analyze` (a fresh process, wall clock) then one in-process parse by
# jaxlib (text already in memory, import excluded), ROUNDS times; medians and their ratio.
"$py" - "$bin" "$dump" "$hlo" "$rounds" <<'EOF'
import resource, statistics, subprocess, sys, time
from jax._src.lib import xla_client as xc
parse = xc.hlo.hlo_module_from_text
binary, dump, hlo, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(hlo).read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
m = parse(text)  # warm-up; also how much peak RSS XLA's parse adds on top of the text
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
del m
print(f"jaxlib hlo_module_from_text adds {grown/1024:.1f} MiB of peak RSS (= {grown*1024/len(text):.2f} x the text) on top of the Python process and the text")
ours, xla = [], []
for _ in range(rounds):
    t = time.perf_counter()
    subprocess.run([binary, "analyze", dump, "--format", "json"], stdout=subprocess.DEVNULL, check=True)
    ours.append(time.perf_counter() - t)
    t = time.perf_counter()
    m = parse(text)
    xla.append(time.perf_counter() - t)
    del m
mo, mx = statistics.median(ours), statistics.median(xla)
ratios = sorted(o / x for o, x in zip(ours, xla))
print(f"analyze end to end (median of {rounds}): {mo*1000:.0f} ms  [{min(ours)*1000:.0f}-{max(ours)*1000:.0f}]")
print(f"jaxlib hlo_module_from_text only (median of {rounds}): {mx*1000:.0f} ms  [{min(xla)*1000:.0f}-{max(xla)*1000:.0f}]")
print(f"ratio analyze / XLA parse: {mo/mx:.3f} (per-round ratios {ratios[0]:.3f}-{ratios[-1]:.3f}; aim <= 0.5)")
EOF

hyperfine --warmup 1 --runs 10 --export-markdown bench-data/analyze.md \
  "$bin analyze $dump --format json" "$bin analyze $dump"

echo "peak RSS:"
hlo_size=$(stat -c %s "$hlo")
read_size=0
for f in "$dump"/*jit_train_step*after_optimizations{.txt,-buffer-assignment.txt,-live-range.txt,-memory-usage-report.txt}; do
  read_size=$((read_size + $(stat -c %s "$f")))
done
rss_kib=$(/usr/bin/time -f %M "$bin" analyze "$dump" --format json 2>&1 >/dev/null | tail -1)
python3 -c "
rss=$rss_kib*1024; hlo=$hlo_size; read=$read_size
print(f'  analyze --format json: {rss/2**20:.1f} MiB; HLO text {hlo/2**20:.1f} MiB -> RSS/HLO text = {rss/hlo:.2f} (aim <= 2)')
print(f'  all files analyze reads: {read/2**20:.1f} MiB -> RSS/files read = {rss/read:.2f}')
"
