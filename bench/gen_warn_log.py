#!/usr/bin/env python3
"""Writes a large training log that hides one real TPU OOM among non-fatal memory warnings.

usage: gen_warn_log.py OUT SIZE_MIB [OOM_FILE]

Unlike gen_log.py, a fifth of the lines hit one of the scanner's anchors without being an error:
- 20% rematerialization warnings (`Can't reduce memory use below X (N bytes) by
  rematerialization; only reduced to Y (M bytes), down from Z (K bytes) originally`), with
  different figures on every line, as XLA prints them for each program it compiles;
- the rest are lines with numbers in them that a training run prints between steps:
  `memory_stats()` dicts, BFC allocator chunk dumps (`InUse at ... of size ...`, `Bin (256): ...`),
  Python warnings with their stack traces, step / loss lines.
The OOM (by default the real aggregate_v5e compiler output shipped in examples/) is appended at
the very end, so nothing follows it. Seeded: the same SIZE_MIB gives the same file.
"""
import os
import random
import sys

out, size_mib = sys.argv[1], int(sys.argv[2])
oom_file = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "..", "examples", "jax-tpu-v5e-oom.log")
rng = random.Random(7)
GIB = 1 << 30


def ts():
    return f"{rng.randint(0, 23):02}:{rng.randint(0, 59):02}:{rng.randint(0, 59):02}.{rng.randint(0, 999999):06}"


def human(b):
    return f"{b / GIB:.2f}GiB"


def remat_warning():
    pid = rng.randint(1000, 9999)
    target = rng.randint(8 * GIB, 15 * GIB)
    reached = target + rng.randint(1 << 20, 4 * GIB)
    original = reached + rng.randint(0, 12 * GIB)
    return (
        f"W1121 {ts()} {pid} hlo_rematerialization.cc:3231] Can't reduce memory use below {human(target)} ({target} bytes) "
        f"by rematerialization; only reduced to {human(reached)} ({reached} bytes), down from {human(original)} ({original} bytes) originally\n"
    )


lines = []
step = 0
while len(lines) < 40000:
    kind = rng.random()
    pid = rng.randint(1000, 9999)
    if kind < 0.3:
        step += 1
        lines.append(f"I1121 {ts()} {pid} train.py:{rng.randint(10, 900)}] step {step} loss={rng.random() * 4:.4f} lr=3e-4 tokens/s={rng.randint(10000, 90000)}\n")
    elif kind < 0.5:
        in_use = rng.randint(1 << 30, 15 * GIB)
        lines.append(
            f"step {step} memory_stats: {{'num_allocs': {rng.randint(100, 90000)}, 'bytes_in_use': {in_use}, "
            f"'peak_bytes_in_use': {in_use + rng.randint(0, 1 << 30)}, 'largest_alloc_size': {rng.randint(1 << 20, 1 << 31)}, "
            f"'bytes_limit': 16911433728, 'bytes_reserved': 0, 'largest_free_block_bytes': {rng.randint(1 << 20, 1 << 32)}}}\n"
        )
    elif kind < 0.8:
        if rng.random() < 0.2:
            b = 1 << rng.randint(8, 28)
            lines.append(
                f"I1121 {ts()} {pid} bfc_allocator.cc:1061] Bin ({b}): \tTotal Chunks: {rng.randint(1, 900)}, Chunks in use: {rng.randint(0, 900)}. "
                f"{rng.randint(1, 999)}.{rng.randint(0, 9)}MiB allocated for chunks. {rng.randint(1, 999)}.{rng.randint(0, 9)}MiB in use in bin.\n"
            )
        else:
            state = "InUse" if rng.random() < 0.8 else "Free"
            lines.append(
                f"I1121 {ts()} {pid} bfc_allocator.cc:1083] {state} at {rng.randint(0x7f0000000000, 0x7fffffffffff):x} of size {rng.randint(256, 1 << 30)} next {rng.randint(1, 99999)}\n"
            )
    else:
        lines.append(f"/usr/lib/python3/site-packages/jax/_src/interpreters/pxla.py:{rng.randint(100, 3000)}: UserWarning: Some donated buffers were not usable: ShapedArray(float32[{rng.randint(1, 4096)},4096])\n")
        lines.append("Traceback (most recent call last):\n")
        for _ in range(rng.randint(2, 6)):
            lines.append(f'  File "/usr/lib/python3/site-packages/jax/_src/{rng.choice(["api", "pjit", "dispatch", "compiler"])}.py", line {rng.randint(10, 3000)}, in {rng.choice(["cache_miss", "_pjit_call_impl", "compile_or_get_cached", "backend_compile"])}\n')
        lines.append("    return fun(*args, **kwargs)\n")
# One line in five is a warning: one after every four other lines.
mixed = []
for i, line in enumerate(lines):
    mixed.append(line)
    if i % 4 == 3:
        mixed.append(remat_warning())
block = "".join(mixed).encode()
target = size_mib * 1024 * 1024
with open(oom_file, "rb") as f:
    oom = f.read()
with open(out, "wb") as f:
    written = 0
    while written + len(block) <= target - len(oom):
        f.write(block)
        written += len(block)
    rest = target - len(oom) - written
    if rest > 0:
        cut = block.rfind(b"\n", 0, rest)
        f.write(block[: cut + 1])
    f.write(oom)
