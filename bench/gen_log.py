#!/usr/bin/env python3
"""Writes a large synthetic training log with one real TPU OOM near the end.

usage: gen_log.py OUT SIZE_MIB [OOM_FILE]

The noise is what a JAX/PyTorch-XLA training run prints: glog-prefixed lines from libtpu, step
and loss lines, throughput, a few lines mentioning memory that are not errors, and a Python
warning now and then. The OOM (by default the real aggregate_v5e compiler output shipped in
examples/) is appended near the end, followed by a little more noise.
"""
import os
import random
import sys

out, size_mib = sys.argv[1], int(sys.argv[2])
oom_file = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "..", "examples", "jax-tpu-v5e-oom.log")
rng = random.Random(42)
lines = []
for step in range(8000):
    t = f"{rng.randint(0, 23):02}:{rng.randint(0, 59):02}:{rng.randint(0, 59):02}.{rng.randint(0, 999999):06}"
    kind = rng.random()
    if kind < 0.6:
        lines.append(f"I1121 {t} {rng.randint(1000, 9999)} train.py:{rng.randint(10, 900)}] step {step} loss={rng.random() * 4:.4f} lr=3e-4 tokens/s={rng.randint(10000, 90000)}\n")
    elif kind < 0.8:
        lines.append(f"I1121 {t} {rng.randint(1000, 9999)} tpu_compiler.cc:{rng.randint(100, 4000)}] Compiled jit_train_step in {rng.random():.3f}s; program HBM usage stable\n")
    elif kind < 0.9:
        lines.append(f"W1121 {t} {rng.randint(1000, 9999)} pjrt_client.cc:{rng.randint(100, 900)}] device 0 memory stats: bytes_in_use={rng.randint(1 << 30, 1 << 33)} peak={rng.randint(1 << 33, 1 << 34)}\n")
    else:
        lines.append(f"/usr/lib/python3/site-packages/jax/_src/interpreters/mlir.py:{rng.randint(100, 999)}: UserWarning: Some donated buffers were not usable: ShapedArray(float32[{rng.randint(1, 4096)},4096])\n")
block = "".join(lines).encode()
target = size_mib * 1024 * 1024
with open(oom_file, "rb") as f:
    oom = f.read()
with open(out, "wb") as f:
    written = 0
    while written + len(block) < target - len(oom) - len(block):
        f.write(block)
        written += len(block)
    f.write(oom)
    f.write(block)
