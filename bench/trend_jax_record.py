"""Records real JAX CPU runs for tests/corpus/trend (hbm-doctor recording format, sample lines).

`leak`: keeps each step's loss array in a Python list (the classic leak); `clean`: converts it
with float(). used_bytes = jax Device.memory_stats()['bytes_in_use'] when the backend reports it,
else the sum of jax.live_arrays() nbytes (the CPU backend has no allocator stats).
Usage: JAX_PLATFORMS=cpu .venv-tpu/bin/python bench/trend_jax_record.py leak|clean OUT [STEPS]
"""
import json
import sys
import time

import jax
import jax.numpy as jnp

mode, out = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
dev = jax.devices()[0]


@jax.jit
def step(w, x):
    y = jnp.tanh(x @ w)
    loss = (y * y).mean(axis=0)  # a [256] f32 vector, 1 KiB
    return w - 1e-3 * (x.T @ y) / x.shape[0], loss


key = jax.random.PRNGKey(0)
w = jax.random.normal(key, (256, 256))
x = jax.random.normal(key, (64, 256))
kept = []
t0 = 1795255200.0
with open(out, "w") as f:
    f.write(json.dumps({"type": "header", "format": "hbm-doctor-recording", "schema_version": 1,
                        "host": "cpu-0", "ts": t0}) + "\n")
    for s in range(steps):
        w, loss = step(w, x)
        if mode == "leak":
            kept.append(loss)
        else:
            float(loss[0])
        if s % 5 == 0:
            stats = dev.memory_stats() or {}
            used = stats.get("bytes_in_use")
            if used is None:
                used = sum(a.nbytes for a in jax.live_arrays())
            f.write(json.dumps({"type": "sample", "host": "cpu-0", "id": str(dev.id), "accelerator": "cpu",
                                "source": "jax", "used_bytes": int(used), "limit_bytes": 16 * 1024 * 1024,
                                "peak_bytes": None, "step": s, "ts": t0 + s * 0.05}) + "\n")
