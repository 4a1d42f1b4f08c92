#!/usr/bin/env python3
"""Generate a large XLA dump for benchmarking `hbm-doctor analyze` (output is NOT committed).

An unrolled deep transformer training step (pre-LN blocks: attention + MLP, Python loop, no
`scan`), sharded over a 2x2 mesh ('data', 'model', Megatron-style weights), with its parameters
donated, compiled ahead of time with the real TPU compiler for `v5e:2x2` on this CPU-only machine
(deviceless, see /work/shared/docs/deviceless-tpu.md). `--backend cpu` compiles the same program
with XLA's CPU backend over 4 forced host devices instead (no tiles; much faster to compile).

usage (from the repository root):

    .venv-tpu/bin/python bench/gen_dump.py [--layers N] [--backend tpu|cpu] [--out DIR]

Defaults: 100 layers, TPU, bench-data/dump-transformer-<backend>-<N>L/. Prints the dump's files,
their sizes and the instruction count of the after-optimizations module. Requires jax[tpu]==0.10.2
(the repository's .venv-tpu).
"""

import argparse
import glob
import os
import shutil
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--backend", choices=["tpu", "cpu"], default="tpu")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = a.out or os.path.join(root, "bench-data", f"dump-transformer-{a.backend}-{a.layers}L")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)

    os.environ["XLA_FLAGS"] = f"--xla_dump_to={out} --xla_dump_hlo_as_text" + (
        " --xla_force_host_platform_device_count=4" if a.backend == "cpu" else ""
    )
    if a.backend == "tpu":
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        # Other processes (fixture generators, `fit`) may hold /tmp/libtpu_lockfile; compiling
        # deviceless needs no exclusive device access.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        os.environ.pop("LIBTPU_INIT_ARGS", None)
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if a.backend == "tpu":
        from jax.experimental import topologies

        topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
        devices = topo.devices
    else:
        devices = jax.devices()[:4]
    mesh = Mesh(np.array(devices).reshape(2, 2), ("data", "model"))

    d, h, s, b, n = a.d_model, a.heads, a.seq, a.batch, a.layers
    f = 4 * d
    bf = jnp.bfloat16

    def layer_specs():
        return {
            "ln1": ((d,), P()),
            "wqkv": ((d, 3 * d), P(None, "model")),
            "wo": ((d, d), P("model", None)),
            "ln2": ((d,), P()),
            "w1": ((d, f), P(None, "model")),
            "w2": ((f, d), P("model", None)),
        }

    def norm(x, g):
        x32 = x.astype(jnp.float32)
        mu = x32.mean(-1, keepdims=True)
        var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
        return ((x32 - mu) * jax.lax.rsqrt(var + 1e-6) * g).astype(bf)

    def block(p, x):
        y = norm(x, p["ln1"])
        qkv = y @ p["wqkv"]
        q, k, v = jnp.split(qkv, 3, axis=-1)
        split = lambda t: t.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)
        q, k, v = split(q), split(k), split(v)
        att = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(d // h).astype(bf)
        mask = jnp.tril(jnp.ones((s, s), bool))
        att = jnp.where(mask, att, jnp.finfo(bf).min)
        att = jax.nn.softmax(att.astype(jnp.float32), axis=-1).astype(bf)
        o = jnp.einsum("bhqk,bhkd->bhqd", att, v).transpose(0, 2, 1, 3).reshape(b, s, d)
        x = x + o @ p["wo"]
        y = norm(x, p["ln2"])
        x = x + jax.nn.gelu(y @ p["w1"]) @ p["w2"]
        return x

    def loss_fn(params, x, target):
        for p in params["layers"]:  # unrolled: one copy of the block per layer
            x = block(p, x)
        x = norm(x, params["ln_f"])
        return jnp.mean((x.astype(jnp.float32) - target) ** 2)

    def train_step(params, x, target):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, target)
        params = jax.tree.map(lambda w, g: (w - 1e-3 * g).astype(w.dtype), params, grads)
        return params, loss

    sds = lambda shape, spec, dt=bf: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, spec))
    params = {
        "layers": [{k: sds(*v) for k, v in layer_specs().items()} for _ in range(n)],
        "ln_f": sds((d,), P()),
    }
    x = sds((b, s, d), P("data"))
    target = sds((b, s, d), P("data"), jnp.float32)

    t0 = time.time()
    lowered = jax.jit(train_step, donate_argnums=(0,)).trace(params, x, target).lower(
        **({"lowering_platforms": ("tpu",)} if a.backend == "tpu" else {})
    )
    t1 = time.time()
    compiled = lowered.compile()
    t2 = time.time()
    print(f"lower {t1 - t0:.1f}s, compile {t2 - t1:.1f}s", file=sys.stderr)
    try:
        print("memory_analysis:", compiled.memory_analysis(), file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - informational only
        print("memory_analysis unavailable:", e, file=sys.stderr)

    main_files = sorted(glob.glob(os.path.join(out, "*jit_train_step*after_optimizations*")))
    for p in main_files:
        print(f"{os.path.getsize(p):>12} {p}")
    text = [p for p in main_files if p.endswith("after_optimizations.txt")]
    if text:
        with open(text[0]) as fh:
            body = fh.read()
        count = sum(1 for line in body.splitlines() if " = " in line and not line.startswith("HloModule"))
        print(f"instructions (all computations): {count}")


if __name__ == "__main__":
    main()
