#!/usr/bin/env python3
"""Generate XLA CPU-backend dumps (no TPU tiles) for hbm-doctor's `analyze` tests.

Each case runs in its own child process with JAX_PLATFORMS=cpu and
XLA_FLAGS="--xla_dump_to=<tmp> --xla_dump_hlo_as_text" (plus
--xla_force_host_platform_device_count=4 for the sharded case), really executes a small JAX
program on the CPU, and copies into tests/corpus/cpu/<case>/dump/ only the files `analyze` reads,
for every module of the dump:

    *.cpu_after_optimizations.txt, *-buffer-assignment.txt, *-live-range.txt,
    *-memory-usage-report.txt

and writes <case>/meta.json: versions, and per jitted function of interest its module name and
all `*_in_bytes` fields of `Compiled.memory_analysis()`.

Cases
-----
mlp_train    a pure-JAX MLP training loop (no flax/optax): `init` (jit, PRNG), `train_step`
             (jit, SGD with momentum, params and momentum donated) run for 3 steps, and `eval`
             (jit) -- several modules in one dump, plus the small modules JAX itself compiles.
sharded_mlp  one SGD step of an MLP over 4 host devices (mesh ('data', 'model'), weights sharded
             on 'model' for the first layer and replicated for the second): an SPMD module
             with num_partitions=4.

Usage (from the repository root, with the repository's .venv-tpu, jax 0.10.2):

    .venv-tpu/bin/python tests/corpus/cpu/generate.py            # all cases
    .venv-tpu/bin/python tests/corpus/cpu/generate.py mlp_train  # one case

Takes about a minute on 2 cores. Regenerating rewrites the dump files; only the `cl_<hash>` part
of file names and nothing in the figures should change for the same versions.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["mlp_train", "sharded_mlp"]
READ_SUFFIXES = (
    "after_optimizations.txt",
    "after_optimizations-buffer-assignment.txt",
    "after_optimizations-live-range.txt",
    "after_optimizations-memory-usage-report.txt",
)
MAX_FILE = 200 * 1024


def memory_stats(compiled):
    ma = compiled.memory_analysis()
    return {k: getattr(ma, k) for k in dir(ma) if k.endswith("_in_bytes")}


def case_mlp_train():
    import jax
    import jax.numpy as jnp
    import numpy as np

    sizes = [784, 512, 512, 10]

    def init(key):
        # One PRNG draw sliced into the weights (each draw unrolls threefry in the CPU module).
        shapes = list(zip(sizes[:-1], sizes[1:]))
        flat = jax.random.normal(key, (sum(i * o for i, o in shapes),))
        params, at = [], 0
        for din, dout in shapes:
            w = flat[at : at + din * dout].reshape(din, dout) * (2.0 / din) ** 0.5
            params.append((w, jnp.zeros(dout)))
            at += din * dout
        return params, jax.tree.map(jnp.zeros_like, params)

    def forward(params, x):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return x @ w + b

    def loss_fn(params, x, y):
        logits = forward(params, x)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), axis=-1))

    def train_step(params, momentum, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - 0.01 * m, params, momentum)
        return params, momentum, loss

    def eval_step(params, x, y):
        logits = forward(params, x)
        return jnp.mean(jnp.argmax(logits, -1) == y), loss_fn(params, x, y)

    rng = np.random.default_rng(0)
    batch = 256
    xs = rng.standard_normal((3, batch, 784), dtype=np.float32)
    ys = rng.integers(0, 10, (3, batch)).astype(np.int32)

    # The executables that run are the ones measured: memory_analysis() and the dump agree.
    key = jax.random.key(0)
    init_c = jax.jit(init).lower(key).compile()
    params, momentum = init_c(key)
    train_c = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, momentum, xs[0], ys[0]).compile()
    eval_c = jax.jit(eval_step).lower(params, xs[0], ys[0]).compile()
    stats = {
        "init": ("jit_init", memory_stats(init_c)),
        "train_step": ("jit_train_step", memory_stats(train_c)),
        "eval": ("jit_eval_step", memory_stats(eval_c)),
    }
    losses = []
    for step in range(3):
        params, momentum, loss = train_c(params, momentum, xs[step], ys[step])
        losses.append(float(loss))
    acc, eval_loss = eval_c(params, xs[0], ys[0])
    return stats, {"losses": losses, "eval_accuracy": float(acc), "eval_loss": float(eval_loss)}


def case_sharded_mlp():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))

    def loss_fn(params, x):
        w1, w2 = params
        return jnp.mean((jnp.tanh(x @ w1) @ w2) ** 2)

    def sgd_step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss

    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    rng = np.random.default_rng(0)
    w1 = put(rng.standard_normal((1024, 2048), dtype=np.float32), P(None, "model"))
    w2 = put(rng.standard_normal((2048, 1024), dtype=np.float32), P())  # replicated
    x = put(rng.standard_normal((512, 1024), dtype=np.float32), P("data"))
    step = jax.jit(sgd_step, donate_argnums=(0,)).lower((w1, w2), x).compile()
    stats = {"sgd_step": ("jit_sgd_step", memory_stats(step))}
    (w1, w2), loss = step((w1, w2), x)
    return stats, {"loss": float(loss)}


def worker(case, dump_dir):
    import jax
    import jaxlib

    stats, result = globals()[f"case_{case}"]()
    meta = {
        "case": case,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "versions": {"python": sys.version.split()[0], "jax": jax.__version__, "jaxlib": jaxlib.__version__},
        "functions": {k: {"module": m, "memory_analysis": s} for k, (m, s) in stats.items()},
        "result": result,
    }
    with open(os.path.join(dump_dir, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)


def run(case):
    with tempfile.TemporaryDirectory() as tmp:
        flags = f"--xla_dump_to={tmp} --xla_dump_hlo_as_text"
        if case == "sharded_mlp":
            flags += " --xla_force_host_platform_device_count=4"
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
        subprocess.run([sys.executable, __file__, "--worker", case, tmp], env=env, check=True)
        out = os.path.join(HERE, case)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(os.path.join(out, "dump"))
        shutil.move(os.path.join(tmp, "meta.json"), os.path.join(out, "meta.json"))
        kept = []
        for p in sorted(glob.glob(os.path.join(tmp, "module_*"))):
            name = os.path.basename(p)
            if not os.path.isfile(p) or not name.endswith(READ_SUFFIXES):
                continue
            size = os.path.getsize(p)
            if size > MAX_FILE:
                raise SystemExit(f"{name} is {size} bytes (> {MAX_FILE}): make the case smaller")
            # Fixtures name no machine: the checkout's path becomes repository-relative.
            root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
            with open(p, encoding="utf-8", errors="replace") as fh:
                text = fh.read().replace(root + os.sep, "")
            with open(os.path.join(out, "dump", name), "w", encoding="utf-8") as fh:
                fh.write(text)
            kept.append((name, size))
        print(f"{case}: {len(kept)} files, {sum(s for _, s in kept)} bytes")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    for case in sys.argv[1:] or CASES:
        if case not in CASES:
            raise SystemExit(f"unknown case {case}; cases: {', '.join(CASES)}")
        run(case)


if __name__ == "__main__":
    main()
