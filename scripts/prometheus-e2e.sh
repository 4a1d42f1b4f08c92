#!/usr/bin/env bash
# End-to-end check of `hbm-doctor exporter` with a real Prometheus (Debian package `prometheus`).
#
# Starts the exporter on loopback over a samples file with known figures, starts Prometheus on
# loopback with a temporary config that scrapes it every second, waits for the scrape, and checks
# PromQL results through the HTTP API. Everything stays on 127.0.0.1 and is stopped on exit.
#
# Usage: scripts/prometheus-e2e.sh [path/to/hbm-doctor]   (default: target/debug/hbm-doctor)
# Exit: 0 pass, 1 a check failed, 77 prometheus is not installed (apt-get install -y prometheus).
set -euo pipefail

BIN="${1:-${HBM_DOCTOR_BIN:-target/debug/hbm-doctor}}"
PROM="${PROMETHEUS_BIN:-$(command -v prometheus || true)}"
if [[ -z "$PROM" ]]; then
    echo "prometheus-e2e: skipped: no prometheus binary (apt-get install -y prometheus)" >&2
    exit 77
fi
[[ -x "$BIN" ]] || { echo "prometheus-e2e: no hbm-doctor binary at $BIN (cargo build first)" >&2; exit 1; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
EXP_PORT="$(free_port)"
PROM_PORT="$(free_port)"

# Two TPU devices as the in-process hook writes them.
now="$(date +%s)"
cat > "$WORK/samples.jsonl" <<JSON
{"type":"sample","host":"e2e","id":"0","accelerator":"tpu","kind":"TPU v5 lite","source":"jax","used_bytes":9663676416,"limit_bytes":16909336576,"peak_bytes":10737418240,"pid":4242,"ts":$now}
{"type":"sample","host":"e2e","id":"1","accelerator":"tpu","kind":"TPU v5 lite","source":"jax","used_bytes":4294967296,"limit_bytes":16909336576,"peak_bytes":null,"pid":4242,"ts":$now}
JSON

"$BIN" exporter --listen "127.0.0.1:$EXP_PORT" --interval 500ms --no-libtpu --no-nvml \
    --samples "$WORK/samples.jsonl" 2> "$WORK/exporter.log" &
PIDS+=($!)

# The shipped alert rules must load (promtool) and evaluate against the scraped series.
RULES="$(cd "$(dirname "$0")/.." && pwd)/contrib/prometheus/alerts.yml"
PROMTOOL="$(dirname "$PROM")/promtool"
if [[ -x "$PROMTOOL" ]]; then "$PROMTOOL" check rules "$RULES" > /dev/null; echo "ok: promtool check rules $RULES"; fi

cat > "$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - "$RULES"
scrape_configs:
  - job_name: hbm-doctor
    static_configs:
      - targets: ["127.0.0.1:$EXP_PORT"]
YAML
"$PROM" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" > "$WORK/prometheus.log" 2>&1 &
PIDS+=($!)

query() { # PromQL -> the first result's value, or empty
    python3 - "$PROM_PORT" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
port, q = sys.argv[1], sys.argv[2]
url = "http://127.0.0.1:%s/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
r = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
print(r[0]["value"][1] if r else "")
PY
}

expect() { # PromQL, expected value
    local got=""
    for _ in $(seq 1 60); do
        got="$(query "$1" 2>/dev/null || true)"
        [[ "$got" == "$2" ]] && { echo "ok: $1 = $got"; return 0; }
        sleep 0.5
    done
    echo "FAIL: $1 = '${got}', expected '$2'" >&2
    echo "--- exporter log"; cat "$WORK/exporter.log" >&2
    echo "--- prometheus log (tail)"; tail -20 "$WORK/prometheus.log" >&2
    exit 1
}

expect 'up{job="hbm-doctor"}' 1
expect 'hbm_doctor_device_memory_used_bytes{device="0",accelerator="tpu",source="jax"}' 9663676416
expect 'hbm_doctor_device_memory_limit_bytes{device="1"}' 16909336576
expect 'hbm_doctor_device_memory_peak_bytes{device="0"}' 10737418240
expect 'sum(hbm_doctor_device_memory_used_bytes)' 13958643712
expect 'round(max(hbm_doctor_device_memory_used_bytes / hbm_doctor_device_memory_limit_bytes), 0.001)' 0.571
expect 'hbm_doctor_up' 1
expect 'count(hbm_doctor_build_info)' 1
# The rule group was loaded and evaluated (its headroom alert fires for nothing here).
expect 'count(ALERTS{alertname="HbmDoctorDeviceMemoryNearLimit"}) or vector(0)' 0
echo "prometheus-e2e: all checks passed"
