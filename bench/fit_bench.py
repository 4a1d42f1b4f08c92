#!/usr/bin/env python3
"""Overhead of `hbm_doctor.jax.fit` over the bare deviceless JAX compile it wraps.

For each program, in back-to-back pairs whose order alternates (so machine load hits both alike):
  bare: jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",)).compile()   (no dump)
  fit:  hbm_doctor.jax.fit(f, *args, target=...)  - the same compile with the dump written to a
        temporary directory, `hbm-doctor analyze` on it, `hbm-doctor explain --dump` on the error
        when it does not fit, and the result objects.
Each run uses a fresh function object, so no jax cache is hit. Prints a markdown table of
medians and the ratio fit / bare.

usage: bench/fit_bench.py [RUNS]   (with jax[tpu] and hbm-doctor importable; see bench/fit.sh)
"""

import statistics
import sys
import time
import os

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

import programs as pr  # noqa: E402
from hbm_doctor.jax import fit  # noqa: E402

PROGRAMS = [
    # name, fn, args, specs, expected fits
    (
        "mlp train step, fits (2x2048, batch 16384/dev)",
        pr.mlp_train_step,
        pr.mlp_args(16384, width=2048, layers=2),
        pr.MLP_SPECS,
    ),
    ("mlp train step, OOM (16x4096, batch 98304/dev)", pr.mlp_train_step, pr.mlp_args(98304, layers=16), pr.MLP_SPECS),
    ("sgd bf16 3x[40960]^2, OOM", pr.sgd_bf16, pr.sgd_bf16_args(), pr.SGD_SPECS),
    ("scanned residual MLP 4 layers, fits (remat by hand)", None, pr.scanned_mlp_args(32768, 1024, 4), pr.SCAN_SPECS),
]


def scanned_remat(params, x):
    def block(h, p):
        w1, w2 = p
        return h + jax.nn.gelu(h @ w1) @ w2, None

    def loss(ps):
        h, _ = jax.lax.scan(jax.checkpoint(block), x, ps)
        return (h.astype("float32") ** 2).mean()

    return jax.value_and_grad(loss)(params)


def fresh(fn):
    def f(*a):
        return fn(*a)

    f.__name__ = fn.__name__
    return f


def bare(fn, args, specs, mesh):
    abstract = [
        jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s)), a)  # noqa: B023
        for a, s in zip(args, specs)
    ]
    t = time.perf_counter()
    lowered = jax.jit(fresh(fn)).trace(*abstract).lower(lowering_platforms=("tpu",))
    try:
        lowered.compile()
        ok = True
    except Exception as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        ok = False
    return time.perf_counter() - t, ok


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
    mesh = Mesh(np.array(topo.devices).reshape(-1), ("data",))
    print(f"jax {jax.__version__}, target v5e-4, {runs} runs each, alternating; medians")
    print()
    print(
        "| program | fits | bare compile | fit | overhead of medians | overhead per pair: median [min, max] "
        "| fit's own steps (analyze + explain) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, fn, args, specs in PROGRAMS:
        fn = fn or scanned_remat
        bare_t, fit_t, own = [], [], []
        bare(fn, args, specs, mesh)  # warm-up: first use of the topology / libtpu
        fit(fresh(fn), *args, target="v5e-4", in_specs=specs)
        ok = None
        for i in range(runs):
            # Alternate which goes first, so neither gains from running second.
            for which in ("bare", "fit") if i % 2 == 0 else ("fit", "bare"):
                if which == "bare":
                    b, ok = bare(fn, args, specs, mesh)
                    bare_t.append(b)
                else:
                    t = time.perf_counter()
                    r = fit(fresh(fn), *args, target="v5e-4", in_specs=specs)
                    fit_t.append(time.perf_counter() - t)
                    own.append(r.analyze_seconds)
            assert r.fits == ok
        mb, mf = statistics.median(bare_t), statistics.median(fit_t)
        # Per pair (back to back), so that load drifting over the run cancels.
        ratios = sorted(f / b - 1 for f, b in zip(fit_t, bare_t))
        print(
            f"| {name} | {'yes' if ok else 'no'} | {mb:.3f} s | {mf:.3f} s | {100 * (mf / mb - 1):+.1f}% "
            f"| {100 * statistics.median(ratios):+.1f}% [{100 * ratios[0]:+.0f}%, {100 * ratios[-1]:+.0f}%] "
            f"| {statistics.median(own) * 1000:.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
