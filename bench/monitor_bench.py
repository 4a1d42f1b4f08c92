#!/usr/bin/env python3
"""Benchmark hbm-doctor's live monitor against tpu-info (PyPI), measured in the same run.

Measures, on this machine:
  1. start-up of `hbm-doctor top --once --format json` (against a fake libtpu service serving 8
     devices on loopback, and with no service at all: the default probe of ports 8431-8438),
     vs start-up of `tpu-info` (which, with no TPU here, finds no chips and exits);
  2. CPU cost of sampling at 10 Hz: `hbm-doctor record --interval 100ms` for DURATION seconds
     against the fake service, as a share of one core, and per sample, vs the CPU of one
     `tpu-info` run (the `watch -n0 tpu-info` way of watching memory; tpu-info has no cheaper
     mode here: its --streaming exits at once without chips).

Usage: bench/monitor_bench.py HBM_DOCTOR FAKE_LIBTPU_TEST_BIN TPU_INFO [DURATION]
(bench/monitor.sh builds the binaries, installs tpu-info into a venv and calls this.)
Prints a Markdown section for BENCHMARKS.md.
"""

import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run_timed(argv, env=None):
    """Wall seconds and child CPU seconds (user+sys) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def median_of(argv, n, env=None):
    runs = [run_timed(argv, env) for _ in range(n)]
    walls = [w for w, _ in runs]
    cpus = [c for _, c in runs]
    return statistics.median(walls), statistics.median(cpus), min(walls), max(walls)


def main():
    hbm, fake, tpu_info = sys.argv[1:4]
    duration = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0
    port = free_port()
    env = dict(os.environ, FAKE_LIBTPU_PORT=str(port), FAKE_LIBTPU_BASE=str(4 << 30), FAKE_LIBTPU_DEVICES="8")
    server = subprocess.Popen([fake, "--exact", "fake_libtpu_child", "--nocapture", "--test-threads=1"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("fake libtpu did not start")
                time.sleep(0.05)

        once = [hbm, "top", "--once", "--format", "json", "--no-nvml", "--ports", str(port)]
        probe = [hbm, "top", "--once", "--format", "json"]
        median_of(once, 3)  # warm the page cache
        h_once = median_of(once, 21)
        h_probe = median_of(probe, 21)
        t_run = median_of([tpu_info], 7)

        with tempfile.TemporaryDirectory() as d:
            rec = [hbm, "record", "-o", os.path.join(d, "r.jsonl"), "--interval", "100ms", "--no-nvml",
                   "--ports", str(port), "--duration", "%gs" % duration]
            wall, cpu = run_timed(rec)
            lines = sum(1 for _ in open(os.path.join(d, "r.jsonl"), "rb"))
            rounds = max(1, round(wall / 0.1))
    finally:
        server.kill()
        server.wait()

    share = cpu / wall
    per_sample_ms = cpu / rounds * 1000
    print("## Live monitor: `top --once` start-up and 10 Hz sampling vs tpu-info\n")
    print("`bench/monitor.sh` (this run: %s, %d cores). Fake libtpu = the test server of "
          "`crates/hbm_doctor/tests/monitor_libtpu.rs` on loopback, 8 devices. tpu-info %s from PyPI "
          "in a venv; with no TPU on this machine it finds no chips and exits, so its gRPC query path "
          "could not be timed (it only queries libtpu after finding chips on the PCI bus).\n"
          % (time.strftime("%Y-%m-%d"), os.cpu_count(), subprocess.run([tpu_info, "--version"], capture_output=True, text=True).stdout.split("tpu-info version:")[-1].split()[0] if True else "?"))
    print("| measure | hbm-doctor | tpu-info | ratio (hbm-doctor / tpu-info) |")
    print("|---|---|---|---|")
    print("| start-up, `top --once --format json` vs `tpu-info`, median wall of 21 / 7 runs | %.1f ms (fake libtpu, 8 devices) | %.0f ms | **%.4f** |"
          % (h_once[0] * 1000, t_run[0] * 1000, h_once[0] / t_run[0]))
    print("| same, nothing listening (probe of 8431-8438, NVML load attempt) | %.1f ms | %.0f ms | **%.4f** |"
          % (h_probe[0] * 1000, t_run[0] * 1000, h_probe[0] / t_run[0]))
    print("| CPU of one start-up (user+sys) | %.1f ms | %.0f ms | **%.4f** |" % (h_once[1] * 1000, t_run[1] * 1000, h_once[1] / t_run[1]))
    print("| CPU per 10 Hz sample (`record --interval 100ms`, %gs, 8 devices, 2 RPCs per round) vs CPU of one `tpu-info` run | %.3f ms | %.0f ms | **%.5f** |"
          % (duration, per_sample_ms, t_run[1] * 1000, per_sample_ms / (t_run[1] * 1000)))
    print("| share of one core at 10 Hz | **%.2f%%** (aim < 1%%) | %.0f%% (`watch -n0.1 tpu-info` would need %.1f cores) | — |"
          % (share * 100, min(100.0, t_run[1] * 10 * 100), t_run[1] * 10))
    print("\nRecording written: %d lines in %.1f s. Start-up wall ranges: hbm-doctor %.1f–%.1f ms, tpu-info %.0f–%.0f ms."
          % (lines, wall, h_once[2] * 1000, h_once[3] * 1000, t_run[2] * 1000, t_run[3] * 1000))


if __name__ == "__main__":
    main()
