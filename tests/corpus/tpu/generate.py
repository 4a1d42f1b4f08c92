#!/usr/bin/env python3
"""Generate real TPU-compiler fixtures for hbm-doctor, deviceless, on a CPU-only machine.

What this does
--------------
For every case below it compiles a small JAX program ahead-of-time for a TPU topology with the
real TPU compiler (the closed-source one shipped in the `libtpu` wheel), in a SUBPROCESS so that
libtpu's own stderr can be captured, and writes into tests/corpus/tpu/<case>/:

  stderr.log      libtpu's stderr for that compile (startup boilerplate kept unless the file
                  would exceed 60 KB; the OOM report and everything around it verbatim)
  exception.txt   traceback.format_exc() of the exception the user sees (absent if it compiled)
  meta.json       case name, purpose, topology, versions, whether it compiled, memory_analysis()
                  figures when it compiled, and the headline figures parsed from stderr /
                  the exception (as the strings printed) for failing cases
  meta.json "label" the expected diagnosis (category, causes best first, the fixed twin that proves
                  the first cause, and the measured basis), see label_for(); --relabel rewrites only it
  dump/           (some cases only) the XLA dump files of the main jit module:
                  *before_optimizations.txt, *after_optimizations.txt, *-buffer-assignment.txt,
                  *-live-range.txt, *-memory-usage-report.txt (those that exist)

No TPU is needed: inputs are abstract jax.ShapeDtypeStruct values, nothing is allocated, and the
compile targets a topology from jax.experimental.topologies.

Requirements
------------
Python 3.11 and jax[tpu]==0.10.2 (libtpu 0.0.42.1) in a venv, e.g.

    python3 -m venv .venv-tpu
    .venv-tpu/bin/pip install "jax[tpu]==0.10.2"

How to run (from the repository root)
-------------------------------------
    .venv-tpu/bin/python tests/corpus/tpu/generate.py            # all cases, sequentially
    .venv-tpu/bin/python tests/corpus/tpu/generate.py fits_v5e padding_v5e   # selected cases
    .venv-tpu/bin/python tests/corpus/tpu/generate.py --list     # list case names
    .venv-tpu/bin/python tests/corpus/tpu/generate.py --relabel  # only rewrite meta.json "label" fields

Each case runs `python generate.py --worker <case> <tmpdir>` in a child process with
TPU_STDERR_LOG_LEVEL=0 TPU_MIN_LOG_LEVEL=0 TPU_WORKER_HOSTNAMES=localhost
TPU_ACCELERATOR_TYPE=<matching the topology> and XLA_FLAGS="--xla_dump_to=<tmp> --xla_dump_hlo_as_text".
Compiles are sequential (the machine this was made on has 2 cores). Outputs are overwritten.
At the end the table in README.md (between its TABLE markers) is rebuilt from every meta.json.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# topology name -> TPU_ACCELERATOR_TYPE that matches it (silences libtpu's host probing)
ACCELERATOR_TYPE = {
    "v5e:2x2": "v5litepod-4",
    "v6e:2x2": "v6e-4",
    "v4:2x2x1": "v4-8",
    "v5p:2x2x1": "v5p-8",
    "v5e:4x4": "v5litepod-16",
}

GiB = 1 << 30
MiB = 1 << 20

# --------------------------------------------------------------------------------------------
# Case registry
# --------------------------------------------------------------------------------------------

CASES = {}


def case(name, topology, purpose, expect, dump=False, compiler_options=None, env=None, label=None):
    """Register a case. expect: 'fit', 'oom', or 'oom_suppressed' (compiles only because
    --xla_tpu_no_crash_on_oom suppressed the OOM) -- what the case is meant to show.

    label: the expected diagnosis (written into meta.json "label", see label_for()):
    dict(category=..., causes=[first, alternatives...], category_also=[...], fixed=<twin case>,
    basis=<text, when there is no fixed twin>). Cases that fit get category "none" by default.

    The decorated builder runs in the worker: builder(mesh) -> (fn, args, jit_kwargs).
    """

    def deco(builder):
        CASES[name] = dict(
            name=name,
            topology=topology,
            purpose=purpose,
            expect=expect,
            dump=dump,
            compiler_options=compiler_options or {},
            env=env or {},
            label=label,
            builder=builder,
        )
        return builder

    return deco


def _jax():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax, jnp, NamedSharding, P


def sds(shape, dtype, mesh, spec):
    jax, jnp, NamedSharding, P = _jax()
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


# ---- shared model pieces ---------------------------------------------------------------------


def mlp_train_step_builder(mesh, batch, width, layers, dtype="float32", remat=False):
    """Plain MLP (tanh), batch sharded over all devices, weights replicated; returns loss and grads."""
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)

    def layer(w, h):
        return jnp.tanh(h @ w)

    if remat:
        layer = jax.checkpoint(layer)

    def loss_fn(ws, x):
        h = x
        for w in ws:
            h = layer(w, h)
        return jnp.mean(h * h)

    def train_step(ws, x):
        loss, grads = jax.value_and_grad(loss_fn)(ws, x)
        return loss, grads

    ws = [sds((width, width), dt, mesh, P()) for _ in range(layers)]
    x = sds((batch, width), dt, mesh, P("d"))
    return train_step, (ws, x), {}


# ---- 1. aggregate ------------------------------------------------------------------------------


@case(
    "aggregate_v5e",
    "v5e:2x2",
    "Many medium activations of an MLP forward+backward (large batch) add up over HBM; "
    "no single buffer is more than 50% of the limit.",
    expect="oom",
    dump=True,
)
def _aggregate_v5e(mesh):
    # per device: f32[65536, 4096] = 1 GiB activation per layer, 16 layers
    return mlp_train_step_builder(mesh, batch=4 * 98304, width=4096, layers=16)


@case(
    "aggregate_v4",
    "v4:2x2x1",
    "Same MLP training step as aggregate_v5e (same per-device batch), on v4 (v4:2x2x1 shows 8 devices, "
    "one per TensorCore, 15.25G each).",
    expect="oom",
)
def _aggregate_v4(mesh):
    n = mesh.devices.size
    return mlp_train_step_builder(mesh, batch=n * 98304, width=4096, layers=16)


@case(
    "aggregate_v5p",
    "v5p:2x2x1",
    "Same MLP training step as aggregate_v5e, per-device batch scaled 7x to exceed v5p HBM (95.74G).",
    expect="oom",
)
def _aggregate_v5p(mesh):
    n = mesh.devices.size
    return mlp_train_step_builder(mesh, batch=n * 7 * 98304, width=4096, layers=16)


@case(
    "aggregate_v6e",
    "v6e:2x2",
    "Same MLP training step as aggregate_v5e, per-device batch scaled 2x to exceed v6e HBM (31.25G).",
    expect="oom",
)
def _aggregate_v6e(mesh):
    n = mesh.devices.size
    return mlp_train_step_builder(mesh, batch=n * 2 * 98304, width=4096, layers=16)


# ---- 2. huge single allocation ----------------------------------------------------------------


@case(
    "huge_alloc_v5e",
    "v5e:2x2",
    "One single intermediate (outer product f32[65536,49152], 12 GiB) is more than 50% of HBM.",
    expect="oom",
)
def _huge_alloc_v5e(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def outer_stats(a, b):
        y = a[:, None] * b[None, :]  # f32[65536, 49152] = 12 GiB on every device
        y = jnp.sort(y, axis=1)  # sort cannot be fused: y must be materialized
        return y[:, :8], y[:, -8:]

    a = sds((65536,), jnp.float32, mesh, P())
    b = sds((49152,), jnp.float32, mesh, P())
    return outer_stats, (a, b), {}


# ---- 3. replicated weight ----------------------------------------------------------------------


def _replicated_builder(mesh, spec):
    jax, jnp, NamedSharding, P = _jax()

    def sgd_step(w, x):
        def loss(w):
            return jnp.mean(jnp.tanh(x @ w) ** 2)

        l, g = jax.value_and_grad(loss)(w)
        return l, w - 0.01 * g

    # f32[49152, 49152] = 9 GiB weight
    w = sds((49152, 49152), jnp.float32, mesh, spec)
    x = sds((1024, 49152), jnp.float32, mesh, P())
    return sgd_step, (w, x), {}


@case(
    "replicated_v5e",
    "v5e:2x2",
    "A 9 GiB weight f32[49152,49152] replicated (PartitionSpec()) over the 4-device mesh in an SGD "
    "step: the weight and the updated weight (9 GiB each; the gradient is fused into the update) on "
    "every device exceed HBM; it fits sharded (see replicated_fixed_v5e).",
    expect="oom",
    dump=True,
)
def _replicated_v5e(mesh):
    jax, jnp, NamedSharding, P = _jax()
    return _replicated_builder(mesh, P())


@case(
    "replicated_fixed_v5e",
    "v5e:2x2",
    "Fixed variant of replicated_v5e: the same weight sharded over the mesh (PartitionSpec(None, 'd'), "
    "2.25 GiB per device) fits.",
    expect="fit",
    dump=True,
)
def _replicated_fixed_v5e(mesh):
    jax, jnp, NamedSharding, P = _jax()
    return _replicated_builder(mesh, P(None, "d"))


# ---- 4. padding --------------------------------------------------------------------------------


def _padding_builder(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def compose_rotations(rot, pts):
        # per-item 3x3 matrices: batched dots whose outputs get a tiled layout with the two
        # trailing dims (3,3) padded into (4,128) tiles (56.9x expansion)
        r2 = jnp.einsum("nij,njk->nik", rot, rot)
        return jnp.einsum("nij,njk->nik", r2, pts)

    n = 4 * (1 << 22)  # 4M items per device; f32[4194304,3,3] = 144 MiB unpadded
    rot = sds((n, 3, 3), jnp.float32, mesh, P("d"))
    pts = sds((n, 3, 3), jnp.float32, mesh, P("d"))
    return compose_rotations, (rot, pts), {}


@case(
    "padding_v5e",
    "v5e:2x2",
    "Batched 3x3 matrix products (f32[4194304,3,3] per device, 144 MiB logical): the dot outputs get "
    "{2,1,0:T(4,128)} layouts padded 56.9x, and the padded intermediates (8G + 4G + 4G) exceed HBM. "
    "(A gather output f32[N,2] was tried first: the compiler gave it a {0,1:T(2,128)} layout, no padding.)",
    expect="oom",
    dump=True,
)
def _padding_v5e(mesh):
    return _padding_builder(mesh)


NO_CRASH = {"LIBTPU_INIT_ARGS": "--xla_tpu_no_crash_on_oom=true"}


@case(
    "padding_no_crash_v5e",
    "v5e:2x2",
    "padding_v5e compiled with LIBTPU_INIT_ARGS=--xla_tpu_no_crash_on_oom=true: the compiler "
    "continues past the buffer-assignment OOM and its program memory allocator prints the full "
    "report (Total hbm usage / Program hbm requirement / 'Largest program allocations in hbm' with "
    "'Extra memory due to padding'); the exception is then INVALID_ARGUMENT: Invalid TPU program.",
    expect="oom",
    env=NO_CRASH,
)
def _padding_no_crash_v5e(mesh):
    return _padding_builder(mesh)


@case(
    "aggregate_no_crash_v5e",
    "v5e:2x2",
    "aggregate_v5e compiled with LIBTPU_INIT_ARGS=--xla_tpu_no_crash_on_oom=true: full "
    "'Largest program allocations in hbm' report for many medium activations. Here the compile "
    "then SUCCEEDS (OOM suppressed, 'XLA::TPU program HBM usage: 14.26G / 15.75G' excludes arguments) "
    "and memory_analysis() reports a peak above HBM.",
    expect="oom_suppressed",
    env=NO_CRASH,
)
def _aggregate_no_crash_v5e(mesh):
    return _aggregate_v5e(mesh)


# ---- 5. debug print ----------------------------------------------------------------------------


def _debug_print_builder(mesh, with_print):
    jax, jnp, NamedSharding, P = _jax()

    def step(x):
        y = jnp.sin(x) * 2.0
        if with_print:
            jax.debug.print("y = {}", y)
        return y.sum(axis=1)

    # global f32[4*32768, 32768] = 16 GiB, 4 GiB per device
    x = sds((4 * 32768, 32768), jnp.float32, mesh, P("d"))
    return step, (x,), {}


@case(
    "debug_print_v5e",
    "v5e:2x2",
    "jax.debug.print of a large sharded array (16 GiB global, 4 GiB per device) gathers the "
    "whole array onto one device and pushes it over HBM.",
    expect="oom",
    dump=True,
)
def _debug_print_v5e(mesh):
    return _debug_print_builder(mesh, True)


@case(
    "debug_print_fixed_v5e",
    "v5e:2x2",
    "Fixed variant of debug_print_v5e: the same program without jax.debug.print fits.",
    expect="fit",
    dump=True,
)
def _debug_print_fixed_v5e(mesh):
    return _debug_print_builder(mesh, False)


# ---- 6. arguments alone ------------------------------------------------------------------------


@case(
    "arguments_v5e",
    "v5e:2x2",
    "The inputs alone exceed HBM: f32 parameters of 20 GiB per device (replicated).",
    expect="oom",
)
def _arguments_v5e(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def norm(params):
        return sum(jnp.sum(p * p) for p in params)

    params = [sds((40960, 65536), jnp.float32, mesh, P()) for _ in range(2)]  # 2 x 10 GiB
    return norm, (params,), {}


# ---- 7. no donation ----------------------------------------------------------------------------


def _donation_builder(mesh, donate):
    jax, jnp, NamedSharding, P = _jax()

    def train_step(params, x):
        def loss(params):
            h = x
            for w in params:
                h = jnp.tanh(h @ w)
            return jnp.mean(h * h)

        l, g = jax.value_and_grad(loss)(params)
        new = [w - 0.01 * gw for w, gw in zip(params, g)]
        return l, new

    # 3 x f32[28672, 28672] = 3 x 3.06 GiB = 9.19 GiB of params per device (replicated)
    params = [sds((28672, 28672), jnp.float32, mesh, P()) for _ in range(3)]
    x = sds((4 * 256, 28672), jnp.float32, mesh, P("d"))
    kw = {"donate_argnums": (0,)} if donate else {}
    return train_step, (params, x), kw


@case(
    "no_donation_v5e",
    "v5e:2x2",
    "SGD train step updating large params without donate_argnums: old and new params live "
    "together and exceed HBM.",
    expect="oom",
    dump=True,
)
def _no_donation_v5e(mesh):
    return _donation_builder(mesh, False)


@case(
    "no_donation_fixed_v5e",
    "v5e:2x2",
    "Fixed variant of no_donation_v5e: donate_argnums=(0,) lets outputs alias the params; fits.",
    expect="fit",
    dump=True,
)
def _no_donation_fixed_v5e(mesh):
    return _donation_builder(mesh, True)


# ---- 8. remat ----------------------------------------------------------------------------------


def _remat_builder(mesh, remat):
    jax, jnp, NamedSharding, P = _jax()

    def block(h, p):
        w1, w2 = p
        u = jax.nn.gelu(h @ w1)  # [B, 4D]
        return h + u @ w2, None

    if remat:
        block = jax.checkpoint(block)

    def loss_fn(params, x):
        h, _ = jax.lax.scan(block, x, params)  # layers stacked on axis 0, one HLO loop body
        return jnp.mean(h * h)

    def train_step(params, x):
        return jax.value_and_grad(loss_fn)(params, x)

    D = 2048
    L = 16
    params = (
        sds((L, D, 4 * D), jnp.bfloat16, mesh, P()),
        sds((L, 4 * D, D), jnp.bfloat16, mesh, P()),
    )
    x = sds((4 * 32768, D), jnp.bfloat16, mesh, P("d"))  # bf16[32768, 2048] per device
    return train_step, (params, x), {}


@case(
    "remat_v6e",
    "v6e:2x2",
    "Deep MLP (16 residual blocks scanned with lax.scan, 4x expansion, bf16, batch 32768 per device) "
    "training step: the activations saved for the backward pass exceed v6e HBM.",
    expect="oom",
    dump=True,
)
def _remat_v6e(mesh):
    return _remat_builder(mesh, False)


@case(
    "remat_fixed_v6e",
    "v6e:2x2",
    "Fixed variant of remat_v6e: the scanned block wrapped in jax.checkpoint (only the block inputs "
    "are saved); fits.",
    expect="fit",
    dump=True,
)
def _remat_fixed_v6e(mesh):
    return _remat_builder(mesh, True)


# ---- 10. Pallas vmem / smem --------------------------------------------------------------------


def _pallas_builder(mesh, kind):
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if kind in ("vmem", "scoped", "vmem_fixed", "scoped_fixed"):
        # vmem: block f32[4096, 8192] = 128 MiB (x2 buffers x in/out) > 128 MiB physical VMEM
        # scoped: block f32[256, 8192] = 8 MiB; 2 buffers x in/out = 32 MiB > 16 MiB default scoped limit
        # vmem_fixed: block f32[64, 8192] = 2 MiB (8 MiB double-buffered in and out)
        # scoped_fixed: the scoped block, with the kernel's vmem_limit_bytes raised to 64 MiB
        rows, cols = 4 * 8192, 8192
        bm = {"vmem": 4096, "scoped": 256, "vmem_fixed": 64, "scoped_fixed": 256}[kind]
        params = dict(dimension_semantics=("parallel",))
        if kind == "scoped_fixed":
            params["vmem_limit_bytes"] = 64 * MiB

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        def per_shard(x):
            return pl.pallas_call(
                kernel,
                out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                grid=(x.shape[0] // bm,),
                in_specs=[pl.BlockSpec((bm, cols), lambda i: (i, 0))],
                out_specs=pl.BlockSpec((bm, cols), lambda i: (i, 0)),
                compiler_params=pltpu.CompilerParams(**params),
            )(x)

        x = sds((4 * rows, cols), jnp.float32, mesh, P("d"))
    else:
        rows, cols = 1024, 1024
        n_scalars = 1 << 22  # int32[4M] = 16 MiB in SMEM

        last = 1 if kind == "smem_fixed" else n_scalars - 1

        def kernel(s_ref, x_ref, o_ref):
            o_ref[...] = x_ref[...] + s_ref[0].astype(jnp.float32) + s_ref[last].astype(jnp.float32)

        def per_shard(s, x):
            if kind == "smem_fixed":  # smem_fixed: only the two scalars the kernel reads go to SMEM
                s = jnp.stack([s[0], s[-1]])
            return pl.pallas_call(
                kernel,
                out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                in_specs=[
                    pl.BlockSpec(memory_space=pltpu.SMEM),
                    pl.BlockSpec(memory_space=pltpu.VMEM),
                ],
                out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            )(s, x)

        s = sds((4 * n_scalars,), jnp.int32, mesh, P("d"))
        x = sds((4 * rows, cols), jnp.float32, mesh, P("d"))

    if kind in ("vmem", "scoped", "vmem_fixed", "scoped_fixed"):
        fn = jax.shard_map(per_shard, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False)

        def pallas_double(x):
            return fn(x)

        return pallas_double, (x,), {}
    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"), check_vma=False)

    def pallas_smem(s, x):
        return fn(s, x)

    return pallas_smem, (s, x), {}


@case(
    "vmem_pallas",
    "v5e:2x2",
    "A Pallas TPU kernel whose block (f32[4096,8192] = 128 MiB, double-buffered in and out) is far "
    "too large for VMEM.",
    expect="oom",
)
def _vmem_pallas(mesh):
    return _pallas_builder(mesh, "vmem")


@case(
    "scoped_vmem_pallas",
    "v5e:2x2",
    "A Pallas TPU kernel whose double-buffered blocks (4 x f32[256,8192] = 32 MiB) fit physical VMEM "
    "(128 MiB) but exceed the default scoped VMEM limit (16 MiB).",
    expect="oom",
)
def _scoped_vmem_pallas(mesh):
    return _pallas_builder(mesh, "scoped")


@case(
    "smem_pallas",
    "v5e:2x2",
    "A Pallas TPU kernel that puts an int32[4194304] (16 MiB) operand in SMEM (1 MiB).",
    expect="oom",
)
def _smem_pallas(mesh):
    return _pallas_builder(mesh, "smem")


# ---- 11. fits ----------------------------------------------------------------------------------


@case(
    "fits_v5e",
    "v5e:2x2",
    "A small MLP training step that fits: success log with 'XLA::TPU program HBM usage' and the "
    "Total hbm usage block; memory_analysis() figures in meta.json.",
    expect="fit",
    dump=True,
)
def _fits_v5e(mesh):
    return mlp_train_step_builder(mesh, batch=4 * 16384, width=4096, layers=4)


# ---- 12. extras ---------------------------------------------------------------------------------


@case(
    "hbm_cap_v5e",
    "v5e:2x2",
    "fits_v5e compiled with LIBTPU_INIT_ARGS=--xla_tpu_max_hbm_size_mib=1024: the cap becomes the "
    "limit everywhere (rematerialization limit '95% hbm (972.80M)', 'Can't reduce memory use below', "
    "'Used 1.62G of 1.00G hbm'). (With 2048 it compiles, and the success line still prints the "
    "physical '/ 15.75G'.)",
    expect="oom",
    env={"LIBTPU_INIT_ARGS": "--xla_tpu_max_hbm_size_mib=1024"},
)
def _hbm_cap_v5e(mesh):
    return _fits_v5e(mesh)


def _terabyte_builder(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def outer_sort(a, b):
        y = a[:, None] * b[None, :]  # f32[1048576, 1048576] = 4 TiB
        y = jnp.sort(y, axis=1)
        return y[:, :4]

    a = sds((1 << 20,), jnp.float32, mesh, P())
    b = sds((1 << 20,), jnp.float32, mesh, P())
    return outer_sort, (a, b), {}


@case(
    "terabyte_v5e",
    "v5e:2x2",
    "A program needing terabytes (f32[1048576,1048576] outer product, sorted). Meant to provoke "
    "'Aborting compilation early because it's unlikely to have enough memory'; this libtpu does not "
    "print that here (also not with --xla_tpu_impure_oom_fast_exit_threshold=1/2/100), it reports "
    "'Used 8.00T of 15.75G' and a rematerialization 'Can't reduce memory use below' warning.",
    expect="oom",
)
def _terabyte_v5e(mesh):
    return _terabyte_builder(mesh)


@case(
    "terabyte_no_crash_v5e",
    "v5e:2x2",
    "terabyte_v5e with --xla_tpu_no_crash_on_oom=true: the LLO verifier then fails with "
    "'Allocation (size=4398046511104) would exceed memory (size=17179869184)' for hbm.",
    expect="oom",
    env=NO_CRASH,
)
def _terabyte_no_crash_v5e(mesh):
    return _terabyte_builder(mesh)


# ---- 12b. fixed twins of the cases above ---------------------------------------------------------


def _twin(name, topology, purpose, broken, builder, dump=True):
    case(name, topology, purpose, expect="fit", dump=dump, label={"twin_of": broken})(builder)


for _gen, _topo, _scale in (("v5e", "v5e:2x2", 1), ("v4", "v4:2x2x1", 1), ("v6e", "v6e:2x2", 2),
                            ("v5p", "v5p:2x2x1", 7)):
    _twin(f"aggregate_fixed_{_gen}", _topo,
          f"Fixed variant of aggregate_{_gen}: the same MLP training step with half the per-device batch; fits.",
          f"aggregate_{_gen}",
          (lambda s: lambda mesh: mlp_train_step_builder(
              mesh, batch=mesh.devices.size * s * 98304 // 2, width=4096, layers=16))(_scale))


def _huge_alloc_fixed_builder(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def outer_stats(a, b):
        # the same statistics, computed over blocks of 4096 rows: one f32[4096,49152] block at a time
        def rows(ab):
            y = jnp.sort(ab[:, None] * b[None, :], axis=1)
            return y[:, :8], y[:, -8:]

        lo, hi = jax.lax.map(rows, a.reshape(-1, 4096))
        return lo.reshape(-1, 8), hi.reshape(-1, 8)

    a = sds((65536,), jnp.float32, mesh, P())
    b = sds((49152,), jnp.float32, mesh, P())
    return outer_stats, (a, b), {}


_twin("huge_alloc_fixed_v5e", "v5e:2x2",
      "Fixed variant of huge_alloc_v5e: the outer product sorted in blocks of 4096 rows (lax.map), "
      "f32[4096,49152] (768 MiB) at a time; fits.", "huge_alloc_v5e", _huge_alloc_fixed_builder)
_twin("arguments_fixed_v5p", "v5p:2x2x1",
      "Fixed variant of arguments_v5e: the same program (20 GiB of replicated params per device) on a "
      "bigger generation, v5p (95.74G per device); fits.", "arguments_v5e", _arguments_v5e)


def _padding_fixed_builder(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def compose_rotations(rot, pts):
        # items-last layout [3,3,N]: the 3x3 products written elementwise over N (the minor dim)
        def mm(a, b):
            return (a[:, :, None, :] * b[None, :, :, :]).sum(axis=1)

        return mm(mm(rot, rot), pts)

    n = 4 * (1 << 22)
    rot = sds((3, 3, n), jnp.float32, mesh, P(None, None, "d"))
    pts = sds((3, 3, n), jnp.float32, mesh, P(None, None, "d"))
    return compose_rotations, (rot, pts), {}


_twin("padding_fixed_v5e", "v5e:2x2",
      "Fixed variant of padding_v5e: items-last layout f32[3,3,N] and the 3x3 products written "
      "elementwise over N; nothing is padded; fits.", "padding_v5e", _padding_fixed_builder)
_twin("hbm_cap_fixed_v5e", "v5e:2x2",
      "Fixed variant of hbm_cap_v5e: the same program (fits_v5e) without "
      "--xla_tpu_max_hbm_size_mib; fits.", "hbm_cap_v5e", lambda mesh: _fits_v5e(mesh))


def _terabyte_fixed_builder(mesh):
    jax, jnp, NamedSharding, P = _jax()

    def outer_sort(a, b):
        y = jnp.sort(a * b)  # what was meant: the elementwise product, f32[1048576]
        return y[:4]

    a = sds((1 << 20,), jnp.float32, mesh, P())
    b = sds((1 << 20,), jnp.float32, mesh, P())
    return outer_sort, (a, b), {}


_twin("terabyte_fixed_v5e", "v5e:2x2",
      "Fixed variant of terabyte_v5e: the elementwise product a * b that was meant instead of the "
      "outer product a[:, None] * b[None, :]; fits.", "terabyte_v5e", _terabyte_fixed_builder)
for _kind, _broken, _what in (
        ("vmem_fixed", "vmem_pallas", "blocks of f32[64,8192] (2 MiB, 8 MiB double-buffered in and out)"),
        ("scoped_fixed", "scoped_vmem_pallas", "the same f32[256,8192] blocks with "
                                               "CompilerParams(vmem_limit_bytes=64 MiB)"),
        ("smem_fixed", "smem_pallas", "only the two scalars the kernel reads (int32[2]) passed in SMEM")):
    _twin(_broken.replace("_pallas", "_fixed_pallas"), "v5e:2x2",
          f"Fixed variant of {_broken}: {_what}; fits.", _broken,
          (lambda k: lambda mesh: _pallas_builder(mesh, k))(_kind), dump=False)


# Labels of the cases above (expected diagnosis; fixed twins get category "none" by themselves).
_EXISTING_LABELS = {
    "aggregate_v5e": dict(category="aggregate", causes=["batch_too_large", "no_remat", "f32_precision"],
                          fixed="aggregate_fixed_v5e"),
    "aggregate_v4": dict(category="aggregate", causes=["batch_too_large", "no_remat", "f32_precision"],
                         fixed="aggregate_fixed_v4"),
    "aggregate_v6e": dict(category="aggregate", causes=["batch_too_large", "no_remat", "f32_precision"],
                          fixed="aggregate_fixed_v6e"),
    "aggregate_v5p": dict(category="aggregate", causes=["batch_too_large", "no_remat", "f32_precision"],
                          fixed="aggregate_fixed_v5p"),
    "aggregate_no_crash_v5e": dict(category="aggregate", causes=["batch_too_large", "no_remat", "f32_precision"],
                                   fixed="aggregate_fixed_v5e"),
    "huge_alloc_v5e": dict(category="single_large_allocation", causes=["large_activation"],
                           fixed="huge_alloc_fixed_v5e"),
    "replicated_v5e": dict(category="single_large_allocation", category_also=["arguments"],
                           causes=["replicated_tensor", "no_donation"], fixed="replicated_fixed_v5e"),
    "padding_v5e": dict(category="single_large_allocation", causes=["padding"], fixed="padding_fixed_v5e"),
    "padding_no_crash_v5e": dict(category="single_large_allocation", causes=["padding"],
                                 fixed="padding_fixed_v5e"),
    "debug_print_v5e": dict(category="single_large_allocation", causes=["debug_print"],
                            fixed="debug_print_fixed_v5e"),
    "arguments_v5e": dict(category="arguments", causes=["arguments_exceed", "replicated_tensor"],
                          fixed="arguments_fixed_v5p"),
    "no_donation_v5e": dict(category="aggregate", category_also=["arguments"],
                            causes=["no_donation", "replicated_tensor"], fixed="no_donation_fixed_v5e"),
    "remat_v6e": dict(category="aggregate", causes=["no_remat", "batch_too_large"], fixed="remat_fixed_v6e"),
    "vmem_pallas": dict(category="vmem", causes=["kernel_tiling"], fixed="vmem_fixed_pallas"),
    "scoped_vmem_pallas": dict(category="vmem", causes=["kernel_tiling"], fixed="scoped_vmem_fixed_pallas"),
    "smem_pallas": dict(category="vmem", causes=["kernel_tiling"], fixed="smem_fixed_pallas"),
    "hbm_cap_v5e": dict(category="aggregate", causes=["preallocation", "batch_too_large"],
                        fixed="hbm_cap_fixed_v5e"),
    "terabyte_v5e": dict(category="single_large_allocation", causes=["shape_bug", "large_activation"],
                         fixed="terabyte_fixed_v5e"),
    "terabyte_no_crash_v5e": dict(category="single_large_allocation", causes=["shape_bug", "large_activation"],
                                  fixed="terabyte_fixed_v5e"),
}
for _n, _l in _EXISTING_LABELS.items():
    CASES[_n]["label"] = _l
for _n in ("replicated_fixed_v5e", "debug_print_fixed_v5e", "no_donation_fixed_v5e", "remat_fixed_v6e"):
    CASES[_n]["label"] = {"twin_of": _n.replace("_fixed", "")}


# ---- 13. broken/fixed pairs for "diagnosis that is right" -------------------------------------
#
# Each pair is one program as an ML engineer writes it, compiled twice: the broken version fails
# to compile (RESOURCE_EXHAUSTED), the fixed twin changes exactly the first cause of the label and
# compiles. Both are dumped. Registered by pair(): <base>_<gen> and <base>_fixed_<gen>.


def pair(base, gen, topology, purpose, fixed_purpose, label, build, broken_kw, fixed_kw,
         env=None, fixed_env=None, fixed_topology=None, fixed_gen=None, dump=True):
    broken = f"{base}_{gen}"
    fixed = f"{base}_fixed_{fixed_gen or gen}"
    lab = dict(label)
    lab["fixed"] = fixed
    case(broken, topology, purpose, expect="oom", dump=dump, env=env, label=lab)(
        lambda mesh: build(mesh, **broken_kw))
    case(fixed, fixed_topology or topology, fixed_purpose, expect="fit", dump=dump, env=fixed_env,
         label={"twin_of": broken})(lambda mesh: build(mesh, **fixed_kw))


def _tm(f, *trees):
    import jax

    return jax.tree_util.tree_map(f, *trees)


def adam_update(params, grads, opt_state, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """optax.adam written out: opt_state = {"count", "mu", "nu"} with mu/nu shaped like params."""
    jax, jnp, NamedSharding, P = _jax()
    count = opt_state["count"] + 1
    mu = _tm(lambda m, g: b1 * m + (1 - b1) * g, opt_state["mu"], grads)
    nu = _tm(lambda v, g: b2 * v + (1 - b2) * g * g, opt_state["nu"], grads)
    c = count.astype(jnp.float32)
    new = _tm(lambda p, m, v: p - lr * (m / (1 - b1 ** c)) / (jnp.sqrt(v / (1 - b2 ** c)) + eps),
              params, mu, nu)
    return new, {"count": count, "mu": mu, "nu": nu}


def _shardings(tree):
    return _tm(lambda a: a.sharding, tree)


def _adam_mlp_builder(mesh, layers, width, batch, param_spec, state_spec, donate=True):
    """Data-parallel MLP regression trained with Adam. params/opt_state are optax-style pytrees;
    in_shardings = out_shardings (what the user asked for), params and state donated."""
    jax, jnp, NamedSharding, P = _jax()
    if isinstance(param_spec, tuple):
        param_spec, state_spec = _P(*param_spec), _P(*state_spec)

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            h = batch["x"]
            for i in range(layers):
                h = jnp.tanh(h @ params[f"layer_{i}"]["w"])
            return jnp.mean((h - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    params = {f"layer_{i}": {"w": sds((width, width), jnp.float32, mesh, param_spec)} for i in range(layers)}
    opt_state = {
        "count": sds((), jnp.int32, mesh, P()),
        "mu": {k: {"w": sds((width, width), jnp.float32, mesh, state_spec)} for k in params},
        "nu": {k: {"w": sds((width, width), jnp.float32, mesh, state_spec)} for k in params},
    }
    batch_ = {"x": sds((batch, width), jnp.float32, mesh, P("d")),
              "y": sds((batch, width), jnp.float32, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P()))}
    if donate:
        kw["donate_argnums"] = (0, 1)
    return train_step, (params, opt_state, batch_), kw


def _P(*a):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*a)


# 13.1 optimizer state replicated under data parallelism -> ZeRO-1 / FSDP


def _adam(mesh, layers, width, batch, params, state):
    return _adam_mlp_builder(mesh, layers, width, batch, _P(*params), _P(*state))


pair(
    "adam_replicated", "v5e", "v5e:2x2",
    "Data-parallel MLP (5 x f32[16384,16384] = 5 GiB of params) trained with optax-style Adam, params "
    "and opt_state (mu, nu) replicated P() and donated: 15 GiB of arguments per device plus the "
    "gradients exceed HBM.",
    "Fixed variant of adam_replicated_v5e: ZeRO-1, opt_state mu/nu sharded P('d', None) (1 GiB each "
    "per device), params still replicated; fits.",
    dict(category="arguments", category_also=["aggregate"],
         causes=["optimizer_state_unsharded", "replicated_tensor", "arguments_exceed"]),
    _adam, dict(layers=5, width=16384, batch=4 * 1024, params=(), state=()),
    dict(layers=5, width=16384, batch=4 * 1024, params=(), state=("d", None)),
)



pair(
    "adam_replicated", "v6e", "v6e:2x2",
    "Data-parallel MLP (4 x f32[24576,24576] = 9 GiB of params) trained with optax-style Adam on v6e, "
    "params and opt_state replicated P() and donated: 27 GiB of arguments per device plus gradients "
    "exceed 31.25G.",
    "Fixed variant of adam_replicated_v6e: FSDP, params and opt_state all sharded P('d', None); fits.",
    dict(category="arguments", category_also=["aggregate"],
         causes=["optimizer_state_unsharded", "replicated_tensor", "arguments_exceed"]),
    _adam, dict(layers=4, width=24576, batch=4 * 1024, params=(), state=()),
    dict(layers=4, width=24576, batch=4 * 1024, params=("d", None), state=("d", None)),
)

pair(
    "adam_replicated", "v4", "v4:2x2x1",
    "Data-parallel MLP (6 x f32[16384,16384] = 6 GiB of params) with optax-style Adam on v4 (8 devices, "
    "15.25G each), params + mu + nu replicated: the arguments alone (18 GiB) exceed HBM.",
    "Fixed variant of adam_replicated_v4: ZeRO-1, mu/nu sharded P('d', None) over the 8 devices "
    "(0.75 GiB each per device); fits.",
    dict(category="arguments", causes=["optimizer_state_unsharded", "arguments_exceed", "replicated_tensor"]),
    _adam, dict(layers=6, width=16384, batch=8 * 512, params=(), state=()),
    dict(layers=6, width=16384, batch=8 * 512, params=(), state=("d", None)),
)


# 13.2 the batch is not sharded: the data input replicated P() instead of P('d')


def _dp_mlp_builder(mesh, layers, width, batch, batch_spec, dtype="float32", per_device_batch=None,
                    micro=1):
    """Data-parallel MLP classifier-ish training step: params (dict) replicated, batch sharded or not.
    micro > 1: gradient accumulation over `micro` micro-batches with lax.scan (same global batch)."""
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)

    def loss_fn(params, x):
        h = x
        for i in range(layers):
            h = jnp.tanh(h @ params[f"dense_{i}"]["kernel"])
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def train_step(params, batch):
        x = batch["inputs"]
        if micro == 1:
            loss, grads = jax.value_and_grad(loss_fn)(params, x)
        else:
            xs = x.reshape(micro, x.shape[0] // micro, *x.shape[1:])
            xs = jax.lax.with_sharding_constraint(xs, NamedSharding(mesh, P(None, "d")))

            def acc(carry, xm):
                l, g = jax.value_and_grad(loss_fn)(params, xm)
                return _tm(jnp.add, carry, (l, g)), None

            zero = (jnp.zeros((), jnp.float32), _tm(jnp.zeros_like, params))
            (loss, grads), _ = jax.lax.scan(acc, zero, xs)
            loss, grads = loss / micro, _tm(lambda g: g / micro, grads)
        new = _tm(lambda p, g: p - 0.01 * g, params, grads)
        return new, loss

    params = {f"dense_{i}": {"kernel": sds((width, width), dt, mesh, P())} for i in range(layers)}
    batch_ = {"inputs": sds((batch, width), dt, mesh, _P(*batch_spec))}
    return train_step, (params, batch_), {"donate_argnums": (0,)}


pair(
    "batch_replicated", "v5e", "v5e:2x2",
    "Data-parallel MLP training step (8 x f32[4096,4096] replicated, global batch 196608) where the "
    "batch is passed replicated P() instead of P('d'): every device computes the whole global batch, "
    "and its activations exceed HBM.",
    "Fixed variant of batch_replicated_v5e: the batch sharded P('d') (49152 rows per device); fits.",
    dict(category="aggregate", causes=["replicated_tensor", "batch_too_large", "no_remat"]),
    _dp_mlp_builder, dict(layers=8, width=4096, batch=196608, batch_spec=()),
    dict(layers=8, width=4096, batch=196608, batch_spec=("d",)),
)

pair(
    "batch_replicated", "v4", "v4:2x2x1",
    "The same unsharded-batch mistake on v4 (8 devices): bf16 MLP (8 x bf16[8192,8192]), global batch "
    "196608 passed replicated P(): all 196608 rows on every device.",
    "Fixed variant of batch_replicated_v4: the batch sharded P('d') (24576 rows per device); fits.",
    dict(category="aggregate", causes=["replicated_tensor", "batch_too_large", "no_remat"]),
    _dp_mlp_builder, dict(layers=8, width=8192, batch=196608, batch_spec=(), dtype="bfloat16"),
    dict(layers=8, width=8192, batch=196608, batch_spec=("d",), dtype="bfloat16"),
)


# 13.3 lax.scan over stacked layer params without remat -> jax.checkpoint in the scan body


def _scan_layers_builder(mesh, n_layers, width, ffn, batch, dtype, remat):
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)

    def block(h, layer):
        u = jax.nn.gelu(h @ layer["w_in"])
        return h + u @ layer["w_out"], None

    if remat:
        block = jax.checkpoint(block)

    def loss_fn(params, x):
        h, _ = jax.lax.scan(block, x, params["layers"])
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def train_step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return _tm(lambda p, g: p - 0.01 * g, params, grads), loss

    params = {"layers": {"w_in": sds((n_layers, width, ffn), dt, mesh, P()),
                         "w_out": sds((n_layers, ffn, width), dt, mesh, P())}}
    x = sds((batch, width), dt, mesh, P("d"))
    return train_step, (params, x), {"donate_argnums": (0,)}


pair(
    "scan_no_remat", "v5e", "v5e:2x2",
    "48 residual MLP blocks scanned with lax.scan over stacked params (f32[48,1024,4096] x 2, the "
    "leading dim is the layer count), batch 4096 rows per device, no jax.checkpoint: every layer's "
    "activations are stacked for the backward pass ([48,4096,4096] f32) and exceed HBM.",
    "Fixed variant of scan_no_remat_v5e: the scanned block wrapped in jax.checkpoint; fits.",
    dict(category="aggregate", category_also=["single_large_allocation"],
         causes=["no_remat", "batch_too_large", "f32_precision"]),
    _scan_layers_builder, dict(n_layers=48, width=1024, ffn=4096, batch=4 * 4096, dtype="float32", remat=False),
    dict(n_layers=48, width=1024, ffn=4096, batch=4 * 4096, dtype="float32", remat=True),
)

pair(
    "scan_no_remat", "v5p", "v5p:2x2x1",
    "64 residual MLP blocks (bf16[64,4096,16384] x 2 = 16 GiB of stacked params) under lax.scan "
    "without jax.checkpoint on v5p, 8192 rows per device: the saved activations exceed 95.74G.",
    "Fixed variant of scan_no_remat_v5p: jax.checkpoint on the scanned block; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _scan_layers_builder, dict(n_layers=64, width=4096, ffn=16384, batch=4 * 8192, dtype="bfloat16", remat=False),
    dict(n_layers=64, width=4096, ffn=16384, batch=4 * 8192, dtype="bfloat16", remat=True),
)


# 13.4 f32 where bf16 fits


pair(
    "f32_params", "v6e", "v6e:2x2",
    "Data-parallel MLP training step entirely in f32 (8 x f32[16384,16384] replicated, 65536 rows per "
    "device) on v6e: f32 params, gradients and activations exceed 31.25G.",
    "Fixed variant of f32_params_v6e: the same model, params and inputs in bf16; fits.",
    dict(category="aggregate", causes=["f32_precision", "batch_too_large", "no_remat"]),
    _dp_mlp_builder, dict(layers=8, width=16384, batch=4 * 65536, batch_spec=("d",), dtype="float32"),
    dict(layers=8, width=16384, batch=4 * 65536, batch_spec=("d",), dtype="bfloat16"),
)

pair(
    "f32_params", "v4", "v4:2x2x1",
    "Scanned residual MLP (24 blocks, f32[24,2048,8192] x 2, 65536 rows per device) with jax.checkpoint, "
    "all in f32 on v4: "
    "params, gradients and the checkpointed carries in f32 exceed 15.25G.",
    "Fixed variant of f32_params_v4: params and inputs in bf16; fits.",
    dict(category="aggregate", causes=["f32_precision", "batch_too_large"]),
    _scan_layers_builder, dict(n_layers=24, width=2048, ffn=8192, batch=8 * 65536, dtype="float32", remat=True),
    dict(n_layers=24, width=2048, ffn=8192, batch=8 * 65536, dtype="bfloat16", remat=True),
)



# 13.5 logits [B,S,V] of a large vocabulary in f32 -> chunked loss


def _lm_head_builder(mesh, batch, seq, d_model, vocab, chunk=None):
    """Language-model head + softmax cross-entropy in f32, training step (grads for the final
    hidden states and the unembedding). chunk: the loss computed over sequence chunks with
    lax.scan + jax.checkpoint, so only one [B, chunk, V] block of logits is live."""
    jax, jnp, NamedSharding, P = _jax()

    def xent(h, w, labels):
        logits = (h @ w).astype(jnp.float32)  # [B, S, V]
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        return jnp.sum(logz - picked)

    def loss_fn(hidden, w_unembed, labels):
        if chunk is None:
            return xent(hidden, w_unembed, labels) / labels.size
        n = hidden.shape[1] // chunk
        hs = hidden.reshape(hidden.shape[0], n, chunk, -1).swapaxes(0, 1)
        ls = labels.reshape(labels.shape[0], n, chunk).swapaxes(0, 1)

        @jax.checkpoint
        def body(acc, xs):
            h, l = xs
            return acc + xent(h, w_unembed, l), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (hs, ls))
        return total / labels.size

    def lm_loss_step(hidden, w_unembed, labels):
        return jax.value_and_grad(loss_fn, argnums=(0, 1))(hidden, w_unembed, labels)

    hidden = sds((batch, seq, d_model), jnp.bfloat16, mesh, P("d"))
    w = sds((d_model, vocab), jnp.bfloat16, mesh, P())
    labels = sds((batch, seq), jnp.int32, mesh, P("d"))
    return lm_loss_step, (hidden, w, labels), {}


pair(
    "logits_f32", "v5e", "v5e:2x2",
    "LM head + cross-entropy in f32 with a 151936-token vocabulary, 12 x 2048 tokens per device: the "
    "logits f32[12,2048,151936] (13.9 GiB per device) and their gradient exceed HBM.",
    "Fixed variant of logits_f32_v5e: the loss computed over 256-token chunks of the sequence "
    "(lax.scan + jax.checkpoint), one f32[12,256,151936] block of logits at a time; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large", "f32_precision"]),
    _lm_head_builder, dict(batch=4 * 12, seq=2048, d_model=2048, vocab=151936),
    dict(batch=4 * 12, seq=2048, d_model=2048, vocab=151936, chunk=256),
)

pair(
    "logits_f32", "v6e", "v6e:2x2",
    "LM head + cross-entropy in f32 with a 256000-token vocabulary on v6e, 12 x 2048 tokens per device: "
    "the logits f32[12,2048,256000] (23.4 GiB per device) and their gradient exceed 31.25G.",
    "Fixed variant of logits_f32_v6e: the loss over 512-token chunks (lax.scan + jax.checkpoint); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large", "f32_precision"]),
    _lm_head_builder, dict(batch=4 * 12, seq=2048, d_model=2048, vocab=256000),
    dict(batch=4 * 12, seq=2048, d_model=2048, vocab=256000, chunk=512),
)


# 13.6 attention scores [B,H,S,S] of long sequences -> blocked (flash-style) attention


def _attention_builder(mesh, batch, seq, heads, head_dim, block=None, train=False):
    """Multi-head self-attention on bf16 q/k/v [B,S,H,D] with f32 softmax. block: queries processed in
    blocks of `block` rows with lax.map (each block sees all keys; scores [B,H,block,S]),
    under jax.checkpoint when training."""
    jax, jnp, NamedSharding, P = _jax()
    scale = head_dim ** -0.5

    def attend(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * scale
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)

    def attention(q, k, v):
        if block is None:
            return attend(q, k, v)
        n = q.shape[1] // block
        qs = q.reshape(q.shape[0], n, block, *q.shape[2:]).swapaxes(0, 1)
        f = jax.checkpoint(attend) if train else attend
        out = jax.lax.map(lambda qb: f(qb, k, v), qs)
        return out.swapaxes(0, 1).reshape(q.shape)

    if train:
        def attention_step(q, k, v):
            return jax.grad(lambda q, k, v: jnp.mean(attention(q, k, v).astype(jnp.float32) ** 2),
                            argnums=(0, 1, 2))(q, k, v)
    else:
        def attention_step(q, k, v):
            return attention(q, k, v)

    spec = P("d")
    q, k, v = (sds((batch, seq, heads, head_dim), jnp.bfloat16, mesh, spec) for _ in range(3))
    return attention_step, (q, k, v), {}


pair(
    "attention_scores", "v5e", "v5e:2x2",
    "Self-attention prefill on a 32768-token sequence (1 sequence per device, 8 heads): the attention "
    "probabilities bf16[1,8,32768,32768] (16 GiB per device; the f32 scores are fused into the softmax) exceed HBM.",
    "Fixed variant of attention_scores_v5e: queries in blocks of 1024 (lax.map, flash-style "
    "blocking; scores [1,8,1024,32768] per block); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _attention_builder, dict(batch=4, seq=32768, heads=8, head_dim=128),
    dict(batch=4, seq=32768, heads=8, head_dim=128, block=1024),
)

pair(
    "attention_scores", "v5p", "v5p:2x2x1",
    "Self-attention forward+backward on 8192-token sequences on v5p (8 sequences per device, 32 heads): "
    "the [8,32,8192,8192] attention probabilities and their gradients (32 GiB each in bf16) exceed 95.74G.",
    "Fixed variant of attention_scores_v5p: queries in blocks of 1024 under jax.checkpoint (lax.map); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large", "no_remat"]),
    _attention_builder, dict(batch=32, seq=8192, heads=32, head_dim=128, train=True),
    dict(batch=32, seq=8192, heads=32, head_dim=128, block=1024, train=True),
)


# 13.7 jax.debug.print / jax.debug.callback of a large array inside a scan


def _debug_scan_builder(mesh, rows, cols, steps, mode):
    """A few steps of an iterative update under lax.scan with a debug print of the whole state in
    the body (mode 'print' or 'callback'); 'norm' prints only a scalar (the fix)."""
    jax, jnp, NamedSharding, P = _jax()

    def body(x, _):
        x = x - 0.1 * jnp.tanh(x)
        if mode == "print":
            jax.debug.print("x = {x}", x=x)
        elif mode == "callback":
            jax.debug.callback(lambda a: None, x)
        else:
            jax.debug.print("|x| = {n}", n=jnp.linalg.norm(x))
        return x, None

    def relax(x):
        x, _ = jax.lax.scan(body, x, None, length=steps)
        return x

    x = sds((rows, cols), jnp.float32, mesh, P("d"))
    return relax, (x,), {"donate_argnums": (0,)}


pair(
    "debug_print_scan", "v5e", "v5e:2x2",
    "jax.debug.print of the whole state inside a lax.scan body (state f32[131072,32768], 4 GiB per "
    "device, 16 GiB global): each step gathers the global array onto the device.",
    "Fixed variant of debug_print_scan_v5e: the body prints only the norm of the state; fits.",
    dict(category="single_large_allocation", causes=["debug_print"]),
    _debug_scan_builder, dict(rows=131072, cols=32768, steps=4, mode="print"),
    dict(rows=131072, cols=32768, steps=4, mode="norm"),
)

pair(
    "debug_callback_scan", "v6e", "v6e:2x2",
    "jax.debug.callback on the whole state inside a lax.scan body on v6e (state f32[262144,32768], "
    "8 GiB per device, 32 GiB global): the callback operand is gathered whole onto the device.",
    "Fixed variant of debug_callback_scan_v6e: the body prints only the norm of the state; fits.",
    dict(category="single_large_allocation", causes=["debug_print"]),
    _debug_scan_builder, dict(rows=262144, cols=32768, steps=4, mode="callback"),
    dict(rows=262144, cols=32768, steps=4, mode="norm"),
)



# 13.8 padding: small unaligned minor dims -> coordinates-first (permuted) layout
# (Tried first: per-point 3x3 rotations applied with einsum('nij,nj->ni') to f32[N,3] points; the
# compiler turned the batched matvec into elementwise code with {0,1:T(4,128)} layouts, no padding,
# 1.75 GiB peak. Batched matrix-matrix products keep the small dims minor and padded.)


def _compose_transforms_builder(mesh, n, coords_first):
    """Composes homogeneous 4x4 transforms along a kinematic chain of 3 links for N poses."""
    jax, jnp, NamedSharding, P = _jax()

    if coords_first:
        def compose(t):  # t: [links, 4, 4, N]
            def mm(a, b):
                return (a[:, :, None, :] * b[None, :, :, :]).sum(axis=1)

            out = mm(mm(t[0], t[1]), t[2])
            return out * 0.5

        t = sds((3, 4, 4, n), jnp.float32, mesh, P(None, None, None, "d"))
    else:
        def compose(t):  # t: [N, links, 4, 4]
            out = jnp.einsum("nij,njk->nik", t[:, 0], t[:, 1])
            out = jnp.einsum("nij,njk->nik", out, t[:, 2])
            return out * 0.5

        t = sds((n, 3, 4, 4), jnp.float32, mesh, P("d"))
    return compose, (t,), {}


pair(
    "padding_transforms", "v5e", "v5e:2x2",
    "Composing homogeneous 4x4 transforms (f32[N,3,4,4], 4M poses per device, 768 MiB logical) with "
    "batched einsum('nij,njk->nik'): the [N,4,4] dot outputs are tiled with the 4 padded to 128 "
    "lanes (32x) and exceed HBM.",
    "Fixed variant of padding_transforms_v5e: poses-last layout f32[3,4,4,N] and the products written "
    "elementwise over N; nothing is padded; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["padding"]),
    _compose_transforms_builder, dict(n=4 * (1 << 22), coords_first=False),
    dict(n=4 * (1 << 22), coords_first=True),
)

pair(
    "padding_transforms", "v6e", "v6e:2x2",
    "Composing homogeneous 4x4 transforms (f32[N,3,4,4], 8M poses per device, 1.5 GiB logical) with "
    "batched einsum('nij,njk->nik') on v6e: the [N,4,4] dot outputs are tiled with the 4 padded to "
    "128 lanes (32x) and exceed 31.25G.",
    "Fixed variant of padding_transforms_v6e: poses-last layout f32[3,4,4,N] and the products written "
    "elementwise over N; nothing is padded; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["padding"]),
    _compose_transforms_builder, dict(n=4 * (1 << 23), coords_first=False),
    dict(n=4 * (1 << 23), coords_first=True),
)



# 13.9 HBM capped by a flag -> no cap


pair(
    "hbm_cap", "v6e", "v6e:2x2",
    "A bf16 data-parallel MLP training step that needs a few GiB, compiled on v6e with "
    "LIBTPU_INIT_ARGS=--xla_tpu_max_hbm_size_mib=2048 left over from a debugging session: the cap "
    "is the limit ('Used ... of 2.00G').",
    "Fixed variant of hbm_cap_v6e: the same program without the flag; fits.",
    dict(category="aggregate", causes=["preallocation", "batch_too_large"]),
    _dp_mlp_builder, dict(layers=8, width=8192, batch=4 * 16384, batch_spec=("d",), dtype="bfloat16"),
    dict(layers=8, width=8192, batch=4 * 16384, batch_spec=("d",), dtype="bfloat16"),
    env={"LIBTPU_INIT_ARGS": "--xla_tpu_max_hbm_size_mib=2048"},
)


# 13.10 weights that do not fit this slice -> more chips / a bigger generation


def _fsdp_decoder_builder(mesh, n_layers, d_model, ffn, batch, mats=2):
    """Inference forward of a stack of (Swi)GLU MLP blocks, bf16 weights FSDP-sharded over 'd' on
    d_model, tokens sharded over 'd'; lax.scan over the stacked layers (leading dim = layer count)."""
    jax, jnp, NamedSharding, P = _jax()

    def block(h, layer):
        if mats == 3:
            u = jax.nn.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])
        else:
            u = jax.nn.gelu(h @ layer["w_up"])
        return h + u @ layer["w_down"], None

    def forward(params, x):
        h, _ = jax.lax.scan(block, x, params["layers"])
        return h

    wspec = P(None, "d", None)
    layers = {"w_up": sds((n_layers, d_model, ffn), jnp.bfloat16, mesh, wspec),
              "w_down": sds((n_layers, ffn, d_model), jnp.bfloat16, mesh, P(None, None, "d"))}
    if mats == 3:
        layers["w_gate"] = sds((n_layers, d_model, ffn), jnp.bfloat16, mesh, wspec)
    x = sds((batch, d_model), jnp.bfloat16, mesh, P("d"))
    return forward, ({"layers": layers}, x), {}


pair(
    "weights_too_big", "v5e", "v5e:2x2",
    "Inference forward of 80 MLP blocks (bf16[80,8192,32768] x 2 = 80 GiB of weights), FSDP-sharded "
    "over the 4 chips of a v5e 2x2: 20 GiB of weights per device, the arguments alone exceed HBM.",
    "Fixed variant of weights_too_big_v5e: the same program on a v5e 4x4 slice (16 chips, 5 GiB of "
    "weights per device); fits.",
    dict(category="arguments", causes=["arguments_exceed", "device_too_small"]),
    _fsdp_decoder_builder, dict(n_layers=80, d_model=8192, ffn=32768, batch=64),
    dict(n_layers=80, d_model=8192, ffn=32768, batch=64),
    fixed_topology="v5e:4x4",
)

pair(
    "weights_too_big", "v6e", "v6e:2x2",
    "Inference forward of 96 SwiGLU blocks (3 x bf16[96,8192,32768] = 144 GiB of weights, a 77B-"
    "parameter MLP stack) FSDP-sharded over a v6e 2x2 (4 chips): 36 GiB per device > 31.25G.",
    "Fixed variant of weights_too_big_v6e: the same program on a bigger generation, v5p 2x2x1 "
    "(4 chips, 95.74G each); fits.",
    dict(category="arguments", causes=["arguments_exceed", "device_too_small"]),
    _fsdp_decoder_builder, dict(n_layers=96, d_model=8192, ffn=32768, batch=64, mats=3),
    dict(n_layers=96, d_model=8192, ffn=32768, batch=64, mats=3),
    fixed_topology="v5p:2x2x1", fixed_gen="v5p",
)


# 13.11 no donation of large state -> donate_argnums


pair(
    "no_donation_adam", "v6e", "v6e:2x2",
    "FSDP Adam step (5 x f32[32768,32768] params, mu, nu, all sharded P('d', None): 15 GiB of state "
    "per device) on v6e without donate_argnums: the new params/mu/nu (15 GiB) cannot reuse the old "
    "buffers, old and new state together exceed 31.25G.",
    "Fixed variant of no_donation_adam_v6e: donate_argnums=(0, 1); the outputs alias the inputs; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _adam_mlp_builder, dict(layers=5, width=32768, batch=4 * 512, param_spec=("d", None),
                            state_spec=("d", None), donate=False),
    dict(layers=5, width=32768, batch=4 * 512, param_spec=("d", None), state_spec=("d", None), donate=True),
)


def _kv_cache_builder(mesh, n_layers, batch, max_len, kv_heads, head_dim, donate):
    """One decode step: writes the new token's keys/values into a preallocated KV cache
    (bf16[layers, batch, max_len, kv_heads, head_dim], batch sharded over 'd') and attends over it."""
    jax, jnp, NamedSharding, P = _jax()

    def decode_step(cache, q, k_new, v_new, pos):
        k = jax.lax.dynamic_update_slice_in_dim(cache["k"], k_new[:, :, None], pos, axis=2)
        v = jax.lax.dynamic_update_slice_in_dim(cache["v"], v_new[:, :, None], pos, axis=2)

        def layer(carry, xs):
            ck, cv = xs
            s = jnp.einsum("bhd,bshd->bhs", q, ck).astype(jnp.float32)
            p = jax.nn.softmax(s, axis=-1).astype(cv.dtype)
            return carry + jnp.einsum("bhs,bshd->bhd", p, cv), None

        out, _ = jax.lax.scan(layer, jnp.zeros_like(q), (k, v))
        return out, {"k": k, "v": v}

    spec = P(None, "d")
    shape = (n_layers, batch, max_len, kv_heads, head_dim)
    cache = {"k": sds(shape, jnp.bfloat16, mesh, spec), "v": sds(shape, jnp.bfloat16, mesh, spec)}
    q = sds((batch, kv_heads, head_dim), jnp.bfloat16, mesh, P("d"))
    k_new = sds((n_layers, batch, kv_heads, head_dim), jnp.bfloat16, mesh, spec)
    v_new = sds((n_layers, batch, kv_heads, head_dim), jnp.bfloat16, mesh, spec)
    pos = sds((), jnp.int32, mesh, P())
    kw = {"donate_argnums": (0,)} if donate else {}
    return decode_step, (cache, q, k_new, v_new, pos), kw


pair(
    "no_donation_kv_cache", "v4", "v4:2x2x1",
    "LLM decode step on v4 (8 devices) that writes into a KV cache (k, v: bf16[32,64,8192,8,128], "
    "8 GiB per device together) without donating it: the updated cache is a second copy and "
    "exceeds 15.25G.",
    "Fixed variant of no_donation_kv_cache_v4: donate_argnums=(0,), the cache is updated in place; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _kv_cache_builder, dict(n_layers=32, batch=64, max_len=8192, kv_heads=8, head_dim=128, donate=False),
    dict(n_layers=32, batch=64, max_len=8192, kv_heads=8, head_dim=128, donate=True),
)



# 13.12 shape bugs: a size typo, a broadcast that squares the batch


def _tiny_lm_builder(mesh, vocab, d_model, batch, seq):
    """Tiny LM training step (embedding, one MLP layer, tied unembedding, cross-entropy). The broken
    twin has vocab_size typed as 3_200_000 instead of 32_000."""
    jax, jnp, NamedSharding, P = _jax()

    def loss_fn(params, tokens, targets):
        h = params["embed"][tokens]  # [B, S, D]
        h = jnp.tanh(h @ params["mlp"])
        logits = h @ params["embed"].T  # [B, S, V]
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(logz - picked)

    def train_step(params, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"embed": sds((vocab, d_model), jnp.float32, mesh, P()),
              "mlp": sds((d_model, d_model), jnp.float32, mesh, P())}
    tokens = sds((batch, seq), jnp.int32, mesh, P("d"))
    targets = sds((batch, seq), jnp.int32, mesh, P("d"))
    return train_step, (params, tokens, targets), {"donate_argnums": (0,)}


pair(
    "shape_bug_vocab", "v5e", "v5e:2x2",
    "Tiny LM training step whose config says vocab_size=3_200_000 (a typo for 32_000): the embedding "
    "f32[3200000,1024] (12 GiB) and the logits f32[4,2048,3200000] per device (98 GiB) are 100x "
    "what was meant.",
    "Fixed variant of shape_bug_vocab_v5e: vocab_size=32_000; fits.",
    dict(category="single_large_allocation", category_also=["arguments"],
         causes=["shape_bug", "large_activation", "arguments_exceed"]),
    _tiny_lm_builder, dict(vocab=3_200_000, d_model=1024, batch=16, seq=2048),
    dict(vocab=32_000, d_model=1024, batch=16, seq=2048),
)


def _regression_builder(mesh, batch, width, squeeze):
    """MLP regression with a scalar output; the step returns the residuals for the metrics. The
    broken twin subtracts targets f32[B] from predictions f32[B,1]: numpy broadcasting makes the
    residual f32[B,B]."""
    jax, jnp, NamedSharding, P = _jax()

    def loss_fn(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        pred = h @ params["w2"]  # [B, 1]
        if squeeze:
            pred = pred[:, 0]
        r = pred - y  # broken: [B, 1] - [B] -> [B, B]
        return jnp.mean(jnp.where(jnp.abs(r) < 1.0, 0.5 * r * r, jnp.abs(r) - 0.5)), r  # Huber

    def train_step(params, x, y):
        (loss, residuals), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss, residuals

    params = {"w1": sds((width, width), jnp.float32, mesh, P()),
              "w2": sds((width, 1), jnp.float32, mesh, P())}
    x = sds((batch, width), jnp.float32, mesh, P("d"))
    y = sds((batch,), jnp.float32, mesh, P("d"))
    return train_step, (params, x, y), {"donate_argnums": (0,)}


pair(
    "shape_bug_broadcast", "v6e", "v6e:2x2",
    "Regression training step (returning its residuals for the metrics) where predictions f32[B,1] "
    "minus targets f32[B] broadcast to a f32[B,B] residual (B = 1048576 global): 1 TiB per device "
    "instead of 1 MiB.",
    "Fixed variant of shape_bug_broadcast_v6e: pred[:, 0] - y, residual f32[B]; fits.",
    dict(category="single_large_allocation", causes=["shape_bug", "large_activation", "batch_too_large"]),
    _regression_builder, dict(batch=1048576, width=1024, squeeze=False),
    dict(batch=1048576, width=1024, squeeze=True),
)


# 13.13 batch too large in a plain data-parallel model -> smaller per-device batch / micro-batches


pair(
    "batch_too_large", "v5p", "v5p:2x2x1",
    "bf16 data-parallel MLP training step (8 x bf16[16384,16384]) on v5p with 524288 rows per "
    "device: the activations exceed 95.74G.",
    "Fixed variant of batch_too_large_v5p: 131072 rows per device; fits.",
    dict(category="aggregate", causes=["batch_too_large", "no_remat"]),
    _dp_mlp_builder, dict(layers=8, width=16384, batch=4 * 524288, batch_spec=("d",), dtype="bfloat16"),
    dict(layers=8, width=16384, batch=4 * 131072, batch_spec=("d",), dtype="bfloat16"),
)

pair(
    "batch_too_large", "v6e", "v6e:2x2",
    "f32 data-parallel MLP training step (8 x f32[4096,4096]) on v6e, 327680 rows per device in one "
    "step: the activations exceed 31.25G.",
    "Fixed variant of batch_too_large_v6e: the same global batch as 4 micro-batches of 81920 rows per "
    "device with gradient accumulation (lax.scan); fits.",
    dict(category="aggregate", causes=["batch_too_large", "no_remat"]),
    _dp_mlp_builder, dict(layers=8, width=4096, batch=4 * 327680, batch_spec=("d",)),
    dict(layers=8, width=4096, batch=4 * 327680, batch_spec=("d",), micro=4),
)


# ---- 14. more broken/fixed pairs (batch tpu3): other models, other names ----------------------
#
# Programs of other kinds than section 13 (a mixture-of-experts layer, an embedding table, a conv
# net, a contrastive loss, a transformer stack, gradient accumulation, a replay buffer, a momentum
# optimizer, a gated MLP, recommender tables, an encoder's gathered output, a sampling loop). (Tried and dropped: DP-SGD
# per-example gradients via jax.vmap(jax.grad), f32[1024,4096,4096] per device on v5p: the compiler
# fused the per-example outer products into their norm and sum reductions, 71 MiB of temporaries.)
# About half keep their dumps (dump=True); the others only stderr.log / exception.txt / meta.json.


# 14.1 mixture-of-experts: expert weights replicated instead of sharded over the expert axis


def _moe_builder(mesh, n_experts, d_model, d_ff, tokens, expert_spec):
    """One Switch-style MoE layer (top-1 routing, capacity factor 1.25) in a regression training
    step. Expert weights are stacked [E, ...]; expert_spec () replicates them on every device,
    ('d',) shards the expert axis (expert parallelism)."""
    jax, jnp, NamedSharding, P = _jax()
    cap = int(tokens * 1.25) // n_experts

    def moe_ffn(experts, router, x):
        gate_logits = (x @ router).astype(jnp.float32)  # [T, E]
        probs = jax.nn.softmax(gate_logits, axis=-1)
        choice = jnp.argmax(probs, axis=-1)
        onehot = jax.nn.one_hot(choice, n_experts, dtype=jnp.int32)  # [T, E]
        slot = jnp.cumsum(onehot, axis=0) * onehot - 1
        dispatch = jax.nn.one_hot(slot, cap, dtype=x.dtype)  # [T, E, C]; slot -1 drops the token
        gate = jnp.max(probs, axis=-1).astype(x.dtype)
        xe = jnp.einsum("tec,td->ecd", dispatch, x)
        he = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xe, experts["wi"]))
        ye = jnp.einsum("ecf,efd->ecd", he, experts["wo"])
        return jnp.einsum("tec,ecd->td", dispatch * gate[:, None, None], ye)

    def moe_train_step(params, tokens_in, targets):
        def loss_fn(params):
            out = tokens_in + moe_ffn(params["experts"], params["router"], tokens_in)
            return jnp.mean((out - targets) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-2 * g, params, grads), loss

    espec = _P(*expert_spec)
    params = {"router": sds((d_model, n_experts), jnp.float32, mesh, P()),
              "experts": {"wi": sds((n_experts, d_model, d_ff), jnp.float32, mesh, espec),
                          "wo": sds((n_experts, d_ff, d_model), jnp.float32, mesh, espec)}}
    x = sds((tokens, d_model), jnp.float32, mesh, P("d"))
    y = sds((tokens, d_model), jnp.float32, mesh, P("d"))
    kw = {"donate_argnums": (0,), "out_shardings": (_shardings(params), NamedSharding(mesh, P()))}
    return moe_train_step, (params, x, y), kw


pair(
    "moe_experts_replicated", "v5e", "v5e:2x2",
    "Switch-style mixture-of-experts layer (32 experts, f32 wi/wo [32,4096,16384], 16 GiB) trained "
    "with SGD (donated), the expert weights replicated P() on every device instead of sharded over the "
    "expert axis: the expert weights alone (16 GiB per device) exceed HBM.",
    "Fixed variant of moe_experts_replicated_v5e: expert parallelism, wi/wo sharded P('d', None, None) "
    "(8 experts, 4 GiB per device); fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed"]),
    _moe_builder, dict(n_experts=32, d_model=4096, d_ff=16384, tokens=4 * 1024, expert_spec=()),
    dict(n_experts=32, d_model=4096, d_ff=16384, tokens=4 * 1024, expert_spec=("d", None, None)),
    dump=True,
)


# 14.2 an embedding table kept in f32


def _embedding_builder(mesh, vocab, dim, batch, bag, dtype):
    """Bag-of-ids embedding model (mean of `bag` ids per example, a projection, a scalar score)
    trained with SGD; the table replicated, donated."""
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)

    def ctr_train_step(params, ids, clicks):
        def loss_fn(params):
            e = jnp.mean(params["item_embedding"][ids], axis=1)  # [B, dim]
            h = jnp.tanh(e @ params["proj"])
            score = jnp.sum(h, axis=-1).astype(jnp.float32)
            return jnp.mean((score - clicks) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 0.05 * g, params, grads), loss

    params = {"item_embedding": sds((vocab, dim), dt, mesh, P()),
              "proj": sds((dim, dim), dt, mesh, P())}
    ids = sds((batch, bag), jnp.int32, mesh, P("d"))
    clicks = sds((batch,), jnp.float32, mesh, P("d"))
    return ctr_train_step, (params, ids, clicks), {"donate_argnums": (0,)}


pair(
    "embed_table_f32", "v6e", "v6e:2x2",
    "Click-through model whose item embedding table is f32[4718592,1024] (18 GiB, replicated) on v6e: "
    "the table and its dense gradient (the scatter-add of the lookups) exceed 31.25G.",
    "Fixed variant of embed_table_f32_v6e: the same table in bf16 (9 GiB); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "replicated_tensor"]),
    _embedding_builder, dict(vocab=4718592, dim=1024, batch=4 * 4096, bag=16, dtype="float32"),
    dict(vocab=4718592, dim=1024, batch=4 * 4096, bag=16, dtype="bfloat16"),
    dump=True,
)


# 14.3 a conv net with too many images per device


def _convnet_builder(mesh, batch, size, widths, classes=1000):
    """Small VGG-style classifier on NHWC images (3x3 convs, ReLU, 2x2 average pooling after every
    second conv), softmax cross-entropy, SGD; params replicated, images sharded over 'd'."""
    jax, jnp, NamedSharding, P = _jax()

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def pool(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") * 0.25

    def forward(params, images):
        h = images
        for i in range(len(widths)):
            h = jax.nn.relu(conv(h, params[f"conv{i}"]))
            if i % 2 == 1:
                h = pool(h)
        h = jnp.mean(h, axis=(1, 2))
        return h @ params["head"]

    def train_step(params, images, labels):
        def loss_fn(params):
            logits = forward(params, images).astype(jnp.float32)
            return jnp.mean(jax.nn.logsumexp(logits, -1)
                            - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 0.1 * g, params, grads), loss

    params = {}
    cin = 3
    for i, c in enumerate(widths):
        params[f"conv{i}"] = sds((3, 3, cin, c), jnp.float32, mesh, P())
        cin = c
    params["head"] = sds((cin, classes), jnp.float32, mesh, P())
    n = mesh.devices.size
    images = sds((n * batch, size, size, 3), jnp.float32, mesh, P("d"))
    labels = sds((n * batch,), jnp.int32, mesh, P("d"))
    return train_step, (params, images, labels), {"donate_argnums": (0,)}


pair(
    "convnet_batch", "v4", "v4:2x2x1",
    "VGG-style conv net (f32, 224x224x3 NHWC images, 64-64-128-128-256-256 channels) training step on v4 "
    "with 1024 images per TensorCore: the feature maps kept for the backward pass (the first ones "
    "f32[1024,224,224,64], 12.25 GiB each) exceed 15.25G.",
    "Fixed variant of convnet_batch_v4: 512 images per TensorCore; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["batch_too_large", "no_remat", "f32_precision"]),
    _convnet_builder, dict(batch=1024, size=224, widths=(64, 64, 128, 128, 256, 256)),
    dict(batch=512, size=224, widths=(64, 64, 128, 128, 256, 256)),
    dump=False,
)


# 14.4 a contrastive (CLIP-style) loss over the global batch


def _contrastive_builder(mesh, batch, feat, embed, block=None):
    """Two-tower contrastive step: image and text features projected and normalised, every local
    image scored against every text of the global batch (logits [B_local, B_global] f32).
    block: the loss over blocks of `block` image rows (lax.map + jax.checkpoint)."""
    jax, jnp, NamedSharding, P = _jax()

    def normalize(z):
        return z * jax.lax.rsqrt(jnp.sum(z * z, axis=-1, keepdims=True) + 1e-6)

    def clip_step(params, img, txt):
        def loss_fn(params):
            zi = normalize(img @ params["img_proj"]).astype(jnp.float32)
            zt = normalize(txt @ params["txt_proj"]).astype(jnp.float32)
            zt_all = jax.lax.with_sharding_constraint(zt, NamedSharding(mesh, P()))
            pos = jnp.sum(zi * zt, axis=-1) * 20.0

            def lse(rows):
                return jax.nn.logsumexp(rows @ zt_all.T * 20.0, axis=-1)

            if block is None:
                logz = lse(zi)
            else:
                zb = zi.reshape(-1, block, zi.shape[-1])
                zb = jax.lax.with_sharding_constraint(zb, NamedSharding(mesh, P("d")))
                logz = jax.lax.map(jax.checkpoint(lse), zb).reshape(-1)
            return jnp.mean(logz - pos)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"img_proj": sds((feat, embed), jnp.bfloat16, mesh, P()),
              "txt_proj": sds((feat, embed), jnp.bfloat16, mesh, P())}
    img = sds((batch, feat), jnp.bfloat16, mesh, P("d"))
    txt = sds((batch, feat), jnp.bfloat16, mesh, P("d"))
    return clip_step, (params, img, txt), {"donate_argnums": (0,)}


pair(
    "contrastive_logits", "v5e", "v5e:2x2",
    "CLIP-style contrastive step, global batch 131072 (32768 pairs per device): every local image is "
    "scored against all 131072 texts, the similarity logits f32[32768,131072] (16 GiB per device) "
    "exceed HBM.",
    "Fixed variant of contrastive_logits_v5e: the loss over blocks of 2048 image rows (lax.map + "
    "jax.checkpoint), one f32[2048,131072] block at a time; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _contrastive_builder, dict(batch=131072, feat=1024, embed=512),
    dict(batch=131072, feat=1024, embed=512, block=2048),
    dump=False,
)


# 14.5 a transformer stack under lax.scan without remat


def _transformer_builder(mesh, n_layers, d_model, heads, seq, batch, remat):
    """Pre-LN decoder-only transformer blocks (causal attention + 4x GELU MLP, bf16) scanned over
    stacked layer params, next-token loss on a small vocabulary; params replicated, batch over 'd'."""
    jax, jnp, NamedSharding, P = _jax()
    hd = d_model // heads

    def ln(x):
        x32 = x.astype(jnp.float32)
        mu = jnp.mean(x32, -1, keepdims=True)
        var = jnp.var(x32, -1, keepdims=True)
        return ((x32 - mu) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype)

    def block(x, lp):
        b, s, _ = x.shape
        h = ln(x)
        q, k, v = jnp.split(h @ lp["wqkv"], 3, axis=-1)
        q, k, v = (t.reshape(b, s, heads, hd) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * hd ** -0.5
        mask = jnp.tril(jnp.ones((s, s), bool))
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1).astype(x.dtype)
        att = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d_model)
        x = x + att @ lp["wo"]
        x = x + jax.nn.gelu(ln(x) @ lp["w_up"]) @ lp["w_down"]
        return x, None

    if remat:
        block = jax.checkpoint(block)

    def lm_train_step(params, tokens):
        def loss_fn(params):
            x = params["embed"][tokens[:, :-1]]
            x, _ = jax.lax.scan(block, x, params["blocks"])
            logits = (ln(x) @ params["embed"].T).astype(jnp.float32)
            tgt = tokens[:, 1:]
            return jnp.mean(jax.nn.logsumexp(logits, -1)
                            - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-4 * g.astype(p.dtype), params, grads), loss

    L, D = n_layers, d_model
    bf = jnp.bfloat16
    params = {"embed": sds((8192, D), bf, mesh, P()),
              "blocks": {"wqkv": sds((L, D, 3 * D), bf, mesh, P()),
                         "wo": sds((L, D, D), bf, mesh, P()),
                         "w_up": sds((L, D, 4 * D), bf, mesh, P()),
                         "w_down": sds((L, 4 * D, D), bf, mesh, P())}}
    tokens = sds((mesh.devices.size * batch, seq + 1), jnp.int32, mesh, P("d"))
    return lm_train_step, (params, tokens), {"donate_argnums": (0,)}


pair(
    "transformer_scan", "v5p", "v5p:2x2x1",
    "Decoder-only transformer (24 layers, d_model 4096, 32 heads, bf16) scanned over stacked layer "
    "params without jax.checkpoint on v5p, 8 sequences of 2048 tokens per device: every layer's "
    "attention scores (stacked f32[24,8,32,2048,2048], 96 GiB) and MLP activations are saved for the "
    "backward pass and exceed 95.74G.",
    "Fixed variant of transformer_scan_v5p: jax.checkpoint on the scanned block; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["no_remat", "large_activation", "batch_too_large"]),
    _transformer_builder, dict(n_layers=24, d_model=4096, heads=32, seq=2048, batch=8, remat=False),
    dict(n_layers=24, d_model=4096, heads=32, seq=2048, batch=8, remat=True),
    dump=False,
)


# 14.6 a gradient accumulator kept in f32 for bf16 params


def _grad_accum_builder(mesh, layers, width, rows, acc_dtype):
    """One micro-batch of gradient accumulation for a bf16 MLP (params replicated): the accumulated
    gradients are persistent train state (an argument, donated), kept in acc_dtype, applied to the
    params every few steps by another function."""
    jax, jnp, NamedSharding, P = _jax()
    adt = jnp.dtype(acc_dtype)

    def loss_fn(params, x):
        h = x
        for i in range(layers):
            h = jax.nn.relu(h @ params[f"fc{i}"])
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def accumulate_step(params, grad_acc, micro_batch):
        loss, g = jax.value_and_grad(loss_fn)(params, micro_batch)
        return _tm(lambda a, gi: a + gi.astype(a.dtype), grad_acc, g), loss

    params = {f"fc{i}": sds((width, width), jnp.bfloat16, mesh, P()) for i in range(layers)}
    grad_acc = {f"fc{i}": sds((width, width), adt, mesh, P()) for i in range(layers)}
    mb = sds((mesh.devices.size * rows, width), jnp.bfloat16, mesh, P("d"))
    return accumulate_step, (params, grad_acc, mb), {"donate_argnums": (1,)}


pair(
    "grad_accum_f32", "v6e", "v6e:2x2",
    "bf16 MLP (6 x bf16[32768,32768] = 12 GiB, replicated) trained with gradient accumulation whose "
    "accumulator, carried between steps as train state, is f32 (24 GiB per device): params and "
    "accumulator alone (36 GiB) exceed 31.25G.",
    "Fixed variant of grad_accum_f32_v6e: the accumulator in bf16, like the params (12 GiB); fits.",
    dict(category="arguments", causes=["f32_precision", "replicated_tensor", "arguments_exceed"]),
    _grad_accum_builder, dict(layers=6, width=32768, rows=1024, acc_dtype="float32"),
    dict(layers=6, width=32768, rows=1024, acc_dtype="bfloat16"),
    dump=True,
)


# 14.7 a replay buffer updated without donation


def _replay_builder(mesh, capacity, obs_dim, n_new, donate):
    """RL replay buffer kept on the device (obs / next_obs f32[capacity, obs_dim], features sharded
    over 'd'): insert a batch of transitions at `pos` and sample a minibatch."""
    jax, jnp, NamedSharding, P = _jax()

    def insert_and_sample(buffer, new, pos, idx):
        buffer = {k: jax.lax.dynamic_update_slice_in_dim(buffer[k], new[k], pos, axis=0) for k in buffer}
        sample = {k: buffer[k][idx] for k in buffer}
        return buffer, sample

    fspec = P(None, "d")
    buffer = {"obs": sds((capacity, obs_dim), jnp.float32, mesh, fspec),
              "next_obs": sds((capacity, obs_dim), jnp.float32, mesh, fspec),
              "reward": sds((capacity, 4), jnp.float32, mesh, P()),
              "action": sds((capacity, 4), jnp.int32, mesh, P())}
    new = {"obs": sds((n_new, obs_dim), jnp.float32, mesh, fspec),
           "next_obs": sds((n_new, obs_dim), jnp.float32, mesh, fspec),
           "reward": sds((n_new, 4), jnp.float32, mesh, P()),
           "action": sds((n_new, 4), jnp.int32, mesh, P())}
    pos = sds((), jnp.int32, mesh, P())
    idx = sds((256,), jnp.int32, mesh, P())
    kw = {"donate_argnums": (0,)} if donate else {}
    return insert_and_sample, (buffer, new, pos, idx), kw


pair(
    "replay_buffer", "v5p", "v5p:2x2x1",
    "On-device RL replay buffer on v5p (obs and next_obs f32[2097152,13312], 26 GiB each per device) "
    "updated with dynamic_update_slice without donate_argnums: the updated buffer is a second copy "
    "and old and new together exceed 95.74G.",
    "Fixed variant of replay_buffer_v5p: donate_argnums=(0,), the buffer is updated in place; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _replay_builder, dict(capacity=2097152, obs_dim=13312, n_new=1024, donate=False),
    dict(capacity=2097152, obs_dim=13312, n_new=1024, donate=True),
    dump=True,
)


# 14.8 momentum SGD whose momentum buffers are replicated under data parallelism


def _momentum_builder(mesh, widths, batch, trace_spec):
    """Data-parallel autoencoder (encoder/decoder dense layers, f32, params replicated) trained with
    SGD + Nesterov momentum (optax.sgd(momentum=0.9, nesterov=True) written out: opt_state
    {"trace"}); trace_spec () replicates the momentum, ('d', None) shards it (ZeRO-1)."""
    jax, jnp, NamedSharding, P = _jax()

    def forward(params, x):
        h = x
        for name in sorted(params):
            h = jax.nn.silu(h @ params[name])
        return h

    def sgd_momentum_step(params, opt_state, x):
        def loss_fn(params):
            return jnp.mean((forward(params, x) - x) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        trace = _tm(lambda t, g: 0.9 * t + g, opt_state["trace"], grads)
        upd = _tm(lambda t, g: 0.9 * t + g, trace, grads)
        params = _tm(lambda p, u: p - 0.01 * u, params, upd)
        return params, {"trace": trace}, loss

    names = [f"enc{i}" for i in range(len(widths) // 2)] + [f"dec{i}" for i in range(len(widths) - len(widths) // 2)]
    params = {n: sds((w, w), jnp.float32, mesh, P()) for n, w in zip(names, widths)}
    tspec = _P(*trace_spec)
    opt_state = {"trace": {n: sds((w, w), jnp.float32, mesh, tspec) for n, w in zip(names, widths)}}
    x = sds((batch, widths[0]), jnp.float32, mesh, P("d"))
    kw = {"donate_argnums": (0, 1),
          "out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P()))}
    return sgd_momentum_step, (params, opt_state, x), kw


pair(
    "momentum_replicated", "v4", "v4:2x2x1",
    "Data-parallel autoencoder (4 x f32[21504,21504] = 6.89 GiB of params) trained with Nesterov "
    "momentum SGD on v4 (8 devices), params and momentum trace replicated P(): 13.78 GiB of "
    "arguments per device plus the update's temporaries exceed 15.25G.",
    "Fixed variant of momentum_replicated_v4: ZeRO-1, the momentum trace sharded P('d', None) over the "
    "8 devices (0.86 GiB per device); fits.",
    dict(category="aggregate", category_also=["arguments"],
         causes=["optimizer_state_unsharded", "replicated_tensor", "arguments_exceed"]),
    _momentum_builder, dict(widths=(21504,) * 4, batch=8 * 256, trace_spec=()),
    dict(widths=(21504,) * 4, batch=8 * 256, trace_spec=("d", None)),
    dump=False,
)


# 14.9 a gated MLP whose gate multiplies as an outer product over the batch


def _gated_mlp_builder(mesh, batch, d_model, d_ff, outer):
    """GLU-style MLP regression step. The broken twin writes the gate as h[:, None, :] * g[None, :, :]
    (an outer product over the batch, [B, B, F]) where h * g was meant."""
    jax, jnp, NamedSharding, P = _jax()

    def glu_train_step(params, x, y):
        def loss_fn(params):
            h = x @ params["w_value"]
            g = jax.nn.sigmoid(x @ params["w_gate"])
            u = h[:, None, :] * g[None, :, :] if outer else h * g
            out = u @ params["w_out"]
            if outer:
                out = jnp.mean(out, axis=1)
            return jnp.mean((out - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"w_value": sds((d_model, d_ff), jnp.float32, mesh, P()),
              "w_gate": sds((d_model, d_ff), jnp.float32, mesh, P()),
              "w_out": sds((d_ff, d_model), jnp.float32, mesh, P())}
    x = sds((batch, d_model), jnp.float32, mesh, P("d"))
    y = sds((batch, d_model), jnp.float32, mesh, P("d"))
    return glu_train_step, (params, x, y), {"donate_argnums": (0,)}


pair(
    "gated_outer", "v6e", "v6e:2x2",
    "GLU MLP regression step on v6e where the gate is applied as h[:, None, :] * g[None, :, :] "
    "instead of h * g: an outer product over the batch, f32[4096,16384,4096] per device (1 TiB).",
    "Fixed variant of gated_outer_v6e: h * g, [B, F]; fits.",
    dict(category="single_large_allocation", causes=["shape_bug", "large_activation", "batch_too_large"]),
    _gated_mlp_builder, dict(batch=4 * 4096, d_model=1024, d_ff=4096, outer=True),
    dict(batch=4 * 4096, d_model=1024, d_ff=4096, outer=False),
    dump=False,
)


# 14.10 recommender tables that do not fit the slice -> a bigger generation


def _recsys_builder(mesh, tables, rows, dim, batch):
    """Inference of a DLRM-like recommender: `tables` bf16 embedding tables [rows, dim] row-sharded
    over 'd', one id per table per example, concatenated into a 2-layer MLP."""
    jax, jnp, NamedSharding, P = _jax()

    def score(params, ids):
        embs = [params["tables"][f"t{i}"][ids[:, i]] for i in range(tables)]
        h = jnp.concatenate(embs, axis=-1)
        h = jax.nn.relu(h @ params["top"]["w1"])
        return (h @ params["top"]["w2"])[:, 0]

    params = {"tables": {f"t{i}": sds((rows, dim), jnp.bfloat16, mesh, P("d", None)) for i in range(tables)},
              "top": {"w1": sds((tables * dim, 1024), jnp.bfloat16, mesh, P()),
                      "w2": sds((1024, 1), jnp.bfloat16, mesh, P())}}
    ids = sds((batch, tables), jnp.int32, mesh, P("d"))
    return score, (params, ids), {}


pair(
    "recsys_tables", "v4", "v4:2x2x1",
    "DLRM-style recommender inference with 20 bf16 embedding tables [16777216,256] (160 GiB), row-sharded "
    "over the 8 TensorCores of a v4 2x2x1: 20 GiB of tables per device, the arguments alone exceed 15.25G.",
    "Fixed variant of recsys_tables_v4: the same program on a bigger generation, v5p 2x2x1 (4 chips, "
    "40 GiB of tables each of 95.74G); fits.",
    dict(category="arguments", causes=["arguments_exceed", "device_too_small"]),
    _recsys_builder, dict(tables=20, rows=16777216, dim=256, batch=8 * 512),
    dict(tables=20, rows=16777216, dim=256, batch=8 * 512),
    fixed_topology="v5p:2x2x1", fixed_gen="v5p", dump=False,
)


# 14.11 an encoder whose output is gathered onto every device


def _encoder_output_builder(mesh, n, d_in, d_hidden, d_out, out_spec):
    """Batch inference of a 2-layer encoder; the embeddings are returned with out_shardings
    `out_spec`: () gathers the whole [N, d_out] result onto every device."""
    jax, jnp, NamedSharding, P = _jax()

    def encode(params, x):
        h = jax.nn.gelu(x @ params["w1"])
        return h @ params["w2"]

    params = {"w1": sds((d_in, d_hidden), jnp.float32, mesh, P()),
              "w2": sds((d_hidden, d_out), jnp.float32, mesh, P())}
    x = sds((n, d_in), jnp.float32, mesh, P("d"))
    return encode, (params, x), {"out_shardings": NamedSharding(mesh, _P(*out_spec))}


pair(
    "encoder_output_gathered", "v5e", "v5e:2x2",
    "Batch inference of an encoder over 262144 inputs whose f32[262144,16384] embeddings (16 GiB) are "
    "returned with out_shardings=P(): the whole result is gathered onto every device.",
    "Fixed variant of encoder_output_gathered_v5e: out_shardings=P('d'), each device keeps its 4 GiB "
    "shard; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor"]),
    _encoder_output_builder, dict(n=262144, d_in=1024, d_hidden=4096, d_out=16384, out_spec=()),
    dict(n=262144, d_in=1024, d_hidden=4096, d_out=16384, out_spec=("d",)),
    dump=True,
)


# 14.12 a generation loop that keeps every step's logits


def _sampling_builder(mesh, batch, steps, d_model, vocab, keep_logits):
    """Greedy autoregressive sampling with lax.scan over `steps` tokens of a toy recurrent LM (bf16
    weights replicated, sequences over 'd'). keep_logits: the loop also stacks every step's f32
    logits [steps, B, V] (as `output_scores=True` does) instead of only the sampled token ids."""
    jax, jnp, NamedSharding, P = _jax()

    def sample(params, h0):
        def step(h, _):
            logits = (h @ params["unembed"]).astype(jnp.float32)  # [B, V]
            tok = jnp.argmax(logits, axis=-1)
            h = jnp.tanh(params["embed"][tok] + h @ params["w_rec"])
            return h, (tok, logits) if keep_logits else tok

        _, out = jax.lax.scan(step, h0, None, length=steps)
        return out

    params = {"embed": sds((vocab, d_model), jnp.bfloat16, mesh, P()),
              "unembed": sds((d_model, vocab), jnp.bfloat16, mesh, P()),
              "w_rec": sds((d_model, d_model), jnp.bfloat16, mesh, P())}
    h0 = sds((batch, d_model), jnp.bfloat16, mesh, P("d"))
    return sample, (params, h0), {}


pair(
    "sampling_scores", "v5p", "v5p:2x2x1",
    "Greedy sampling of 4096 tokens for 64 sequences per device on v5p with a 128000-token vocabulary, "
    "the loop keeping every step's f32 logits (stacked f32[4096,256,128000], 125 GiB per device) as "
    "well as the token ids: the score history exceeds 95.74G.",
    "Fixed variant of sampling_scores_v5p: the loop keeps only the sampled token ids; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _sampling_builder, dict(batch=4 * 64, steps=4096, d_model=2048, vocab=128000, keep_logits=True),
    dict(batch=4 * 64, steps=4096, d_model=2048, vocab=128000, keep_logits=False),
    dump=True,
)



# ---- 15. more broken/fixed pairs (batch tpu4): other models, other names ----------------------
#
# Programs of kinds sections 13 and 14 do not have (a dense-message GNN, an LSTM through time, a
# 3D-conv video net, a decoder's KV cache, a micro-batch loop differentiated as one sum, layer-axis
# FSDP, a retrieval top-k, a full Hessian, an encoder-decoder with cross attention, a top-p sampler,
# a dataset kept on the device). The same conventions: the fixed twin changes exactly the first
# cause. Five keep their dumps (dump=True); the others only stderr.log / exception.txt / meta.json.
# (Tried and dropped: a diffusion U-Net without remat, 128 images of 256x256 per v6e device: it
# compiled (peak 24.82 GiB, the compiler's own rematerialization) after 8 minutes; a GShard MoE
# with dense dispatch/combine tensors [1,65536,64,1280] per device and an embedding lookup written
# as one_hot(ids, 131072) @ table: the compiler fused the one-hot operands into their einsums and
# never materialized them, peaks 3.44 GiB and 0.72 GiB.)


# 15.1 a GNN that computes its messages for every node pair


def _gnn_builder(mesh, graphs, nodes, dim, hidden, degree, dense):
    """Interaction-network layer (a 2-layer message MLP on [x_receiver, x_sender], sum aggregation,
    a node update) trained on a node regression target, f32; graphs batched [G, N, dim] and sharded
    over 'd', edges given as sender/receiver index lists [G, E]. dense: the messages are computed for
    every node pair ([N, N, hidden] per graph) and masked with the adjacency built from the edge
    lists; otherwise only along the E edges (gather + segment_sum)."""
    jax, jnp, NamedSharding, P = _jax()

    def layer(params, x, senders, receivers):
        a = x @ params["w_recv"]
        b = x @ params["w_send"]
        if dense:
            adj = jnp.zeros((nodes, nodes), x.dtype).at[receivers, senders].add(1.0)
            h = jax.nn.relu(a[:, None, :] + b[None, :, :] + params["b_msg"])  # [N, N, H]
            m = jax.nn.silu(h @ params["w_msg"])  # [N, N, dim]
            agg = jnp.einsum("ij,ijd->id", adj, m)
        else:
            h = jax.nn.relu(a[receivers] + b[senders] + params["b_msg"])  # [E, H]
            m = jax.nn.silu(h @ params["w_msg"])
            agg = jax.ops.segment_sum(m, receivers, num_segments=nodes)
        return x + jax.nn.relu(jnp.concatenate([x, agg], -1) @ params["w_node"])

    def gnn_train_step(params, x, senders, receivers, y):
        def loss_fn(params):
            out = jax.vmap(lambda xg, s, r: layer(params, xg, s, r))(x, senders, receivers)
            return jnp.mean((out - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    f32 = jnp.float32
    params = {"w_recv": sds((dim, hidden), f32, mesh, P()), "w_send": sds((dim, hidden), f32, mesh, P()),
              "b_msg": sds((hidden,), f32, mesh, P()), "w_msg": sds((hidden, dim), f32, mesh, P()),
              "w_node": sds((2 * dim, dim), f32, mesh, P())}
    g = mesh.devices.size * graphs
    x = sds((g, nodes, dim), f32, mesh, P("d"))
    senders = sds((g, nodes * degree), jnp.int32, mesh, P("d"))
    receivers = sds((g, nodes * degree), jnp.int32, mesh, P("d"))
    y = sds((g, nodes, dim), f32, mesh, P("d"))
    return gnn_train_step, (params, x, senders, receivers, y), {"donate_argnums": (0,)}


pair(
    "gnn_dense_messages", "v5e", "v5e:2x2",
    "Interaction-network GNN layer (f32, 2 graphs of 4096 nodes per device, 16 edges per node) whose "
    "message MLP is evaluated for every node pair and masked with the adjacency: the messages "
    "f32[2,4096,4096,128] (16 GiB per device) exceed HBM.",
    "Fixed variant of gnn_dense_messages_v5e: the messages computed only along the 65536 edges of each "
    "graph (gather + jax.ops.segment_sum); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _gnn_builder, dict(graphs=2, nodes=4096, dim=128, hidden=128, degree=16, dense=True),
    dict(graphs=2, nodes=4096, dim=128, hidden=128, degree=16, dense=False),
    dump=True,
)


# 15.2 an LSTM scanned over a long sequence without remat


def _lstm_builder(mesh, batch, seq, d_in, hidden, remat):
    """LSTM sequence regression: bf16 inputs [B, T, d_in] and weights, an LSTM cell with f32 state
    scanned over time with lax.scan, a linear head on every step's hidden state; SGD, weights
    replicated and donated, sequences sharded over 'd'. remat: the cell under jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def lstm_train_step(params, x, y):
        def loss_fn(params):
            def cell(carry, x_t):
                h, c = carry
                z = (x_t @ params["wx"] + h.astype(bf) @ params["wh"]).astype(f32) + params["b"]
                i, f, g, o = jnp.split(z, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h.astype(bf)

            step = jax.checkpoint(cell) if remat else cell
            b = x.shape[0]
            zero = jnp.zeros((b, hidden), f32)
            _, hs = jax.lax.scan(step, (zero, zero), x.swapaxes(0, 1))  # [T, B, H]
            pred = (hs @ params["w_out"]).astype(f32)
            return jnp.mean((pred - y.swapaxes(0, 1)) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g.astype(p.dtype), params, grads), loss

    params = {"wx": sds((d_in, 4 * hidden), bf, mesh, P()), "wh": sds((hidden, 4 * hidden), bf, mesh, P()),
              "b": sds((4 * hidden,), f32, mesh, P()), "w_out": sds((hidden, d_in), bf, mesh, P())}
    n = mesh.devices.size * batch
    x = sds((n, seq, d_in), bf, mesh, P("d"))
    y = sds((n, seq, d_in), f32, mesh, P("d"))
    return lstm_train_step, (params, x, y), {"donate_argnums": (0,)}


pair(
    "lstm_no_remat", "v5e", "v5e:2x2",
    "LSTM (hidden 1024, f32 cell state) scanned with lax.scan over 2048 time steps, 256 sequences per "
    "device, trained without jax.checkpoint: every step's gate activations are stacked for the backward "
    "pass (f32[2048,256,1024], 2 GiB each, a dozen of them) and exceed HBM.",
    "Fixed variant of lstm_no_remat_v5e: the LSTM cell under jax.checkpoint (only the carries are "
    "stacked); fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large", "f32_precision"]),
    _lstm_builder, dict(batch=256, seq=2048, d_in=512, hidden=1024, remat=False),
    dict(batch=256, seq=2048, d_in=512, hidden=1024, remat=True),
    dump=False,
)


# 15.3 a 3D-conv video classifier in f32


def _video_builder(mesh, batch, frames, size, widths, dtype, classes=400):
    """C3D-style video classifier on NDHWC clips: 3x3x3 convs, ReLU, 2x2x2 average pooling after
    every second conv, global pooling, a linear head, softmax cross-entropy, SGD; params
    replicated and donated, clips sharded over 'd'. dtype: params and clips."""
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1, 1), "SAME",
                                            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))

    def pool(x):
        b, d, hh, ww, c = x.shape
        return x.reshape(b, d // 2, 2, hh // 2, 2, ww // 2, 2, c).mean(axis=(2, 4, 6))

    def video_train_step(params, clips, labels):
        def loss_fn(params):
            h = clips
            for i in range(len(widths)):
                h = jax.nn.relu(conv(h, params[f"conv{i}"]))
                if i % 2 == 1:
                    h = pool(h)
            logits = (jnp.mean(h, axis=(1, 2, 3)) @ params["head"]).astype(jnp.float32)
            return jnp.mean(jax.nn.logsumexp(logits, -1)
                            - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 0.05 * g, params, grads), loss

    params = {}
    cin = 3
    for i, c in enumerate(widths):
        params[f"conv{i}"] = sds((3, 3, 3, cin, c), dt, mesh, P())
        cin = c
    params["head"] = sds((cin, classes), dt, mesh, P())
    n = mesh.devices.size * batch
    clips = sds((n, frames, size, size, 3), dt, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    return video_train_step, (params, clips, labels), {"donate_argnums": (0,)}


pair(
    "video_conv3d_f32", "v4", "v4:2x2x1",
    "C3D-style video classifier (3x3x3 convs, 64-64-128-128-256-256 channels) trained in f32 on v4, "
    "80 clips of 16x112x112 frames per TensorCore: the f32 feature maps (f32[80,16,112,112,64], 6.12 GiB "
    "slots) kept for the backward pass exceed 15.25G.",
    "Fixed variant of video_conv3d_f32_v4: params and clips in bf16; fits.",
    dict(category="aggregate", causes=["f32_precision", "batch_too_large", "no_remat"]),
    _video_builder, dict(batch=80, frames=16, size=112, widths=(64, 64, 128, 128, 256, 256), dtype="float32"),
    dict(batch=80, frames=16, size=112, widths=(64, 64, 128, 128, 256, 256), dtype="bfloat16"),
    dump=False,
)


# 15.4 a decoder's KV cache kept in f32


def _decode_builder(mesh, n_layers, batch, max_len, d_model, heads, kv_heads, d_ff, cache_dtype,
                    vocab=32000):
    """One decode step of a GQA decoder-only LM (bf16 weights replicated; RMSNorm, SwiGLU MLP) with a
    per-layer KV cache k/v [B, max_len, kv_heads, head_dim] in cache_dtype, batch sharded over 'd',
    donated and updated in place at `pos`."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    cdt = jnp.dtype(cache_dtype)
    hd = d_model // heads
    rep = heads // kv_heads

    def rms(x):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf)

    def decode_step(params, cache, tok, pos):
        b = tok.shape[0]
        x = params["embed"][tok]  # [B, D]
        new = {"k": [], "v": []}
        valid = jnp.arange(max_len) <= pos
        for l in range(n_layers):
            lp = params["layers"][l]
            h = rms(x)
            q = (h @ lp["wq"]).reshape(b, kv_heads, rep, hd)
            k = (h @ lp["wk"]).reshape(b, 1, kv_heads, hd).astype(cdt)
            v = (h @ lp["wv"]).reshape(b, 1, kv_heads, hd).astype(cdt)
            kc = jax.lax.dynamic_update_slice_in_dim(cache["k"][l], k, pos, axis=1)
            vc = jax.lax.dynamic_update_slice_in_dim(cache["v"][l], v, pos, axis=1)
            new["k"].append(kc)
            new["v"].append(vc)
            s = jnp.einsum("bgrd,bsgd->bgrs", q.astype(cdt), kc).astype(f32) * hd ** -0.5
            p = jax.nn.softmax(jnp.where(valid, s, -1e30), axis=-1)
            o = jnp.einsum("bgrs,bsgd->bgrd", p.astype(cdt), vc).astype(bf).reshape(b, d_model)
            x = x + o @ lp["wo"]
            h = rms(x)
            x = x + (jax.nn.silu(h @ lp["w_gate"]) * (h @ lp["w_up"])) @ lp["w_down"]
        logits = (rms(x) @ params["embed"].T).astype(f32)
        return logits, new

    def w(*shape):
        return sds(shape, bf, mesh, P())

    params = {"embed": w(vocab, d_model),
              "layers": [{"wq": w(d_model, d_model), "wk": w(d_model, kv_heads * hd),
                          "wv": w(d_model, kv_heads * hd), "wo": w(d_model, d_model),
                          "w_gate": w(d_model, d_ff), "w_up": w(d_model, d_ff), "w_down": w(d_ff, d_model)}
                         for _ in range(n_layers)]}
    n = mesh.devices.size * batch
    cspec = P("d")
    cache = {kv: [sds((n, max_len, kv_heads, hd), cdt, mesh, cspec) for _ in range(n_layers)]
             for kv in ("k", "v")}
    tok = sds((n,), jnp.int32, mesh, P("d"))
    pos = sds((), jnp.int32, mesh, P())
    kw = {"donate_argnums": (1,),
          "out_shardings": (NamedSharding(mesh, P("d")), _shardings(cache))}
    return decode_step, (params, cache, tok, pos), kw


pair(
    "kv_cache_f32", "v6e", "v6e:2x2",
    "One decode step of a 32-layer GQA decoder (bf16 weights, 3.9 GiB) on v6e whose KV cache "
    "(16 sequences x 8192 positions x 8 kv heads x 128 per device and layer) is kept in f32: the cache "
    "alone is 32 GiB per device and the arguments (35.87G) exceed 31.25G.",
    "Fixed variant of kv_cache_f32_v6e: the KV cache in bf16 (16 GiB per device); fits.",
    dict(category="arguments", causes=["f32_precision", "arguments_exceed"]),
    _decode_builder, dict(n_layers=32, batch=16, max_len=8192, d_model=2048, heads=16, kv_heads=8, d_ff=8192,
                          cache_dtype="float32"),
    dict(n_layers=32, batch=16, max_len=8192, d_model=2048, heads=16, kv_heads=8, d_ff=8192,
         cache_dtype="bfloat16"),
    dump=False,
)


# 15.5 gradient accumulation written as one gradient of a Python loop's summed loss


def _microbatch_builder(mesh, layers, width, batch, micro, grad_per_micro):
    """Data-parallel bf16 MLP whose step splits the batch into `micro` micro-batches. The broken
    twin sums the micro-batch losses in a Python loop and takes one gradient of the sum (every
    micro-batch's activations live until the backward pass); grad_per_micro: the gradient of
    each micro-batch inside lax.scan, accumulated (the usual gradient accumulation)."""
    jax, jnp, NamedSharding, P = _jax()
    bf = jnp.bfloat16

    def loss_fn(params, x):
        h = x
        for i in range(layers):
            h = jax.nn.gelu(h @ params[f"dense_{i}"])
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def train_step(params, x):
        xs = x.reshape(micro, x.shape[0] // micro, width)
        xs = jax.lax.with_sharding_constraint(xs, NamedSharding(mesh, P(None, "d")))
        if grad_per_micro:
            def acc(carry, xm):
                l, g = jax.value_and_grad(loss_fn)(params, xm)
                return _tm(lambda a, b: a + b.astype(a.dtype), carry, (l, g)), None

            zero = (jnp.zeros((), jnp.float32), _tm(lambda p: jnp.zeros(p.shape, jnp.float32), params))
            (loss, grads), _ = jax.lax.scan(acc, zero, xs)
        else:
            def total(params):
                return sum(loss_fn(params, xs[i]) for i in range(micro))

            loss, grads = jax.value_and_grad(total)(params)
        return _tm(lambda p, g: p - (0.01 / micro) * g.astype(p.dtype), params, grads), loss / micro

    params = {f"dense_{i}": sds((width, width), bf, mesh, P()) for i in range(layers)}
    x = sds((batch, width), bf, mesh, P("d"))
    return train_step, (params, x), {"donate_argnums": (0,)}


pair(
    "microbatch_loss_sum", "v4", "v4:2x2x1",
    "bf16 MLP (8 x bf16[8192,8192]) on v4, 196608 rows per TensorCore split into 16 micro-batches, but "
    "the micro-batch losses are summed in a Python loop and differentiated once: all 16 micro-batches' "
    "activations are live together and exceed 15.25G.",
    "Fixed variant of microbatch_loss_sum_v4: the gradient of each micro-batch taken inside lax.scan and "
    "accumulated (f32), one micro-batch's activations live at a time; fits.",
    dict(category="aggregate", causes=["batch_too_large", "no_remat"]),
    _microbatch_builder, dict(layers=8, width=8192, batch=8 * 196608, micro=16, grad_per_micro=False),
    dict(layers=8, width=8192, batch=8 * 196608, micro=16, grad_per_micro=True),
    dump=False,
)


# 15.6 FSDP over stacked layer params sharded along the layer axis


def _fsdp_scan_builder(mesh, n_layers, width, ffn, batch, param_spec):
    """FSDP training step of a residual MLP stack scanned over stacked params (bf16 [L, D, F] and
    [L, F, D], checkpointed block), params sharded with `param_spec` and donated, batch over 'd'.
    ('d', None, None) shards the layer axis the scan slices; (None, 'd', None) shards within a layer."""
    jax, jnp, NamedSharding, P = _jax()
    bf = jnp.bfloat16

    @jax.checkpoint
    def block(h, layer):
        return h + jax.nn.gelu(h @ layer["w_in"]) @ layer["w_out"], None

    def fsdp_train_step(params, x):
        def loss_fn(params):
            h, _ = jax.lax.scan(block, x, params["layers"])
            return jnp.mean(h.astype(jnp.float32) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    spec = _P(*param_spec)
    params = {"layers": {"w_in": sds((n_layers, width, ffn), bf, mesh, spec),
                         "w_out": sds((n_layers, ffn, width), bf, mesh, spec)}}
    x = sds((batch, width), bf, mesh, P("d"))
    kw = {"donate_argnums": (0,), "out_shardings": (_shardings(params), NamedSharding(mesh, P()))}
    return fsdp_train_step, (params, x), kw


pair(
    "fsdp_layer_axis", "v5e", "v5e:2x2",
    "FSDP training step of 64 scanned residual MLP blocks (bf16[64,4096,16384] and [64,16384,4096], 16 GiB) "
    "whose stacked params are sharded P('d', None, None) along the layer axis that lax.scan slices: the "
    "partitioner gathers whole stacks (8 GiB buffers) onto every device and exceeds HBM.",
    "Fixed variant of fsdp_layer_axis_v5e: the stacks sharded P(None, 'd', None), within each layer (one "
    "layer gathered per scan step); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["replicated_tensor"]),
    _fsdp_scan_builder, dict(n_layers=64, width=4096, ffn=16384, batch=4 * 2048, param_spec=("d", None, None)),
    dict(n_layers=64, width=4096, ffn=16384, batch=4 * 2048, param_spec=(None, "d", None)),
    dump=True,
)


# 15.7 a retrieval step that scores every query against the whole database at once


def _retrieval_builder(mesh, queries, db_size, dim, k, block=None):
    """Exact maximum-inner-product search: bf16 queries [Q, dim] sharded over 'd', a bf16 database
    [N, dim] replicated, the top k ids and scores per query. block: the database scanned in blocks
    of `block` rows (lax.scan), a running top-k merged per block."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def search(db, q):
        if block is None:
            return jax.lax.top_k((q @ db.T).astype(f32), k)
        blocks = db.reshape(db_size // block, block, dim)

        def body(best, xs):
            db_b, off = xs
            s = (q @ db_b.T).astype(f32)
            vals = jnp.concatenate([best[0], s], axis=-1)
            ids = jnp.concatenate([best[1], jnp.broadcast_to(off + jnp.arange(block, dtype=jnp.int32), s.shape)],
                                  axis=-1)
            v, i = jax.lax.top_k(vals, k)
            return (v, jnp.take_along_axis(ids, i, axis=-1)), None

        init = (jnp.full((q.shape[0], k), -jnp.inf, f32), jnp.zeros((q.shape[0], k), jnp.int32))
        offs = jnp.arange(db_size // block, dtype=jnp.int32) * block
        best, _ = jax.lax.scan(body, init, (blocks, offs))
        return best

    db = sds((db_size, dim), jnp.bfloat16, mesh, P())
    q = sds((queries, dim), jnp.bfloat16, mesh, P("d"))
    return search, (db, q), {}


pair(
    "retrieval_topk", "v5p", "v5p:2x2x1",
    "Exact top-100 inner-product search on v5p, 8192 queries per device against a replicated bf16 "
    "database of 8388608 x 256: the scores of every query against every row, bf16[8192,8388608] "
    "(128 GiB per device), exceed 95.74G.",
    "Fixed variant of retrieval_topk_v5p: the database scanned in blocks of 65536 rows (lax.scan) with a "
    "running top-100; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _retrieval_builder, dict(queries=4 * 8192, db_size=8388608, dim=256, k=100),
    dict(queries=4 * 8192, db_size=8388608, dim=256, k=100, block=65536),
    dump=True,
)


# 15.8 a full Hessian where a Hessian-vector product was meant


def _hessian_builder(mesh, batch, d_in, hidden, full):
    """Newton-CG-style curvature of a small f32 MLP regression loss with respect to the first layer's
    weights w1 [d_in, hidden] (flattened P = d_in * hidden parameters), data sharded over 'd'.
    full: jax.hessian (jacfwd of jacrev: P tangents pushed through the whole batch, a [P, P] result)
    contracted with v afterwards; otherwise the Hessian-vector product jax.jvp(jax.grad(f), (w,), (v,))."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def curvature(params, v, x, y):
        def f(w1):
            h = jnp.tanh(x @ w1)
            return jnp.mean((h @ params["w2"] - y) ** 2)

        w1 = params["w1"]
        if full:
            hess = jax.hessian(f)(w1).reshape(w1.size, w1.size)
            return (hess @ v.reshape(-1)).reshape(w1.shape)
        return jax.jvp(jax.grad(f), (w1,), (v,))[1]

    params = {"w1": sds((d_in, hidden), f32, mesh, P()), "w2": sds((hidden, 1), f32, mesh, P())}
    v = sds((d_in, hidden), f32, mesh, P())
    x = sds((batch, d_in), f32, mesh, P("d"))
    y = sds((batch, 1), f32, mesh, P("d"))
    return curvature, (params, v, x, y), {}


pair(
    "hessian_full", "v5p", "v5p:2x2x1",
    "Newton-CG curvature of an MLP loss on v5p computed with jax.hessian with respect to w1 f32[512,256] "
    "(131072 parameters) and then multiplied by v, where a Hessian-vector product was meant: the "
    "forward-over-reverse tangents f32[131072,1024,256] (128 GiB per device) exceed 95.74G.",
    "Fixed variant of hessian_full_v5p: the Hessian-vector product jax.jvp(jax.grad(f), (w1,), (v,)); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _hessian_builder, dict(batch=4 * 1024, d_in=512, hidden=256, full=True),
    dict(batch=4 * 1024, d_in=512, hidden=256, full=False),
    dump=True,
)


# 15.9 an encoder-decoder (T5-style) with cross attention over a long source, no remat


def _encdec_builder(mesh, batch, src_len, tgt_len, d_model, heads, n_dec, remat):
    """T5-style decoder stack (bf16; causal self-attention, cross attention to the encoder output,
    ReLU MLP) scanned over stacked layer params, trained with a next-token loss; the encoder output
    [B, src_len, D] is an input (the encoder is frozen). remat: the decoder block under
    jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def ln(x):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf)

    def attend(q, k, v, mask=None):
        b, sq, _ = q.shape
        sk = k.shape[1]
        q, k, v = q.reshape(b, sq, heads, hd), k.reshape(b, sk, heads, hd), v.reshape(b, sk, heads, hd)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32)
        if mask is not None:
            s = jnp.where(mask, s, -1e9)
        p = jax.nn.softmax(s, axis=-1).astype(bf)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, sq, d_model)

    def encdec_train_step(params, enc_out, tokens):
        causal = jnp.tril(jnp.ones((tgt_len, tgt_len), bool))

        def block(x, lp):
            h = ln(x)
            x = x + attend(h @ lp["sq"], h @ lp["sk"], h @ lp["sv"], causal) @ lp["so"]
            h = ln(x)
            x = x + attend(h @ lp["cq"], enc_out @ lp["ck"], enc_out @ lp["cv"]) @ lp["co"]
            x = x + jax.nn.relu(ln(x) @ lp["w_up"]) @ lp["w_down"]
            return x, None

        body = jax.checkpoint(block) if remat else block

        def loss_fn(params):
            x = params["embed"][tokens[:, :-1]]
            x, _ = jax.lax.scan(body, x, params["dec"])
            logits = (ln(x) @ params["embed"].T).astype(f32)
            tgt = tokens[:, 1:]
            return jnp.mean(jax.nn.logsumexp(logits, -1)
                            - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-4 * g.astype(p.dtype), params, grads), loss

    L, D = n_dec, d_model
    dec = {n: sds((L, D, D), bf, mesh, P()) for n in ("sq", "sk", "sv", "so", "cq", "ck", "cv", "co")}
    dec["w_up"] = sds((L, D, 4 * D), bf, mesh, P())
    dec["w_down"] = sds((L, 4 * D, D), bf, mesh, P())
    params = {"embed": sds((32128, D), bf, mesh, P()), "dec": dec}
    n = mesh.devices.size * batch
    enc_out = sds((n, src_len, D), bf, mesh, P("d"))
    tokens = sds((n, tgt_len + 1), jnp.int32, mesh, P("d"))
    return encdec_train_step, (params, enc_out, tokens), {"donate_argnums": (0,)}


pair(
    "encdec_cross_attention", "v5p", "v5p:2x2x1",
    "T5-style decoder stack (24 layers, d_model 2048, 16 heads, bf16) trained on v5p with cross attention "
    "to 8192-token encoder outputs, 12 sequences of 1024 target tokens per device, scanned without "
    "jax.checkpoint: every layer's cross-attention scores (stacked f32[24,12,16,1024,8192], 144 GiB) are "
    "saved for the backward pass and exceed 95.74G.",
    "Fixed variant of encdec_cross_attention_v5p: jax.checkpoint on the scanned decoder block; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["no_remat", "large_activation", "batch_too_large"]),
    _encdec_builder, dict(batch=12, src_len=8192, tgt_len=1024, d_model=2048, heads=16, n_dec=24, remat=False),
    dict(batch=12, src_len=8192, tgt_len=1024, d_model=2048, heads=16, n_dec=24, remat=True),
    dump=False,
)


# 15.10 nucleus (top-p) sampling that sorts the whole vocabulary


def _nucleus_builder(mesh, batch, d_model, vocab, full_sort, candidates=256, top_p=0.9):
    """Top-p sampling of the next token for a batch of sequences (rollout generation): f32 logits
    [B, V] from the final hidden states (bf16 unembedding replicated, sequences over 'd').
    full_sort: the candidates ordered with jnp.argsort over the whole vocabulary; otherwise
    lax.top_k(logits, candidates) and the nucleus within those."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def sample_top_p(params, h, key):
        logits = (h @ params["unembed"]).astype(f32)  # [B, V]
        if full_sort:
            order = jnp.argsort(-logits, axis=-1)
            cand = jnp.take_along_axis(logits, order, axis=-1)
        else:
            cand, order = jax.lax.top_k(logits, candidates)
        probs = jax.nn.softmax(cand, axis=-1)
        keep = jnp.cumsum(probs, axis=-1) - probs < top_p
        pick = jax.random.categorical(key, jnp.where(keep, cand, -jnp.inf), axis=-1)
        return jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0]

    params = {"unembed": sds((d_model, vocab), jnp.bfloat16, mesh, P())}
    h = sds((mesh.devices.size * batch, d_model), jnp.bfloat16, mesh, P("d"))
    key = sds((2,), jnp.uint32, mesh, P())
    return sample_top_p, (params, h, key), {}


pair(
    "nucleus_sort", "v6e", "v6e:2x2",
    "Top-p sampling of the next token for 16384 rollouts per device on v6e (vocabulary 128256) that "
    "orders the candidates with jnp.argsort over the whole vocabulary: the f32 logits, the sort's "
    "keys, permutation and sorted copies ([16384,128256], 7.83 GiB each) exceed 31.25G.",
    "Fixed variant of nucleus_sort_v6e: lax.top_k(logits, 256) and the nucleus within those 256 "
    "candidates; fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large"]),
    _nucleus_builder, dict(batch=16384, d_model=4096, vocab=128256, full_sort=True),
    dict(batch=16384, d_model=4096, vocab=128256, full_sort=False),
    dump=True,
)


# 15.11 a tokenized dataset kept on the device, replicated


def _dataset_builder(mesh, n_seqs, seq, batch, vocab, d_model, data_spec):
    """Language-model step whose whole tokenized dataset lives in HBM (int32 [n_seqs, seq], an
    argument, not donated) for a host-free input pipeline: each step gathers its `batch`
    sequences by index, then a small bf16 model (embedding, GELU MLP, tied softmax) with SGD.
    data_spec () replicates the dataset on every device, ('d', None) shards its rows."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def train_step(params, dataset, idx):
        tokens = jax.lax.with_sharding_constraint(dataset[idx], NamedSharding(mesh, P("d")))

        def loss_fn(params):
            x = params["embed"][tokens[:, :-1]]
            h = x + jax.nn.gelu(x @ params["w1"]) @ params["w2"]
            logits = (h @ params["embed"].T).astype(f32)
            tgt = tokens[:, 1:]
            return jnp.mean(jax.nn.logsumexp(logits, -1)
                            - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"embed": sds((vocab, d_model), bf, mesh, P()),
              "w1": sds((d_model, 4 * d_model), bf, mesh, P()),
              "w2": sds((4 * d_model, d_model), bf, mesh, P())}
    dataset = sds((n_seqs, seq), jnp.int32, mesh, _P(*data_spec))
    idx = sds((mesh.devices.size * batch,), jnp.int32, mesh, P())
    return train_step, (params, dataset, idx), {"donate_argnums": (0,)}


pair(
    "dataset_replicated", "v5e", "v5e:2x2",
    "Language-model step that keeps its whole tokenized dataset in HBM (int32[2097152,2048], 16 GiB) and "
    "gathers each batch by index, the dataset passed replicated P() where P('d', None) was meant: the "
    "dataset alone exceeds HBM on every device.",
    "Fixed variant of dataset_replicated_v5e: the dataset's rows sharded P('d', None) (4 GiB per device); "
    "fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed"]),
    _dataset_builder, dict(n_seqs=2097152, seq=2048, batch=16, vocab=32768, d_model=1024, data_spec=()),
    dict(n_seqs=2097152, seq=2048, batch=16, vocab=32768, d_model=1024, data_spec=("d", None)),
    dump=False,
)


# ---- 16. more broken/fixed pairs (batch tpu5): other models, other names ----------------------
#
# Programs of kinds sections 13-15 do not have (DP-SGD per-example gradients, gradients
# all-gathered where an all-reduce was meant, linear attention multiplied out the quadratic way,
# convolutions written as im2col patches, grouped-query attention with repeated KV heads, a dense
# mixture-of-experts that runs every expert on every token, an int8 model dequantized for all layers
# at once, a learned-dynamics rollout that keeps its trajectory, a replicated distillation teacher,
# a Pallas matmul whose blocks and accumulator exceed scoped VMEM). The same conventions: the fixed
# twin changes exactly the first cause. Five keep their dumps (dump=True); the others only
# stderr.log / exception.txt / meta.json.
# (Tried and dropped: multi-LoRA serving with per-request merged weights W + A[id] @ B[id]
# ([96,4096,11008] per layer) compiled at 2.87 GiB: the compiler fused the merge into the consumer
# convolution and never materialized it; a ResNet stem on 3-channel uint8 images with a per-image
# random crop compiled at 1.08 GiB without padding (the 3-channel arrays took unpadded layouts);
# an exact GP (RBF kernel [49152,49152] and jnp.linalg.cholesky) drove the compiling process past
# 9 GiB of host memory within 4 minutes, with and without jnp.eye, and was stopped.)


# 16.1 DP-SGD: per-example gradients of a sequence model materialized for the whole batch


def _dpsgd_builder(mesh, batch, seq, d_model, d_ff, micro=None, clip=1.0, noise=1.0):
    """DP-SGD step of a token-level MLP regressor (f32, params replicated and donated): per-example
    gradients with jax.vmap(jax.grad(loss_one)), each clipped to norm `clip`, summed, Gaussian noise
    added. Over a sequence each example's weight gradient is a [T]-contracted product, so the
    per-example gradients are real [B, D, F] arrays. micro: the clipped sum taken over micro-batches
    of `micro` examples inside lax.scan (an accumulator), not over the whole per-device batch."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def loss_one(params, x, y):  # one example: x [T, D]
        h = jax.nn.gelu(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def clipped_sum(params, x, y):
        g = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, x, y)  # leaves [b, ...]
        norms = jnp.sqrt(sum(jnp.sum(l.reshape(l.shape[0], -1) ** 2, axis=1)
                             for l in jax.tree_util.tree_leaves(g)))
        scale = jnp.minimum(1.0, clip / (norms + 1e-6))
        return _tm(lambda l: jnp.einsum("b,b...->...", scale, l), g)

    def dpsgd_step(params, x, y, key):
        if micro is None:
            gsum = clipped_sum(params, x, y)
        else:
            xs = x.reshape(-1, micro, *x.shape[1:])
            ys = y.reshape(-1, micro, *y.shape[1:])
            xs = jax.lax.with_sharding_constraint(xs, NamedSharding(mesh, P(None, "d")))
            ys = jax.lax.with_sharding_constraint(ys, NamedSharding(mesh, P(None, "d")))

            def acc(carry, xy):
                return _tm(jnp.add, carry, clipped_sum(params, *xy)), None

            gsum, _ = jax.lax.scan(acc, _tm(jnp.zeros_like, params), (xs, ys))
        leaves, tree = jax.tree_util.tree_flatten(gsum)
        keys = jax.random.split(key, len(leaves))
        noisy = [l + noise * clip * jax.random.normal(k, l.shape, f32) for l, k in zip(leaves, keys)]
        g = jax.tree_util.tree_unflatten(tree, noisy)
        n = x.shape[0]
        return _tm(lambda p, g: p - 1e-3 * g / n, params, g)

    params = {"w1": sds((d_model, d_ff), f32, mesh, P()), "w2": sds((d_ff, d_model), f32, mesh, P())}
    nb = mesh.devices.size * batch
    x = sds((nb, seq, d_model), f32, mesh, P("d"))
    y = sds((nb, seq, d_model), f32, mesh, P("d"))
    key = sds((2,), jnp.uint32, mesh, P())
    return dpsgd_step, (params, x, y, key), {"donate_argnums": (0,)}


pair(
    "dpsgd_per_example", "v5p", "v5p:2x2x1",
    "DP-SGD step of a token-level f32 MLP (w1 [1024,4096], w2 [4096,1024]) on 4096 sequences of 128 "
    "tokens per device: jax.vmap(jax.grad(...)) over the whole per-device batch, so the per-example "
    "gradients f32[4096,1024,4096] and f32[4096,4096,1024] (64 GiB each) are materialized before "
    "clipping and exceed 95.74G.",
    "Fixed variant of dpsgd_per_example_v5p: the clipped per-example gradients summed over micro-batches "
    "of 512 examples (128 per device) inside lax.scan; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _dpsgd_builder, dict(batch=4096, seq=128, d_model=1024, d_ff=4096),
    dict(batch=4096, seq=128, d_model=1024, d_ff=4096, micro=512),
    dump=False,
)


# 16.2 data parallelism in shard_map whose gradients are all-gathered, then averaged


def _allgather_grads_builder(mesh, layers, width, batch, reduce):
    """Data-parallel MLP training step written with jax.shard_map (params replicated, the batch
    over 'd'): each device computes its gradients, then reduce='gather_mean' does
    jax.lax.all_gather(grads, 'd').mean(0) (every device receives every device's gradients),
    reduce='pmean' jax.lax.pmean(grads, 'd') (an all-reduce)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def local_step(params, x, y):
        def loss_fn(params):
            h = x
            for i in range(layers):
                h = jnp.tanh(h @ params[f"layer_{i}"])
            return jnp.mean((h - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        if reduce == "gather_mean":
            grads = _tm(lambda g: jax.lax.all_gather(g, "d").mean(0), grads)
        else:
            grads = jax.lax.pmean(grads, "d")
        loss = jax.lax.pmean(loss, "d")
        return _tm(lambda p, g: p - 1e-2 * g, params, grads), loss

    step = jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=(P(), P()),
                         check_vma=False)

    def dp_train_step(params, x, y):
        return step(params, x, y)

    params = {f"layer_{i}": sds((width, width), f32, mesh, P()) for i in range(layers)}
    n = mesh.devices.size * batch
    x = sds((n, width), f32, mesh, P("d"))
    y = sds((n, width), f32, mesh, P("d"))
    return dp_train_step, (params, x, y), {"donate_argnums": (0,)}


pair(
    "allgather_grads", "v5e", "v5e:4x4",
    "Data-parallel MLP (3 x f32[16384,16384], replicated) written with jax.shard_map on v5e:4x4 "
    "(16 devices) that averages its gradients with jax.lax.all_gather(g, 'd').mean(0): every device "
    "receives all 16 gradients of a layer (16 GiB, listed as f32[262144,16384]) and exceeds 15.75G.",
    "Fixed variant of allgather_grads_v5e: jax.lax.pmean(grads, 'd') (an all-reduce); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "replicated_tensor"]),
    _allgather_grads_builder, dict(layers=3, width=16384, batch=2048, reduce="gather_mean"),
    dict(layers=3, width=16384, batch=2048, reduce="pmean"),
    dump=True,
)


# 16.3 linear attention multiplied out the quadratic way


def _linear_attention_builder(mesh, batch, seq, heads, head_dim, d_model, associate_kv):
    """Training step of a linear-attention (elu+1 feature map, non-causal) encoder block, bf16,
    params replicated and donated, sequences over 'd'. associate_kv False: out = (phi(q) phi(k)^T) v,
    the [B, H, S, S] score matrix is formed; True: out = phi(q) (phi(k)^T v), a [B, H, Dh, Dh] state."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def attention(params, x):
        q, k, v = (jnp.einsum("bsd,dhe->bhse", x, params[n]) for n in ("wq", "wk", "wv"))
        fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
        if associate_kv:
            kv = jnp.einsum("bhtd,bhte->bhde", fk, v)
            num = jnp.einsum("bhsd,bhde->bhse", fq, kv)
            den = jnp.einsum("bhsd,bhd->bhs", fq, fk.sum(2))
        else:
            scores = jnp.einsum("bhsd,bhtd->bhst", fq, fk)
            num = jnp.einsum("bhst,bhte->bhse", scores, v)
            den = scores.astype(f32).sum(-1)
        o = (num.astype(f32) / (den[..., None] + 1e-6)).astype(bf)
        return x + jnp.einsum("bhse,hed->bsd", o, params["wo"])

    def linear_attn_train_step(params, x):
        def loss_fn(params):
            h = attention(params, x)
            h = h + jax.nn.gelu(h @ params["w1"]) @ params["w2"]
            return jnp.mean(h.astype(f32) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {n: sds((d_model, heads, head_dim), bf, mesh, P()) for n in ("wq", "wk", "wv")}
    params["wo"] = sds((heads, head_dim, d_model), bf, mesh, P())
    params["w1"] = sds((d_model, 4 * d_model), bf, mesh, P())
    params["w2"] = sds((4 * d_model, d_model), bf, mesh, P())
    x = sds((mesh.devices.size * batch, seq, d_model), bf, mesh, P("d"))
    return linear_attn_train_step, (params, x), {"donate_argnums": (0,)}


pair(
    "linear_attention_quadratic", "v6e", "v6e:2x2",
    "Training step of a linear-attention (elu+1 features, non-causal) encoder block, bf16, 8 sequences of "
    "16384 tokens per device, 8 heads of 64, computed as (phi(q) phi(k)^T) v: the [B,H,S,S] score matrix "
    "bf16[8,8,16384,16384] (32 GiB) is formed and exceeds 31.25G.",
    "Fixed variant of linear_attention_quadratic_v6e: phi(q) (phi(k)^T v), a [B,H,64,64] state per head; "
    "fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _linear_attention_builder, dict(batch=8, seq=16384, heads=8, head_dim=64, d_model=512, associate_kv=False),
    dict(batch=8, seq=16384, heads=8, head_dim=64, d_model=512, associate_kv=True),
    dump=False,
)


# 16.4 convolutions written as im2col patches + matmul


def _im2col_builder(mesh, batch, size, widths, kernel, use_patches, classes=1000):
    """Image classifier (f32, NHWC, stride-1 'SAME' convs with ReLU, 2x2 average pooling between
    stages, global pooling, a dense head), SGD, params replicated and donated, images over 'd'.
    use_patches: each conv as jax.lax.conv_general_dilated_patches (im2col, [B, H, W, C*k*k])
    followed by a matmul with the reshaped kernel; otherwise jax.lax.conv_general_dilated."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dn = ("NHWC", "HWIO", "NHWC")

    def conv(x, w):
        if use_patches:
            p = jax.lax.conv_general_dilated_patches(x, (kernel, kernel), (1, 1), "SAME",
                                                     dimension_numbers=dn)  # [B, H, W, C*k*k], C major
            cin, cout = w.shape[2], w.shape[3]
            return p @ w.transpose(2, 0, 1, 3).reshape(cin * kernel * kernel, cout)
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)

    def im2col_train_step(params, images, labels):
        def loss_fn(params):
            h = images
            for i in range(len(widths)):
                h = jax.nn.relu(conv(h, params[f"conv_{i}"]))
                if i + 1 < len(widths):
                    b, hh, ww, c = h.shape
                    h = h.reshape(b, hh // 2, 2, ww // 2, 2, c).mean((2, 4))
            logits = h.mean((1, 2)) @ params["head"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-2 * g, params, grads), loss

    params, cin = {}, 3
    for i, c in enumerate(widths):
        params[f"conv_{i}"] = sds((kernel, kernel, cin, c), f32, mesh, P())
        cin = c
    params["head"] = sds((cin, classes), f32, mesh, P())
    n = mesh.devices.size * batch
    images = sds((n, size, size, 3), f32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    return im2col_train_step, (params, images, labels), {"donate_argnums": (0,)}


pair(
    "im2col_patches", "v4", "v4:2x2x1",
    "Image classifier on v4 (256 images of 256x256 per TensorCore, f32, 5x5 convolutions 64-128-256) whose "
    "convolutions are written as jax.lax.conv_general_dilated_patches + matmul: the im2col patches "
    "(e.g. [256,128,128,1600], 12.5 GiB in bf16) are 25x the activations and exceed 15.25G.",
    "Fixed variant of im2col_patches_v4: the same convolutions with jax.lax.conv_general_dilated; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _im2col_builder, dict(batch=256, size=256, widths=(64, 128, 256), kernel=5, use_patches=True),
    dict(batch=256, size=256, widths=(64, 128, 256), kernel=5, use_patches=False),
    dump=False,
)


# 16.5 grouped-query attention decode that repeats the KV heads


def _gqa_decode_builder(mesh, n_layers, batch, max_len, d_model, heads, kv_heads, head_dim, repeat_kv):
    """One decode step of a GQA decoder (bf16, params replicated, requests over 'd') reading a
    stacked KV cache [L, B, S, KV, Dh] (bf16, donated, carried through the lax.scan over layers and
    updated in place: the new token's K/V written at `pos`). repeat_kv: K and V are expanded to all query heads with
    jnp.repeat(cache, heads // kv_heads, axis=2) before the attention einsums; otherwise the queries
    are grouped [B, KV, G, Dh] and the einsums read the cache as it is."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    g = heads // kv_heads

    def decode_step(params, cache, x, pos):
        def layer(carry, xs):
            h, ck_all, cv_all = carry
            p, i = xs
            q = (h @ p["wq"]).reshape(-1, heads, head_dim)
            k = (h @ p["wk"]).reshape(1, -1, 1, kv_heads, head_dim)
            v = (h @ p["wv"]).reshape(1, -1, 1, kv_heads, head_dim)
            ck_all = jax.lax.dynamic_update_slice(ck_all, k, (i, 0, pos, 0, 0))  # in place (donated)
            cv_all = jax.lax.dynamic_update_slice(cv_all, v, (i, 0, pos, 0, 0))
            ck = jax.lax.dynamic_index_in_dim(ck_all, i, 0, keepdims=False)  # [B, S, KV, Dh]
            cv = jax.lax.dynamic_index_in_dim(cv_all, i, 0, keepdims=False)
            if repeat_kv:
                kr, vr = jnp.repeat(ck, g, axis=2), jnp.repeat(cv, g, axis=2)  # [B, S, H, Dh]
                s = jnp.einsum("bhd,bshd->bhs", q, kr).astype(f32) / head_dim ** 0.5
                w = jax.nn.softmax(s, axis=-1).astype(bf)
                o = jnp.einsum("bhs,bshd->bhd", w, vr)
            else:
                qg = q.reshape(-1, kv_heads, g, head_dim)
                s = jnp.einsum("bkgd,bskd->bkgs", qg, ck).astype(f32) / head_dim ** 0.5
                w = jax.nn.softmax(s, axis=-1).astype(bf)
                o = jnp.einsum("bkgs,bskd->bkgd", w, cv)
            h = h + o.reshape(-1, heads * head_dim) @ p["wo"]
            h = h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]
            return (h, ck_all, cv_all), None

        layers = jnp.arange(n_layers, dtype=jnp.int32)
        (h, k_new, v_new), _ = jax.lax.scan(layer, (x, cache["k"], cache["v"]), (params, layers))
        return h, {"k": k_new, "v": v_new}

    L = n_layers
    params = {"wq": sds((L, d_model, heads * head_dim), bf, mesh, P()),
              "wk": sds((L, d_model, kv_heads * head_dim), bf, mesh, P()),
              "wv": sds((L, d_model, kv_heads * head_dim), bf, mesh, P()),
              "wo": sds((L, heads * head_dim, d_model), bf, mesh, P()),
              "w1": sds((L, d_model, 4 * d_model), bf, mesh, P()),
              "w2": sds((L, 4 * d_model, d_model), bf, mesh, P())}
    n = mesh.devices.size * batch
    cspec = P(None, "d")
    cache = {"k": sds((L, n, max_len, kv_heads, head_dim), bf, mesh, cspec),
             "v": sds((L, n, max_len, kv_heads, head_dim), bf, mesh, cspec)}
    x = sds((n, d_model), bf, mesh, P("d"))
    pos = sds((), jnp.int32, mesh, P())
    kw = {"donate_argnums": (1,),
          "out_shardings": (NamedSharding(mesh, P("d")), _shardings(cache))}
    return decode_step, (params, cache, x, pos), kw


pair(
    "gqa_repeat_kv", "v5p", "v5p:2x2x1",
    "Decode step of a 4-layer grouped-query-attention decoder on v5p (96 requests per device, a 32768-token "
    "bf16 KV cache of 8 KV heads, 24 GiB each for K and V, donated) that expands K and V to the 64 query "
    "heads with jnp.repeat: the repeated cache slice (48 GiB, listed as bf16[96,32768,8,8,128]) exceeds "
    "what is left of 95.74G.",
    "Fixed variant of gqa_repeat_kv_v5p: the queries grouped [B,8,8,128] and the einsums read the cache "
    "as it is; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _gqa_decode_builder, dict(n_layers=4, batch=96, max_len=32768, d_model=8192, heads=64, kv_heads=8,
                              head_dim=128, repeat_kv=True),
    dict(n_layers=4, batch=96, max_len=32768, d_model=8192, heads=64, kv_heads=8, head_dim=128,
         repeat_kv=False),
    dump=True,
)


# 16.6 a dense mixture-of-experts: every expert on every token


def _dense_moe_builder(mesh, tokens, d_model, d_ff, n_experts, dense, capacity_factor=1.25):
    """Training step of one MoE feed-forward layer (bf16, top-1 router, experts stacked [E, ...],
    params replicated and donated, tokens over 'd'). dense: every expert is applied to every token
    (einsum 'td,edf->etf') and the outputs weighted by the gate, a [E, T, F] activation; otherwise
    top-1 routing with a capacity of capacity_factor * T / E tokens per expert, tokens gathered by
    index into [E, C, D] and scattered back. Tokens are routed in groups, one group per device."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    e = n_experts
    groups = mesh.devices.size

    def moe(params, x):
        probs = jax.nn.softmax((x @ params["router"]).astype(f32), axis=-1)  # [T, E]
        if dense:
            gate = probs * jax.nn.one_hot(jnp.argmax(probs, -1), e, dtype=f32)  # top-1 weights
            h = jax.nn.gelu(jnp.einsum("td,edf->etf", x, params["wi"]))
            y = jnp.einsum("etf,efd->etd", h, params["wo"])
            return jnp.einsum("te,etd->td", gate.astype(bf), y)
        t = x.shape[0]
        cap = int(capacity_factor * t / e)
        choice = jnp.argmax(probs, -1)
        gate = jnp.max(probs, -1)
        onehot = jax.nn.one_hot(choice, e, dtype=jnp.int32)
        pos = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, -1) - 1  # slot within the expert
        keep = pos < cap
        flat = jnp.where(keep, choice * cap + pos, e * cap)  # dropped tokens -> a dummy slot
        idx = jnp.full((e * cap + 1,), t, jnp.int32).at[flat].set(jnp.arange(t, dtype=jnp.int32))
        xp = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])[idx[:-1]].reshape(e, cap, -1)
        h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xp, params["wi"]))
        y = jnp.einsum("ecf,efd->ecd", h, params["wo"]).reshape(e * cap, -1)
        y = jnp.concatenate([y, jnp.zeros((1, y.shape[1]), y.dtype)])[flat]
        return y * (gate * keep).astype(bf)[:, None]

    def moe_train_step(params, x, y):
        def loss_fn(params):  # tokens in groups, one group per device (GShard), routed within it
            xg = jax.lax.with_sharding_constraint(x.reshape(groups, -1, x.shape[-1]), NamedSharding(mesh, P("d")))
            out = xg + jax.vmap(lambda xd: moe(params, xd))(xg)
            return jnp.mean((out.reshape(y.shape) - y).astype(f32) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"router": sds((d_model, e), bf, mesh, P()),
              "wi": sds((e, d_model, d_ff), bf, mesh, P()),
              "wo": sds((e, d_ff, d_model), bf, mesh, P())}
    n = mesh.devices.size * tokens
    x = sds((n, d_model), bf, mesh, P("d"))
    y = sds((n, d_model), bf, mesh, P("d"))
    return moe_train_step, (params, x, y), {"donate_argnums": (0,)}


pair(
    "moe_dense_experts", "v5e", "v5e:2x2",
    "Training step of a top-1 mixture-of-experts layer (8 experts, d_model 2048, d_ff 8192, bf16, 65536 "
    "tokens per device) written densely: every expert runs on every token and the outputs are weighted "
    "by the gate, so the expert activations bf16[8,65536,8192] (8 GiB each) exceed 15.75G.",
    "Fixed variant of moe_dense_experts_v5e: top-1 routing with capacity factor 1.25 (tokens gathered "
    "into [8,10240,2048] per device and scattered back); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _dense_moe_builder, dict(tokens=65536, d_model=2048, d_ff=8192, n_experts=8, dense=True),
    dict(tokens=65536, d_model=2048, d_ff=8192, n_experts=8, dense=False),
    dump=False,
)


# 16.7 an int8 weight-only quantized model dequantized for all layers at once


def _int8_serving_builder(mesh, n_layers, d_model, d_ff, batch, seq, per_layer):
    """Prefill (forward only) of an int8 weight-only quantized MLP stack: weights int8 [L, D, F] /
    [L, F, D] with per-channel f32 scales, tensor parallel (the F axis over 'd'), activations bf16
    replicated, lax.scan over the layers. per_layer False: the whole stack is dequantized to bf16
    (`w.astype(bf16) * scale`) before the scan, as a dequantize(params) call at the top of the model;
    True: each layer's weights are dequantized inside the scanned layer."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def dequant(w, s):
        return w.astype(bf) * s[..., None, :].astype(bf)

    def prefill(qparams, x):
        def layer(h, q):
            wi, wo = (dequant(q["w_in"], q["s_in"]), dequant(q["w_out"], q["s_out"])) if per_layer \
                else (q["w_in"], q["w_out"])
            u = jax.nn.gelu(h @ wi)
            return h + u @ wo, None

        if per_layer:
            xs = qparams
        else:
            xs = {"w_in": dequant(qparams["w_in"], qparams["s_in"]),
                  "w_out": dequant(qparams["w_out"], qparams["s_out"])}
        h, _ = jax.lax.scan(layer, x, xs)
        return h

    q = {"w_in": sds((n_layers, d_model, d_ff), jnp.int8, mesh, P(None, None, "d")),
         "s_in": sds((n_layers, d_ff), f32, mesh, P(None, "d")),
         "w_out": sds((n_layers, d_ff, d_model), jnp.int8, mesh, P(None, "d", None)),
         "s_out": sds((n_layers, d_model), f32, mesh, P())}
    x = sds((batch, seq, d_model), bf, mesh, P())
    return prefill, (q, x), {}


pair(
    "int8_dequant_upfront", "v6e", "v6e:2x2",
    "Prefill of an int8 weight-only quantized MLP stack on v6e (96 layers of int8 [8192,32768] and "
    "[32768,8192], tensor parallel: 12 GiB of int8 per device) that dequantizes the whole stack to bf16 "
    "before the lax.scan over layers: two bf16[96,8192,8192] stacks (12 GiB each) next to the int8 "
    "weights exceed 31.25G.",
    "Fixed variant of int8_dequant_upfront_v6e: each layer dequantized inside the scanned layer; fits.",
    dict(category="aggregate", causes=["large_activation"]),
    _int8_serving_builder, dict(n_layers=96, d_model=8192, d_ff=32768, batch=8, seq=2048, per_layer=False),
    dict(n_layers=96, d_model=8192, d_ff=32768, batch=8, seq=2048, per_layer=True),
    dump=True,
)


# 16.8 a learned-dynamics rollout that keeps every state when only the last one is used


def _rollout_builder(mesh, particles, dim, hidden, steps, keep_trajectory, dt=1e-2):
    """Simulation with a learned vector field (an f32 2-layer MLP, replicated): RK4 steps under
    lax.scan for `steps` steps, particle states f32 [N, dim] over 'd'; the caller uses only the final
    state. keep_trajectory: the scan returns every state as its stacked output ([steps, N, dim]) and
    the function returns trajectory[-1]; otherwise the state is only the carry."""
    jax, jnp, NamedSharding, P = _jax()

    def rollout(params, x0):
        def f(x):
            return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]

        def rk4(x, _):
            k1 = f(x)
            k2 = f(x + 0.5 * dt * k1)
            k3 = f(x + 0.5 * dt * k2)
            k4 = f(x + dt * k3)
            x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            return x, (x if keep_trajectory else None)

        x, traj = jax.lax.scan(rk4, x0, None, length=steps)
        return traj[-1] if keep_trajectory else x

    f32 = jnp.float32
    params = {"w1": sds((dim, hidden), f32, mesh, P()), "b1": sds((hidden,), f32, mesh, P()),
              "w2": sds((hidden, dim), f32, mesh, P())}
    x0 = sds((mesh.devices.size * particles, dim), f32, mesh, P("d"))
    return rollout, (params, x0), {}


pair(
    "rollout_trajectory", "v4", "v4:2x2x1",
    "Rollout of a learned f32 vector field (RK4, 2048 steps, 16384 particles of dim 128 per TensorCore) "
    "whose lax.scan returns every state and the caller keeps trajectory[-1]: the stacked trajectory "
    "f32[2048,16384,128] (16 GiB) exceeds 15.25G.",
    "Fixed variant of rollout_trajectory_v4: the state only as the scan's carry; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _rollout_builder, dict(particles=16384, dim=128, hidden=512, steps=2048, keep_trajectory=True),
    dict(particles=16384, dim=128, hidden=512, steps=2048, keep_trajectory=False),
    dump=True,
)


# 16.9 knowledge distillation with the teacher replicated on every device


def _distill_builder(mesh, t_layers, t_width, s_layers, s_width, d_in, batch, teacher_spec):
    """Distillation step: a frozen f32 teacher MLP stack (params [L, D, D] under lax.scan) produces
    soft targets for a bf16 student trained with SGD (donated); data over 'd'. teacher_spec () keeps
    the teacher replicated on every device; (None, 'd', None) shards it FSDP-style (each layer
    gathered inside the scan)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mlp_stack(stack, h, dtype):
        def layer(h, w):
            return h + jax.nn.gelu(h @ w.astype(dtype)), None

        h, _ = jax.lax.scan(layer, h, stack)
        return h

    def distill_step(student, teacher, x):
        t_out = mlp_stack(teacher["layers"], x.astype(f32) @ teacher["w_in"], f32) @ teacher["w_out"]
        t_prob = jax.nn.softmax(jax.lax.stop_gradient(t_out), -1)

        def loss_fn(student):
            s = mlp_stack(student["layers"], x @ student["w_in"], bf) @ student["w_out"]
            return -jnp.mean(jnp.sum(t_prob * jax.nn.log_softmax(s.astype(f32), -1), -1))

        loss, grads = jax.value_and_grad(loss_fn)(student)
        return _tm(lambda p, g: p - 1e-3 * g, student, grads), loss

    tspec = _P(*teacher_spec)
    teacher = {"w_in": sds((d_in, t_width), f32, mesh, P()),
               "layers": sds((t_layers, t_width, t_width), f32, mesh, tspec),
               "w_out": sds((t_width, d_in), f32, mesh, P())}
    student = {"w_in": sds((d_in, s_width), bf, mesh, P()),
               "layers": sds((s_layers, s_width, s_width), bf, mesh, P()),
               "w_out": sds((s_width, d_in), bf, mesh, P())}
    x = sds((mesh.devices.size * batch, d_in), bf, mesh, P("d"))
    return distill_step, (student, teacher, x), {"donate_argnums": (0,)}


pair(
    "distill_teacher_replicated", "v6e", "v6e:2x2",
    "Distillation step on v6e: a frozen f32 teacher (32 x f32[16384,16384] under lax.scan, 32 GiB) passed "
    "replicated P() next to a small bf16 student: the teacher alone exceeds 31.25G on every device.",
    "Fixed variant of distill_teacher_replicated_v6e: the teacher's layer stack sharded P(None, 'd', None) "
    "(FSDP-style, 8 GiB per device, each layer gathered in the scan); fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed", "f32_precision"]),
    _distill_builder, dict(t_layers=32, t_width=16384, s_layers=8, s_width=2048, d_in=1024, batch=1024,
                           teacher_spec=()),
    dict(t_layers=32, t_width=16384, s_layers=8, s_width=2048, d_in=1024, batch=1024,
         teacher_spec=(None, "d", None)),
    dump=True,
)


# 16.10 a Pallas matmul kernel whose accumulator scratch and blocks exceed scoped VMEM


def _pallas_matmul_builder(mesh, m, k, n, bm, bk, bn):
    """Blocked bf16 matmul as a Pallas TPU kernel (grid (M/bm, N/bn, K/bk), an f32 accumulator in a
    VMEM scratch buffer, written out at the last k step), run per device under jax.shard_map with
    the rows over 'd'. Blocks bm x bk, bk x bn and bm x bn (double-buffered) plus the f32 scratch
    must fit the scoped VMEM limit."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    nk = k // bk

    def kernel(x_ref, w_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nk - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def per_shard(x, w):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((x.shape[0], n), x.dtype),
            grid=(x.shape[0] // bm, n // bn, nk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, w)

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"), check_vma=False)

    def pallas_matmul(x, w):
        return fn(x, w)

    x = sds((mesh.devices.size * m, k), jnp.bfloat16, mesh, P("d"))
    w = sds((k, n), jnp.bfloat16, mesh, P())
    return pallas_matmul, (x, w), {}


pair(
    "pallas_matmul_scratch", "v6e", "v6e:2x2",
    "A blocked bf16 matmul Pallas kernel on v6e with 2048x2048 blocks and an f32[2048,2048] VMEM "
    "accumulator scratch: double-buffered blocks plus the scratch (64 MiB) exceed the 32 MiB scoped "
    "VMEM limit.",
    "Fixed variant of pallas_matmul_scratch_v6e: 512x512 blocks (a 1 MiB accumulator); fits.",
    dict(category="vmem", causes=["kernel_tiling"]),
    _pallas_matmul_builder, dict(m=4096, k=4096, n=4096, bm=2048, bk=2048, bn=2048),
    dict(m=4096, k=4096, n=4096, bm=512, bk=512, bn=512),
    dump=False,
)


# ---- 17. more broken/fixed pairs (batch tpu6): other models, other names ----------------------
#
# Programs of kinds sections 13-16 do not have (an f32 EMA copy of FSDP-sharded params kept
# replicated, an ensemble vmapped over stacked members, a Fourier neural operator trained without
# remat, a selective state-space scan written with lax.associative_scan, a PINN residual through
# jax.jacfwd of the batched network, gradient accumulation that stacks every micro-batch's
# gradients, an encoder that returns every layer's attention maps, an RNN-T joint over the whole
# lattice, one-hot target distributions from the input pipeline, a CLIP loss whose global
# similarity matrix is built on every device). The same conventions: the fixed twin changes
# exactly the first cause. Five keep their dumps (dump=True); the others only stderr.log /
# exception.txt / meta.json.
# (Tried and dropped, both meant to show lane padding of 3 RGB channels: a nearest-neighbour
# optical-flow warp, take_along_axis on f32[64, H*W, 3] per device, compiled at 2.08 GiB (the gather
# got the {1,2,0:T(4,128)} layout, channels major, no padding); a per-image 3x3 colour matrix as
# einsum('npc,ncd->npd') on the same pixels compiled at 1.00 GiB (the same planar layout, the
# batched dot turned elementwise).)


# 17.1 an EMA of the parameters in f32, replicated, next to FSDP-sharded params and Adam state


def _ema_builder(mesh, n_dense, width, rows, ema_spec):
    """Data-parallel MLP regressor trained with Adam, params and Adam state sharded FSDP-style
    (P('d', None), gathered per layer by the compiler), plus an exponential moving average of the
    params in f32 (flax-style {"dense_i": {"kernel"}} trees). ema_spec: the EMA's PartitionSpec;
    () keeps the EMA copy whole on every device. All state donated, out_shardings = in_shardings."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def ema_train_step(params, opt_state, ema_params, batch):
        def loss_fn(params):
            h = batch["inputs"]
            for i in range(n_dense):
                h = jax.nn.relu(h @ params[f"dense_{i}"]["kernel"])
            return jnp.mean((h - batch["targets"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        ema_params = _tm(lambda e, p: 0.9999 * e + 1e-4 * p, ema_params, params)
        return params, opt_state, ema_params, loss

    def tree(spec):
        return {f"dense_{i}": {"kernel": sds((width, width), f32, mesh, spec)} for i in range(n_dense)}

    fsdp = P("d", None)
    params = tree(fsdp)
    opt_state = {"count": sds((), jnp.int32, mesh, P()), "mu": tree(fsdp), "nu": tree(fsdp)}
    ema_params = tree(_P(*ema_spec))
    n = mesh.devices.size * rows
    batch = {"inputs": sds((n, width), f32, mesh, P("d")), "targets": sds((n, width), f32, mesh, P("d"))}
    kw = {"donate_argnums": (0, 1, 2),
          "out_shardings": (_shardings(params), _shardings(opt_state), _shardings(ema_params),
                            NamedSharding(mesh, P()))}
    return ema_train_step, (params, opt_state, ema_params, batch), kw


pair(
    "ema_replicated", "v5e", "v5e:4x4",
    "Adam training step of a 14-layer f32 MLP (kernels [16384,16384], 14 GiB of params) with params and "
    "Adam state sharded P('d', None) over 16 v5e chips, plus an f32 EMA copy of the params left "
    "replicated P(): the 14 GiB EMA on every device, with the sharded state, exceeds 15.75G.",
    "Fixed variant of ema_replicated_v5e: the EMA copy sharded like the params, P('d', None); fits.",
    dict(category="arguments", category_also=["aggregate"],
         causes=["replicated_tensor", "arguments_exceed", "f32_precision"]),
    _ema_builder, dict(n_dense=14, width=16384, rows=2048, ema_spec=()),
    dict(n_dense=14, width=16384, rows=2048, ema_spec=("d", None)),
    dump=False,
)


# 17.2 a deep ensemble evaluated with jax.vmap over stacked member params


def _ensemble_builder(mesh, members, rows, d_in, hidden, d_out, one_by_one):
    """Inference of a deep ensemble: `members` bf16 MLPs with stacked params [K, ...] (replicated),
    inputs over 'd'; returns the ensemble mean and spread. one_by_one=False runs all members at once
    with jax.vmap (every hidden activation [K, N, H]); True runs them one after another with
    jax.lax.map (one member's [N, H] at a time)."""
    jax, jnp, NamedSharding, P = _jax()
    bf = jnp.bfloat16

    def member_forward(p, feats):
        h = jax.nn.gelu(feats @ p["embed"])
        h = jax.nn.gelu(h @ p["hidden"])
        return (h @ p["head"]).astype(jnp.float32)

    def ensemble_predict(members_p, feats):
        if one_by_one:
            outs = jax.lax.map(lambda p: member_forward(p, feats), members_p)
        else:
            outs = jax.vmap(member_forward, in_axes=(0, None))(members_p, feats)
        return outs.mean(0), outs.std(0)

    members_p = {"embed": sds((members, d_in, hidden), bf, mesh, P()),
                 "hidden": sds((members, hidden, hidden), bf, mesh, P()),
                 "head": sds((members, hidden, d_out), bf, mesh, P())}
    feats = sds((mesh.devices.size * rows, d_in), bf, mesh, P("d"))
    return ensemble_predict, (members_p, feats), {}


pair(
    "ensemble_vmap", "v6e", "v6e:2x2",
    "Deep-ensemble inference of 16 bf16 MLPs (1024 -> 12288 -> 12288 -> 16) with stacked params, "
    "jax.vmap over the members on 98304 rows per device: every hidden activation is "
    "bf16[16,98304,12288] (36 GiB) and exceeds 31.25G.",
    "Fixed variant of ensemble_vmap_v6e: the members run one after another with jax.lax.map; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _ensemble_builder, dict(members=16, rows=98304, d_in=1024, hidden=12288, d_out=16, one_by_one=False),
    dict(members=16, rows=98304, d_in=1024, hidden=12288, d_out=16, one_by_one=True),
    dump=False,
)


# 17.3 a Fourier neural operator (FFT spectral layers, complex64) trained without remat


def _fno_builder(mesh, fields, grid, channels, modes, depth, remat):
    """FNO training step on 2-D fields [N, X, Y, C] (f32, over 'd'): `depth` Fourier layers under
    lax.scan over stacked weights, each rfft2 -> keep modes x modes -> complex channel mixing ->
    irfft2, plus a pointwise linear path and gelu; SGD, params donated. remat: jax.checkpoint on
    the scanned layer (otherwise every layer's spectra and activations are kept for the backward)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def fourier_layer(u, w):
        uh = jnp.fft.rfft2(u, axes=(1, 2))
        low = uh[:, :modes, :modes, :]
        mix = jax.lax.complex(w["spec_re"], w["spec_im"])
        out_low = jnp.einsum("nxyi,xyio->nxyo", low, mix)
        vh = jnp.zeros(uh.shape, uh.dtype).at[:, :modes, :modes, :].set(out_low)
        v = jnp.fft.irfft2(vh, s=(grid, grid), axes=(1, 2))
        return jax.nn.gelu(v + u @ w["pointwise"]), None

    if remat:
        fourier_layer = jax.checkpoint(fourier_layer)

    def fno_train_step(theta, a, u_true):
        def loss_fn(theta):
            u = a @ theta["lift"]
            u, _ = jax.lax.scan(fourier_layer, u, theta["blocks"])
            return jnp.mean((u @ theta["project"] - u_true) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(theta)
        return _tm(lambda p, g: p - 1e-3 * g, theta, g), loss

    theta = {"lift": sds((3, channels), f32, mesh, P()),
             "blocks": {"spec_re": sds((depth, modes, modes, channels, channels), f32, mesh, P()),
                        "spec_im": sds((depth, modes, modes, channels, channels), f32, mesh, P()),
                        "pointwise": sds((depth, channels, channels), f32, mesh, P())},
             "project": sds((channels, 1), f32, mesh, P())}
    n = mesh.devices.size * fields
    a = sds((n, grid, grid, 3), f32, mesh, P("d"))
    u_true = sds((n, grid, grid, 1), f32, mesh, P("d"))
    return fno_train_step, (theta, a, u_true), {"donate_argnums": (0,)}


pair(
    "fno_no_remat", "v4", "v4:2x2x1",
    "Fourier neural operator (24 spectral layers, 64 channels, 32x32 modes, rfft2/irfft2 in complex64) "
    "trained on 16 fields of 256x256 per TensorCore, lax.scan over the layers without jax.checkpoint: "
    "every layer's f32 activations and complex64 spectra are kept for the backward and exceed 15.25G.",
    "Fixed variant of fno_no_remat_v4: jax.checkpoint on the scanned Fourier layer; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _fno_builder, dict(fields=16, grid=256, channels=64, modes=32, depth=24, remat=False),
    dict(fields=16, grid=256, channels=64, modes=32, depth=24, remat=True),
    dump=False,
)


# 17.4 a selective state-space (Mamba-style) scan written with lax.associative_scan


def _ssm_builder(mesh, seqs, length, d_inner, d_state, recurrent):
    """Prefill of one selective-SSM block (bf16 projections, f32 state): discretized dA, dB*x of
    shape [N, L, D, S] and h_t = dA_t * h_{t-1} + dBx_t. recurrent=False computes every state at once
    with jax.lax.associative_scan over L (all [N, L, D, S] states and the scan's levels live);
    True runs lax.scan over L with the state [N, D, S] as the carry and emits only y_t."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def ssm_prefill(blk, xin):
        x = xin @ blk["in_proj"]                                       # [N, L, D] bf16
        delta = jax.nn.softplus((x @ blk["dt_proj"]).astype(f32))      # [N, L, D]
        Bm = (x @ blk["b_proj"]).astype(f32)                           # [N, L, S]
        Cm = (x @ blk["c_proj"]).astype(f32)                           # [N, L, S]
        A = -jnp.exp(blk["a_log"])                                     # [D, S]
        xf = x.astype(f32)
        if recurrent:
            def step(h, inp):
                d_t, b_t, c_t, x_t = inp
                h = jnp.exp(d_t[..., None] * A) * h + (d_t * x_t)[..., None] * b_t[:, None, :]
                return h, jnp.einsum("nds,ns->nd", h, c_t)

            seq_major = lambda t: jnp.swapaxes(t, 0, 1)
            h0 = jnp.zeros((x.shape[0], d_inner, d_state), f32)
            _, ys = jax.lax.scan(step, h0, (seq_major(delta), seq_major(Bm), seq_major(Cm), seq_major(xf)))
            y = seq_major(ys)
        else:
            dA = jnp.exp(delta[..., None] * A)                          # [N, L, D, S]
            dBx = (delta * xf)[..., None] * Bm[:, :, None, :]           # [N, L, D, S]

            def combine(a, b):
                return a[0] * b[0], b[0] * a[1] + b[1]

            _, h = jax.lax.associative_scan(combine, (dA, dBx), axis=1)
            y = jnp.einsum("nlds,nls->nld", h, Cm)
        return (y.astype(bf) * jax.nn.silu(x)) @ blk["out_proj"]

    d_model = d_inner // 2
    blk = {"in_proj": sds((d_model, d_inner), bf, mesh, P()), "dt_proj": sds((d_inner, d_inner), bf, mesh, P()),
           "b_proj": sds((d_inner, d_state), bf, mesh, P()), "c_proj": sds((d_inner, d_state), bf, mesh, P()),
           "a_log": sds((d_inner, d_state), f32, mesh, P()), "out_proj": sds((d_inner, d_model), bf, mesh, P())}
    xin = sds((mesh.devices.size * seqs, length, d_model), bf, mesh, P("d"))
    return ssm_prefill, (blk, xin), {}


pair(
    "ssm_associative_scan", "v6e", "v6e:2x2",
    "Prefill of a selective state-space block (d_inner 4096, state 16) on 8 sequences of 8192 tokens "
    "per device, the recurrence computed with jax.lax.associative_scan: the f32 states [8,8192,4096,16] "
    "(16 GiB) and the scan's intermediates exceed 31.25G.",
    "Fixed variant of ssm_associative_scan_v6e: lax.scan over the sequence with the state [N, D, S] as the "
    "carry; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _ssm_builder, dict(seqs=8, length=8192, d_inner=4096, d_state=16, recurrent=False),
    dict(seqs=8, length=8192, d_inner=4096, d_state=16, recurrent=True),
    dump=True,
)


# 17.5 a physics-informed network whose input gradient is jax.jacfwd of the batched network


def _pinn_builder(mesh, colloc, hidden, depth, per_point):
    """PINN training step for the advection equation u_t + c u_x = 0: an f32 tanh MLP u(x, t)
    evaluated on collocation points [N, 2] (over 'd'); the residual needs du/d(x, t) per point.
    per_point=False takes jax.jacfwd of the batched network (a [N, N, 2] Jacobian, its tangents
    [2N, N, hidden] through every layer) and its diagonal; True takes jax.vmap(jax.grad) of the
    per-point network. SGD, params donated."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def u_net(net, pts):
        h = pts
        for i in range(depth):
            h = jnp.tanh(h @ net[f"fc{i}"]["w"] + net[f"fc{i}"]["b"])
        return (h @ net["out"])[..., 0]

    def pinn_step(net, pts):
        def residual(net):
            if per_point:
                du = jax.vmap(jax.grad(lambda p: u_net(net, p[None])[0]))(pts)        # [N, 2]
            else:
                jac = jax.jacfwd(lambda q: u_net(net, q))(pts)                        # [N, N, 2]
                du = jnp.diagonal(jac, axis1=0, axis2=1).T                            # [N, 2]
            return jnp.mean((du[:, 1] + 0.5 * du[:, 0]) ** 2)

        loss, g = jax.value_and_grad(residual)(net)
        return _tm(lambda p, g: p - 1e-3 * g, net, g), loss

    net = {}
    d = 2
    for i in range(depth):
        net[f"fc{i}"] = {"w": sds((d, hidden), f32, mesh, P()), "b": sds((hidden,), f32, mesh, P())}
        d = hidden
    net["out"] = sds((hidden, 1), f32, mesh, P())
    pts = sds((mesh.devices.size * colloc, 2), f32, mesh, P("d"))
    return pinn_step, (net, pts), {"donate_argnums": (0,)}


pair(
    "pinn_jacfwd_batch", "v5p", "v5p:2x2x1",
    "PINN step (advection residual, f32 tanh MLP 2 -> 4x256 -> 1) on 8192 collocation points per device "
    "whose input gradient is jax.jacfwd of the batched network: a Jacobian of every output with respect to "
    "every point, tangents [2N, N, 256] through each layer, far beyond 95.74G.",
    "Fixed variant of pinn_jacfwd_batch_v5p: jax.vmap(jax.grad(...)) of the per-point network; fits.",
    dict(category="single_large_allocation", causes=["shape_bug", "large_activation"]),
    _pinn_builder, dict(colloc=8192, hidden=256, depth=4, per_point=False),
    dict(colloc=8192, hidden=256, depth=4, per_point=True),
    dump=False,
)


# 17.6 gradient accumulation that stacks every micro-batch's gradients, then averages


def _stacked_accum_builder(mesh, n_blocks, width, rows, n_micro, stack):
    """Data-parallel f32 MLP, params replicated and donated, the per-device batch split into
    n_micro micro-batches. stack=True: lax.scan returns each micro-batch's gradients as its stacked
    output ([n_micro, ...] per param) and the step averages them with .mean(0); False: the scan
    carries a running sum (initialised with the first micro-batch's gradients)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def accum_train_step(weights, feats, labels):
        def loss_fn(weights, xb, yb):
            h = xb
            for i in range(n_blocks):
                h = jax.nn.silu(h @ weights[f"block{i}"])
            return jnp.mean((h - yb) ** 2)

        grad_fn = jax.grad(loss_fn)
        split = lambda t: jax.lax.with_sharding_constraint(
            t.reshape(n_micro, -1, width), NamedSharding(mesh, P(None, "d")))
        xs, ys = split(feats), split(labels)
        if stack:
            _, per_micro = jax.lax.scan(lambda c, b: (c, grad_fn(weights, *b)), None, (xs, ys))
            grads = _tm(lambda g: g.mean(0), per_micro)
        else:
            first = grad_fn(weights, xs[0], ys[0])
            total, _ = jax.lax.scan(lambda c, b: (_tm(jnp.add, c, grad_fn(weights, *b)), None),
                                    first, (xs[1:], ys[1:]))
            grads = _tm(lambda g: g / n_micro, total)
        return _tm(lambda w, g: w - 1e-2 * g, weights, grads)

    weights = {f"block{i}": sds((width, width), f32, mesh, P()) for i in range(n_blocks)}
    n = mesh.devices.size * rows
    feats = sds((n, width), f32, mesh, P("d"))
    labels = sds((n, width), f32, mesh, P("d"))
    return accum_train_step, (weights, feats, labels), {"donate_argnums": (0,)}


pair(
    "grad_stack_microbatch", "v5p", "v5p:2x2x1",
    "Gradient accumulation over 48 micro-batches of an f32 MLP (4 blocks [12288,12288], replicated) "
    "whose lax.scan returns every micro-batch's gradients ([48,12288,12288] per block, 27 GiB each) and "
    "averages them afterwards: the stacked gradients exceed 95.74G.",
    "Fixed variant of grad_stack_microbatch_v5p: the scan carries a running sum of the gradients; fits.",
    dict(category="aggregate", causes=["large_activation", "f32_precision"]),
    _stacked_accum_builder, dict(n_blocks=4, width=12288, rows=49152, n_micro=48, stack=True),
    dict(n_blocks=4, width=12288, rows=49152, n_micro=48, stack=False),
    dump=True,
)


# 17.7 an encoder that returns every layer's attention maps (output_attentions=True)


def _attn_maps_builder(mesh, n_layers, docs, seq, d_model, heads, output_attentions):
    """Inference of a bf16 pre-LN transformer encoder (lax.scan over stacked layers), documents over
    'd'. output_attentions=True (the Hugging Face flag) makes the scan return every layer's
    attention probabilities, stacked [L, N, H, S, S]; False returns only the hidden states."""
    jax, jnp, NamedSharding, P = _jax()
    bf = jnp.bfloat16
    hd = d_model // heads

    def encode(stack, tokens):
        def block(x, p):
            n, s, _ = x.shape
            h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-6).astype(bf)
            q, k, v = (jnp.einsum("nsd,de->nse", h, p[m]).reshape(n, s, heads, hd) for m in ("wq", "wk", "wv"))
            probs = jax.nn.softmax(jnp.einsum("nqhd,nkhd->nhqk", q, k) / jnp.sqrt(hd).astype(bf), axis=-1)
            ctx = jnp.einsum("nhqk,nkhd->nqhd", probs, v).reshape(n, s, d_model)
            x = x + ctx @ p["wo"]
            x = x + jax.nn.gelu(x @ p["ff_in"]) @ p["ff_out"]
            return x, (probs if output_attentions else None)

        x, maps = jax.lax.scan(block, tokens, stack)
        return (x, maps) if output_attentions else x

    shp = lambda *s: sds((n_layers,) + s, bf, mesh, P())
    stack = {"wq": shp(d_model, d_model), "wk": shp(d_model, d_model), "wv": shp(d_model, d_model),
             "wo": shp(d_model, d_model), "ff_in": shp(d_model, 4 * d_model), "ff_out": shp(4 * d_model, d_model)}
    tokens = sds((mesh.devices.size * docs, seq, d_model), bf, mesh, P("d"))
    return encode, (stack, tokens), {}


pair(
    "attention_maps_returned", "v6e", "v6e:2x2",
    "bf16 transformer encoder (12 layers, d_model 1024, 16 heads) on 8 documents of 4096 tokens per device "
    "with output_attentions=True: the scan returns every layer's attention probabilities "
    "bf16[12,8,16,4096,4096] (48 GiB per device), beyond 31.25G.",
    "Fixed variant of attention_maps_returned_v6e: output_attentions=False (only the hidden states); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _attn_maps_builder, dict(n_layers=12, docs=8, seq=4096, d_model=1024, heads=16, output_attentions=True),
    dict(n_layers=12, docs=8, seq=4096, d_model=1024, heads=16, output_attentions=False),
    dump=True,
)



# 17.8 an RNN-T loss whose joint network is evaluated on the whole [B, T, U, V] lattice


def _rnnt_builder(mesh, utts, frames, labels, enc_dim, vocab, chunk=None):
    """RNN-Transducer training step (f32 params, bf16 joint matmul): joint(enc_t, pred_u) =
    tanh(enc_t W_e + pred_u W_p) W_out over every (t, u) pair, log-softmax over the vocabulary,
    blank and label log-probs gathered ([B, T, U] each), then the forward (alpha) recursion as a
    lax.scan over frames with an inner scan over labels. chunk=None evaluates the joint on the whole
    lattice at once (logits [B, T, U, V]); chunk=c evaluates it for c frames at a time inside
    lax.map under jax.checkpoint, keeping only the gathered [B, c, U] log-probs."""
    jax, jnp, NamedSharding, P = _jax()
    f32, bf = jnp.float32, jnp.bfloat16

    def joint_logprobs(jw, enc, pred, tgt):
        # enc [B, t, E], pred [B, U, E], tgt [B, U] -> (blank, emit) log-probs [B, t, U]
        z = jnp.tanh((enc @ jw["w_enc"])[:, :, None, :] + (pred @ jw["w_pred"])[:, None, :, :])
        logits = (z.astype(bf) @ jw["w_out"].astype(bf)).astype(f32)           # [B, t, U, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        blank = logp[..., 0]
        emit = jnp.take_along_axis(logp, jnp.broadcast_to(tgt[:, None, :, None], logp.shape[:3] + (1,)),
                                   axis=-1)[..., 0]
        return blank, emit

    def rnnt_train_step(jw, enc, pred, tgt):
        def loss_fn(jw):
            if chunk is None:
                blank, emit = joint_logprobs(jw, enc, pred, tgt)
            else:
                encs = jnp.swapaxes(enc.reshape(enc.shape[0], -1, chunk, enc.shape[-1]), 0, 1)
                fn = jax.checkpoint(lambda e: joint_logprobs(jw, e, pred, tgt))
                blank, emit = jax.lax.map(fn, encs)                             # [nc, B, c, U]
                blank, emit = (jnp.swapaxes(a, 0, 1).reshape(enc.shape[0], frames, labels) for a in (blank, emit))

            def over_t(alpha, be):                                              # alpha [B, U]
                b_t, e_t = be                                                   # [B, U]
                from_blank = alpha + b_t

                def over_u(prev, xs):
                    fb, e_prev = xs
                    cur = jnp.logaddexp(fb, prev + e_prev)
                    return cur, cur

                first = from_blank[:, 0]
                _, rest = jax.lax.scan(over_u, first, (from_blank[:, 1:].T, e_t[:, :-1].T))
                return jnp.concatenate([first[:, None], rest.T], axis=1), None

            alpha0 = jnp.concatenate([jnp.zeros((enc.shape[0], 1), f32),
                                      jnp.full((enc.shape[0], labels - 1), -1e4, f32)], axis=1)
            alpha, _ = jax.lax.scan(over_t, alpha0, (jnp.swapaxes(blank, 0, 1), jnp.swapaxes(emit, 0, 1)))
            return -jnp.mean(alpha[:, -1])

        loss, g = jax.value_and_grad(loss_fn)(jw)
        return _tm(lambda p, g: p - 1e-3 * g, jw, g), loss

    jw = {"w_enc": sds((enc_dim, enc_dim), f32, mesh, P()), "w_pred": sds((enc_dim, enc_dim), f32, mesh, P()),
          "w_out": sds((enc_dim, vocab), f32, mesh, P())}
    n = mesh.devices.size * utts
    enc = sds((n, frames, enc_dim), f32, mesh, P("d"))
    pred = sds((n, labels, enc_dim), f32, mesh, P("d"))
    tgt = sds((n, labels), jnp.int32, mesh, P("d"))
    return rnnt_train_step, (jw, enc, pred, tgt), {"donate_argnums": (0,)}


pair(
    "rnnt_joint_lattice", "v4", "v4:2x2x1",
    "RNN-T training step (joint network 512 -> 4096 word pieces) on 16 utterances of 512 frames and 128 "
    "labels per TensorCore, the joint evaluated on the whole [B, T, U, V] lattice: logits and their "
    "log-softmax [16,512,128,4096] exceed 15.25G.",
    "Fixed variant of rnnt_joint_lattice_v4: the joint evaluated 32 frames at a time (lax.map under "
    "jax.checkpoint), only the blank/label log-probs kept; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _rnnt_builder, dict(utts=16, frames=512, labels=128, enc_dim=512, vocab=4096),
    dict(utts=16, frames=512, labels=128, enc_dim=512, vocab=4096, chunk=32),
    dump=False,
)


# 17.9 a language model trained on one-hot target distributions from the input pipeline


def _onehot_targets_builder(mesh, seqs, seq, d_model, vocab, integer_targets):
    """Token-level MLP language model (bf16 params, f32 loss) trained with SGD, params donated.
    integer_targets=False: the input pipeline delivers the targets as f32 one-hot distributions
    [B, S, V] (Keras categorical_crossentropy style) and the loss is -sum(targets * log_softmax);
    True: int32 token ids [B, S] and the loss gathers the target's log-probability."""
    jax, jnp, NamedSharding, P = _jax()
    f32, bf = jnp.float32, jnp.bfloat16

    def lm_train_step(lm, ids, targets):
        def loss_fn(lm):
            h = jnp.take(lm["tok_emb"], ids, axis=0)
            h = h + jax.nn.gelu(h @ lm["ff_up"]) @ lm["ff_down"]
            logp = jax.nn.log_softmax((h @ lm["unembed"]).astype(f32), axis=-1)      # [B, S, V]
            if integer_targets:
                return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
            return -jnp.mean(jnp.sum(targets * logp, axis=-1))

        loss, g = jax.value_and_grad(loss_fn)(lm)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), lm, g), loss

    lm = {"tok_emb": sds((vocab, d_model), bf, mesh, P()), "ff_up": sds((d_model, 4 * d_model), bf, mesh, P()),
          "ff_down": sds((4 * d_model, d_model), bf, mesh, P()), "unembed": sds((d_model, vocab), bf, mesh, P())}
    n = mesh.devices.size * seqs
    ids = sds((n, seq), jnp.int32, mesh, P("d"))
    if integer_targets:
        targets = sds((n, seq), jnp.int32, mesh, P("d"))
    else:
        targets = sds((n, seq, vocab), f32, mesh, P("d"))
    return lm_train_step, (lm, ids, targets), {"donate_argnums": (0,)}


pair(
    "onehot_targets", "v5e", "v5e:2x2",
    "Token-level language model (d_model 1024, vocabulary 65536) on 16 sequences of 2048 tokens per device, "
    "the targets delivered as f32 one-hot distributions [B, S, V] (8 GiB per device) and used as "
    "-sum(targets * log_softmax(logits)): with the logits and their gradient it exceeds 15.75G.",
    "Fixed variant of onehot_targets_v5e: int32 target ids [B, S] and take_along_axis on the log-probs; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "f32_precision", "batch_too_large"]),
    _onehot_targets_builder, dict(seqs=16, seq=2048, d_model=1024, vocab=65536, integer_targets=False),
    dict(seqs=16, seq=2048, d_model=1024, vocab=65536, integer_targets=True),
    dump=True,
)


# 17.10 a CLIP loss in shard_map where every device builds the whole global similarity matrix


def _clip_gather_builder(mesh, pairs, feat, embed, local_rows):
    """CLIP-style contrastive step in jax.shard_map (projection heads f32, replicated; image/text
    features over 'd'): both embeddings are all-gathered into the global batch. local_rows=False
    then computes the global [B_global, B_global] similarity matrix and the symmetric cross-entropy
    on every device (the same matrix everywhere); True computes only this device's rows against the
    gathered other modality ([b, B_global] for images->texts and for texts->images), labels offset
    by jax.lax.axis_index. Gradients pmean'ed, SGD, heads donated."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def unit(z):
        return z * jax.lax.rsqrt(jnp.sum(z * z, axis=-1, keepdims=True) + 1e-12)

    def xent(logits, labels):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[:, None], axis=-1))

    def local_step(heads, img_feats, txt_feats):
        def loss_fn(heads):
            zi = unit(img_feats @ heads["img_proj"])
            zt = unit(txt_feats @ heads["txt_proj"])
            all_i = jax.lax.all_gather(zi, "d", tiled=True)
            all_t = jax.lax.all_gather(zt, "d", tiled=True)
            temp = jnp.exp(heads["log_temp"])
            if local_rows:
                lbl = jax.lax.axis_index("d") * zi.shape[0] + jnp.arange(zi.shape[0])
                return 0.5 * (xent(temp * zi @ all_t.T, lbl) + xent(temp * zt @ all_i.T, lbl))
            sim = temp * all_i @ all_t.T                                 # [B_global, B_global]
            lbl = jnp.arange(sim.shape[0])
            return 0.5 * (xent(sim, lbl) + xent(sim.T, lbl))

        loss, g = jax.value_and_grad(loss_fn)(heads)
        g = jax.lax.pmean(g, "d")
        return _tm(lambda p, g: p - 1e-3 * g, heads, g), jax.lax.pmean(loss, "d")

    step = jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=(P(), P()),
                         check_vma=False)

    def clip_train_step(heads, img_feats, txt_feats):
        return step(heads, img_feats, txt_feats)

    heads = {"img_proj": sds((feat, embed), f32, mesh, P()), "txt_proj": sds((feat, embed), f32, mesh, P()),
             "log_temp": sds((), f32, mesh, P())}
    n = mesh.devices.size * pairs
    img_feats = sds((n, feat), f32, mesh, P("d"))
    txt_feats = sds((n, feat), f32, mesh, P("d"))
    return clip_train_step, (heads, img_feats, txt_feats), {"donate_argnums": (0,)}


pair(
    "clip_global_similarity", "v5e", "v5e:4x4",
    "CLIP-style contrastive step in jax.shard_map on 16 v5e chips (4096 image-text pairs per device, "
    "65536 global): both embeddings all-gathered and the whole f32[65536,65536] similarity matrix "
    "(16 GiB) computed on every device, beyond 15.75G.",
    "Fixed variant of clip_global_similarity_v5e: each device computes only its own rows against the "
    "gathered other modality ([4096, 65536] per direction); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "large_activation", "batch_too_large"]),
    _clip_gather_builder, dict(pairs=4096, feat=1024, embed=512, local_rows=False),
    dict(pairs=4096, feat=1024, embed=512, local_rows=True),
    dump=True,
)


# ---- 18. more broken/fixed pairs (batch tpu7): other models, other names ----------------------
#
# Programs of kinds sections 13-17 do not have (a beam search that returns every step's scores, an
# additive attention bias delivered by the input pipeline as f32 [B, H, S, S], a surrogate model
# trained with jax_enable_x64 left on, packed sequences attending across the whole pack, a remat
# policy that saves every matmul, a video transformer with joint space-time attention, per-layer
# relative-position biases gathered for all layers before the scan, a segmentation head upsampled to
# full resolution before the loss, dropout masks drawn for all layers at once). The same
# conventions: the fixed twin changes exactly the first cause. Five keep their dumps (dump=True);
# the others only stderr.log / exception.txt / meta.json.
# (Tried and dropped: einsums contracted in the written order with optimize=False, a bilinear head
# 'bi,bj,ijk->bk' (outer product bf16[65536,1024,1024] first) and a linear-kernel score
# 'nd,md,m->n' (Gram matrix bf16[262144,262144] first): both compiled, the bilinear one at
# the same 0.44 GiB peak as optimize='optimal', the intermediate never materialized; a
# tensor-parallel MLP on a 4 x 4 ('batch', 'model') mesh whose hidden activation was constrained to
# P('batch', None): 15.01G / 13.42G of program against 14.63G / 12.88G with P('batch', 'model') at
# two sizes, both fit, the constraint barely moved the peak.)


# 18.1 beam search that returns the full score distribution of every decoding step


def _beam_search_builder(mesh, prompts, beams, steps, d_model, vocab, output_scores):
    """Beam-search decoding of a small recurrent bf16 decoder (state [B*K, D], tied to a token
    embedding). Each step scores every beam's continuations, log_softmax over the vocabulary in f32,
    adds the beam scores and keeps the top `beams` of K*V with lax.top_k. output_scores=True (the
    Hugging Face generate() flag) makes the lax.scan return each step's [B, K, V] scores, stacked
    [T, B, K, V]; False returns only the chosen token ids and beam scores ([T, B, K])."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def generate_beams(dec, start_state):
        b = start_state.shape[0]

        def decode_step(carry, _):
            state, beam_logp, last_tok = carry                                  # [B,K,D], [B,K], [B,K]
            x = jnp.take(dec["tok_embed"], last_tok, axis=0)                    # [B,K,D]
            state = jnp.tanh(state @ dec["w_state"] + x @ dec["w_input"])
            logp = jax.nn.log_softmax((state @ dec["w_vocab"]).astype(f32), axis=-1)   # [B,K,V]
            cand = beam_logp[..., None] + logp
            best, flat = jax.lax.top_k(cand.reshape(b, beams * vocab), beams)
            src, tok = flat // vocab, flat % vocab
            state = jnp.take_along_axis(state, src[..., None], axis=1)
            out = (tok, best, cand) if output_scores else (tok, best)
            return (state, best, tok), out

        init = (jnp.broadcast_to(start_state[:, None, :], (b, beams, d_model)).astype(bf),
                jnp.zeros((b, beams), f32).at[:, 1:].set(-1e9), jnp.zeros((b, beams), jnp.int32))
        _, outs = jax.lax.scan(decode_step, init, None, length=steps)
        return outs

    dec = {"tok_embed": sds((vocab, d_model), bf, mesh, P()), "w_state": sds((d_model, d_model), bf, mesh, P()),
           "w_input": sds((d_model, d_model), bf, mesh, P()), "w_vocab": sds((d_model, vocab), bf, mesh, P())}
    start_state = sds((mesh.devices.size * prompts, d_model), bf, mesh, P("d"))
    return generate_beams, (dec, start_state), {}


pair(
    "beam_search_scores", "v5e", "v5e:2x2",
    "Beam search (4 beams, 256 steps, vocabulary 32768) for 128 prompts per device with output_scores=True: "
    "the decoding scan returns every step's f32 [B, K, V] scores, stacked f32[256,128,4,32768] (16 GiB per "
    "device), beyond 15.75G.",
    "Fixed variant of beam_search_scores_v5e: output_scores=False, the scan returns only the chosen token ids "
    "and beam scores [T, B, K]; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _beam_search_builder, dict(prompts=128, beams=4, steps=256, d_model=1024, vocab=32768, output_scores=True),
    dict(prompts=128, beams=4, steps=256, d_model=1024, vocab=32768, output_scores=False),
    dump=True,
)


# 18.2 an additive attention bias built by the input pipeline as f32 [B, H, S, S]


def _attn_bias_input_builder(mesh, n_layers, docs, seq, d_model, heads, bias_from_pipeline):
    """Inference of a bf16 encoder with ALiBi-style per-head linear biases plus key padding
    (lax.scan over stacked layers, documents over 'd'). bias_from_pipeline=True: the input pipeline
    delivers the whole additive bias as f32[B, H, S, S] (slopes * distance, -1e9 on padded keys),
    an argument of the step; False: the step gets int32 lengths [B] and builds the bias inside the
    attention from iota (fused into the softmax, never stored)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    slopes = 2.0 ** (-8.0 * (jnp.arange(heads, dtype=f32) + 1) / heads)

    def encode_docs(enc, tokens, mask_info):
        n, s, _ = tokens.shape
        if bias_from_pipeline:
            bias = mask_info
        else:
            pos = jnp.arange(s)
            dist = -jnp.abs(pos[:, None] - pos[None, :]).astype(f32)              # [S, S]
            keep = pos[None, :] < mask_info[:, None]                              # [B, S]
            bias = jnp.where(keep[:, None, None, :], slopes[None, :, None, None] * dist, -1e9)

        def layer(x, p):
            h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(f32)), -1, keepdims=True) + 1e-6).astype(bf)
            q, k, v = (jnp.einsum("nsd,de->nse", h, p[m]).reshape(n, s, heads, hd) for m in ("q", "k", "v"))
            logits = jnp.einsum("nqhd,nkhd->nhqk", q, k).astype(f32) / jnp.sqrt(f32(hd)) + bias
            probs = jax.nn.softmax(logits, axis=-1).astype(bf)
            ctx = jnp.einsum("nhqk,nkhd->nqhd", probs, v).reshape(n, s, d_model)
            x = x + ctx @ p["o"]
            return x + jax.nn.gelu(x @ p["mlp_in"]) @ p["mlp_out"], None

        x, _ = jax.lax.scan(layer, tokens, enc)
        return x

    shp = lambda *s: sds((n_layers,) + s, bf, mesh, P())
    enc = {"q": shp(d_model, d_model), "k": shp(d_model, d_model), "v": shp(d_model, d_model),
           "o": shp(d_model, d_model), "mlp_in": shp(d_model, 4 * d_model), "mlp_out": shp(4 * d_model, d_model)}
    n = mesh.devices.size * docs
    tokens = sds((n, seq, d_model), bf, mesh, P("d"))
    if bias_from_pipeline:
        mask_info = sds((n, heads, seq, seq), f32, mesh, P("d"))
    else:
        mask_info = sds((n,), jnp.int32, mesh, P("d"))
    return encode_docs, (enc, tokens, mask_info), {}


pair(
    "attn_bias_input", "v6e", "v6e:2x2",
    "bf16 encoder inference (8 layers, d_model 1024, 16 heads) on 24 documents of 4096 tokens per device whose "
    "input pipeline delivers the ALiBi + key-padding bias as f32[B,16,4096,4096] (24 GiB per device); with "
    "the attention probabilities it exceeds 31.25G.",
    "Fixed variant of attn_bias_input_v6e: int32 document lengths [B], the bias built inside the attention "
    "from iota; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _attn_bias_input_builder, dict(n_layers=8, docs=24, seq=4096, d_model=1024, heads=16, bias_from_pipeline=True),
    dict(n_layers=8, docs=24, seq=4096, d_model=1024, heads=16, bias_from_pipeline=False),
    dump=True,
)


# 18.3 a surrogate model trained with jax_enable_x64 left on


def _x64_surrogate_builder(mesh, n_hidden, width, rows, x64):
    """A neural surrogate of a simulator (softplus MLP, params replicated and donated, SGD) trained
    in a process where jax_enable_x64 is on (switched on for the reference ODE solver): params and
    samples come from numpy float64 arrays, so everything is f64. x64=False: the flag off, the
    same program in f32."""
    jax, jnp, NamedSharding, P = _jax()
    jax.config.update("jax_enable_x64", bool(x64))
    import numpy as np
    dt = jnp.dtype(np.float64) if x64 else jnp.dtype(np.float32)

    def surrogate_step(theta, samples, responses):
        def mse(theta):
            z = samples
            for i in range(n_hidden):
                z = jax.nn.softplus(z @ theta[f"hidden_{i}"])
            return jnp.mean((z @ theta["readout"] - responses) ** 2)

        loss, g = jax.value_and_grad(mse)(theta)
        return _tm(lambda p, g: p - 1e-3 * g, theta, g), loss

    theta = {f"hidden_{i}": sds((width, width), dt, mesh, P()) for i in range(n_hidden)}
    theta["readout"] = sds((width, 8), dt, mesh, P())
    n = mesh.devices.size * rows
    samples = sds((n, width), dt, mesh, P("d"))
    responses = sds((n, 8), dt, mesh, P("d"))
    return surrogate_step, (theta, samples, responses), {"donate_argnums": (0,)}


pair(
    "x64_surrogate", "v4", "v4:2x2x1",
    "Simulator surrogate (softplus MLP, 6 x [8192,8192]) trained on 32768 samples per TensorCore with "
    "jax_enable_x64 left on: params, samples and every activation in f64, beyond 15.25G.",
    "Fixed variant of x64_surrogate_v4: jax_enable_x64 off, the same program in f32; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "batch_too_large", "no_remat"]),
    _x64_surrogate_builder, dict(n_hidden=6, width=8192, rows=32768, x64=True),
    dict(n_hidden=6, width=8192, rows=32768, x64=False),
    dump=False,
)


# 18.4 packed sequences whose attention spans the whole pack


def _packed_attention_builder(mesh, n_layers, packs, docs_per_pack, doc_len, d_model, heads, packed):
    """Inference of a bf16 encoder over documents of doc_len tokens (lax.scan over stacked layers).
    packed=True: the data loader concatenates docs_per_pack documents into one row (T5X-style packing)
    with segment ids, and attention runs over the whole row with a same-segment mask
    ([packs, H, R, R] scores for rows of R = docs_per_pack * doc_len tokens); False: the documents
    stay separate rows [packs * docs_per_pack, doc_len] and attend within themselves."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def encode_packed(weights, rows, segment_ids):
        n, s, _ = rows.shape
        same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]    # [N, 1, S, S]

        def layer(x, p):
            h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(f32)), -1, keepdims=True) + 1e-6).astype(bf)
            q, k, v = (jnp.einsum("nsd,de->nse", h, p[m]).reshape(n, s, heads, hd) for m in ("wq", "wk", "wv"))
            att = jnp.einsum("nqhd,nkhd->nhqk", q, k).astype(f32) / jnp.sqrt(f32(hd))
            probs = jax.nn.softmax(jnp.where(same, att, -1e9), axis=-1).astype(bf)
            x = x + jnp.einsum("nhqk,nkhd->nqhd", probs, v).reshape(n, s, d_model) @ p["wo"]
            return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"], None

        x, _ = jax.lax.scan(layer, rows, weights)
        return x

    shp = lambda *s: sds((n_layers,) + s, bf, mesh, P())
    weights = {"wq": shp(d_model, d_model), "wk": shp(d_model, d_model), "wv": shp(d_model, d_model),
               "wo": shp(d_model, d_model), "w1": shp(d_model, 4 * d_model), "w2": shp(4 * d_model, d_model)}
    nd = mesh.devices.size
    if packed:
        rows = sds((nd * packs, docs_per_pack * doc_len, d_model), bf, mesh, P("d"))
        segment_ids = sds((nd * packs, docs_per_pack * doc_len), jnp.int32, mesh, P("d"))
    else:
        rows = sds((nd * packs * docs_per_pack, doc_len, d_model), bf, mesh, P("d"))
        segment_ids = sds((nd * packs * docs_per_pack, doc_len), jnp.int32, mesh, P("d"))
    return encode_packed, (weights, rows, segment_ids), {}


pair(
    "packed_attention", "v5p", "v5p:2x2x1",
    "bf16 encoder inference (6 layers, d_model 1024, 16 heads) on 4 packed rows per device, each 16 documents "
    "of 2048 tokens concatenated (32768 tokens) with a same-segment mask: the attention spans the whole row, "
    "probabilities bf16[4,16,32768,32768] (128 GiB per device), beyond 95.74G.",
    "Fixed variant of packed_attention_v5p: the 64 documents as separate rows of 2048 tokens; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _packed_attention_builder, dict(n_layers=6, packs=4, docs_per_pack=16, doc_len=2048, d_model=1024, heads=16,
                                    packed=True),
    dict(n_layers=6, packs=4, docs_per_pack=16, doc_len=2048, d_model=1024, heads=16, packed=False),
    dump=True,
)


# 18.5 jax.checkpoint with a policy that saves every matmul output


def _remat_policy_builder(mesh, n_blocks, d_model, d_ff, tokens, policy):
    """Training step of a stack of pre-LN feed-forward blocks (bf16, lax.scan over stacked params,
    SGD, params donated) on tokens [N, D] over 'd'. The scanned block is wrapped in
    jax.checkpoint(policy=jax.checkpoint_policies.<policy>): 'dots_saveable' keeps every matmul
    output of every block for the backward ([L, N, F] stacks); 'nothing_saveable' keeps only the
    block inputs and recomputes the rest."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def ff_block(x, p):
        h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(f32)), -1, keepdims=True) + 1e-6).astype(bf)
        h = h * p["norm_scale"]
        up = h @ p["w_up"]
        gate = h @ p["w_gate"]
        return x + (jax.nn.silu(gate) * up) @ p["w_down"], None

    block = jax.checkpoint(ff_block, policy=getattr(jax.checkpoint_policies, policy))

    def mixer_train_step(stack, x, y):
        def loss_fn(stack):
            out, _ = jax.lax.scan(block, x, stack)
            return jnp.mean(jnp.square((out - y).astype(f32)))

        loss, g = jax.value_and_grad(loss_fn)(stack)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), stack, g), loss

    stack = {"norm_scale": sds((n_blocks, d_model), bf, mesh, P()),
             "w_up": sds((n_blocks, d_model, d_ff), bf, mesh, P()),
             "w_gate": sds((n_blocks, d_model, d_ff), bf, mesh, P()),
             "w_down": sds((n_blocks, d_ff, d_model), bf, mesh, P())}
    n = mesh.devices.size * tokens
    x = sds((n, d_model), bf, mesh, P("d"))
    y = sds((n, d_model), bf, mesh, P("d"))
    return mixer_train_step, (stack, x, y), {"donate_argnums": (0,)}


pair(
    "remat_policy_dots", "v5e", "v5e:2x2",
    "Training step of 16 gated feed-forward blocks (bf16, d_model 1024, d_ff 4096) on 49152 tokens per device, "
    "the scanned block under jax.checkpoint(policy=jax.checkpoint_policies.dots_saveable): every block's "
    "up and gate projections ([16,49152,4096] bf16 stacks) are kept for the backward, beyond 15.75G.",
    "Fixed variant of remat_policy_dots_v5e: policy=jax.checkpoint_policies.nothing_saveable; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _remat_policy_builder, dict(n_blocks=16, d_model=1024, d_ff=4096, tokens=49152, policy="dots_saveable"),
    dict(n_blocks=16, d_model=1024, d_ff=4096, tokens=49152, policy="nothing_saveable"),
    dump=False,
)


# 18.6 a video transformer with joint space-time attention over every frame's patches


def _video_attention_builder(mesh, n_layers, clips, frames, patches, d_model, heads, divided):
    """Inference of a bf16 video transformer (TimeSformer-like, lax.scan over stacked layers) on patch
    tokens [B, T, P, D] over 'd'. divided=False: joint space-time attention over all T*P tokens of a
    clip ([B, H, T*P, T*P] scores); True: divided attention, first over time for each patch
    ([B*P, H, T, T]), then over space within each frame ([B*T, H, P, P])."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def attend(x, p, pre):
        n, s, _ = x.shape
        q, k, v = (jnp.einsum("nsd,de->nse", x, p[pre + m]).reshape(n, s, heads, hd) for m in ("q", "k", "v"))
        w = jax.nn.softmax(jnp.einsum("nqhd,nkhd->nhqk", q, k).astype(f32) / jnp.sqrt(f32(hd)), -1).astype(bf)
        return jnp.einsum("nhqk,nkhd->nqhd", w, v).reshape(n, s, d_model) @ p[pre + "o"]

    def classify_clips(vit, tubes):
        b, t, pn, d = tubes.shape

        def layer(x, p):
            if divided:
                xt = jnp.swapaxes(x, 1, 2).reshape(b * pn, t, d)
                x = x + jnp.swapaxes(attend(xt, p, "t_").reshape(b, pn, t, d), 1, 2)
                x = x + attend(x.reshape(b * t, pn, d), p, "s_").reshape(b, t, pn, d)
            else:
                x = x + attend(x.reshape(b, t * pn, d), p, "s_").reshape(b, t, pn, d)
            return x + jax.nn.gelu(x @ p["fc1"]) @ p["fc2"], None

        x, _ = jax.lax.scan(layer, tubes, vit["layers"])
        return x.mean(axis=(1, 2)) @ vit["head"]

    shp = lambda *s: sds((n_layers,) + s, bf, mesh, P())
    layers = {pre + m: shp(d_model, d_model) for pre in ("s_", "t_") for m in ("q", "k", "v", "o")}
    layers.update(fc1=shp(d_model, 4 * d_model), fc2=shp(4 * d_model, d_model))
    vit = {"layers": layers, "head": sds((d_model, 400), bf, mesh, P())}
    tubes = sds((mesh.devices.size * clips, frames, patches, d_model), bf, mesh, P("d"))
    return classify_clips, (vit, tubes), {}


pair(
    "video_joint_attention", "v6e", "v6e:2x2",
    "Video transformer inference (12 layers, d_model 768, 12 heads) on 8 clips of 32 frames x 256 patches per "
    "device with joint space-time attention over all 8192 tokens of a clip: the f32 scores "
    "[8,12,8192,8192] (24 GiB per device) next to their softmax exceed 31.25G.",
    "Fixed variant of video_joint_attention_v6e: divided space-time attention (over the 32 frames per patch, "
    "then over the 256 patches per frame); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _video_attention_builder, dict(n_layers=12, clips=8, frames=32, patches=256, d_model=768, heads=12,
                                   divided=False),
    dict(n_layers=12, clips=8, frames=32, patches=256, d_model=768, heads=12, divided=True),
    dump=True,
)


# 18.7 per-layer relative-position biases computed for every layer before the layer scan


def _relpos_bias_builder(mesh, n_layers, docs, seq, d_model, heads, buckets, per_layer_in_scan):
    """Inference of a bf16 encoder where every layer has its own learned relative-position bias table
    [buckets, H] (T5-style log buckets). per_layer_in_scan=False: the biases of all layers are gathered
    before the lax.scan over layers, bias f32[L, H, S, S], and fed to the scan as xs;
    True: the [S, S] bucket ids are computed once and each layer gathers its own table inside the scan."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def bucket_ids(s):
        rel = jnp.arange(s)[None, :] - jnp.arange(s)[:, None]
        half = buckets // 2
        sign = (rel > 0).astype(jnp.int32) * half
        a = jnp.abs(rel)
        exact = half // 2
        big = exact + (jnp.log(jnp.maximum(a, 1).astype(f32) / exact) / jnp.log(f32(seq) / exact)
                       * (half - exact)).astype(jnp.int32)
        return sign + jnp.where(a < exact, a, jnp.minimum(big, half - 1))         # [S, S]

    def encode_relpos(enc, tokens):
        n, s, _ = tokens.shape
        ids = bucket_ids(s)

        def layer(x, xs):
            p, bias = xs
            if bias is None:
                bias = jnp.transpose(p["rel_table"][ids], (2, 0, 1))              # [H, S, S]
            h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(f32)), -1, keepdims=True) + 1e-6).astype(bf)
            q, k, v = (jnp.einsum("nsd,de->nse", h, p[m]).reshape(n, s, heads, hd) for m in ("wq", "wk", "wv"))
            att = jnp.einsum("nqhd,nkhd->nhqk", q, k).astype(f32) + bias[None]
            probs = jax.nn.softmax(att, axis=-1).astype(bf)
            x = x + jnp.einsum("nhqk,nkhd->nqhd", probs, v).reshape(n, s, d_model) @ p["wo"]
            return x + jax.nn.relu(x @ p["wi"]) @ p["wf"], None

        if per_layer_in_scan:
            x, _ = jax.lax.scan(layer, tokens, (enc, None))
        else:
            all_bias = jnp.transpose(enc["rel_table"][:, ids], (0, 3, 1, 2))     # [L, H, S, S] f32
            x, _ = jax.lax.scan(layer, tokens, (enc, all_bias))
        return x

    shp = lambda *s: sds((n_layers,) + s, bf, mesh, P())
    enc = {"wq": shp(d_model, d_model), "wk": shp(d_model, d_model), "wv": shp(d_model, d_model),
           "wo": shp(d_model, d_model), "wi": shp(d_model, 4 * d_model), "wf": shp(4 * d_model, d_model),
           "rel_table": sds((n_layers, buckets, heads), f32, mesh, P())}
    tokens = sds((mesh.devices.size * docs, seq, d_model), bf, mesh, P("d"))
    return encode_relpos, (enc, tokens), {}


pair(
    "relpos_bias_all_layers", "v4", "v4:2x2x1",
    "bf16 encoder inference (16 layers, d_model 1024, 16 heads, a relative-position bias table per layer) on "
    "2 documents of 4096 tokens per TensorCore, the biases of all layers gathered before the layer scan: "
    "f32[16,16,4096,4096] (16 GiB), beyond 15.25G.",
    "Fixed variant of relpos_bias_all_layers_v4: each layer gathers its own bias from the bucket ids inside "
    "the scan; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "padding", "f32_precision"]),
    _relpos_bias_builder, dict(n_layers=16, docs=2, seq=4096, d_model=1024, heads=16, buckets=32,
                               per_layer_in_scan=False),
    dict(n_layers=16, docs=2, seq=4096, d_model=1024, heads=16, buckets=32, per_layer_in_scan=True),
    dump=True,
)


# 18.8 a segmentation head whose logits are upsampled to the full resolution before the loss


def _seg_head_builder(mesh, images, size, feat, classes, full_res_loss):
    """Training step of a SegFormer-style all-MLP decode head (f32) on backbone features at 1/4
    resolution [B, H/4, W/4, C] over 'd', labels int32 [B, H, W]. full_res_loss=True: the logits are
    bilinearly upsampled to [B, H, W, K] (jax.image.resize) before the softmax cross-entropy;
    False: the labels are subsampled to 1/4 resolution and the loss is taken there."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def seg_train_step(head, fmap, labels):
        def loss_fn(head):
            z = jax.nn.relu(fmap @ head["fuse"])
            logits = z @ head["classify"]                                        # [B, h, w, K]
            if full_res_loss:
                b, h, w, k = logits.shape
                logits = jax.image.resize(logits, (b, size, size, k), "bilinear")
                lbl = labels
            else:
                lbl = labels[:, ::4, ::4]
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, lbl[..., None], axis=-1))

        loss, g = jax.value_and_grad(loss_fn)(head)
        return _tm(lambda p, g: p - 1e-3 * g, head, g), loss

    head = {"fuse": sds((feat, 256), f32, mesh, P()), "classify": sds((256, classes), f32, mesh, P())}
    n = mesh.devices.size * images
    fmap = sds((n, size // 4, size // 4, feat), f32, mesh, P("d"))
    labels = sds((n, size, size), jnp.int32, mesh, P("d"))
    return seg_train_step, (head, fmap, labels), {"donate_argnums": (0,)}


pair(
    "seg_logits_full_res", "v5p", "v5p:2x2x1",
    "SegFormer-style decode head (150 classes, f32) trained on 80 images of 1024x1024 per device, the 1/4-"
    "resolution logits bilinearly upsampled to f32[80,1024,1024,150] before the cross-entropy: the "
    "full-resolution logits, log-softmax and gradients exceed 95.74G.",
    "Fixed variant of seg_logits_full_res_v5p: the labels subsampled to 1/4 resolution, the loss on the "
    "decoder's own logits; fits.",
    dict(category="aggregate", category_also=["single_large_allocation"],
         causes=["large_activation", "f32_precision", "batch_too_large"]),
    _seg_head_builder, dict(images=80, size=1024, feat=512, classes=150, full_res_loss=True),
    dict(images=80, size=1024, feat=512, classes=150, full_res_loss=False),
    dump=False,
)


# 18.9 dropout masks drawn for every layer at once, before the layer scan


def _dropout_masks_builder(mesh, n_layers, seqs, seq, d_model, d_ff, rate, per_layer_keys):
    """Training step of a bf16 feed-forward stack (lax.scan over stacked params, jax.checkpoint on
    the block, SGD, params donated) with dropout on the [N, S, F] hidden of every layer.
    per_layer_keys=False: one jax.random.bernoulli call draws the keep masks of all layers up front,
    [L, N, S, F], and the scan consumes them as xs; True: the scan gets one PRNG key per layer
    (jax.random.split) and draws its layer's mask inside the block."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def ff_train_step(ffn, seqs_in, rng):
        def loss_fn(ffn):
            def block(x, xs):
                p, drop = xs
                h = jax.nn.gelu(x @ p["up"])
                if per_layer_keys:
                    drop = jax.random.bernoulli(drop, 1.0 - rate, h.shape)
                h = jnp.where(drop, h / (1.0 - rate), 0).astype(bf)
                return x + h @ p["down"], None

            b, s, _ = seqs_in.shape
            if per_layer_keys:
                drops = jax.random.split(rng, n_layers)
            else:
                drops = jax.random.bernoulli(rng, 1.0 - rate, (n_layers, b, s, d_ff))
            out, _ = jax.lax.scan(jax.checkpoint(block), seqs_in, (ffn, drops))
            return jnp.mean(jnp.square(out.astype(f32)))

        loss, g = jax.value_and_grad(loss_fn)(ffn)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), ffn, g), loss

    ffn = {"up": sds((n_layers, d_model, d_ff), bf, mesh, P()), "down": sds((n_layers, d_ff, d_model), bf, mesh, P())}
    seqs_in = sds((mesh.devices.size * seqs, seq, d_model), bf, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, P())
    return ff_train_step, (ffn, seqs_in, rng), {"donate_argnums": (0,)}


pair(
    "dropout_masks_upfront", "v6e", "v6e:2x2",
    "Training step of 24 checkpointed feed-forward blocks (bf16, 1024 -> 4096) on 96 sequences of 2048 tokens "
    "per device with dropout 0.1 whose keep masks for all layers are drawn by one jax.random.bernoulli call "
    "before the layer scan: pred[24,96,2048,4096] (18 GiB) plus the random bits behind it, beyond 31.25G.",
    "Fixed variant of dropout_masks_upfront_v6e: one PRNG key per layer (jax.random.split), each block draws "
    "its own mask; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _dropout_masks_builder, dict(n_layers=24, seqs=96, seq=2048, d_model=1024, d_ff=4096, rate=0.1,
                                 per_layer_keys=False),
    dict(n_layers=24, seqs=96, seq=2048, d_model=1024, d_ff=4096, rate=0.1, per_layer_keys=True),
    dump=False,
)


# ---- 19. more broken/fixed pairs (batch tpu8): other models, other names ----------------------
#
# Programs of kinds sections 13-18 do not have (a MoCo queue of negatives kept replicated, an RLHF
# policy step with a frozen f32 reference copy for the KL penalty, a hashed n-gram embedding table
# replicated, an eval loop that stacks every batch's logits before the metrics, a Pallas layer-norm
# kernel whose row block fits v6e's scoped VMEM but not v5e's, a NeRF step with too many rays per
# device, Shampoo preconditioner statistics replicated under data parallelism, a point-cloud Chamfer
# loss over the full pairwise distance matrix). The same conventions: the fixed twin changes exactly
# the first cause. About half keep their dumps (dump=True); the others only stderr.log /
# exception.txt / meta.json.


# 19.1 a MoCo queue of negatives kept replicated on every device


def _moco_queue_builder(mesh, queue_len, dim, d_in, per_device, queue_spec, temp=0.07, m=0.999):
    """MoCo v2 step: a query encoder (2-layer MLP, bf16 weights) trained with InfoNCE against the
    positive key of a momentum encoder and a queue of past keys f32[K, dim] as negatives; the
    momentum encoder is an EMA of the query encoder. The queue is kept as [W, K/W, dim], one slot
    range per data-parallel worker, and each worker's new keys are enqueued into its own range with
    dynamic_update_slice (queue donated). queue_spec P(): the queue replicated on every device;
    P('d', None, None): each worker's range on its own device."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def encode(p, x):
        return jnp.tanh(x @ p["proj_a"]) @ p["proj_b"]

    def moco_update(online, momentum, negatives, ptr, view_q, view_k):
        def info_nce(online):
            q = encode(online, view_q).astype(f32)
            q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
            k = encode(momentum, view_k).astype(f32)
            k = jax.lax.stop_gradient(k / jnp.linalg.norm(k, axis=-1, keepdims=True))
            pos = jnp.sum(q * k, -1) / temp
            neg = q @ negatives.reshape(-1, dim).T / temp                         # [B, K] f32
            return jnp.mean(jnp.logaddexp(pos, jax.nn.logsumexp(neg, axis=-1)) - pos), k

        (loss, keys), g = jax.value_and_grad(info_nce, has_aux=True)(online)
        online = _tm(lambda p, g: (p - 0.03 * g).astype(p.dtype), online, g)
        momentum = _tm(lambda a, b: (m * a + (1 - m) * b).astype(a.dtype), momentum, online)
        keys = keys.reshape(negatives.shape[0], -1, dim)                          # [W, B/W, dim]
        negatives = jax.lax.dynamic_update_slice_in_dim(negatives, keys, ptr, axis=1)
        return online, momentum, negatives, loss

    net = lambda: {"proj_a": sds((d_in, 4096), bf, mesh, P()), "proj_b": sds((4096, dim), bf, mesh, P())}
    workers = mesh.devices.size
    negatives = sds((workers, queue_len // workers, dim), f32, mesh, queue_spec)
    ptr = sds((), jnp.int32, mesh, P())
    n = mesh.devices.size * per_device
    view_q = sds((n, d_in), bf, mesh, P("d"))
    view_k = sds((n, d_in), bf, mesh, P("d"))
    return moco_update, (net(), net(), negatives, ptr, view_q, view_k), {"donate_argnums": (0, 1, 2)}


pair(
    "moco_queue_replicated", "v5e", "v5e:2x2",
    "MoCo v2 step on 256 image pairs per device with a queue of 4194304 negatives f32[4,1048576,1024] (16 GiB) "
    "replicated on every device: the queue alone exceeds 15.75G.",
    "Fixed variant of moco_queue_replicated_v5e: each worker's queue range on its own device, P('d', None, None) "
    "(4 GiB per device); fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed", "f32_precision"]),
    _moco_queue_builder, dict(queue_len=4194304, dim=1024, d_in=2048, per_device=256, queue_spec=_P()),
    dict(queue_len=4194304, dim=1024, d_in=2048, per_device=256, queue_spec=_P("d", None, None)),
    dump=True,
)


# 19.2 an RLHF policy step with a frozen f32 reference copy of the policy for the KL penalty


def _rlhf_ref_builder(mesh, n_blocks, d_model, d_ff, vocab, seqs, seq, ref_dtype):
    """Policy-gradient step of a bf16 language model (token embedding, lax.scan over stacked
    feed-forward blocks under jax.checkpoint, tied output head) with a KL penalty against a frozen
    reference model. The reference is a copy of the initial policy kept in `ref_dtype` ("float32":
    the checkpoint as loaded; "bfloat16": the policy's own dtype). Policy and reference replicated,
    the policy donated; rollouts [N, S] over 'd'."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def logprobs(w, toks):
        x = jnp.take(w["embed"], toks, axis=0)

        def blk(h, p):
            h = h.astype(p["up"].dtype)
            return h + jax.nn.gelu(h @ p["up"]) @ p["down"], None

        x, _ = jax.lax.scan(jax.checkpoint(blk), x, w["blocks"])
        return jax.nn.log_softmax((x @ w["embed"].T).astype(f32), axis=-1)      # [N, S, V]

    def rlhf_policy_step(actor, reference, rollouts, advantages):
        def objective(actor):
            lp = logprobs(actor, rollouts)
            lp_ref = jax.lax.stop_gradient(logprobs(reference, rollouts))
            taken = jnp.take_along_axis(lp, rollouts[..., None], axis=-1)[..., 0]
            kl = jnp.sum(jnp.exp(lp) * (lp - lp_ref), axis=-1)
            return -jnp.mean(taken * advantages) + 0.05 * jnp.mean(kl)

        obj, g = jax.value_and_grad(objective)(actor)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), actor, g), obj

    def model(dt):
        return {"embed": sds((vocab, d_model), dt, mesh, P()),
                "blocks": {"up": sds((n_blocks, d_model, d_ff), dt, mesh, P()),
                           "down": sds((n_blocks, d_ff, d_model), dt, mesh, P())}}

    n = mesh.devices.size * seqs
    rollouts = sds((n, seq), jnp.int32, mesh, P("d"))
    advantages = sds((n, seq), f32, mesh, P("d"))
    return rlhf_policy_step, (model(bf), model(jnp.dtype(ref_dtype)), rollouts, advantages), {"donate_argnums": (0,)}


pair(
    "rlhf_reference_f32", "v6e", "v6e:2x2",
    "RLHF policy-gradient step of a 4.4B-parameter bf16 model (32 feed-forward blocks 4096 -> 16384, vocabulary "
    "32768) on 8 rollouts of 1024 tokens per device, with the frozen reference model for the KL penalty kept as "
    "the f32 checkpoint (17.6 GB) next to the bf16 policy, both replicated: beyond 31.25G.",
    "Fixed variant of rlhf_reference_f32_v6e: the reference copy in bf16 like the policy; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["f32_precision", "replicated_tensor"]),
    _rlhf_ref_builder, dict(n_blocks=32, d_model=4096, d_ff=16384, vocab=32768, seqs=8, seq=1024,
                            ref_dtype="float32"),
    dict(n_blocks=32, d_model=4096, d_ff=16384, vocab=32768, seqs=8, seq=1024, ref_dtype="bfloat16"),
    dump=False,
)


# 19.3 a hashed n-gram embedding table replicated on every device


def _ngram_table_builder(mesh, buckets, dim, seqs, seq, orders, table_spec):
    """A token classifier with hashed n-gram features (fastText / Engram-style): every position's
    bigram .. n-gram is hashed into one bf16 table [buckets, dim], the looked-up rows are summed and
    fed to a small head; SGD on the table and the head, both donated. table_spec P(): the table
    replicated; P('d', None): its rows sharded over 'd'."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def hashed_ngram_step(hash_table, head, tokens, tags):
        ids = []
        for n in range(2, orders + 2):
            h = jnp.zeros_like(tokens, dtype=jnp.uint32)
            for j in range(n):
                h = h * jnp.uint32(1000003) + jnp.roll(tokens, j, axis=1).astype(jnp.uint32)
            ids.append((h % jnp.uint32(buckets)).astype(jnp.int32))

        def xent(tbl, head):
            feats = sum(jnp.take(tbl, i, axis=0) for i in ids).astype(f32)        # [N, S, D]
            logits = jnp.tanh(feats) @ head
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tags[..., None], -1))

        loss, (gt, gh) = jax.value_and_grad(xent, argnums=(0, 1))(hash_table, head)
        return (hash_table - 0.1 * gt).astype(bf), head - 0.1 * gh, loss

    hash_table = sds((buckets, dim), bf, mesh, table_spec)
    head = sds((dim, 64), f32, mesh, P())
    n = mesh.devices.size * seqs
    tokens = sds((n, seq), jnp.int32, mesh, P("d"))
    tags = sds((n, seq), jnp.int32, mesh, P("d"))
    return hashed_ngram_step, (hash_table, head, tokens, tags), {"donate_argnums": (0, 1)}


pair(
    "ngram_table_replicated", "v5e", "v5e:4x4",
    "Token tagger with hashed 2..4-gram features from one bf16 table of 10485760 buckets x 1024 (20 GiB) "
    "replicated on each of the 16 devices of v5e:4x4: the table alone exceeds 15.75G.",
    "Fixed variant of ngram_table_replicated_v5e: the table's rows sharded P('d', None) (1.25 GiB per device); fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed"]),
    _ngram_table_builder, dict(buckets=10485760, dim=1024, seqs=16, seq=512, orders=3, table_spec=_P()),
    dict(buckets=10485760, dim=1024, seqs=16, seq=512, orders=3, table_spec=_P("d", None)),
    dump=False,
)


# 19.4 an eval loop that stacks every batch's logits on the device before computing the metrics


def _eval_concat_builder(mesh, n_batches, seqs, seq, d_model, vocab, stack_logits):
    """Evaluation of a small bf16 language model over a whole split in one jitted call: lax.scan over
    the eval batches [T, N, S] (N over 'd'). stack_logits=True: the scan returns every batch's f32
    logits [N, S, V], stacked [T, N, S, V], and accuracy / perplexity are computed on the stack
    afterwards; False: each step reduces its batch to (correct, nll sum, count) in the carry."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def evaluate_split(lm, inputs, targets):
        def forward(toks):
            h = jnp.take(lm["tok"], toks, axis=0)
            h = h + jax.nn.gelu(h @ lm["w_in"]) @ lm["w_out"]
            return (h @ lm["unembed"]).astype(f32)

        if stack_logits:
            _, all_logits = jax.lax.scan(lambda c, t: (c, forward(t)), 0, inputs)      # [T, N, S, V]
            lp = jax.nn.log_softmax(all_logits, axis=-1)
            nll = -jnp.take_along_axis(lp, targets[..., None], -1)[..., 0]
            acc = jnp.mean(jnp.argmax(all_logits, -1) == targets)
            return acc, jnp.exp(jnp.mean(nll))

        def step(c, xs):
            t, y = xs
            logits = forward(t)
            nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), y[..., None], -1)[..., 0]
            return (c[0] + jnp.sum(jnp.argmax(logits, -1) == y), c[1] + jnp.sum(nll)), None

        (correct, nll), _ = jax.lax.scan(step, (jnp.int32(0), f32(0)), (inputs, targets))
        count = targets.size
        return correct / count, jnp.exp(nll / count)

    lm = {"tok": sds((vocab, d_model), bf, mesh, P()), "w_in": sds((d_model, 4 * d_model), bf, mesh, P()),
          "w_out": sds((4 * d_model, d_model), bf, mesh, P()), "unembed": sds((d_model, vocab), bf, mesh, P())}
    shape = (n_batches, mesh.devices.size * seqs, seq)
    inputs = sds(shape, jnp.int32, mesh, P(None, "d", None))
    targets = sds(shape, jnp.int32, mesh, P(None, "d", None))
    return evaluate_split, (lm, inputs, targets), {}


pair(
    "eval_logits_stacked", "v5p", "v5p:2x2x1",
    "Evaluation of a bf16 LM (vocabulary 32768) over 48 batches of 16 x 1024 tokens per device in one jitted "
    "lax.scan that returns every batch's f32 logits, stacked f32[48,16,1024,32768] (96 GiB per device), before "
    "accuracy and perplexity are computed: beyond 95.74G.",
    "Fixed variant of eval_logits_stacked_v5p: each scan step reduces its batch to correct / NLL sums in the "
    "carry; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _eval_concat_builder, dict(n_batches=48, seqs=16, seq=1024, d_model=1024, vocab=32768, stack_logits=True),
    dict(n_batches=48, seqs=16, seq=1024, d_model=1024, vocab=32768, stack_logits=False),
    dump=True,
)


# 19.5 a Pallas layer-norm kernel whose row block fits v6e's scoped VMEM but not v5e's


def _pallas_layernorm_builder(mesh, rows, width, block_rows):
    """Row-wise layer norm as a Pallas TPU kernel (bf16 in and out, statistics in f32, gain and bias
    f32[1, width]), grid over blocks of block_rows rows, under jax.shard_map with the rows over 'd'.
    The double-buffered bf16 blocks in and out plus the kernel's f32 temporaries must fit the scoped
    VMEM limit (16 MiB on v5e, 32 MiB on v6e)."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def ln_kernel(x_ref, g_ref, b_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        mu = jnp.mean(x, axis=-1, keepdims=True)
        xc = x - mu
        var = jnp.mean(xc * xc, axis=-1, keepdims=True)
        o_ref[...] = (xc * jax.lax.rsqrt(var + 1e-5) * g_ref[...] + b_ref[...]).astype(o_ref.dtype)

    def per_shard(x, g, b):
        return pl.pallas_call(
            ln_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // block_rows,),
            in_specs=[pl.BlockSpec((block_rows, width), lambda i: (i, 0)),
                      pl.BlockSpec((1, width), lambda i: (0, 0)),
                      pl.BlockSpec((1, width), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((block_rows, width), lambda i: (i, 0)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x, g, b)

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"), P(), P()), out_specs=P("d"), check_vma=False)

    def layernorm_rows(x, gain, bias):
        return fn(x, gain, bias)

    x = sds((mesh.devices.size * rows, width), jnp.bfloat16, mesh, P("d"))
    gain = sds((1, width), jnp.float32, mesh, P())
    bias = sds((1, width), jnp.float32, mesh, P())
    return layernorm_rows, (x, gain, bias), {}


pair(
    "pallas_layernorm_rows", "v5e", "v5e:2x2",
    "A Pallas layer-norm kernel over bf16[16384,8192] rows per device with blocks of 256 rows, tuned on v6e "
    "(32 MiB scoped VMEM), run on v5e: the double-buffered 4 MiB blocks in and out plus the f32 temporaries "
    "of the block exceed v5e's 16 MiB scoped VMEM limit.",
    "Fixed variant of pallas_layernorm_rows_v5e: blocks of 64 rows; fits.",
    dict(category="vmem", causes=["kernel_tiling"]),
    _pallas_layernorm_builder, dict(rows=16384, width=8192, block_rows=256),
    dict(rows=16384, width=8192, block_rows=64),
    dump=False,
)


# 19.6 a NeRF training step with too many rays per device


def _nerf_builder(mesh, rays, samples, width, depth, freqs):
    """NeRF training step: positional encoding of `samples` points along each ray (sin/cos of
    `freqs` frequencies), an f32 MLP of `depth` layers with a skip connection to the encoding
    halfway, density and colour heads, volume rendering by alpha compositing (cumprod over the
    samples) and an MSE against the pixel colours; Adam-free SGD, params replicated and donated,
    rays [R, ...] over 'd'."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def nerf_step(field, origins, directions, pixels):
        def render_loss(field):
            t = jnp.linspace(2.0, 6.0, samples)
            pts = origins[:, None, :] + directions[:, None, :] * t[None, :, None]     # [R, S, 3]
            enc = [pts] + [fn(pts * (2.0 ** k)) for k in range(freqs) for fn in (jnp.sin, jnp.cos)]
            enc = jnp.concatenate(enc, axis=-1)                                      # [R, S, 3 + 6F]
            h = enc
            for i in range(depth):
                if i == depth // 2:
                    h = jnp.concatenate([h, enc], axis=-1)
                h = jax.nn.relu(h @ field[f"dense_{i}"])
            sigma = jax.nn.softplus(h @ field["sigma"])[..., 0]
            rgb = jax.nn.sigmoid(h @ field["rgb"])
            alpha = 1.0 - jnp.exp(-sigma * (4.0 / samples))
            trans = jnp.cumprod(jnp.concatenate([jnp.ones_like(alpha[:, :1]), 1.0 - alpha[:, :-1] + 1e-10], -1), -1)
            color = jnp.sum((alpha * trans)[..., None] * rgb, axis=1)
            return jnp.mean((color - pixels) ** 2)

        loss, g = jax.value_and_grad(render_loss)(field)
        return _tm(lambda p, g: p - 5e-4 * g, field, g), loss

    enc_dim = 3 + 6 * freqs
    field = {}
    for i in range(depth):
        d_in = enc_dim if i == 0 else (width + enc_dim if i == depth // 2 else width)
        field[f"dense_{i}"] = sds((d_in, width), f32, mesh, P())
    field["sigma"] = sds((width, 1), f32, mesh, P())
    field["rgb"] = sds((width, 3), f32, mesh, P())
    n = mesh.devices.size * rays
    origins = sds((n, 3), f32, mesh, P("d"))
    directions = sds((n, 3), f32, mesh, P("d"))
    pixels = sds((n, 3), f32, mesh, P("d"))
    return nerf_step, (field, origins, directions, pixels), {"donate_argnums": (0,)}


pair(
    "nerf_rays_batch", "v6e", "v6e:2x2",
    "NeRF training step (8-layer f32 MLP of width 256, 10 encoding frequencies, 192 samples per ray) on 32768 "
    "rays per device: the [R, 192, 256] activations of every layer kept for the backward exceed 31.25G.",
    "Fixed variant of nerf_rays_batch_v6e: 8192 rays per device; fits.",
    dict(category="aggregate", causes=["batch_too_large", "no_remat", "padding"]),
    _nerf_builder, dict(rays=32768, samples=192, width=256, depth=8, freqs=10),
    dict(rays=8192, samples=192, width=256, depth=8, freqs=10),
    dump=False,
)


# 19.7 Shampoo preconditioner statistics replicated under data parallelism


def _shampoo_builder(mesh, n_layers, width, rows, stats_spec, beta2=0.99):
    """Data-parallel training of a stack of f32 dense layers ([L, D, D], lax.scan, relu) with a
    Shampoo-style optimizer: per layer the left and right statistics L += G G^T, R += G^T G and their
    inverse fourth roots (kept as state, refreshed elsewhere every k steps), the update
    L^-1/4 G R^-1/4. Params replicated; stats_spec is the PartitionSpec of the four [L, D, D]
    state stacks (P(): replicated; P(None, 'd', None): their rows over 'd'). Everything donated."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def shampoo_step(kernels, precond, feats, targets):
        def mse(kernels):
            h, _ = jax.lax.scan(lambda h, w: (jax.nn.relu(h @ w), None), feats, kernels)
            return jnp.mean((h - targets) ** 2)

        loss, g = jax.value_and_grad(mse)(kernels)
        left = beta2 * precond["left"] + jnp.einsum("lij,lkj->lik", g, g)
        right = beta2 * precond["right"] + jnp.einsum("lji,ljk->lik", g, g)
        step = jnp.einsum("lij,ljk,lkm->lim", precond["left_root"], g, precond["right_root"])
        new_state = {"left": left, "right": right, "left_root": precond["left_root"],
                     "right_root": precond["right_root"]}
        return kernels - 1e-3 * step, new_state, loss

    kernels = sds((n_layers, width, width), f32, mesh, P())
    precond = {k: sds((n_layers, width, width), f32, mesh, stats_spec)
               for k in ("left", "right", "left_root", "right_root")}
    n = mesh.devices.size * rows
    feats = sds((n, width), f32, mesh, P("d"))
    targets = sds((n, width), f32, mesh, P("d"))
    return shampoo_step, (kernels, precond, feats, targets), {"donate_argnums": (0, 1)}


pair(
    "shampoo_stats_replicated", "v4", "v4:2x2x1",
    "Shampoo training step of 10 f32 dense layers [8192, 8192] on 4096 rows per TensorCore, the four "
    "preconditioner stacks (statistics and inverse roots, 4 x f32[10,8192,8192] = 10 GiB) replicated on "
    "every TensorCore next to the 2.5 GiB of params: beyond 15.25G.",
    "Fixed variant of shampoo_stats_replicated_v4: the preconditioner stacks' rows sharded "
    "P(None, 'd', None) (1.25 GiB per TensorCore); fits.",
    dict(category="aggregate", category_also=["arguments"],
         causes=["optimizer_state_unsharded", "replicated_tensor"]),
    _shampoo_builder, dict(n_layers=10, width=8192, rows=4096, stats_spec=_P()),
    dict(n_layers=10, width=8192, rows=4096, stats_spec=_P(None, "d", None)),
    dump=True,
)


# 19.8 a point-cloud Chamfer loss over the full pairwise distance matrix


def _chamfer_builder(mesh, clouds, points, feat, block=None):
    """Training step of a point-cloud autoencoder (per-point f32 MLP encoder, max-pooled code, a
    decoder MLP that emits `points` xyz points) with a Chamfer loss against the input cloud.
    block=None: the full pairwise squared distances [B, N, N] are built and reduced with min over
    both axes; block=b: the distances are taken b predicted points at a time (lax.map under
    jax.checkpoint), each block's nearest neighbours reduced before the next."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def chamfer_train_step(ae, cloud):
        def loss_fn(ae):
            code = jnp.max(jax.nn.relu(jax.nn.relu(cloud @ ae["enc_a"]) @ ae["enc_b"]), axis=1)   # [B, F]
            recon = (jax.nn.relu(code @ ae["dec_a"]) @ ae["dec_b"]).reshape(cloud.shape)          # [B, N, 3]
            if block is None:
                d = jnp.sum((recon[:, :, None, :] - cloud[:, None, :, :]) ** 2, -1)              # [B, N, N]
                return jnp.mean(jnp.min(d, 2)) + jnp.mean(jnp.min(d, 1))

            def part(r):                                                                        # [B, b, 3]
                d = jnp.sum((r[:, :, None, :] - cloud[:, None, :, :]) ** 2, -1)
                return jnp.min(d, 2), jnp.min(d, 1)

            rb = jnp.moveaxis(recon.reshape(recon.shape[0], -1, block, 3), 1, 0)
            fwd, bwd = jax.lax.map(jax.checkpoint(part), rb)
            return jnp.mean(fwd) + jnp.mean(jnp.min(bwd, 0))

        loss, g = jax.value_and_grad(loss_fn)(ae)
        return _tm(lambda p, g: p - 1e-3 * g, ae, g), loss

    ae = {"enc_a": sds((3, 128), f32, mesh, P()), "enc_b": sds((128, feat), f32, mesh, P()),
          "dec_a": sds((feat, 1024), f32, mesh, P()), "dec_b": sds((1024, points * 3), f32, mesh, P())}
    cloud = sds((mesh.devices.size * clouds, points, 3), f32, mesh, P("d"))
    return chamfer_train_step, (ae, cloud), {"donate_argnums": (0,)}


pair(
    "chamfer_pairwise", "v6e", "v6e:2x2",
    "Point-cloud autoencoder trained with a Chamfer loss on 32 clouds of 16384 points per device: the full "
    "pairwise squared distances f32[32,16384,16384] (32 GiB per device) exceed 31.25G.",
    "Fixed variant of chamfer_pairwise_v6e: the distances 1024 predicted points at a time (lax.map under "
    "jax.checkpoint); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _chamfer_builder, dict(clouds=32, points=16384, feat=512),
    dict(clouds=32, points=16384, feat=512, block=1024),
    dump=True,
)


# ---- 20. more broken/fixed pairs (batch tpu9): other models, other names ----------------------
#
# Programs of kinds sections 13-19 do not have (a conformer speech encoder over long audio in f32,
# a diffusion sampler differentiated through all its denoising steps for a reward, a Perceiver whose
# huge byte array is cross-attended by a few latents, a vocabulary-parallel LM head whose logits are
# all-gathered for the loss, an early-exit model computing every exit's logits at once, a dataset kept
# resident in HBM as f32 pixels instead of uint8, a multi-task model with thousands of replicated task
# heads). The same conventions: the fixed twin changes exactly the first cause. About half keep their
# dumps (dump=True); the others only stderr.log / exception.txt / meta.json.


# 20.1 a conformer speech encoder over long audio, everything in f32


def _conformer_builder(mesh, utterances, frames, width, heads, n_blocks, dtype):
    """Conformer-style CTC encoder step: per block a half-step feed-forward, full multi-head
    self-attention over all frames, a gated pointwise 'conv' module and a second half-step
    feed-forward, lax.scan over the stacked blocks under jax.checkpoint; CTC replaced by a frame-wise
    cross-entropy over 1024 word pieces. dtype: the dtype of the stacked weights and of the filterbank
    frames as fed (float32: as exported by the recipe; bfloat16: cast on the host). SGD, donated."""
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)
    hd = width // heads

    def block(x, w):
        x = x + 0.5 * jax.nn.swish(x @ w["ff1_in"]) @ w["ff1_out"]
        q, k, v = (jnp.einsum("btd,dhe->bthe", x, w[n]) for n in ("wq", "wk", "wv"))
        att = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k) / (hd ** 0.5), axis=-1)
        x = x + jnp.einsum("bhqk,bkhe,hed->bqd", att, v, w["wo"])
        a, g = jnp.split(x @ w["glu"], 2, axis=-1)
        x = x + (a * jax.nn.sigmoid(g)) @ w["pw"]
        x = x + 0.5 * jax.nn.swish(x @ w["ff2_in"]) @ w["ff2_out"]
        return x, None

    def asr_encoder_step(enc, fbank, pieces):
        def frame_xent(enc):
            x = fbank @ enc["subsample"]
            x, _ = jax.lax.scan(jax.checkpoint(block), x, enc["stack"])
            lp = jax.nn.log_softmax((x @ enc["ctc"]).astype(jnp.float32), axis=-1)
            return -jnp.mean(jnp.take_along_axis(lp, pieces[..., None], -1))

        loss, g = jax.value_and_grad(frame_xent)(enc)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), enc, g), loss

    L, D = n_blocks, width
    s = lambda *shape: sds((L,) + shape, dt, mesh, P())
    enc = {"subsample": sds((320, D), dt, mesh, P()), "ctc": sds((D, 1024), dt, mesh, P()),
           "stack": {"ff1_in": s(D, 4 * D), "ff1_out": s(4 * D, D), "wq": s(D, heads, hd), "wk": s(D, heads, hd),
                     "wv": s(D, heads, hd), "wo": s(heads, hd, D), "glu": s(D, 2 * D), "pw": s(D, D),
                     "ff2_in": s(D, 4 * D), "ff2_out": s(4 * D, D)}}
    n = mesh.devices.size * utterances
    fbank = sds((n, frames, 320), dt, mesh, P("d"))
    pieces = sds((n, frames), jnp.int32, mesh, P("d"))
    return asr_encoder_step, (enc, fbank, pieces), {"donate_argnums": (0,)}


pair(
    "conformer_frames_f32", "v5e", "v5e:2x2",
    "Conformer encoder step (12 blocks, width 512, 8 heads) on 4 utterances of 8192 frames per device with "
    "f32 weights and filterbanks: the f32 attention over all 8192 frames of a block exceeds 15.75G.",
    "Fixed variant of conformer_frames_f32_v5e: the weights and filterbank frames in bf16; fits.",
    dict(category="single_large_allocation", causes=["f32_precision", "large_activation", "batch_too_large"]),
    _conformer_builder, dict(utterances=4, frames=8192, width=512, heads=8, n_blocks=12, dtype="float32"),
    dict(utterances=4, frames=8192, width=512, heads=8, n_blocks=12, dtype="bfloat16"),
    dump=False,
)


# 20.2 a diffusion sampler differentiated through every denoising step (reward fine-tuning)


def _draft_builder(mesh, latents, tokens, width, steps, remat_step):
    """DRaFT-style reward fine-tuning: a DDIM sampler runs `steps` denoising steps of a small bf16
    denoiser (time-conditioned token MLP with a token-mixing layer) from noise under lax.scan, a
    differentiable reward (a frozen linear critic) scores the final latents, and the gradient flows back
    through every step. remat_step=False: the scan keeps every step's activations for the backward;
    True: the step is wrapped in jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def eps_model(w, z, t):
        h = z.astype(bf) @ w["inp"] + jnp.sin(t * w["freq"]).astype(bf)
        h = h + jax.nn.gelu(jnp.einsum("bnd,nm->bmd", h, w["mix"]))
        h = h + jax.nn.gelu(h @ w["up"]) @ w["down"]
        return (h @ w["out"]).astype(f32)

    def reward_finetune_step(denoiser, critic, noise):
        def neg_reward(denoiser):
            def ddim(z, i):
                t = 1.0 - i / steps
                a, a_next = jnp.cos(t * 1.5), jnp.cos((t - 1.0 / steps) * 1.5)
                e = eps_model(denoiser, z, t)
                x0 = (z - jnp.sqrt(1 - a * a) * e) / a
                return a_next * x0 + jnp.sqrt(1 - a_next * a_next) * e, None

            body = jax.checkpoint(ddim) if remat_step else ddim
            z, _ = jax.lax.scan(body, noise, jnp.arange(steps, dtype=f32))
            return -jnp.mean(z.reshape(z.shape[0], -1) @ critic)

        r, g = jax.value_and_grad(neg_reward)(denoiser)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), denoiser, g), r

    C = 16
    denoiser = {"inp": sds((C, width), bf, mesh, P()), "freq": sds((width,), f32, mesh, P()),
                "mix": sds((tokens, tokens), bf, mesh, P()), "up": sds((width, 4 * width), bf, mesh, P()),
                "down": sds((4 * width, width), bf, mesh, P()), "out": sds((width, C), bf, mesh, P())}
    critic = sds((tokens * C,), f32, mesh, P())
    noise = sds((mesh.devices.size * latents, tokens, C), f32, mesh, P("d"))
    return reward_finetune_step, (denoiser, critic, noise), {"donate_argnums": (0,)}


pair(
    "draft_sampler_backprop", "v6e", "v6e:2x2",
    "Reward fine-tuning of a latent diffusion denoiser by backpropagating through a 50-step DDIM sampler "
    "(lax.scan, no remat) on 4 latents of 4096 tokens per device: every step's bf16 [4,4096,4096] MLP "
    "activations are kept for the backward (stacked bf16[50,4,4096,4096], 6.25 GiB each), beyond 31.25G.",
    "Fixed variant of draft_sampler_backprop_v6e: each denoising step under jax.checkpoint; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _draft_builder, dict(latents=4, tokens=4096, width=1024, steps=50, remat_step=False),
    dict(latents=4, tokens=4096, width=1024, steps=50, remat_step=True),
    dump=False,
)


# 20.3 a Perceiver whose few latents cross-attend a huge byte array


def _perceiver_builder(mesh, arrays, n_bytes, n_latents, width, heads, depth):
    """Perceiver IO classifier over raw bytes: the byte array [B, M] is embedded (byte + position)
    and cross-attended once by `n_latents` learned latents, followed by `depth` latent
    self-attention blocks (lax.scan, jax.checkpoint) and a mean-pooled head. The embedded bytes, their
    keys and values and the cross-attention probabilities [B, H, N, M] are kept for the backward.
    `arrays` byte arrays per device; params replicated and donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = width // heads

    def latent_block(z, w):
        q, k, v = (jnp.einsum("bnd,dhe->bnhe", z, w[n]) for n in ("q", "k", "v"))
        a = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k) / hd ** 0.5, -1)
        z = z + jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["o"])
        return z + jax.nn.gelu(z @ w["up"]) @ w["down"], None

    def perceiver_step(model, byte_arrays, classes):
        def xent(model):
            x = jnp.take(model["byte_emb"], byte_arrays, axis=0) + model["pos_emb"][None]   # [B, M, D]
            k = jnp.einsum("bmd,dhe->bmhe", x, model["xk"])
            v = jnp.einsum("bmd,dhe->bmhe", x, model["xv"])
            q = jnp.einsum("nd,dhe->nhe", model["latents"], model["xq"])
            a = jax.nn.softmax(jnp.einsum("nhe,bmhe->bhnm", q, k) / hd ** 0.5, -1)          # [B, H, N, M]
            o = jnp.einsum("bhnm,bmhe->bnhe", a, v)
            z = model["latents"][None] + jnp.einsum("bnhe,hed->bnd", o, model["xo"])
            z, _ = jax.lax.scan(jax.checkpoint(latent_block), z, model["blocks"])
            logits = (jnp.mean(z, 1) @ model["head"]).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), classes[:, None], -1))

        loss, g = jax.value_and_grad(xent)(model)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), model, g), loss

    D, H, E = width, heads, hd
    r = lambda *shape: sds(shape, bf, mesh, P())
    model = {"byte_emb": r(256, D), "pos_emb": r(n_bytes, D), "latents": r(n_latents, D),
             "xq": r(D, H, E), "xk": r(D, H, E), "xv": r(D, H, E), "xo": r(H, E, D),
             "blocks": {"q": r(depth, D, H, E), "k": r(depth, D, H, E), "v": r(depth, D, H, E),
                        "o": r(depth, H, E, D), "up": r(depth, D, 4 * D), "down": r(depth, 4 * D, D)},
             "head": r(D, 1000)}
    n = mesh.devices.size * arrays
    byte_arrays = sds((n, n_bytes), jnp.int32, mesh, P("d"))
    classes = sds((n,), jnp.int32, mesh, P("d"))
    return perceiver_step, (model, byte_arrays, classes), {"donate_argnums": (0,)}


pair(
    "perceiver_byte_array", "v5p", "v5p:2x2x1",
    "Perceiver IO training step on 8 raw byte arrays of 1048576 bytes per device (512 latents, width 512, "
    "8 heads): the embedded bytes, their keys / values and the bf16 cross-attention probabilities "
    "[8,8,512,1048576] kept for the backward exceed 95.74G.",
    "Fixed variant of perceiver_byte_array_v5p: 2 byte arrays per device, not 8; fits.",
    dict(category="single_large_allocation", causes=["batch_too_large", "large_activation"]),
    _perceiver_builder, dict(arrays=8, n_bytes=1048576, n_latents=512, width=512, heads=8, depth=6),
    dict(arrays=2, n_bytes=1048576, n_latents=512, width=512, heads=8, depth=6),
    dump=False,
)


# 20.4 a vocabulary-parallel LM head whose logits are all-gathered for the loss


def _vocab_parallel_builder(mesh, seqs, seq, d_model, vocab, gather_logits):
    """Megatron-style vocabulary parallelism over all 16 devices of v5e:4x4: the activations are
    replicated across the tensor-parallel axis, the output embedding [D, V] is split over 'd' along
    the vocabulary, the logits [N, S, V] come out vocabulary-sharded. gather_logits=True: the loss
    first constrains the logits to P() ("gather them to compute the softmax"); False: the log-softmax
    and the target pick-up run on the vocabulary-sharded logits (GSPMD inserts the max / sum
    all-reduces)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def lm_head_step(trunk, out_embed, hidden, next_tokens):
        def xent(trunk, out_embed):
            h = hidden + jax.nn.gelu(hidden @ trunk["fc_a"]) @ trunk["fc_b"]
            logits = (h @ out_embed).astype(f32)                                     # [N, S, V] over V
            if gather_logits:
                logits = jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P()))
            lse = jax.nn.logsumexp(logits, axis=-1)
            picked = jnp.take_along_axis(logits, next_tokens[..., None], -1)[..., 0]
            return jnp.mean(lse - picked)

        loss, (gt, ge) = jax.value_and_grad(xent, argnums=(0, 1))(trunk, out_embed)
        trunk = _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), trunk, gt)
        return trunk, (out_embed - 1e-4 * ge).astype(bf), loss

    trunk = {"fc_a": sds((d_model, 4 * d_model), bf, mesh, P()), "fc_b": sds((4 * d_model, d_model), bf, mesh, P())}
    out_embed = sds((d_model, vocab), bf, mesh, P(None, "d"))
    hidden = sds((seqs, seq, d_model), bf, mesh, P())
    next_tokens = sds((seqs, seq), jnp.int32, mesh, P())
    return lm_head_step, (trunk, out_embed, hidden, next_tokens), {"donate_argnums": (0, 1)}


pair(
    "vocab_parallel_gathered", "v5e", "v5e:4x4",
    "Vocabulary-parallel LM head on v5e:4x4 (vocabulary 262144 split over 16 devices, 8 x 2048 tokens "
    "replicated across the tensor-parallel axis): the loss constrains the f32 logits to P(), so every "
    "device holds f32[8,2048,262144] (16 GiB): beyond 15.75G.",
    "Fixed variant of vocab_parallel_gathered_v5e: the log-softmax runs on the vocabulary-sharded logits "
    "(no sharding constraint to P()); fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "large_activation", "f32_precision"]),
    _vocab_parallel_builder, dict(seqs=8, seq=2048, d_model=2048, vocab=262144, gather_logits=True),
    dict(seqs=8, seq=2048, d_model=2048, vocab=262144, gather_logits=False),
    dump=True,
)


# 20.5 an early-exit model computing every exit's logits at once


def _early_exit_builder(mesh, n_layers, seqs, seq, d_model, vocab, loss_in_scan):
    """Early-exit (CALM-style) LM training: every layer of a lax.scan stack has an exit through the
    shared unembedding, and the loss averages the cross-entropy of all exits. loss_in_scan=False: the
    scan returns every layer's hidden states [L, N, S, D] and the exits' f32 logits [L, N, S, V] are
    computed at once afterwards; True: each layer's exit loss is computed inside the scanned block
    (under jax.checkpoint), only a scalar per layer leaves it."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def exit_nll(h, unembed, y):
        lp = jax.nn.log_softmax((h @ unembed).astype(f32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, y[..., None], -1))

    def early_exit_step(net, tokens, targets):
        def all_exits_loss(net):
            h = jnp.take(net["embed"], tokens, axis=0)

            def layer(h, w):
                return h + jax.nn.gelu(h @ w["fc1"]) @ w["fc2"]

            if loss_in_scan:
                def blk(h, w):
                    h = layer(h, w)
                    return h, exit_nll(h, net["unembed"], targets)

                _, nll = jax.lax.scan(jax.checkpoint(blk), h, net["layers"])
                return jnp.mean(nll)

            def blk(h, w):
                h = layer(h, w)
                return h, h

            _, hs = jax.lax.scan(jax.checkpoint(blk), h, net["layers"])                 # [L, N, S, D]
            lp = jax.nn.log_softmax(jnp.einsum("lnsd,dv->lnsv", hs, net["unembed"]).astype(f32), -1)
            return -jnp.mean(jnp.take_along_axis(lp, targets[None, ..., None], -1))

        loss, g = jax.value_and_grad(all_exits_loss)(net)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), net, g), loss

    L, D = n_layers, d_model
    net = {"embed": sds((vocab, D), bf, mesh, P()), "unembed": sds((D, vocab), bf, mesh, P()),
           "layers": {"fc1": sds((L, D, 4 * D), bf, mesh, P()), "fc2": sds((L, 4 * D, D), bf, mesh, P())}}
    n = mesh.devices.size * seqs
    tokens = sds((n, seq), jnp.int32, mesh, P("d"))
    targets = sds((n, seq), jnp.int32, mesh, P("d"))
    return early_exit_step, (net, tokens, targets), {"donate_argnums": (0,)}


pair(
    "early_exit_all_logits", "v4", "v4:2x2x1",
    "Early-exit LM step (16 layers, each with an exit through the shared unembedding, vocabulary 32768) on "
    "8 x 1024 tokens per TensorCore: the exits' f32 logits computed at once, f32[16,8,1024,32768] (16 GiB "
    "per TensorCore), exceed 15.25G.",
    "Fixed variant of early_exit_all_logits_v4: each layer's exit loss computed inside the scanned block "
    "(jax.checkpoint), only a scalar per layer kept; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _early_exit_builder, dict(n_layers=16, seqs=8, seq=1024, d_model=1024, vocab=32768, loss_in_scan=False),
    dict(n_layers=16, seqs=8, seq=1024, d_model=1024, vocab=32768, loss_in_scan=True),
    dump=False,
)


# 20.6 a dataset kept resident in HBM as f32 pixels instead of uint8


def _resident_dataset_builder(mesh, images, size, batch, width, pixel_dtype):
    """The 'whole dataset on the accelerator' trick for a small-image dataset (ImageNet 64x64): the
    training images live in HBM as one array [N, H, W, 3] with its rows over 'd', and each step
    slices its batch out of the local shard by index (no host input pipeline). pixel_dtype: float32
    (the numpy preprocessing's output, already scaled to [0, 1]) or uint8 (the raw pixels, scaled on
    the device). A small patch-embedding MLP classifier, SGD, params donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def resident_data_step(clf, pixels, labels, step):
        idx = (step * batch + jnp.arange(batch)) % pixels.shape[1]                   # the same rows of every shard
        x = jnp.take(pixels, idx, axis=1).reshape(-1, size, size, 3)                  # [W * batch, H, W, 3]
        x = x.astype(f32) / 255.0 if x.dtype == jnp.uint8 else x
        y = jnp.take(labels, idx, axis=1).reshape(-1)

        def xent(clf):
            p = x.reshape(x.shape[0], size // 8, 8, size // 8, 8, 3).transpose(0, 1, 3, 2, 4, 5)
            p = p.reshape(x.shape[0], (size // 8) ** 2, 192).astype(bf)
            h = jax.nn.gelu(p @ clf["patch"])
            h = h + jax.nn.gelu(h @ clf["mlp_a"]) @ clf["mlp_b"]
            logits = (jnp.mean(h, 1) @ clf["head"]).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], -1))

        loss, g = jax.value_and_grad(xent)(clf)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), clf, g), loss

    clf = {"patch": sds((192, width), bf, mesh, P()), "mlp_a": sds((width, 4 * width), bf, mesh, P()),
           "mlp_b": sds((4 * width, width), bf, mesh, P()), "head": sds((width, 1000), bf, mesh, P())}
    w = mesh.devices.size
    pixels = sds((w, images // w, size, size, 3), jnp.dtype(pixel_dtype), mesh, P("d"))
    labels = sds((w, images // w), jnp.int32, mesh, P("d"))
    step = sds((), jnp.int32, mesh, P())
    return resident_data_step, (clf, pixels, labels, step), {"donate_argnums": (0,)}


pair(
    "resident_pixels_f32", "v5e", "v5e:2x2",
    "ImageNet 64x64 (1281168 training images) kept resident in HBM with its rows over the 4 devices, as the "
    "f32 output of the numpy preprocessing: 14.66 GiB of pixels per device, and the compiler converts the whole "
    "shard to bf16 before the batch is sliced (another 14.66 GiB): beyond 15.75G.",
    "Fixed variant of resident_pixels_f32_v5e: the resident pixels as uint8 (3.66 GiB per device), scaled "
    "on the device after the batch is sliced; fits.",
    dict(category="single_large_allocation", category_also=["arguments"], causes=["f32_precision", "large_activation"]),
    _resident_dataset_builder, dict(images=1281168, size=64, batch=256, width=768, pixel_dtype="float32"),
    dict(images=1281168, size=64, batch=256, width=768, pixel_dtype="uint8"),
    dump=False,
)


# 20.7 a multi-task model with thousands of task heads replicated on every device


def _multitask_builder(mesh, tasks, per_task, d_in, d_model, classes, heads_spec):
    """Multi-task classification: a shared bf16 trunk and one f32 linear head per task [T, D, C]; each
    batch holds `per_task` examples of every task, laid out [T, k, d_in] with the task axis over 'd'
    (each device serves a slice of the tasks). heads_spec P(): the head stack replicated on every
    device; P('d', None, None): each device keeps the heads of its own tasks. SGD, donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def multitask_step(trunk, task_heads, feats, answers):
        def xent(trunk, task_heads):
            h = jax.nn.gelu(feats @ trunk["w1"]) @ trunk["w2"]                              # [T, k, D]
            logits = jnp.einsum("tkd,tdc->tkc", h.astype(f32), task_heads)
            lp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(lp, answers[..., None], -1))

        loss, (gt, gh) = jax.value_and_grad(xent, argnums=(0, 1))(trunk, task_heads)
        trunk = _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), trunk, gt)
        return trunk, task_heads - 1e-3 * gh, loss

    trunk = {"w1": sds((d_in, 4 * d_model), bf, mesh, P()), "w2": sds((4 * d_model, d_model), bf, mesh, P())}
    task_heads = sds((tasks, d_model, classes), f32, mesh, heads_spec)
    feats = sds((tasks, per_task, d_in), bf, mesh, P("d"))
    answers = sds((tasks, per_task), jnp.int32, mesh, P("d"))
    return multitask_step, (trunk, task_heads, feats, answers), {"donate_argnums": (0, 1)}


pair(
    "multitask_heads_replicated", "v4", "v4:2x2x1",
    "Multi-task classifier with 4096 task heads f32[4096,1024,1024] (16 GiB) replicated on each of the 8 "
    "TensorCores of v4:2x2x1 while the batch's task axis is sharded: the heads alone exceed 15.25G.",
    "Fixed variant of multitask_heads_replicated_v4: the head stack sharded by task, P('d', None, None) "
    "(2 GiB per TensorCore); fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed", "f32_precision"]),
    _multitask_builder, dict(tasks=4096, per_task=8, d_in=1024, d_model=1024, classes=1024, heads_spec=_P()),
    dict(tasks=4096, per_task=8, d_in=1024, d_model=1024, classes=1024, heads_spec=_P("d", None, None)),
    dump=True,
)


# ---- 21. more broken/fixed pairs (batch tpu10): other models, other names ---------------------
#
# Programs of kinds sections 13-20 do not have (a Graphormer with a dense per-head spatial-encoding
# bias, K-FAC factors replicated under data parallelism, per-layer activations returned in f32 for
# monitoring, a log-mel front end with a hop-length typo, a global-filter network that uses the full
# complex fft2, a video enhancer with a VGG perceptual loss in f32, a neural ODE differentiated through
# its RK4 solver, global-norm clipping through ravel_pytree, a sequence-parallel prefill that
# all-gathers K/V). The same conventions: the fixed twin changes exactly the first cause. About half
# keep their dumps (dump=True); the others only stderr.log / exception.txt / meta.json.


# 21.1 a Graphormer whose spatial-encoding bias is a dense [B, H, N, N] tensor per batch of graphs


def _graphormer_builder(mesh, graphs, nodes, width, heads, depth, max_hops=32):
    """Graphormer-style graph regression: node features embedded, `depth` transformer layers (lax.scan,
    jax.checkpoint) whose attention adds a learned per-head spatial-encoding bias looked up from the
    shortest-path-hop matrix spd [B, N, N] (int32, from the data pipeline): bias = table[h, spd] as a
    dense f32 [B, H, N, N] shared by all layers. `graphs` graphs of `nodes` nodes per device."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = width // heads

    def graph_layer(x, w, bias):
        q, k, v = (jnp.einsum("bnd,dhe->bnhe", x, w[n]) for n in ("wq", "wk", "wv"))
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(f32) / hd ** 0.5 + bias
        a = jax.nn.softmax(s, axis=-1).astype(bf)
        x = x + jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["wo"])
        return x + jax.nn.gelu(x @ w["ffn_in"]) @ w["ffn_out"]

    def graphormer_step(gnet, atom_feats, hops, energy):
        def mse(gnet):
            bias = jnp.take(gnet["hop_bias"], hops, axis=1).transpose(1, 0, 2, 3)     # [B, H, N, N] f32
            x = atom_feats @ gnet["atom_in"]
            x, _ = jax.lax.scan(jax.checkpoint(lambda x, w: (graph_layer(x, w, bias), None)), x, gnet["layers"])
            pred = (jnp.mean(x, axis=1) @ gnet["readout"]).astype(f32)
            return jnp.mean((pred[:, 0] - energy) ** 2)

        loss, g = jax.value_and_grad(mse)(gnet)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), gnet, g), loss

    L, D, H, E = depth, width, heads, hd
    r = lambda *shape: sds(shape, bf, mesh, P())
    gnet = {"atom_in": r(64, D), "hop_bias": sds((H, max_hops), f32, mesh, P()), "readout": r(D, 1),
            "layers": {"wq": r(L, D, H, E), "wk": r(L, D, H, E), "wv": r(L, D, H, E), "wo": r(L, H, E, D),
                       "ffn_in": r(L, D, 4 * D), "ffn_out": r(L, 4 * D, D)}}
    n = mesh.devices.size * graphs
    atom_feats = sds((n, nodes, 64), bf, mesh, P("d"))
    hops = sds((n, nodes, nodes), jnp.int32, mesh, P("d"))
    energy = sds((n,), f32, mesh, P("d"))
    return graphormer_step, (gnet, atom_feats, hops, energy), {"donate_argnums": (0,)}


pair(
    "graphormer_hop_bias", "v5p", "v5p:2x2x1",
    "Graphormer step (12 layers, width 512, 16 heads) on 96 graphs of 2048 nodes per device: the dense "
    "spatial-encoding bias gathered as f32[96,2048,2048,16] (heads minor), its [B, H, N, N] transpose, its "
    "gradient and each layer's f32 scores exceed 95.74G.",
    "Fixed variant of graphormer_hop_bias_v5p: 24 graphs per device, not 96; fits.",
    dict(category="single_large_allocation", causes=["batch_too_large", "padding", "large_activation"]),
    _graphormer_builder, dict(graphs=96, nodes=2048, width=512, heads=16, depth=12),
    dict(graphs=24, nodes=2048, width=512, heads=16, depth=12),
    dump=False,
)


# 21.2 K-FAC: the Kronecker factors and their inverses replicated under data parallelism


def _kfac_builder(mesh, layers, width, rows, factor_spec):
    """K-FAC natural-gradient step for a tanh MLP (bf16 kernels [W, W], FSDP: rows over 'd'): per
    layer the input-activation factor A and the pre-activation-gradient factor G (EMAs, f32 [W, W]) are
    updated from the batch, and the gradient is preconditioned with the damped inverses A_inv, G_inv
    (refreshed every few hundred steps by another jitted function). Output gradients come from zero
    probes added to the pre-activations (as kfac-jax's layer tags do). factor_spec: the sharding of
    every factor and inverse."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def kfac_step(kernels, curvature, x, y):
        def loss_fn(kernels, probes):
            h, ins = x, []
            for i in range(layers):
                ins.append(h)
                h = jnp.tanh(h @ kernels[f"fc{i}"] + probes[i])
            return jnp.mean((h.astype(f32) - y) ** 2), ins

        probes = [jnp.zeros((x.shape[0], width), bf) for _ in range(layers)]
        (loss, ins), (g, dprobe) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(kernels, probes)
        n = x.shape[0]
        new_k, new_c = {}, {"A": {}, "G": {}, "A_inv": curvature["A_inv"], "G_inv": curvature["G_inv"]}
        for i in range(layers):
            k = f"fc{i}"
            a = ins[i].astype(f32)
            s = dprobe[i].astype(f32) * n
            new_c["A"][k] = 0.95 * curvature["A"][k] + 0.05 * (a.T @ a) / n
            new_c["G"][k] = 0.95 * curvature["G"][k] + 0.05 * (s.T @ s) / n
            nat = curvature["A_inv"][k] @ g[k].astype(f32) @ curvature["G_inv"][k]
            new_k[k] = (kernels[k].astype(f32) - 1e-3 * nat).astype(bf)
        return new_k, new_c, loss

    kernels = {f"fc{i}": sds((width, width), bf, mesh, P("d", None)) for i in range(layers)}
    fac = lambda: {f"fc{i}": sds((width, width), f32, mesh, factor_spec) for i in range(layers)}
    curvature = {"A": fac(), "G": fac(), "A_inv": fac(), "G_inv": fac()}
    n = mesh.devices.size * rows
    x = sds((n, width), bf, mesh, P("d"))
    y = sds((n, width), f32, mesh, P("d"))
    return kfac_step, (kernels, curvature, x, y), {"donate_argnums": (0, 1)}


pair(
    "kfac_factors_replicated", "v5e", "v5e:4x4",
    "K-FAC step for a 16-layer tanh MLP (bf16 kernels [8192,8192] FSDP-sharded over the 16 devices of "
    "v5e:4x4): the f32 factors A, G and their inverses (4 x 16 x 256 MiB = 16 GiB) replicated on every "
    "device; the arguments alone exceed 15.75G.",
    "Fixed variant of kfac_factors_replicated_v5e: every factor and inverse sharded by rows, P('d', None) "
    "(1 GiB per device); fits.",
    dict(category="arguments", causes=["optimizer_state_unsharded", "replicated_tensor", "arguments_exceed"]),
    _kfac_builder, dict(layers=16, width=8192, rows=512, factor_spec=_P()),
    dict(layers=16, width=8192, rows=512, factor_spec=_P("d", None)),
    dump=False,
)


# 21.3 per-layer activations returned in f32 so that the host can compute their statistics


def _layer_stats_builder(mesh, n_layers, seqs, seq, d_model, d_ff, vocab, stats_in_scan):
    """LM training step with activation monitoring: a lax.scan over `n_layers` residual MLP blocks
    (jax.checkpoint). stats_in_scan=False: every block also emits its output cast to f32 and the step
    returns the stack [L, N, S, D] so that the logging code computes norms / histograms on the host;
    True: each block reduces its output to a few f32 statistics (mean, rms, absmax, fraction of
    near-zeros) inside the scan, [L, 4] leaves the step."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mlp_block(h, w):
        z = h.astype(f32)
        z = (z * jax.lax.rsqrt(jnp.mean(z * z, -1, keepdims=True) + 1e-6)).astype(bf)
        h = h + jax.nn.gelu(z @ w["w_up"]) @ w["w_down"]
        if stats_in_scan:
            hf = h.astype(f32)
            st = jnp.stack([jnp.mean(hf), jnp.sqrt(jnp.mean(hf * hf)), jnp.max(jnp.abs(hf)),
                            jnp.mean((jnp.abs(hf) < 1e-3).astype(f32))])
            return h, st
        return h, h.astype(f32)

    def monitored_train_step(lm, tokens, labels):
        def xent(lm):
            h = jnp.take(lm["tok_emb"], tokens, axis=0)
            h, acts = jax.lax.scan(jax.checkpoint(mlp_block), h, lm["blocks"])
            lp = jax.nn.log_softmax((h @ lm["tok_emb"].T).astype(f32), axis=-1)
            return -jnp.mean(jnp.take_along_axis(lp, labels[..., None], -1)), acts

        (loss, acts), g = jax.value_and_grad(xent, has_aux=True)(lm)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), lm, g), loss, acts

    L = n_layers
    lm = {"tok_emb": sds((vocab, d_model), bf, mesh, P()),
          "blocks": {"w_up": sds((L, d_model, d_ff), bf, mesh, P()), "w_down": sds((L, d_ff, d_model), bf, mesh, P())}}
    n = mesh.devices.size * seqs
    tokens = sds((n, seq), jnp.int32, mesh, P("d"))
    labels = sds((n, seq), jnp.int32, mesh, P("d"))
    return monitored_train_step, (lm, tokens, labels), {"donate_argnums": (0,)}


pair(
    "layer_acts_monitor_f32", "v6e", "v6e:2x2",
    "LM step (40 residual MLP blocks, d_model 4096) on 8 x 4096 tokens per device that returns every "
    "block's output cast to f32 for host-side histograms: f32[40,8,4096,4096] (20 GiB per device) on top "
    "of the checkpointed residuals exceeds 31.25G.",
    "Fixed variant of layer_acts_monitor_f32_v6e: each block reduces its output to 4 f32 statistics inside "
    "the scan, f32[40,4] leaves the step; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision"]),
    _layer_stats_builder, dict(n_layers=40, seqs=8, seq=4096, d_model=4096, d_ff=8192, vocab=8192, stats_in_scan=False),
    dict(n_layers=40, seqs=8, seq=4096, d_model=4096, d_ff=8192, vocab=8192, stats_in_scan=True),
    dump=False,
)


# 21.4 a log-mel audio front end whose hop length is 1 sample instead of 160


def _logmel_builder(mesh, clips, seconds, win, hop, n_mels, width, tags=527, rate=16000):
    """Audio tagging step with the log-mel front end on the device: the waveform [B, T] (f32, 16 kHz) is
    framed with a gather (frame i starts at i * hop), Hann-windowed, rfft'd, projected on a mel
    filterbank (frozen, passed in) and log-compressed; a frame MLP, mean pooling and a sigmoid
    multi-label head (AudioSet's 527 tags). hop: the hop length in samples (160 = 10 ms)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    T = seconds * rate
    n_frames = (T - win) // hop + 1

    def audio_tagging_step(tagger, melbank, waves, targets):
        idx = jnp.arange(n_frames)[:, None] * hop + jnp.arange(win)[None, :]
        frames = waves[:, idx] * jnp.hanning(win).astype(f32)                       # [B, frames, win]
        power = jnp.abs(jnp.fft.rfft(frames, axis=-1)) ** 2                           # [B, frames, win/2+1]
        logmel = jnp.log(power @ melbank + 1e-6).astype(bf)

        def bce(tagger):
            h = jax.nn.gelu(logmel @ tagger["frame_in"])
            h = h + jax.nn.gelu(h @ tagger["frame_mid"])
            logits = (jnp.mean(h, axis=1) @ tagger["tag_head"]).astype(f32)
            return jnp.mean(jnp.logaddexp(0.0, logits) - targets * logits)

        loss, g = jax.value_and_grad(bce)(tagger)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), tagger, g), loss

    tagger = {"frame_in": sds((n_mels, width), bf, mesh, P()), "frame_mid": sds((width, width), bf, mesh, P()),
              "tag_head": sds((width, tags), bf, mesh, P())}
    melbank = sds((win // 2 + 1, n_mels), f32, mesh, P())
    n = mesh.devices.size * clips
    waves = sds((n, T), f32, mesh, P("d"))
    targets = sds((n, tags), f32, mesh, P("d"))
    return audio_tagging_step, (tagger, melbank, waves, targets), {"donate_argnums": (0,)}


pair(
    "logmel_hop_typo", "v5e", "v5e:2x2",
    "Audio tagger with an on-device log-mel front end (1024-sample windows) on 64 clips of 30 s per device "
    "whose hop length is 1 sample (a typo for 160): 479,000 frames per clip, f32[64,479000,1024] frames and "
    "their spectra, far beyond 15.75G.",
    "Fixed variant of logmel_hop_typo_v5e: hop length 160 samples (10 ms), 2994 frames per clip; fits.",
    dict(category="single_large_allocation", causes=["shape_bug", "large_activation", "batch_too_large"]),
    _logmel_builder, dict(clips=64, seconds=30, win=1024, hop=1, n_mels=128, width=512),
    dict(clips=64, seconds=30, win=1024, hop=160, n_mels=128, width=512),
    dump=False,
)


# 21.5 a global-filter network (GFNet) whose spectral filter uses the full complex fft2


def _global_filter_builder(mesh, images, size, channels, depth, real_fft):
    """GFNet-style image model at high resolution: `depth` global-filter layers (lax.scan,
    jax.checkpoint), each x + ifft2(fft2(x) * K) with a learned complex filter K per position and
    channel, then a pointwise channel mix. real_fft=False: jnp.fft.fft2 / ifft2 on the real f32 input,
    complex64 spectra [B, H, W, C] and a filter [H, W, C]; True: rfft2 / irfft2, spectra
    [B, H, W/2+1, C] and a filter [H, W/2+1, C] (the real input's spectrum is Hermitian)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    wf = size // 2 + 1 if real_fft else size

    def global_filter(x, w):
        filt = jax.lax.complex(w["filt_re"], w["filt_im"])
        if real_fft:
            y = jnp.fft.irfft2(jnp.fft.rfft2(x, axes=(1, 2)) * filt, s=(size, size), axes=(1, 2))
        else:
            y = jnp.real(jnp.fft.ifft2(jnp.fft.fft2(x, axes=(1, 2)) * filt, axes=(1, 2)))
        x = x + y
        return x + jax.nn.gelu(x @ w["mix"]), None

    def gfnet_step(gf, pixels, labels):
        def xent(gf):
            x = pixels @ gf["stem"]
            x, _ = jax.lax.scan(jax.checkpoint(global_filter), x, gf["filters"])
            logits = jnp.mean(x, axis=(1, 2)) @ gf["head"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

        loss, g = jax.value_and_grad(xent)(gf)
        return _tm(lambda p, g: p - 1e-3 * g, gf, g), loss

    C = channels
    gf = {"stem": sds((3, C), f32, mesh, P()), "head": sds((C, 1000), f32, mesh, P()),
          "filters": {"filt_re": sds((depth, size, wf, C), f32, mesh, P()),
                      "filt_im": sds((depth, size, wf, C), f32, mesh, P()),
                      "mix": sds((depth, C, C), f32, mesh, P())}}
    n = mesh.devices.size * images
    pixels = sds((n, size, size, 3), f32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    return gfnet_step, (gf, pixels, labels), {"donate_argnums": (0,)}


pair(
    "gfnet_full_fft2", "v4", "v4:2x2x1",
    "GFNet-style global-filter model (8 layers, 64 channels) on 12 images of 512x512 per TensorCore whose "
    "filter multiplies the full complex64 fft2 of the real input: the complex spectra [12,512,512,64] of "
    "a layer and their gradients exceed 15.25G.",
    "Fixed variant of gfnet_full_fft2_v4: rfft2 / irfft2 with a [512,257,64] filter (half the spectrum); fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large"]),
    _global_filter_builder, dict(images=12, size=512, channels=64, depth=8, real_fft=False),
    dict(images=12, size=512, channels=64, depth=8, real_fft=True),
    dump=False,
)


# 21.6 a video enhancement model trained with a VGG perceptual loss, everything in f32


def _video_perceptual_builder(mesh, clips, frames, size, width, dtype):
    """Video enhancement (denoising) step: a small residual conv network applied to every frame of the
    clips [B, T, H, W, 3], trained with an L1 loss plus a perceptual loss, the distance between frozen
    VGG-style conv features (64-64 | pool | 128-128 | pool | 256) of the enhanced and the clean frames,
    at full resolution for every frame. dtype: the frames, the network and the frozen VGG weights
    (float32 as loaded from the checkpoint, or bfloat16)."""
    jax, jnp, NamedSharding, P = _jax()
    dt = jnp.dtype(dtype)
    f32 = jnp.float32

    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def pool(x):
        n, h, w, c = x.shape
        return x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))

    def vgg_features(vgg, x):
        h = jax.nn.relu(conv(x, vgg["c1_1"]))
        h1 = jax.nn.relu(conv(h, vgg["c1_2"]))
        h = jax.nn.relu(conv(pool(h1), vgg["c2_1"]))
        h2 = jax.nn.relu(conv(h, vgg["c2_2"]))
        h3 = jax.nn.relu(conv(pool(h2), vgg["c3_1"]))
        return h1, h2, h3

    def enhancer_step(enhancer, vgg, noisy, clean):
        x = noisy.reshape((-1,) + noisy.shape[2:])
        y = clean.reshape((-1,) + clean.shape[2:])
        feats_y = vgg_features(vgg, y)

        def loss_fn(enhancer):
            h = jax.nn.relu(conv(x, enhancer["k_in"]))
            h = jax.nn.relu(conv(h, enhancer["k_mid"]))
            out = x + conv(h, enhancer["k_out"])
            feats = vgg_features(vgg, out)
            perc = sum(jnp.mean(jnp.abs(a - b).astype(f32)) for a, b in zip(feats, feats_y))
            return jnp.mean(jnp.abs(out - y).astype(f32)) + 0.1 * perc

        loss, g = jax.value_and_grad(loss_fn)(enhancer)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), enhancer, g), loss

    k = lambda i, o: sds((3, 3, i, o), dt, mesh, P())
    enhancer = {"k_in": k(3, width), "k_mid": k(width, width), "k_out": k(width, 3)}
    vgg = {"c1_1": k(3, 64), "c1_2": k(64, 64), "c2_1": k(64, 128), "c2_2": k(128, 128), "c3_1": k(128, 256)}
    n = mesh.devices.size * clips
    noisy = sds((n, frames, size, size, 3), dt, mesh, P("d"))
    clean = sds((n, frames, size, size, 3), dt, mesh, P("d"))
    return enhancer_step, (enhancer, vgg, noisy, clean), {"donate_argnums": (0,)}


pair(
    "video_vgg_perceptual_f32", "v6e", "v6e:2x2",
    "Video denoiser trained with a VGG perceptual loss on 32 clips of 16 frames of 256x256 per device, the "
    "frames, the network and the frozen VGG weights in f32 as loaded: every frame's f32 VGG features at full "
    "resolution, kept for the backward, exceed 31.25G.",
    "Fixed variant of video_vgg_perceptual_f32_v6e: the frames, the network and the VGG weights in bf16; fits.",
    dict(category="aggregate", causes=["f32_precision", "batch_too_large", "no_remat"]),
    _video_perceptual_builder, dict(clips=32, frames=16, size=256, width=32, dtype="float32"),
    dict(clips=32, frames=16, size=256, width=32, dtype="bfloat16"),
    dump=True,
)


# 21.7 a neural ODE trained by backpropagating through every RK4 step of its solver


def _neural_ode_builder(mesh, rows, d_state, d_hidden, steps, remat_step):
    """Continuous-depth model: the state z [N, D] (f32) is integrated over t in [0, 1] with `steps`
    fixed RK4 steps (lax.scan) of a time-conditioned MLP vector field, then read out for a regression
    loss; the gradient is taken by backpropagating through the solver (discretise-then-optimise).
    remat_step=False: the scan keeps the four stages' activations of every step for the backward;
    True: the RK4 step under jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def vector_field(th, z, t):
        return jnp.tanh(z @ th["f_in"] + t * th["f_time"]) @ th["f_out"]

    def node_step(ode, z0, target):
        def mse(ode):
            dt = 1.0 / steps

            def rk4(z, i):
                t = i * dt
                k1 = vector_field(ode, z, t)
                k2 = vector_field(ode, z + 0.5 * dt * k1, t + 0.5 * dt)
                k3 = vector_field(ode, z + 0.5 * dt * k2, t + 0.5 * dt)
                k4 = vector_field(ode, z + dt * k3, t + dt)
                return z + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), None

            body = jax.checkpoint(rk4) if remat_step else rk4
            z, _ = jax.lax.scan(body, z0 @ ode["encode"], jnp.arange(steps, dtype=f32))
            return jnp.mean((z @ ode["decode"] - target) ** 2)

        loss, g = jax.value_and_grad(mse)(ode)
        return _tm(lambda p, g: p - 1e-3 * g, ode, g), loss

    D, H = d_state, d_hidden
    ode = {"encode": sds((64, D), f32, mesh, P()), "f_in": sds((D, H), f32, mesh, P()),
           "f_time": sds((H,), f32, mesh, P()), "f_out": sds((H, D), f32, mesh, P()),
           "decode": sds((D, 64), f32, mesh, P())}
    n = mesh.devices.size * rows
    z0 = sds((n, 64), f32, mesh, P("d"))
    target = sds((n, 64), f32, mesh, P("d"))
    return node_step, (ode, z0, target), {"donate_argnums": (0,)}


pair(
    "neural_ode_rk4_backprop", "v4", "v4:2x2x1",
    "Neural ODE (state 1024, MLP vector field 4096 wide) integrated with 64 RK4 steps under lax.scan on "
    "4096 rows per TensorCore, differentiated through the solver without remat: the four stages' f32 "
    "activations of all 64 steps are kept for the backward and exceed 15.25G.",
    "Fixed variant of neural_ode_rk4_backprop_v4: the RK4 step under jax.checkpoint; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _neural_ode_builder, dict(rows=4096, d_state=1024, d_hidden=4096, steps=64, remat_step=False),
    dict(rows=4096, d_state=1024, d_hidden=4096, steps=64, remat_step=True),
    dump=False,
)


# 21.8 global-norm gradient clipping through jax.flatten_util.ravel_pytree


def _flat_clip_builder(mesh, n_layers, d_model, d_ff, rows, flat):
    """A bf16 MLP stack with f32 norm scales, data parallel (replicated), trained with global-norm
    clipping and momentum. flat=True: the gradients go through jax.flatten_util.ravel_pytree (one
    vector, promoted to f32 because of the f32 scales), are clipped and unravelled; False: the
    norm is a sum of per-leaf squared sums and each leaf is scaled in its own dtype
    (optax.clip_by_global_norm)."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.flatten_util import ravel_pytree
    bf, f32 = jnp.bfloat16, jnp.float32

    def clipped_step(net, velocity, x, y):
        def mse(net):
            h = x
            for i in range(n_layers):
                blk = net[f"block{i}"]
                z = (h.astype(f32) * blk["scale"]).astype(bf)
                h = h + jax.nn.gelu(z @ blk["up"]) @ blk["down"]
            return jnp.mean((h.astype(f32) - y) ** 2)

        loss, g = jax.value_and_grad(mse)(net)
        if flat:
            gv, unravel = ravel_pytree(g)
            gv = gv * jnp.minimum(1.0, 1.0 / (jnp.linalg.norm(gv) + 1e-6))
            g = unravel(gv)
        else:
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(l.astype(f32))) for l in jax.tree_util.tree_leaves(g)))
            s = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
            g = _tm(lambda l: (l * s).astype(l.dtype), g)
        velocity = _tm(lambda v, l: (0.9 * v + l).astype(v.dtype), velocity, g)
        net = _tm(lambda p, v: (p - 1e-3 * v).astype(p.dtype), net, velocity)
        return net, velocity, loss

    def tree():
        return {f"block{i}": {"scale": sds((d_model,), f32, mesh, P()),
                              "up": sds((d_model, d_ff), bf, mesh, P()),
                              "down": sds((d_ff, d_model), bf, mesh, P())} for i in range(n_layers)}

    n = mesh.devices.size * rows
    x = sds((n, d_model), bf, mesh, P("d"))
    y = sds((n, d_model), f32, mesh, P("d"))
    return clipped_step, (tree(), tree(), x, y), {"donate_argnums": (0, 1)}


pair(
    "ravel_clip_f32", "v5e", "v5e:2x2",
    "Global-norm clipping through jax.flatten_util.ravel_pytree for a 12-block bf16 MLP (d_model 4096, "
    "d_ff 16384, 1.6 B parameters, replicated) with f32 norm scales: the gradients become one f32 vector "
    "(6 GiB) and its clipped copy, next to 6 GiB of bf16 params and momentum: beyond 15.75G.",
    "Fixed variant of ravel_clip_f32_v5e: the global norm from per-leaf squared sums, each leaf scaled in "
    "its own dtype (optax.clip_by_global_norm); fits.",
    dict(category="aggregate", causes=["large_activation", "f32_precision"]),
    _flat_clip_builder, dict(n_layers=12, d_model=4096, d_ff=16384, rows=1024, flat=True),
    dict(n_layers=12, d_model=4096, d_ff=16384, rows=1024, flat=False),
    dump=False,
)


# 21.9 a sequence-parallel long-context prefill that all-gathers the whole K/V on every device


def _seqpar_prefill_builder(mesh, seq, heads, head_dim, n_layers, q_chunk, kv_chunk, ring):
    """Long-context prefill with sequence parallelism in jax.shard_map: the sequence [S, D] is split over
    the 16 devices of v5e:4x4, `n_layers` layers (lax.scan) of causal-free blockwise attention with an
    online softmax (query chunks by lax.map, key/value chunks by lax.scan) and an MLP. ring=False: each
    layer all-gathers the full K and V ([S, H, E] each) onto every device and attends to them;
    True: ring attention, the local K/V block is passed around with jax.lax.ppermute, n steps."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n_dev = mesh.devices.size
    H, E = heads, head_dim
    D = H * E

    def attend(q, k, v, state):
        """q [Sq, H, E]; k, v [Sk, H, E]; state (o [nq, H, cq, E], m, l [nq, H, cq]) updated."""
        qc = q.reshape(-1, q_chunk, H, E)
        kc, vc = k.reshape(-1, kv_chunk, H, E), v.reshape(-1, kv_chunk, H, E)

        def per_q(args):
            qb, st = args

            def kv_step(st, kv):
                o, m, l = st
                kb, vb = kv
                s = jnp.einsum("qhe,khe->hqk", qb, kb).astype(f32) / E ** 0.5
                m2 = jnp.maximum(m, s.max(-1))
                p = jnp.exp(s - m2[..., None])
                c = jnp.exp(m - m2)
                return (o * c[..., None] + jnp.einsum("hqk,khe->hqe", p.astype(bf), vb).astype(f32),
                        m2, l * c + p.sum(-1)), None

            st, _ = jax.lax.scan(kv_step, st, (kc, vc))
            return st

        return jax.lax.map(per_q, (qc, state))

    def local_prefill(stack, x):
        def layer(x, w):
            q, k, v = (jnp.einsum("sd,dhe->she", x, w[n]) for n in ("wq", "wk", "wv"))
            nq = q.shape[0] // q_chunk
            st = (jnp.zeros((nq, H, q_chunk, E), f32), jnp.full((nq, H, q_chunk), -1e30, f32),
                  jnp.zeros((nq, H, q_chunk), f32))
            if ring:
                def ring_step(c, _):
                    st, k, v = c
                    st = attend(q, k, v, st)
                    perm = [(i, (i + 1) % n_dev) for i in range(n_dev)]
                    return (st, jax.lax.ppermute(k, "d", perm), jax.lax.ppermute(v, "d", perm)), None

                (st, _, _), _ = jax.lax.scan(ring_step, (st, k, v), None, length=n_dev)
            else:
                k_all = jax.lax.all_gather(k, "d", axis=0, tiled=True)                     # [S, H, E]
                v_all = jax.lax.all_gather(v, "d", axis=0, tiled=True)
                st = attend(q, k_all, v_all, st)
            o, m, l = st
            o = (o / l[..., None]).transpose(0, 2, 1, 3).reshape(-1, H, E).astype(bf)       # [S/n, H, E]
            x = x + jnp.einsum("she,hed->sd", o, w["wo"])
            return x + jax.nn.gelu(x @ w["mlp_in"]) @ w["mlp_out"], None

        x, _ = jax.lax.scan(layer, x, stack)
        return x

    prefill = jax.shard_map(local_prefill, mesh=mesh, in_specs=(P(), P("d")), out_specs=P("d"), check_vma=False)

    def long_context_prefill(stack, x):
        return prefill(stack, x)

    L = n_layers
    r = lambda *shape: sds(shape, bf, mesh, P())
    stack = {"wq": r(L, D, H, E), "wk": r(L, D, H, E), "wv": r(L, D, H, E), "wo": r(L, H, E, D),
             "mlp_in": r(L, D, 2 * D), "mlp_out": r(L, 2 * D, D)}
    x = sds((seq, D), bf, mesh, P("d"))
    return long_context_prefill, (stack, x), {}


pair(
    "seqpar_kv_allgather", "v5e", "v5e:4x4",
    "Sequence-parallel prefill of 1048576 tokens over the 16 devices of v5e:4x4 (4 layers, 32 heads of 128) "
    "whose attention all-gathers each layer's K and V: bf16[1048576,32,128] twice (16 GiB) on every device, "
    "beyond 15.75G.",
    "Fixed variant of seqpar_kv_allgather_v5e: ring attention, the local K/V block passed around with "
    "jax.lax.ppermute; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "large_activation"]),
    _seqpar_prefill_builder, dict(seq=1048576, heads=32, head_dim=128, n_layers=4, q_chunk=4096, kv_chunk=2048, ring=False),
    dict(seq=1048576, heads=32, head_dim=128, n_layers=4, q_chunk=4096, kv_chunk=2048, ring=True),
    dump=True,
)


# ---- 22. more broken/fixed pairs (batch tpu11): other models, other names ---------------------
#
# Programs of kinds sections 13-21 do not have (FSDP over the wrong axis of a 2-D mesh, a causal mask
# built over the flattened batch, a speculative-decoding step that keeps every draft position's full
# distribution in f32, a gradient-checkpointing flag read under the wrong config key, augmentation that
# blurs the full-resolution images before cropping, a DiT with patch size 1, FixMatch with a too-large
# unlabeled ratio, an embedding-projector callback on the whole embedding matrix, a tied output layer
# whose transposed copy is made before the decode loop). The same
# conventions: the fixed twin changes exactly the first cause. Only the projector pair keeps its dumps
# (the other after-optimizations modules are 190-560 KB).


# 22.1 FSDP written against the wrong axis of a 2-D ('data', 'model') mesh whose 'model' axis has size 1


def _mesh_axis_fsdp_builder(mesh, n_proj, width, rows, shard_axis):
    """Deep projection stack trained with heavy-ball momentum; the code builds a 2-D mesh
    ('data', 'model') = (n, 1) for later tensor parallelism and FSDP-shards every kernel and its f32
    momentum along shard_axis. 'model' has size 1, so P('model', None) replicates them."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    n = mesh.devices.size
    mesh2 = Mesh(mesh.devices.reshape(n, 1), ("data", "model"))

    def momentum_fsdp_step(kernels, velocity, feats, target):
        def regress(kernels):
            h = feats
            for i in range(n_proj):
                h = jax.nn.relu(h @ kernels[f"proj{i}"])
            return jnp.mean((h.astype(f32) - target) ** 2)

        loss, g = jax.value_and_grad(regress)(kernels)
        vel = _tm(lambda v, g: 0.9 * v + g.astype(f32), velocity, g)
        return _tm(lambda k, v: (k - 1e-3 * v).astype(k.dtype), kernels, vel), vel, loss

    kernels = {f"proj{i}": sds((width, width), bf, mesh2, P(shard_axis, None)) for i in range(n_proj)}
    velocity = {f"proj{i}": sds((width, width), f32, mesh2, P(shard_axis, None)) for i in range(n_proj)}
    feats = sds((n * rows, width), bf, mesh2, P("data"))
    target = sds((n * rows, width), f32, mesh2, P("data"))
    return momentum_fsdp_step, (kernels, velocity, feats, target), {"donate_argnums": (0, 1)}


pair(
    "mesh_axis_fsdp", "v5e", "v5e:2x2",
    "FSDP written against the size-1 'model' axis of a ('data', 'model') = (4, 1) mesh: 12 bf16 kernels "
    "[16384,16384] and their f32 momentum, P('model', None), are in effect replicated (18 GiB per device); "
    "the arguments alone exceed 15.75G.",
    "Fixed variant of mesh_axis_fsdp_v5e: kernels and momentum sharded P('data', None) over the 4 devices; fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed"]),
    _mesh_axis_fsdp_builder, dict(n_proj=12, width=16384, rows=2048, shard_axis="model"),
    dict(n_proj=12, width=16384, rows=2048, shard_axis="data"),
    dump=False,
)


# 22.2 a causal mask built over the flattened batch (every token attends across sequences)


def _flat_causal_builder(mesh, seqs, seq, d_model, heads, depth, vocab, flatten):
    """Small causal LM (scan over `depth` blocks, jax.checkpoint). flatten=True: the embedded batch is
    reshaped to one stream [B*S, D] 'to avoid the batch dim', and the causal mask / attention run over
    B*S tokens; False: attention per sequence [B, H, S, S]."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def attend(x, w):
        q, k, v = (jnp.einsum("...td,dhe->...the", x, w[n]) for n in ("q_proj", "k_proj", "v_proj"))
        T = x.shape[-2]
        causal = jnp.tril(jnp.ones((T, T), bool))
        s = jnp.einsum("...qhe,...khe->...hqk", q, k).astype(f32) / hd ** 0.5
        a = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1).astype(bf)
        o = jnp.einsum("...hqk,...khe->...qhe", a, v)
        x = x + jnp.einsum("...qhe,hed->...qd", o, w["o_proj"])
        return x + jax.nn.gelu(x @ w["up"]) @ w["down"]

    def causal_lm_step(net, ids, next_ids):
        def xent(net):
            x = jnp.take(net["embed"], ids, axis=0)                       # [B, S, D]
            if flatten:
                x = x.reshape(-1, d_model)                                 # [B*S, D]
            x, _ = jax.lax.scan(jax.checkpoint(lambda x, w: (attend(x, w), None)), x, net["blocks"])
            x = x.reshape(ids.shape + (d_model,))
            lp = jax.nn.log_softmax((x @ net["embed"].T).astype(f32), axis=-1)
            return -jnp.mean(jnp.take_along_axis(lp, next_ids[..., None], -1))

        loss, g = jax.value_and_grad(xent)(net)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), net, g), loss

    L, D, H, E = depth, d_model, heads, hd
    r = lambda *shape: sds(shape, bf, mesh, P())
    net = {"embed": r(vocab, D),
           "blocks": {"q_proj": r(L, D, H, E), "k_proj": r(L, D, H, E), "v_proj": r(L, D, H, E),
                      "o_proj": r(L, H, E, D), "up": r(L, D, 4 * D), "down": r(L, 4 * D, D)}}
    n = mesh.devices.size * seqs
    ids = sds((n, seq), jnp.int32, mesh, P("d"))
    next_ids = sds((n, seq), jnp.int32, mesh, P("d"))
    return causal_lm_step, (net, ids, next_ids), {"donate_argnums": (0,)}


pair(
    "flat_causal_mask", "v6e", "v6e:2x2",
    "Causal LM (4 blocks, d_model 1024, 8 heads) on 64 sequences of 1024 tokens per device whose batch is "
    "flattened into one 262144-token stream before attention: the causal mask and scores cover B*S x B*S "
    "tokens, far beyond 31.25G.",
    "Fixed variant of flat_causal_mask_v6e: attention per sequence ([B, H, S, S]), the batch not flattened; fits.",
    dict(category="single_large_allocation", causes=["shape_bug", "large_activation", "batch_too_large"]),
    _flat_causal_builder, dict(seqs=64, seq=1024, d_model=1024, heads=8, depth=4, vocab=32768, flatten=True),
    dict(seqs=64, seq=1024, d_model=1024, heads=8, depth=4, vocab=32768, flatten=False),
    dump=False,
)


# 22.3 speculative decoding that keeps every draft position's full distribution in f32


def _spec_decode_builder(mesh, seqs, n_draft, vocab, d_small, d_big, probs_dtype):
    """One speculative-decoding round: a small draft LM head proposes n_draft tokens autoregressively
    (lax.scan) and keeps its full distribution q [K, B, V] per position for the rejection step; the target
    model scores all K+1 positions at once (p [B, K+1, V]); tokens are accepted with probability
    min(1, p/q) and the first rejected position is resampled from max(0, p - q). probs_dtype: the dtype in
    which q and p are kept."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def speculative_round(drafter, verifier, h_small, h_big, rng):
        keys = jax.random.split(rng, n_draft + 2)

        def propose(h, k):
            logits = h @ drafter["lm_head"]
            tok = jax.random.categorical(k, logits.astype(f32), axis=-1)
            q = jax.nn.softmax(logits.astype(f32), axis=-1).astype(probs_dtype)
            h = jnp.tanh(h + jnp.take(drafter["embed"], tok, axis=0) @ drafter["mix"]).astype(bf)
            return h, (tok, q)

        _, (toks, q) = jax.lax.scan(propose, h_small, keys[:n_draft])          # [K, B], [K, B, V]
        e = jnp.take(verifier["embed"], toks.T, axis=0)                          # [B, K, Db]
        hs = jnp.concatenate([h_big[:, None, :], jnp.tanh(h_big[:, None, :] + e @ verifier["mix"]).astype(bf)], 1)
        p = jax.nn.softmax((hs @ verifier["lm_head"]).astype(f32), axis=-1).astype(probs_dtype)   # [B, K+1, V]
        qt = jnp.swapaxes(q, 0, 1)                                               # [B, K, V]
        p_tok = jnp.take_along_axis(p[:, :n_draft], toks.T[..., None], -1)[..., 0].astype(f32)
        q_tok = jnp.take_along_axis(qt, toks.T[..., None], -1)[..., 0].astype(f32)
        u = jax.random.uniform(keys[-2], p_tok.shape)
        accepted = jnp.cumprod(u < p_tok / q_tok, axis=1).sum(1)                 # [B]
        p_at = jnp.take_along_axis(p, accepted[:, None, None], 1)[:, 0].astype(f32)
        q_pad = jnp.concatenate([qt, jnp.zeros_like(qt[:, :1])], 1)
        q_at = jnp.take_along_axis(q_pad, accepted[:, None, None], 1)[:, 0].astype(f32)
        resid = jnp.maximum(p_at - q_at, 0.0)
        bonus = jax.random.categorical(keys[-1], jnp.log(resid + 1e-20), axis=-1)
        return toks.T, accepted, bonus

    drafter = {"lm_head": sds((d_small, vocab), bf, mesh, P()), "embed": sds((vocab, d_small), bf, mesh, P()),
               "mix": sds((d_small, d_small), bf, mesh, P())}
    verifier = {"lm_head": sds((d_big, vocab), bf, mesh, P()), "embed": sds((vocab, d_big), bf, mesh, P()),
                "mix": sds((d_big, d_big), bf, mesh, P())}
    n = mesh.devices.size * seqs
    h_small = sds((n, d_small), bf, mesh, P("d"))
    h_big = sds((n, d_big), bf, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, P())
    return speculative_round, (drafter, verifier, h_small, h_big, rng), {}


pair(
    "spec_decode_probs_f32", "v5e", "v5e:2x2",
    "Speculative-decoding round (8 draft tokens, vocabulary 262144) for 512 sequences per device that keeps "
    "the draft's full distribution per position and the target's for all 9 positions in f32 "
    "(f32[8,512,262144] and f32[512,9,262144]): beyond 15.75G.",
    "Fixed variant of spec_decode_probs_f32_v5e: the draft and target distributions kept in bf16; fits.",
    dict(category="aggregate", causes=["f32_precision", "large_activation", "batch_too_large"]),
    _spec_decode_builder, dict(seqs=512, n_draft=8, vocab=262144, d_small=512, d_big=2048, probs_dtype="float32"),
    dict(seqs=512, n_draft=8, vocab=262144, d_small=512, d_big=2048, probs_dtype="bfloat16"),
    dump=False,
)


# 22.4 gradient checkpointing switched on in the config, but read under another key


def _remat_key_builder(mesh, images, patches, width, heads, depth, cfg):
    """ViT encoder (patch tokens precomputed, `depth` pre-LN blocks in lax.scan) for classification. The
    block is wrapped in jax.checkpoint when cfg.get("remat") is true; cfg: the run's config dict."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = width // heads
    use_remat = bool(cfg.get("remat", False))

    def norm(x):
        z = x.astype(f32)
        return ((z - z.mean(-1, keepdims=True)) * jax.lax.rsqrt(z.var(-1, keepdims=True) + 1e-6)).astype(bf)

    def vit_block(x, w):
        y = norm(x)
        q, k, v = (jnp.einsum("bnd,dhe->bnhe", y, w[n]) for n in ("wq", "wk", "wv"))
        a = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(f32) / hd ** 0.5, axis=-1).astype(bf)
        x = x + jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["wo"])
        return x + jax.nn.gelu(norm(x) @ w["fc1"]) @ w["fc2"], None

    block = jax.checkpoint(vit_block) if use_remat else vit_block

    def vit_train_step(vit, patch_tokens, classes):
        def xent(vit):
            x = patch_tokens @ vit["patch_proj"] + vit["pos"]
            x, _ = jax.lax.scan(block, x, vit["blocks"])
            logits = (norm(x).mean(1) @ vit["head"]).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), classes[:, None], 1))

        loss, g = jax.value_and_grad(xent)(vit)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), vit, g), loss

    L, D, H, E = depth, width, heads, hd
    r = lambda *shape: sds(shape, bf, mesh, P())
    vit = {"patch_proj": r(768, D), "pos": r(patches, D), "head": r(D, 1000),
           "blocks": {"wq": r(L, D, H, E), "wk": r(L, D, H, E), "wv": r(L, D, H, E), "wo": r(L, H, E, D),
                      "fc1": r(L, D, 4 * D), "fc2": r(L, 4 * D, D)}}
    n = mesh.devices.size * images
    patch_tokens = sds((n, patches, 768), bf, mesh, P("d"))
    classes = sds((n,), jnp.int32, mesh, P("d"))
    return vit_train_step, (vit, patch_tokens, classes), {"donate_argnums": (0,)}


pair(
    "remat_config_key", "v5p", "v5p:2x2x1",
    "ViT-L step (24 blocks, width 1024, 256 patches) on 384 images per device whose config sets "
    "{'gradient_checkpointing': True} while the model reads cfg.get('remat'): no jax.checkpoint, every "
    "block's activations kept for the backward pass, beyond 95.74G.",
    "Fixed variant of remat_config_key_v5p: the config key the model reads, {'remat': True}, so the scanned "
    "block is under jax.checkpoint; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _remat_key_builder, dict(images=384, patches=256, width=1024, heads=16, depth=24, cfg={"gradient_checkpointing": True}),
    dict(images=384, patches=256, width=1024, heads=16, depth=24, cfg={"remat": True}),
    dump=False,
)


# 22.5 augmentation (blur, colour jitter) on the full-resolution images before the random crop


def _augment_order_builder(mesh, images, side, crop, crop_first):
    """Self-supervised pretraining input stage on the device: uint8 photos [B, side, side, 3] are
    Gaussian-blurred (5x5 depthwise conv) and colour-jittered in f32, then randomly cropped to crop x crop
    and fed to a patch-MLP encoder. crop_first=True crops the uint8 images first and augments the crops."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    g = jnp.exp(-jnp.arange(-2, 3, dtype=f32) ** 2 / 2.0)
    g2 = (g[:, None] * g[None, :]) / jnp.sum(g) ** 2
    kernel = jnp.broadcast_to(g2[:, :, None, None], (5, 5, 1, 3))

    def augment(x, rng):
        x = x.astype(f32) / 255.0
        x = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         feature_group_count=3)
        gain = 1.0 + 0.4 * jax.random.uniform(rng, (x.shape[0], 1, 1, 3), minval=-1.0)
        return jnp.clip(x * gain, 0.0, 1.0)

    def take_crops(x, rng):
        off = jax.random.randint(rng, (x.shape[0], 2), 0, side - crop)
        return jax.vmap(lambda im, o: jax.lax.dynamic_slice(im, (o[0], o[1], 0), (crop, crop, 3)))(x, off)

    def pretrain_step(encoder, photos, rng):
        k_aug, k_crop = jax.random.split(rng)
        if crop_first:
            views = augment(take_crops(photos, k_crop), k_aug)
        else:
            views = take_crops(augment(photos, k_aug), k_crop)
        b = views.shape[0]
        tok = views.reshape(b, crop // 16, 16, crop // 16, 16, 3).transpose(0, 1, 3, 2, 4, 5)
        tok = tok.reshape(b, (crop // 16) ** 2, 768).astype(bf)

        def recon(encoder):
            h = jax.nn.gelu(tok @ encoder["embed"])
            return jnp.mean(((h @ encoder["unembed"]).astype(f32) - tok.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(recon)(encoder)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), encoder, g), loss

    encoder = {"embed": sds((768, 1024), bf, mesh, P()), "unembed": sds((1024, 768), bf, mesh, P())}
    n = mesh.devices.size * images
    photos = sds((n, side, side, 3), jnp.uint8, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, P())
    return pretrain_step, (encoder, photos, rng), {"donate_argnums": (0,)}


pair(
    "augment_before_crop", "v4", "v4:2x2x1",
    "Pretraining step whose on-device augmentation blurs and colour-jitters 64 uint8 photos of 4096x4096 per "
    "TensorCore in f32 before taking 224x224 random crops: full-resolution f32 images, beyond 15.25G.",
    "Fixed variant of augment_before_crop_v4: the uint8 photos cropped first, the 224x224 crops augmented; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "padding"]),
    _augment_order_builder, dict(images=64, side=4096, crop=224, crop_first=False),
    dict(images=64, side=4096, crop=224, crop_first=True),
    dump=False,
)


# 22.6 a diffusion transformer (DiT) at 512 px with patch size 1 on the latent grid


def _dit_patch_builder(mesh, images, latent, patch, width, heads, depth):
    """DiT training step (adaLN-zero blocks conditioned on timestep + class, lax.scan, jax.checkpoint) on
    VAE latents [B, latent, latent, 4]; the latent grid is cut into patch x patch tokens."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = width // heads
    T = (latent // patch) ** 2
    pdim = patch * patch * 4

    def dit_block(x, w, c):
        mod = (c @ w["ada"]).reshape(c.shape[0], 1, 6, -1)
        sh1, sc1, g1, sh2, sc2, g2 = (mod[:, :, i] for i in range(6))
        y = x.astype(f32)
        y = ((y - y.mean(-1, keepdims=True)) * jax.lax.rsqrt(y.var(-1, keepdims=True) + 1e-6)).astype(bf)
        y = y * (1 + sc1) + sh1
        q, k, v = (jnp.einsum("btd,dhe->bthe", y, w[n]) for n in ("to_q", "to_k", "to_v"))
        a = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(f32) / hd ** 0.5, axis=-1).astype(bf)
        x = x + g1 * jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["to_out"])
        y = x * (1 + sc2) + sh2
        return x + g2 * (jax.nn.gelu(y @ w["mlp1"]) @ w["mlp2"])

    def dit_train_step(dit, latents, noise, t_emb, y_emb):
        def eps_mse(dit):
            b = latents.shape[0]
            zt = (0.7 * latents + 0.7 * noise).astype(bf)
            tok = zt.reshape(b, latent // patch, patch, latent // patch, patch, 4).transpose(0, 1, 3, 2, 4, 5)
            x = tok.reshape(b, T, pdim) @ dit["patchify"] + dit["pos"]
            c = jax.nn.silu(t_emb + y_emb)
            x, _ = jax.lax.scan(jax.checkpoint(lambda x, w: (dit_block(x, w, c), None)), x, dit["blocks"])
            out = (x @ dit["unpatchify"]).reshape(b, latent // patch, latent // patch, patch, patch, 4)
            out = out.transpose(0, 1, 3, 2, 4, 5).reshape(latents.shape)
            return jnp.mean((out.astype(f32) - noise) ** 2)

        loss, g = jax.value_and_grad(eps_mse)(dit)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), dit, g), loss

    L, D, H, E = depth, width, heads, hd
    r = lambda *shape: sds(shape, bf, mesh, P())
    dit = {"patchify": r(pdim, D), "pos": r(T, D), "unpatchify": r(D, pdim),
           "blocks": {"ada": r(L, D, 6 * D), "to_q": r(L, D, H, E), "to_k": r(L, D, H, E), "to_v": r(L, D, H, E),
                      "to_out": r(L, H, E, D), "mlp1": r(L, D, 4 * D), "mlp2": r(L, 4 * D, D)}}
    n = mesh.devices.size * images
    latents = sds((n, latent, latent, 4), f32, mesh, P("d"))
    noise = sds((n, latent, latent, 4), f32, mesh, P("d"))
    t_emb = sds((n, D), bf, mesh, P("d"))
    y_emb = sds((n, D), bf, mesh, P("d"))
    return dit_train_step, (dit, latents, noise, t_emb, y_emb), {"donate_argnums": (0,)}


pair(
    "dit_patch_size", "v6e", "v6e:2x2",
    "DiT-L step (24 adaLN blocks, width 1024, 16 heads) on 32 latents of 64x64x4 (512 px) per device with "
    "patch size 1: 4096 tokens per image, f32 scores [32,16,4096,4096] per block, beyond 31.25G.",
    "Fixed variant of dit_patch_size_v6e: patch size 2 (1024 tokens per image, DiT-L/2); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _dit_patch_builder, dict(images=32, latent=64, patch=1, width=1024, heads=16, depth=24),
    dict(images=32, latent=64, patch=2, width=1024, heads=16, depth=24),
    dump=False,
)


# 22.7 FixMatch with a large unlabeled-to-labeled ratio (two views of every unlabeled image)


def _fixmatch_builder(mesh, labeled, mu, patches, width, depth):
    """FixMatch step: a patch-MLP-mixer classifier (lax.scan over `depth` mixer blocks, jax.checkpoint)
    on `labeled` labeled images and mu * labeled unlabeled ones per device; every unlabeled image is
    seen as a weak and a strong view (both patch tokens from the data pipeline); the weak view's
    confident predictions are the strong view's pseudo-labels."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mixer_block(x, w):
        z = x.astype(f32)
        z = (z * jax.lax.rsqrt(jnp.mean(z * z, -1, keepdims=True) + 1e-6)).astype(bf)
        x = x + jnp.einsum("bpd,pq->bqd", jax.nn.gelu(jnp.einsum("bpd,pq->bqd", z, w["tok1"])), w["tok2"])
        return x + jax.nn.gelu(x @ w["ch1"]) @ w["ch2"], None

    def classify(net, x):
        h = x @ net["stem"]
        h, _ = jax.lax.scan(jax.checkpoint(mixer_block), h, net["mixers"])
        return (h.mean(1) @ net["cls"]).astype(f32)

    def fixmatch_step(net, x_lab, y_lab, x_weak, x_strong):
        def total(net):
            sup = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(classify(net, x_lab)), y_lab[:, None], 1))
            pw = jax.nn.softmax(jax.lax.stop_gradient(classify(net, x_weak)))
            pseudo, conf = jnp.argmax(pw, -1), jnp.max(pw, -1)
            ls = jax.nn.log_softmax(classify(net, x_strong))
            unsup = -jnp.mean((conf > 0.95) * jnp.take_along_axis(ls, pseudo[:, None], 1)[:, 0])
            return sup + unsup

        loss, g = jax.value_and_grad(total)(net)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), net, g), loss

    L, D, T = depth, width, patches
    r = lambda *shape: sds(shape, bf, mesh, P())
    net = {"stem": r(768, D), "cls": r(D, 100),
           "mixers": {"tok1": r(L, T, 4 * T), "tok2": r(L, 4 * T, T), "ch1": r(L, D, 4 * D), "ch2": r(L, 4 * D, D)}}
    n = mesh.devices.size
    x_lab = sds((n * labeled, T, 768), bf, mesh, P("d"))
    y_lab = sds((n * labeled,), jnp.int32, mesh, P("d"))
    x_weak = sds((n * labeled * mu, T, 768), bf, mesh, P("d"))
    x_strong = sds((n * labeled * mu, T, 768), bf, mesh, P("d"))
    return fixmatch_step, (net, x_lab, y_lab, x_weak, x_strong), {"donate_argnums": (0,)}


pair(
    "fixmatch_unlabeled_ratio", "v4", "v4:2x2x1",
    "FixMatch step (MLP-mixer, 16 blocks, width 1024, 256 patches) with 64 labeled images and mu = 16 times "
    "as many unlabeled ones per TensorCore, each seen as a weak and a strong view: beyond 15.25G.",
    "Fixed variant of fixmatch_unlabeled_ratio_v4: mu = 4 unlabeled images per labeled one; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["batch_too_large", "large_activation"]),
    _fixmatch_builder, dict(labeled=64, mu=16, patches=256, width=1024, depth=16),
    dict(labeled=64, mu=4, patches=256, width=1024, depth=16),
    dump=False,
)


# 22.8 an embedding-projector logging callback handed the whole (sharded) embedding matrix


def _projector_callback_builder(mesh, rows, feat, dim, sample):
    """Dual-encoder training step (in-batch contrastive loss per device) that also sends embeddings to a
    host-side projector / nearest-neighbour logger through jax.debug.callback. sample=None: the whole
    embedding matrix [N, dim] f32; otherwise only its first `sample` rows."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def log_to_projector(emb):
        pass

    def retrieval_step(towers, queries, docs):
        def info_nce(towers):
            qe = jnp.tanh(queries @ towers["query_tower"]).astype(f32)
            de = jnp.tanh(docs @ towers["doc_tower"]).astype(f32)
            qe = qe.reshape(mesh.devices.size, -1, dim)
            de = de.reshape(mesh.devices.size, -1, dim)
            s = jnp.einsum("wqd,wkd->wqk", qe[:, :1024], de[:, :1024])
            loss = jnp.mean(jax.nn.logsumexp(s, -1) - jnp.diagonal(s, axis1=1, axis2=2))
            return loss, de.reshape(-1, dim)

        (loss, doc_emb), g = jax.value_and_grad(info_nce, has_aux=True)(towers)
        jax.debug.callback(log_to_projector, doc_emb if sample is None else doc_emb[:sample])
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), towers, g), loss

    towers = {"query_tower": sds((feat, dim), bf, mesh, P()), "doc_tower": sds((feat, dim), bf, mesh, P())}
    n = mesh.devices.size * rows
    queries = sds((n, feat), bf, mesh, P("d"))
    docs = sds((n, feat), bf, mesh, P("d"))
    return retrieval_step, (towers, queries, docs), {"donate_argnums": (0,)}


pair(
    "projector_callback", "v5e", "v5e:4x4",
    "Dual-encoder step on the 16 devices of v5e:4x4 that passes the whole f32 document-embedding matrix "
    "[4194304,1024] (1 GiB per device, 16 GiB global) to jax.debug.callback for a host-side projector: "
    "gathered onto one device, beyond 15.75G.",
    "Fixed variant of projector_callback_v5e: the callback gets only the first 4096 embeddings; fits.",
    dict(category="single_large_allocation", causes=["debug_print"]),
    _projector_callback_builder, dict(rows=262144, feat=256, dim=1024, sample=None),
    dict(rows=262144, feat=256, dim=1024, sample=4096),
    dump=True,
)


# 22.9 a tied output layer: the item-embedding table transposed (and cast to f32) once, before the decode loop


def _tied_items_builder(mesh, users, items, dim, steps, f32_copy):
    """Generative next-item recommender decoding `steps` items per user greedily (lax.scan), the output
    layer tied to the item-embedding table [items, dim] (bf16, replicated for serving). f32_copy=True: the
    decode code prepares `out_w = table.T.astype(f32)` once, outside the loop, 'for stable logits';
    False: logits = h @ table.T in bf16 with f32 accumulation (preferred_element_type)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def recommend_items(rec, history_state, last_item):
        table = rec["item_table"]
        out_w = table.T.astype(f32) if f32_copy else None

        def next_item(c, _):
            h, it = c
            h = jnp.tanh(h @ rec["cell"] + jnp.take(table, it, axis=0)).astype(bf)
            if f32_copy:
                scores = h.astype(f32) @ out_w
            else:
                scores = jnp.einsum("bd,vd->bv", h, table, preferred_element_type=f32)
            it = jnp.argmax(scores, axis=-1).astype(jnp.int32)
            return (h, it), it

        _, picked = jax.lax.scan(next_item, (history_state, last_item), None, length=steps)
        return picked.T

    rec = {"item_table": sds((items, dim), bf, mesh, P()), "cell": sds((dim, dim), bf, mesh, P())}
    n = mesh.devices.size * users
    history_state = sds((n, dim), bf, mesh, P("d"))
    last_item = sds((n,), jnp.int32, mesh, P("d"))
    return recommend_items, (rec, history_state, last_item), {}


pair(
    "tied_items_transposed", "v6e", "v6e:2x2",
    "Next-item recommender decoding 20 items for 256 users per device, the output layer tied to a bf16 "
    "item table [2097152,4096] (16 GiB, replicated): the decode code prepares table.T.astype(f32) once "
    "before the loop; the compiler keeps that transposed copy (as bf16[4096,2097152], 16 GiB) next to the "
    "table, beyond 31.25G.",
    "Fixed variant of tied_items_transposed_v6e: the scores from the table itself, einsum('bd,vd->bv') with "
    "f32 accumulation (preferred_element_type), no transposed copy; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "replicated_tensor"]),
    _tied_items_builder, dict(users=256, items=2097152, dim=4096, steps=20, f32_copy=True),
    dict(users=256, items=2097152, dim=4096, steps=20, f32_copy=False),
    dump=True,
)


# ---- 23. more broken/fixed pairs (batch tpu12): other models, other names ---------------------
#
# Programs of kinds sections 13-22 do not have (a 3-D U-Net on full-resolution multi-modal MRI volumes
# without rematerialization, a GAN discriminator step run in f32 on the real and the generated batch, a
# retrieval-augmented reader that concatenates every retrieved passage into one context, ZeRO-3 weights
# all-gathered once before the layer scan, a learned positional table of a 1M-token maximum length kept
# replicated in f32, a global batch size used as the per-device batch, a super-resolution network that
# upsamples before its conv body, an activation-offload policy whose destination is 'device', an MoE
# layer whose expert capacity forgets to divide by the number of experts). The same conventions: the
# fixed twin changes exactly the first cause. Only the ZeRO-3 pair keeps its dumps (every other pair has
# a dump file over 160 KB: 170-309 KB).


# 23.1 a 3-D U-Net on full-resolution multi-modal MRI volumes (no patching), no rematerialization


def _unet3d_builder(mesh, vols, side, width, modalities, classes, remat):
    """3-D U-Net (two conv3x3x3 + GELU per stage, 3 resolutions, skip connections by concatenation) for
    voxel-wise tumour segmentation of whole [side]^3 volumes with `modalities` MRI channels. remat=True
    wraps every stage in jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    dn = ("NDHWC", "DHWIO", "NDHWC")

    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1, 1), "SAME", dimension_numbers=dn)

    def stage(x, ks):
        for k in ks:
            x = jax.nn.gelu(conv(x, k)).astype(bf)
        return x

    run = jax.checkpoint(stage) if remat else stage

    def down(x):
        b, d, h, w, c = x.shape
        return x.reshape(b, d // 2, 2, h // 2, 2, w // 2, 2, c).mean((2, 4, 6)).astype(bf)

    def up(x):
        for ax in (1, 2, 3):
            x = jnp.repeat(x, 2, axis=ax)
        return x

    def segment_step(unet, mri, seg):
        def dice_xent(unet):
            e0 = run(mri, unet["enc0"])
            e1 = run(down(e0), unet["enc1"])
            mid = run(down(e1), unet["mid"])
            d1 = run(jnp.concatenate([up(mid), e1], -1), unet["dec1"])
            d0 = run(jnp.concatenate([up(d1), e0], -1), unet["dec0"])
            logits = conv(d0, unet["head"]).astype(f32)
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, seg[..., None], -1))

        loss, g = jax.value_and_grad(dice_xent)(unet)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), unet, g), loss

    c = width
    k = lambda i, o: sds((3, 3, 3, i, o), bf, mesh, P())
    unet = {"enc0": [k(modalities, c), k(c, c)], "enc1": [k(c, 2 * c), k(2 * c, 2 * c)],
            "mid": [k(2 * c, 4 * c), k(4 * c, 4 * c)], "dec1": [k(6 * c, 2 * c), k(2 * c, 2 * c)],
            "dec0": [k(3 * c, c), k(c, c)], "head": k(c, classes)}
    n = mesh.devices.size * vols
    mri = sds((n, side, side, side, modalities), bf, mesh, P("d"))
    seg = sds((n, side, side, side), jnp.int32, mesh, P("d"))
    return segment_step, (unet, mri, seg), {"donate_argnums": (0,)}


pair(
    "unet3d_full_volume", "v4", "v4:2x2x1",
    "3-D U-Net (width 128, 3 resolutions, no rematerialization) trained on whole 128^3 four-modality MRI "
    "volumes, 2 per TensorCore, no patching: the full-resolution 3-D conv activations and the conv "
    "temporaries of the decoder's 384-channel concatenation go beyond 15.25G.",
    "Fixed variant of unet3d_full_volume_v4: trained on random 64^3 patches of the volumes (2 per "
    "TensorCore), the rest unchanged; fits.",
    dict(category="aggregate", causes=["batch_too_large", "large_activation", "no_remat"]),
    _unet3d_builder, dict(vols=2, side=128, width=128, modalities=4, classes=4, remat=False),
    dict(vols=2, side=64, width=128, modalities=4, classes=4, remat=False),
    dump=False,
)


# 23.2 a GAN discriminator step that runs the discriminator in f32 on the real and the generated batch


def _gan_disc_builder(mesh, images, side, latent, disc_dtype):
    """Discriminator update of a non-saturating GAN: the generator (bf16, frozen for this step) renders
    `images` fakes per device from latents, the discriminator (5 convs, leaky ReLU) scores the real and the
    fake batch, and the logistic loss is differentiated w.r.t. the discriminator. disc_dtype: the dtype of
    the discriminator's compute (its f32 master weights cast to it, and both batches)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    dt = jnp.dtype(disc_dtype)
    dn = ("NHWC", "HWIO", "NHWC")

    def generate(gen, z):
        x = (z @ gen["fc"]).reshape(z.shape[0], 16, 16, 256)
        for k in gen["ups"]:
            x = jnp.repeat(jnp.repeat(x, 2, 1), 2, 2)
            x = jax.nn.relu(jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dn))
        return jnp.tanh(jax.lax.conv_general_dilated(x, gen["rgb"], (1, 1), "SAME", dimension_numbers=dn))

    def critic(disc, x):
        x = x.astype(dt)
        for i, k in enumerate(disc["convs"]):
            s = 1 if i == 0 else 2
            x = jax.nn.leaky_relu(jax.lax.conv_general_dilated(x, k.astype(dt), (s, s), "SAME",
                                                               dimension_numbers=dn), 0.2)
        return x.mean((1, 2)) @ disc["fc"].astype(dt)

    def discriminator_step(disc, gen, photos, z):
        fakes = jax.lax.stop_gradient(generate(gen, z))

        def logistic(disc):
            real_logit = critic(disc, photos).astype(f32)
            fake_logit = critic(disc, fakes).astype(f32)
            return jnp.mean(jax.nn.softplus(-real_logit)) + jnp.mean(jax.nn.softplus(fake_logit))

        loss, g = jax.value_and_grad(logistic)(disc)
        return _tm(lambda p, g: p - 2e-4 * g.astype(f32), disc, g), loss

    w = lambda *s: sds(s, f32, mesh, P())
    b = lambda *s: sds(s, bf, mesh, P())
    disc = {"convs": [w(3, 3, 3, 128), w(4, 4, 128, 128), w(4, 4, 128, 256), w(4, 4, 256, 512),
                      w(4, 4, 512, 512)], "fc": w(512, 1)}
    ups = []
    ch = 256
    s = 16
    while s < side:
        ups.append(b(3, 3, ch, 128))
        ch, s = 128, s * 2
    gen = {"fc": b(latent, 16 * 16 * 256), "ups": ups, "rgb": b(3, 3, 128, 3)}
    n = mesh.devices.size * images
    photos = sds((n, side, side, 3), bf, mesh, P("d"))
    z = sds((n, latent), bf, mesh, P("d"))
    return discriminator_step, (disc, gen, photos, z), {"donate_argnums": (0,)}


pair(
    "gan_disc_f32", "v6e", "v6e:2x2",
    "GAN discriminator step on 256x256 photos, 640 real and 640 generated per device, the discriminator "
    "computed in f32 (weights and both batches): its f32 conv and leaky-ReLU activations for the real and "
    "the fake batch are kept for the backward pass, beyond 31.25G.",
    "Fixed variant of gan_disc_f32_v6e: the discriminator computed in bf16 (f32 master weights cast); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "batch_too_large", "no_remat"]),
    _gan_disc_builder, dict(images=640, side=256, latent=512, disc_dtype="float32"),
    dict(images=640, side=256, latent=512, disc_dtype="bfloat16"),
    dump=False,
)


# 23.3 a retrieval-augmented reader that concatenates every retrieved passage into one long context


def _rag_reader_builder(mesh, questions, passages, psg_len, d_model, heads, depth, fuse_late):
    """Extractive reader of a retrieval-augmented QA system: each question comes with `passages` retrieved
    passages of psg_len tokens (question already prefixed to each). fuse_late=False: the passages are
    concatenated into one [passages * psg_len] context and encoded with full self-attention; True
    (fusion-in-decoder style): every passage encoded on its own, the span scores taken over all of them.
    Blocks under jax.checkpoint in both."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def encoder_block(x, w):
        q, k, v = (jnp.einsum("btd,dhe->bthe", x, w[n]) for n in ("wq", "wk", "wv"))
        a = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(f32) / hd ** 0.5, -1).astype(bf)
        x = x + jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["wo"])
        return (x + jax.nn.gelu(x @ w["ff_in"]) @ w["ff_out"]).astype(bf), None

    def reader_step(reader, ctx_ids, start, end):
        def span_nll(reader):
            ids = ctx_ids.reshape(-1, psg_len) if fuse_late else ctx_ids.reshape(ctx_ids.shape[0], -1)
            x = jnp.take(reader["tok"], ids, axis=0)
            x, _ = jax.lax.scan(jax.checkpoint(encoder_block), x, reader["layers"])
            x = x.reshape(ctx_ids.shape[0], passages * psg_len, d_model)
            se = (x @ reader["span"]).astype(f32)                               # [B, T, 2]
            ls = jax.nn.log_softmax(se[..., 0], -1)
            le = jax.nn.log_softmax(se[..., 1], -1)
            return -jnp.mean(jnp.take_along_axis(ls, start[:, None], 1) + jnp.take_along_axis(le, end[:, None], 1))

        loss, g = jax.value_and_grad(span_nll)(reader)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), reader, g), loss

    L, D, H, E = depth, d_model, heads, hd
    r = lambda *s: sds(s, bf, mesh, P())
    reader = {"tok": r(32128, D), "span": r(D, 2),
              "layers": {"wq": r(L, D, H, E), "wk": r(L, D, H, E), "wv": r(L, D, H, E), "wo": r(L, H, E, D),
                         "ff_in": r(L, D, 4 * D), "ff_out": r(L, 4 * D, D)}}
    n = mesh.devices.size * questions
    ctx_ids = sds((n, passages, psg_len), jnp.int32, mesh, P("d"))
    start = sds((n,), jnp.int32, mesh, P("d"))
    end = sds((n,), jnp.int32, mesh, P("d"))
    return reader_step, (reader, ctx_ids, start, end), {"donate_argnums": (0,)}


pair(
    "rag_concat_passages", "v5p", "v5p:2x2x1",
    "Retrieval-augmented extractive reader (6 blocks, d_model 1024, 16 heads) trained on 4 questions per "
    "device, each with 64 retrieved passages of 256 tokens concatenated into one 16384-token context under "
    "full self-attention: [4,16,16384,16384] attention per block, beyond 95.74G.",
    "Fixed variant of rag_concat_passages_v5p: every passage encoded on its own (fusion-in-decoder style, "
    "attention [256,16,256,256]), the span scores over all passages; fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large"]),
    _rag_reader_builder, dict(questions=4, passages=64, psg_len=256, d_model=1024, heads=16, depth=6,
                              fuse_late=False),
    dict(questions=4, passages=64, psg_len=256, d_model=1024, heads=16, depth=6, fuse_late=True),
    dump=False,
)


# 23.4 ZeRO-3 / FSDP weights all-gathered once, before the scan over layers


def _zero3_upfront_builder(mesh, layers, d_model, d_ff, rows, gather_per_layer):
    """Feed-forward stack (residual GELU MLP blocks in lax.scan, jax.checkpoint) whose stacked weights are
    stored sharded P(None, 'd', None). gather_per_layer=False: the step all-gathers the whole stack once,
    before the scan ('one big collective is faster'), via with_sharding_constraint(..., P()); True: each
    layer's weights are gathered inside the scan body."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    full = NamedSharding(mesh, P())

    def ffn_stack_step(stack, acts, targets):
        def mse(stack):
            if not gather_per_layer:
                stack = jax.lax.with_sharding_constraint(stack, full)

            def block(x, w):
                if gather_per_layer:
                    w = jax.lax.with_sharding_constraint(w, full)
                return (x + jax.nn.gelu(x @ w["fc1"]) @ w["fc2"]).astype(bf), None

            y, _ = jax.lax.scan(jax.checkpoint(block), acts, stack)
            return jnp.mean((y.astype(f32) - targets) ** 2)

        loss, g = jax.value_and_grad(mse)(stack)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), stack, g), loss

    stack = {"fc1": sds((layers, d_model, d_ff), bf, mesh, P(None, "d", None)),
             "fc2": sds((layers, d_ff, d_model), bf, mesh, P(None, "d", None))}
    n = mesh.devices.size * rows
    acts = sds((n, d_model), bf, mesh, P("d"))
    targets = sds((n, d_model), f32, mesh, P("d"))
    return ffn_stack_step, (stack, acts, targets), {"donate_argnums": (0,)}


pair(
    "zero3_gather_upfront", "v5e", "v5e:2x2",
    "FSDP/ZeRO-3 stack of 48 MLP blocks (4096 -> 16384 -> 4096, bf16, 12 GiB, sharded 3 GiB per device) "
    "whose step all-gathers the whole stack once before the layer scan: the gathered 12 GiB copy and its "
    "full-size gradient exceed 15.75G.",
    "Fixed variant of zero3_gather_upfront_v5e: each layer's weights gathered inside the scan body; fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _zero3_upfront_builder, dict(layers=48, d_model=4096, d_ff=16384, rows=8192, gather_per_layer=False),
    dict(layers=48, d_model=4096, d_ff=16384, rows=8192, gather_per_layer=True),
    dump=True,
)


# 23.5 a learned positional table for a 1M-token maximum length, replicated and in f32


def _learned_pos_builder(mesh, max_len, d_model, vocab, seqs, seq, table_spec):
    """Long-context encoder with a learned absolute position table [max_len, d_model] in f32 ('positions
    are learned slowly, keep them in f32'), trained with plain SGD. table_spec: its PartitionSpec."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def long_ctx_step(enc, tokens, offsets, labels):
        def nll(enc):
            pos = offsets[:, None] + jnp.arange(seq)[None, :]
            x = jnp.take(enc["tok_emb"], tokens, axis=0) + jnp.take(enc["pos_emb"], pos, axis=0).astype(bf)
            h = jax.nn.gelu(x @ enc["mix"]).astype(bf)
            logits = (h.mean(1) @ enc["cls"]).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[:, None], 1))

        loss, g = jax.value_and_grad(nll)(enc)
        return _tm(lambda p, g: (p - 1e-3 * g.astype(p.dtype)).astype(p.dtype), enc, g), loss

    enc = {"tok_emb": sds((vocab, d_model), bf, mesh, P("d", None)),
           "pos_emb": sds((max_len, d_model), f32, mesh, table_spec),
           "mix": sds((d_model, d_model), bf, mesh, P()), "cls": sds((d_model, 1024), bf, mesh, P())}
    n = mesh.devices.size * seqs
    tokens = sds((n, seq), jnp.int32, mesh, P("d"))
    offsets = sds((n,), jnp.int32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    return long_ctx_step, (enc, tokens, offsets, labels), {"donate_argnums": (0,)}


pair(
    "learned_pos_table_replicated", "v5e", "v5e:4x4",
    "Long-context encoder on the 16 devices of v5e:4x4 with a learned f32 position table for a 1048576-token "
    "maximum length (f32[1048576,4096], 16 GiB) replicated on every device: the arguments alone exceed 15.75G.",
    "Fixed variant of learned_pos_table_replicated_v5e: the position table sharded P('d', None) over the 16 "
    "devices (1 GiB each); fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed", "f32_precision"]),
    _learned_pos_builder, dict(max_len=1048576, d_model=4096, vocab=65536, seqs=4, seq=4096, table_spec=_P()),
    dict(max_len=1048576, d_model=4096, vocab=65536, seqs=4, seq=4096, table_spec=_P("d", None)),
    dump=False,
)


# 23.6 the global batch size of the config used as the per-device batch


def _global_as_local_builder(mesh, global_batch, per_device, seq, d_model, heads, depth, classes):
    """Sentence-pair classifier (BERT-style encoder, `depth` blocks under jax.checkpoint in lax.scan). The
    input pipeline builds arrays of [global rows, seq] sharded over the devices; per_device=True: the
    config's global_batch is taken as the per-device batch (global rows = devices * global_batch), as a
    port from a one-device script did; False: global rows = global_batch."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def block(x, w):
        q, k, v = (jnp.einsum("btd,dhe->bthe", x, w[n]) for n in ("query", "key", "value"))
        a = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(f32) / hd ** 0.5, -1).astype(bf)
        x = x + jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["attn_out"])
        return (x + jax.nn.gelu(x @ w["inter"]) @ w["output"]).astype(bf), None

    def pair_cls_step(bert, input_ids, label):
        def xent(bert):
            x = jnp.take(bert["word_emb"], input_ids, axis=0)
            x, _ = jax.lax.scan(jax.checkpoint(block), x, bert["encoder"])
            logits = (x[:, 0] @ bert["classifier"]).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), label[:, None], 1))

        loss, g = jax.value_and_grad(xent)(bert)
        return _tm(lambda p, g: (p - 2e-5 * g).astype(p.dtype), bert, g), loss

    L, D, H, E = depth, d_model, heads, hd
    r = lambda *s: sds(s, bf, mesh, P())
    bert = {"word_emb": r(30522, D), "classifier": r(D, classes),
            "encoder": {"query": r(L, D, H, E), "key": r(L, D, H, E), "value": r(L, D, H, E),
                        "attn_out": r(L, H, E, D), "inter": r(L, D, 4 * D), "output": r(L, 4 * D, D)}}
    n = mesh.devices.size * global_batch if per_device else global_batch
    input_ids = sds((n, seq), jnp.int32, mesh, P("d"))
    label = sds((n,), jnp.int32, mesh, P("d"))
    return pair_cls_step, (bert, input_ids, label), {"donate_argnums": (0,)}


pair(
    "global_batch_per_device", "v5p", "v5p:2x2x1",
    "BERT-style sentence-pair classifier (16 blocks, d_model 2048, checkpointed) whose config global_batch "
    "2048 is used as the per-device batch on the 4 devices of v5p:2x2x1 (8192 sequences of 512 tokens in "
    "all): beyond 95.74G.",
    "Fixed variant of global_batch_per_device_v5p: 2048 sequences in all, 512 per device; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["batch_too_large", "large_activation"]),
    _global_as_local_builder, dict(global_batch=2048, per_device=True, seq=512, d_model=2048, heads=16,
                                   depth=16, classes=3),
    dict(global_batch=2048, per_device=False, seq=512, d_model=2048, heads=16, depth=16, classes=3),
    dump=False,
)


# 23.7 a super-resolution network that upsamples the input before its conv body


def _superres_builder(mesh, images, lr_side, scale, width, depth, upsample_first):
    """x4 single-image super-resolution (residual conv body, L1 loss). upsample_first=True (SRCNN / VDSR
    style): the low-resolution input is resized to the output resolution first and every conv runs at the
    high resolution; False (ESPCN / EDSR style): the body runs at the low resolution and a final conv to
    3*scale^2 channels is rearranged into pixels (depth-to-space)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    dn = ("NHWC", "HWIO", "NHWC")
    conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=dn)

    def sr_step(net, low_res, high_res):
        def l1(net):
            x = low_res
            if upsample_first:
                b, h, w, c = x.shape
                x = jax.image.resize(x, (b, h * scale, w * scale, c), "bilinear").astype(bf)
            f = conv(x, net["stem"])
            for k1, k2 in net["body"]:
                f = (f + conv(jax.nn.relu(conv(f, k1)), k2)).astype(bf)
            if upsample_first:
                out = conv(f, net["tail"])
            else:
                y = conv(f, net["tail"])
                b, h, w, _ = y.shape
                out = y.reshape(b, h, w, scale, scale, 3).transpose(0, 1, 3, 2, 4, 5).reshape(
                    b, h * scale, w * scale, 3)
            return jnp.mean(jnp.abs(out.astype(f32) - high_res.astype(f32)))

        loss, g = jax.value_and_grad(l1)(net)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), net, g), loss

    k = lambda i, o: sds((3, 3, i, o), bf, mesh, P())
    net = {"stem": k(3, width), "body": [(k(width, width), k(width, width)) for _ in range(depth)],
           "tail": k(width, 3 if upsample_first else 3 * scale * scale)}
    n = mesh.devices.size * images
    low_res = sds((n, lr_side, lr_side, 3), bf, mesh, P("d"))
    high_res = sds((n, lr_side * scale, lr_side * scale, 3), bf, mesh, P("d"))
    return sr_step, (net, low_res, high_res), {"donate_argnums": (0,)}


pair(
    "superres_upsample_first", "v4", "v4:2x2x1",
    "x4 super-resolution network (8 residual blocks, 128 channels) trained on 32 crops of 128x128 per "
    "TensorCore that resizes the input to 512x512 before the conv body: every conv activation is at the "
    "output resolution, beyond 15.25G.",
    "Fixed variant of superres_upsample_first_v4: the body at 128x128 and a final conv to 48 channels "
    "rearranged into 512x512 pixels (depth-to-space); fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large", "no_remat"]),
    _superres_builder, dict(images=32, lr_side=128, scale=4, width=128, depth=8, upsample_first=True),
    dict(images=32, lr_side=128, scale=4, width=128, depth=8, upsample_first=False),
    dump=False,
)


# 23.8 activation offloading configured with the wrong destination memory (device instead of pinned_host)


def _offload_policy_builder(mesh, seqs, seq, d_model, d_ff, depth, offload_dst):
    """Decoder-only LM trunk (scan over `depth` MLP-heavy blocks) whose config asks to offload each block's
    saved residual stream to host memory: jax.checkpoint with
    save_and_offload_only_these_names(names_which_can_be_offloaded=['resid', 'ffn_pre'], offload_src='device',
    offload_dst=offload_dst). offload_dst='device' (the config's value): the named activations are simply
    saved in HBM; 'pinned_host': moved to host memory between the forward and the backward pass."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.ad_checkpoint import checkpoint_name
    bf, f32 = jnp.bfloat16, jnp.float32
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["resid", "ffn_pre"],
        offload_src="device", offload_dst=offload_dst)

    def block(x, w):
        x = checkpoint_name(x, "resid")
        h = checkpoint_name(x @ w["ffn_up"], "ffn_pre")
        return (x + jax.nn.gelu(h) @ w["ffn_down"]).astype(bf), None

    def trunk_step(trunk, hidden, target):
        def mse(trunk):
            y, _ = jax.lax.scan(jax.checkpoint(block, policy=policy), hidden, trunk)
            return jnp.mean((y.astype(f32) - target.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(mse)(trunk)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), trunk, g), loss

    trunk = {"ffn_up": sds((depth, d_model, d_ff), bf, mesh, P()),
             "ffn_down": sds((depth, d_ff, d_model), bf, mesh, P())}
    n = mesh.devices.size * seqs
    hidden = sds((n, seq, d_model), bf, mesh, P("d"))
    target = sds((n, seq, d_model), bf, mesh, P("d"))
    return trunk_step, (trunk, hidden, target), {"donate_argnums": (0,)}


pair(
    "offload_dst_device", "v6e", "v6e:2x2",
    "LM trunk (24 blocks, d_model 2048, d_ff 8192) on 32 sequences of 4096 tokens per device whose "
    "activation-offload policy names offload_dst='device': the residual stream and the MLP pre-activations "
    "of every block stay in HBM for the backward pass, beyond 31.25G.",
    "Fixed variant of offload_dst_device_v6e: offload_dst='pinned_host', the named activations moved to host "
    "memory until the backward pass; fits.",
    dict(category="single_large_allocation", causes=["no_remat", "batch_too_large"]),
    _offload_policy_builder, dict(seqs=32, seq=4096, d_model=2048, d_ff=8192, depth=24, offload_dst="device"),
    dict(seqs=32, seq=4096, d_model=2048, d_ff=8192, depth=24, offload_dst="pinned_host"),
    dump=False,
)


# 23.9 a mixture-of-experts layer whose expert capacity is computed from all tokens, not tokens per expert


def _moe_capacity_builder(mesh, rows, d_model, d_ff, experts, capacity_factor, per_expert):
    """Switch-style top-1 MoE feed-forward layer with dense one-hot dispatch/combine ([T, E, C]). Capacity
    C = capacity_factor * T / E when per_expert, else capacity_factor * T (the division by the number of
    experts forgotten). Experts sharded over the devices (expert parallelism)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    T = rows
    cap = int(capacity_factor * T / experts) if per_expert else int(capacity_factor * T)

    def switch_step(moe, tokens, target):
        def mse(moe):
            def route(x):                                                     # per device group [T, D]
                probs = jax.nn.softmax((x @ moe["router"]).astype(f32), -1)
                e = jnp.argmax(probs, -1)
                onehot = jax.nn.one_hot(e, experts, dtype=jnp.int32)
                slot = jnp.cumsum(onehot, 0) * onehot - 1
                dispatch = (jax.nn.one_hot(slot, cap, dtype=bf) * onehot[..., None].astype(bf))   # [T, E, C]
                gate = jnp.max(probs, -1).astype(bf)
                return dispatch, gate

            xs = tokens.reshape(-1, T, d_model)
            dispatch, gate = jax.vmap(route)(xs)                              # [G, T, E, C]
            xe = jnp.einsum("gtec,gtd->egcd", dispatch, xs)
            h = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", xe, moe["wi"]))
            ye = jnp.einsum("egcf,efd->egcd", h, moe["wo"])
            y = jnp.einsum("gtec,egcd->gtd", dispatch, ye) * gate[..., None]
            return jnp.mean((y.reshape(tokens.shape).astype(f32) - target) ** 2)

        loss, g = jax.value_and_grad(mse)(moe)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), moe, g), loss

    moe = {"router": sds((d_model, experts), bf, mesh, P()),
           "wi": sds((experts, d_model, d_ff), bf, mesh, P("d", None, None)),
           "wo": sds((experts, d_ff, d_model), bf, mesh, P("d", None, None))}
    n = mesh.devices.size * rows
    tokens = sds((n, d_model), bf, mesh, P("d"))
    target = sds((n, d_model), f32, mesh, P("d"))
    return switch_step, (moe, tokens, target), {"donate_argnums": (0,)}


pair(
    "moe_capacity_all_tokens", "v5e", "v5e:2x2",
    "Switch-style MoE layer (64 experts, d_model 1024, expert parallelism) on 16384 tokens per device whose "
    "expert capacity is 1.25 * T instead of 1.25 * T / E: every expert gets a 20480-slot buffer "
    "(expert activations bf16[64,20480,4096], 10 GiB), beyond 15.75G.",
    "Fixed variant of moe_capacity_all_tokens_v5e: capacity 1.25 * T / E (320 slots per expert); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _moe_capacity_builder, dict(rows=16384, d_model=1024, d_ff=4096, experts=64, capacity_factor=1.25,
                                per_expert=False),
    dict(rows=16384, d_model=1024, d_ff=4096, experts=64, capacity_factor=1.25, per_expert=True),
    dump=False,
)


# ---- 24. more broken/fixed pairs (batch tpu13): other models, other names ---------------------
#
# Programs of kinds sections 13-23 do not have (a mixture of LoRA adapters whose per-sequence delta W
# is materialized, a serving KV cache preallocated for a maximum batch far above the served one,
# jax.checkpoint around the whole loss instead of the scanned block, a PPO step holding the policy,
# reference, reward and value models replicated, an Evoformer-style pair stack in f32, a speech encoder
# attending over 10 ms frames without subsampling, a GCN that scatters its edges into a dense [N, N]
# adjacency, log-domain Sinkhorn iterations differentiated without rematerialization). The same
# conventions: the fixed twin changes exactly the first cause. Only the KV-cache, GCN and Sinkhorn pairs keep
# their dumps (the other modules are over 160 KB).


# 24.1 a mixture of LoRA adapters whose per-sequence delta W is materialized


def _lora_mix_builder(mesh, seqs, seq_len, d_model, depth, adapters, rank, low_rank_path):
    """Frozen bf16 base projections (scanned over `depth` layers) with `adapters` LoRA adapters per layer,
    mixed per sequence by a router on the mean-pooled input. low_rank_path=False: every adapter's delta
    B_e @ A_e is formed and the per-sequence weight W0 + sum_e g[b, e] dW_e ([B, D, D]) is built and applied;
    True: y = x W0 + sum_e g[b, e] (x B_e) A_e. Only the adapters and the router are trained."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def layer(carry, xs):
        h, gates = carry
        w0, down, up = xs                                            # [D,D], [E,D,r], [E,r,D]
        if low_rank_path:
            z = jnp.einsum("bsd,edr->bser", h, down)
            y = h @ w0 + jnp.einsum("be,bser,erk->bsk", gates, z, up)
        else:
            delta = jnp.einsum("edr,erk->edk", down, up)             # every adapter's full delta W
            w_seq = w0[None] + jnp.einsum("be,edk->bdk", gates, delta)   # [B, D, D]
            y = jnp.einsum("bsd,bdk->bsk", h, w_seq)
        return (jax.nn.gelu(y).astype(bf), gates), None

    def adapter_step(lora, frozen, feats, target):
        def mse(lora):
            gates = jax.nn.softmax((feats.mean(1) @ lora["router"]).astype(f32), -1).astype(bf)
            (h, _), _ = jax.lax.scan(layer, (feats, gates), (frozen["w0"], lora["down"], lora["up"]))
            return jnp.mean((h.astype(f32) - target) ** 2)

        loss, g = jax.value_and_grad(mse)(lora)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), lora, g), loss

    L, D, E, r = depth, d_model, adapters, rank
    lora = {"router": sds((D, E), bf, mesh, P()),
            "down": sds((L, E, D, r), bf, mesh, P()), "up": sds((L, E, r, D), bf, mesh, P())}
    frozen = {"w0": sds((L, D, D), bf, mesh, P())}
    n = mesh.devices.size * seqs
    feats = sds((n, seq_len, D), bf, mesh, P("d"))
    target = sds((n, seq_len, D), bf, mesh, P("d"))
    return adapter_step, (lora, frozen, feats, target), {"donate_argnums": (0,)}


pair(
    "lora_mixture_delta", "v5e", "v5e:2x2",
    "Mixture of 16 rank-16 LoRA adapters on 8 frozen d=4096 projections, routed per sequence (128 sequences "
    "of 256 tokens per device): each layer forms every adapter's delta W and a per-sequence weight "
    "bf16[128,4096,4096] (4 GiB), kept with its gradient for the backward pass, beyond 15.75G.",
    "Fixed variant of lora_mixture_delta_v5e: the adapters applied on the low-rank path, x W0 + sum_e "
    "g_e (x B_e) A_e, no delta W formed; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large", "no_remat"]),
    _lora_mix_builder, dict(seqs=128, seq_len=256, d_model=4096, depth=8, adapters=16, rank=16,
                            low_rank_path=False),
    dict(seqs=128, seq_len=256, d_model=4096, depth=8, adapters=16, rank=16, low_rank_path=True),
    dump=False,
)


# 24.2 a decode step whose KV cache is preallocated for a maximum batch far above the served batch


def _kv_slots_builder(mesh, max_batch, max_len, d_model, heads, kv_heads, d_ff, depth):
    """One greedy decode step of a GQA decoder over a preallocated KV cache [L, max_batch, max_len, Hkv, hd]
    (slots sharded over the devices); every slot is decoded. The cache is donated and updated per layer in
    the scan over layers."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    grp = heads // kv_heads

    def decode_step(slots_k, slots_v, lm, tok, pos):
        x = jnp.take(lm["embed"], tok, axis=0)                        # [B, D]

        def block(x, xs):
            w, ck, cv = xs
            q = (x @ w["q"]).reshape(-1, kv_heads, grp, hd)
            k = (x @ w["k"]).reshape(-1, 1, kv_heads, hd)
            v = (x @ w["v"]).reshape(-1, 1, kv_heads, hd)
            ck = jax.lax.dynamic_update_slice_in_dim(ck, k, pos, 1)
            cv = jax.lax.dynamic_update_slice_in_dim(cv, v, pos, 1)
            s = jnp.einsum("bhgd,bthd->bhgt", q, ck).astype(f32) / hd ** 0.5
            s = jnp.where(jnp.arange(max_len) <= pos, s, -1e9)
            a = jax.nn.softmax(s, -1).astype(bf)
            o = jnp.einsum("bhgt,bthd->bhgd", a, cv).reshape(-1, d_model)
            x = x + o @ w["o"]
            x = (x + jax.nn.gelu(x @ w["up"]) @ w["down"]).astype(bf)
            return x, (ck, cv)

        x, (nk, nv) = jax.lax.scan(block, x, (lm["layers"], slots_k, slots_v))
        nxt = jnp.argmax((x @ lm["embed"].T).astype(f32), -1)
        return nk, nv, nxt

    L, D, F = depth, d_model, d_ff
    kvd = kv_heads * hd
    w = lambda *s: sds(s, bf, mesh, P())
    lm = {"embed": w(32000, D),
          "layers": {"q": w(L, D, D), "k": w(L, D, kvd), "v": w(L, D, kvd), "o": w(L, D, D),
                     "up": w(L, D, F), "down": w(L, F, D)}}
    cache = sds((L, max_batch, max_len, kv_heads, hd), bf, mesh, P(None, "d"))
    tok = sds((max_batch,), jnp.int32, mesh, P("d"))
    pos = sds((), jnp.int32, mesh, P())
    return decode_step, (cache, cache, lm, tok, pos), {"donate_argnums": (0, 1)}


pair(
    "kv_slots_max_batch", "v5p", "v5p:2x2x1",
    "Serving decode step (16-layer GQA decoder, d=2048, 8 KV heads) whose KV cache is preallocated for "
    "max_batch=512 sequences of 16384 tokens (the engine serves 128): 128 slots per device, 64 GiB of "
    "keys and 64 GiB of values per device before any compute, beyond 95.74G.",
    "Fixed variant of kv_slots_max_batch_v5p: max_batch=128, the served batch (32 slots per device); fits.",
    dict(category="arguments", category_also=["single_large_allocation"], causes=["batch_too_large", "arguments_exceed"]),
    _kv_slots_builder, dict(max_batch=512, max_len=16384, d_model=2048, heads=16, kv_heads=8, d_ff=8192,
                            depth=16),
    dict(max_batch=128, max_len=16384, d_model=2048, heads=16, kv_heads=8, d_ff=8192, depth=16),
    dump=True,
)


# 24.3 jax.checkpoint wrapped around the whole loss, not around the scanned block


def _remat_outer_builder(mesh, rows, d_model, d_ff, depth, where):
    """Residual GELU-MLP stack (scanned over `depth` blocks, bf16). where='loss': jax.checkpoint wraps the
    whole loss function (the backward pass recomputes the forward and keeps every block's activations);
    where='block': jax.checkpoint on the scanned block."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mlp_block(x, w):
        return (x + jax.nn.gelu(x @ w["fc_in"]) @ w["fc_out"]).astype(bf), None

    body = jax.checkpoint(mlp_block) if where == "block" else mlp_block

    def objective(net, x, y):
        h, _ = jax.lax.scan(body, x, net["blocks"])
        return jnp.mean((h.astype(f32) - y) ** 2)

    loss_fn = jax.checkpoint(objective) if where == "loss" else objective

    def regress_step(net, x, y):
        loss, g = jax.value_and_grad(loss_fn)(net, x, y)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), net, g), loss

    net = {"blocks": {"fc_in": sds((depth, d_model, d_ff), bf, mesh, P()),
                      "fc_out": sds((depth, d_ff, d_model), bf, mesh, P())}}
    n = mesh.devices.size * rows
    x = sds((n, d_model), bf, mesh, P("d"))
    y = sds((n, d_model), bf, mesh, P("d"))
    return regress_step, (net, x, y), {"donate_argnums": (0,)}


pair(
    "remat_whole_loss", "v6e", "v6e:2x2",
    "24 residual MLP blocks (d=2048, 4x expansion, bf16, lax.scan) on 65536 rows per device with "
    "jax.checkpoint around the whole loss function: the backward pass recomputes the forward and keeps "
    "every block's activations anyway (about 2.25 GiB per block), beyond 31.25G.",
    "Fixed variant of remat_whole_loss_v6e: jax.checkpoint on the scanned block instead; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["no_remat", "batch_too_large"]),
    _remat_outer_builder, dict(rows=65536, d_model=2048, d_ff=8192, depth=24, where="loss"),
    dict(rows=65536, d_model=2048, d_ff=8192, depth=24, where="block"),
    dump=False,
)


# 24.4 a PPO step holding the policy, reference, reward and value models, all replicated


def _ppo_four_builder(mesh, seqs, seq_len, d_model, d_ff, depth, fsdp):
    """PPO update of an RLHF pipeline with four transformer-MLP towers of the same size: the policy and the
    value model are trained (SGD), the reference policy and the reward model are frozen. fsdp=False: all
    four stacks replicated (P()); True: every stack's d_model axis sharded over the devices."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def tower(params, h):
        def blk(h, w):
            return (h + jax.nn.gelu(h @ w["wi"]) @ w["wo"]).astype(bf), None

        h, _ = jax.lax.scan(jax.checkpoint(blk), h, params)
        return h

    def ppo_step(actor, critic, sft_ref, scorer, embeds, actions):
        ref_h = jax.lax.stop_gradient(tower(sft_ref, embeds))
        reward = jax.lax.stop_gradient(tower(scorer, embeds).astype(f32).mean((1, 2)))

        def objective(actor, critic):
            pol_h = tower(actor, embeds).astype(f32)
            value = tower(critic, embeds).astype(f32).mean((1, 2))
            logp = jax.nn.log_softmax(pol_h, -1)
            ref_lp = jax.nn.log_softmax(ref_h.astype(f32), -1)
            lp = jnp.take_along_axis(logp, actions[..., None], -1)[..., 0].sum(-1)
            rl = jnp.take_along_axis(ref_lp, actions[..., None], -1)[..., 0].sum(-1)
            ratio = jnp.exp(lp - jax.lax.stop_gradient(lp))
            adv = jax.lax.stop_gradient(reward - 0.05 * (lp - rl) - value)
            pg = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv))
            return pg + 0.5 * jnp.mean((value - reward) ** 2)

        loss, (ga, gc) = jax.value_and_grad(objective, argnums=(0, 1))(actor, critic)
        upd = lambda p, g: (p - 1e-6 * g).astype(p.dtype)
        return _tm(upd, actor, ga), _tm(upd, critic, gc), loss

    spec = P(None, "d", None) if fsdp else P()
    model = lambda: {"wi": sds((depth, d_model, d_ff), bf, mesh, spec),
                     "wo": sds((depth, d_ff, d_model), bf, mesh, P(None, None, "d") if fsdp else P())}
    n = mesh.devices.size * seqs
    embeds = sds((n, seq_len, d_model), bf, mesh, P("d"))
    actions = sds((n, seq_len), jnp.int32, mesh, P("d"))
    return ppo_step, (model(), model(), model(), model(), embeds, actions), {"donate_argnums": (0, 1)}


pair(
    "ppo_four_models_replicated", "v4", "v4:2x2x1",
    "RLHF PPO step with four equal towers (18 MLP blocks of d=4096, 4x expansion, bf16: 4.5 GiB each) - "
    "policy, value, frozen reference and frozen reward model - all replicated on each of the 8 "
    "TensorCores: 18 GiB of weights per TensorCore before any activation, beyond 15.25G.",
    "Fixed variant of ppo_four_models_replicated_v4: the four stacks sharded over the 8 TensorCores along "
    "d_model (FSDP); fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed"]),
    _ppo_four_builder, dict(seqs=4, seq_len=512, d_model=4096, d_ff=16384, depth=18, fsdp=False),
    dict(seqs=4, seq_len=512, d_model=4096, d_ff=16384, depth=18, fsdp=True),
    dump=False,
)


# 24.5 an Evoformer-style pair stack computed and stored in f32


def _pair_stack_builder(mesh, crops, residues, channels, depth, pair_dtype):
    """Pair-representation trunk of a protein structure model: `depth` blocks of triangle multiplicative
    update (outgoing edges) + pair transition (4x) on z [B, N, N, C], scanned under jax.checkpoint, and a
    distogram head (64 bins) trained with cross-entropy. pair_dtype: dtype of z and the trunk weights."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dt = jnp.dtype(pair_dtype)

    def ln(x):
        x32 = x.astype(f32)
        m = x32.mean(-1, keepdims=True)
        return ((x32 - m) * jax.lax.rsqrt(((x32 - m) ** 2).mean(-1, keepdims=True) + 1e-5)).astype(dt)

    def tri_block(z, w):
        zn = ln(z)
        a = jax.nn.sigmoid(zn @ w["ga"]) * (zn @ w["pa"])
        b = jax.nn.sigmoid(zn @ w["gb"]) * (zn @ w["pb"])
        t = jnp.einsum("bikc,bjkc->bijc", a, b)
        z = z + jax.nn.sigmoid(zn @ w["g"]) * (ln(t) @ w["o"])
        zn = ln(z)
        z = z + jax.nn.relu(zn @ w["t1"]) @ w["t2"]
        return z.astype(dt), None

    def trunk_step(trunk, pair0, bins):
        def distogram_nll(trunk):
            z, _ = jax.lax.scan(jax.checkpoint(tri_block), pair0.astype(dt), trunk["blocks"])
            logits = (z @ trunk["head"]).astype(f32)
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, bins[..., None], -1))

        loss, g = jax.value_and_grad(distogram_nll)(trunk)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), trunk, g), loss

    C, L = channels, depth
    w = lambda *s: sds(s, dt, mesh, P())
    trunk = {"blocks": {"ga": w(L, C, C), "pa": w(L, C, C), "gb": w(L, C, C), "pb": w(L, C, C),
                        "g": w(L, C, C), "o": w(L, C, C), "t1": w(L, C, 4 * C), "t2": w(L, 4 * C, C)},
             "head": w(C, 64)}
    n = mesh.devices.size * crops
    pair0 = sds((n, residues, residues, C), jnp.bfloat16, mesh, P("d"))
    bins = sds((n, residues, residues), jnp.int32, mesh, P("d"))
    return trunk_step, (trunk, pair0, bins), {"donate_argnums": (0,)}


pair(
    "pair_trunk_f32", "v5p", "v5p:2x2x1",
    "Evoformer-style pair trunk (48 blocks of triangle multiplicative update + transition, C=128, "
    "jax.checkpoint per block) on 4 crops of 1024 residues per device, the pair representation and the "
    "trunk in f32: the saved block inputs f32[48,4,1024,1024,128] alone are 96 GiB, beyond 95.74G.",
    "Fixed variant of pair_trunk_f32_v5p: the pair representation and the trunk in bf16; fits.",
    dict(category="single_large_allocation", causes=["f32_precision", "batch_too_large", "large_activation"]),
    _pair_stack_builder, dict(crops=4, residues=1024, channels=128, depth=48, pair_dtype="float32"),
    dict(crops=4, residues=1024, channels=128, depth=48, pair_dtype="bfloat16"),
    dump=False,
)


# 24.6 a speech encoder attending over raw 10 ms frames (no subsampling front end)


def _asr_frames_builder(mesh, utts, frames, mels, d_model, heads, depth, subsample):
    """Transformer speech encoder with a CTC head on 30 s utterances of 10 ms log-mel frames. subsample=1:
    the frames are projected straight to d_model and attended over at 3000 positions; 4: two stride-2
    convolutions (a conv front end) first, 750 positions. Blocks scanned under jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    dn = ("NHWC", "HWIO", "NHWC")

    def enc_block(x, w):
        q, k, v = (jnp.einsum("btd,dhe->bthe", x, w[n]) for n in ("wq", "wk", "wv"))
        a = jax.nn.softmax(jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(f32) / hd ** 0.5, -1).astype(bf)
        x = x + jnp.einsum("bhqk,bkhe,hed->bqd", a, v, w["wo"])
        return (x + jax.nn.gelu(x @ w["ff1"]) @ w["ff2"]).astype(bf), None

    def ctc_step(enc, logmel, targets):
        def frame_nll(enc):
            if subsample == 1:
                x = (logmel @ enc["proj"]).astype(bf)
            else:
                h = logmel[..., None]
                for kern in enc["front"]:
                    h = jax.nn.relu(jax.lax.conv_general_dilated(h, kern, (2, 2), "SAME",
                                                                 dimension_numbers=dn))
                x = (h.reshape(h.shape[0], h.shape[1], -1) @ enc["proj"]).astype(bf)
            x, _ = jax.lax.scan(jax.checkpoint(enc_block), x, enc["blocks"])
            lp = jax.nn.log_softmax((x @ enc["ctc"]).astype(f32), -1)
            t = targets[:, : x.shape[1]]
            return -jnp.mean(jnp.take_along_axis(lp, t[..., None], -1))

        loss, g = jax.value_and_grad(frame_nll)(enc)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), enc, g), loss

    D, H, E, L = d_model, heads, hd, depth
    w = lambda *s: sds(s, bf, mesh, P())
    enc = {"blocks": {"wq": w(L, D, H, E), "wk": w(L, D, H, E), "wv": w(L, D, H, E), "wo": w(L, H, E, D),
                      "ff1": w(L, D, 4 * D), "ff2": w(L, 4 * D, D)}, "ctc": w(D, 1024)}
    if subsample == 1:
        enc["proj"] = w(mels, D)
    else:
        enc["front"] = [w(3, 3, 1, 32), w(3, 3, 32, 32)]
        enc["proj"] = w(32 * (mels // 4), D)
    n = mesh.devices.size * utts
    logmel = sds((n, frames, mels), bf, mesh, P("d"))
    targets = sds((n, frames), jnp.int32, mesh, P("d"))
    return ctc_step, (enc, logmel, targets), {"donate_argnums": (0,)}


pair(
    "asr_no_subsampling", "v5e", "v5e:2x2",
    "Speech encoder (12 blocks, d=512, 8 heads, CTC head) on 96 utterances of 30 s per device at a 10 ms "
    "frame rate with no subsampling front end: self-attention over 3000 frames, "
    "probabilities bf16[96,8,3000,3000] (12.9 GiB) in the backward pass, beyond 15.75G.",
    "Fixed variant of asr_no_subsampling_v5e: a conv front end (two stride-2 3x3 convolutions) subsamples "
    "to 750 positions before attention; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _asr_frames_builder, dict(utts=96, frames=3000, mels=80, d_model=512, heads=8, depth=12, subsample=1),
    dict(utts=96, frames=3000, mels=80, d_model=512, heads=8, depth=12, subsample=4),
    dump=False,
)


# 24.7 a GCN that scatters its edge list into a dense [N, N] adjacency


def _gcn_adj_builder(mesh, nodes, edges, feat, hidden, classes, dense):
    """Two-layer GCN (symmetric degree normalisation) for node classification, one graph per device (the
    graphs of a batch sharded over the devices). dense=True: the edge list is scattered into a dense f32
    [N, N] adjacency, normalised and multiplied; False: messages gathered along the edges and summed per
    node with jax.ops.segment_sum."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def propagate(h, src, dst):
        deg = jax.ops.segment_sum(jnp.ones_like(src, f32), dst, nodes) + 1.0
        norm = jax.lax.rsqrt(deg)
        if dense:
            adj = jnp.zeros((nodes, nodes), f32).at[dst, src].add(1.0) + jnp.eye(nodes, dtype=f32)
            a_hat = norm[:, None] * adj * norm[None, :]
            return (a_hat @ h.astype(f32)).astype(bf)
        msg = h[src] * (norm[src] * norm[dst])[:, None].astype(bf)
        return (jax.ops.segment_sum(msg, dst, nodes) + h * (norm * norm)[:, None].astype(bf)).astype(bf)

    def graph_loss(gcn, x, src, dst, y):
        h = jax.nn.relu(propagate(x @ gcn["w1"], src, dst))
        logits = propagate(h @ gcn["w2"], src, dst).astype(f32)
        lp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(lp, y[:, None], -1))

    def node_cls_step(gcn, x, src, dst, y):
        def batch_loss(gcn):
            return jnp.mean(jax.vmap(graph_loss, in_axes=(None, 0, 0, 0, 0))(gcn, x, src, dst, y))

        loss, g = jax.value_and_grad(batch_loss)(gcn)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), gcn, g), loss

    gcn = {"w1": sds((feat, hidden), bf, mesh, P()), "w2": sds((hidden, classes), bf, mesh, P())}
    g = mesh.devices.size
    x = sds((g, nodes, feat), bf, mesh, P("d"))
    src = sds((g, edges), jnp.int32, mesh, P("d"))
    dst = sds((g, edges), jnp.int32, mesh, P("d"))
    y = sds((g, nodes), jnp.int32, mesh, P("d"))
    return node_cls_step, (gcn, x, src, dst, y), {"donate_argnums": (0,)}


pair(
    "gcn_dense_adjacency", "v5e", "v5e:2x2",
    "Two-layer GCN on one graph of 65536 nodes and 1M edges per device, the edge list scattered into a "
    "dense normalised adjacency f32[65536,65536] (16 GiB) for each propagation, beyond 15.75G.",
    "Fixed variant of gcn_dense_adjacency_v5e: messages gathered along the edges and summed per node with "
    "jax.ops.segment_sum, no dense adjacency; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _gcn_adj_builder, dict(nodes=65536, edges=1 << 20, feat=256, hidden=256, classes=64, dense=True),
    dict(nodes=65536, edges=1 << 20, feat=256, hidden=256, classes=64, dense=False),
    dump=True,
)


# 24.8 log-domain Sinkhorn iterations differentiated through, without rematerialization


def _sinkhorn_builder(mesh, pairs, points, dim, iters, remat):
    """Entropic optimal-transport loss between predicted and target point sets (a learned point embedding
    f32[dim, dim]), log-domain Sinkhorn for `iters` iterations in lax.scan, differentiated through the
    iterations. remat=True: each iteration under jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    eps = 0.05

    def ot_cost(proj, a_pts, b_pts):
        a = a_pts @ proj
        cost = jnp.sum(a * a, -1)[:, None] + jnp.sum(b_pts * b_pts, -1)[None, :] - 2 * a @ b_pts.T
        logw = -jnp.log(points)

        def half_steps(fg, _):
            f, g = fg
            f = -eps * jax.nn.logsumexp((g[None, :] - cost) / eps + logw, 1)
            g = -eps * jax.nn.logsumexp((f[:, None] - cost) / eps + logw, 0)
            return (f, g), None

        body = jax.checkpoint(half_steps) if remat else half_steps
        (f, g), _ = jax.lax.scan(body, (jnp.zeros(points, f32), jnp.zeros(points, f32)), None, length=iters)
        return jnp.mean(f) + jnp.mean(g)

    def transport_step(proj, clouds, goals):
        loss, gr = jax.value_and_grad(
            lambda p: jnp.mean(jax.vmap(ot_cost, in_axes=(None, 0, 0))(p, clouds, goals)))(proj)
        return proj - 1e-3 * gr, loss

    proj = sds((dim, dim), f32, mesh, P())
    n = mesh.devices.size * pairs
    clouds = sds((n, points, dim), f32, mesh, P("d"))
    goals = sds((n, points, dim), f32, mesh, P("d"))
    return transport_step, (proj, clouds, goals), {"donate_argnums": (0,)}


pair(
    "sinkhorn_unrolled_grad", "v6e", "v6e:2x2",
    "Entropic OT loss between 2 pairs of 8192-point clouds per device, 100 log-domain Sinkhorn iterations "
    "in lax.scan differentiated through without rematerialization: every iteration keeps its f32[8192,8192] "
    "softmax weights for the backward pass, beyond 31.25G.",
    "Fixed variant of sinkhorn_unrolled_grad_v6e: each Sinkhorn iteration under jax.checkpoint; fits.",
    dict(category="single_large_allocation", causes=["no_remat", "large_activation"]),
    _sinkhorn_builder, dict(pairs=2, points=8192, dim=64, iters=100, remat=False),
    dict(pairs=2, points=8192, dim=64, iters=100, remat=True),
    dump=True,
)


# ---- 25. more broken/fixed pairs (batch tpu14): other models, other names ---------------------
#
# Programs of kinds sections 13-24 do not have (a tensor-parallel MLP stack whose hidden activations are
# pinned replicated after every matmul, a two-tower retrieval model that runs its item tower over
# per-row sampled negatives, a WaveNet-style dilated causal stack over raw audio in f32, an importance-
# weighted autoencoder with too many images per device, a sparse embedding-table update without
# donation, a transformer whose jax.checkpoint covers only the attention sub-layer, second-order
# (covariance) pooling over 130 channels, a Lion optimizer whose f32 momentum is replicated while the
# params are FSDP-sharded). The same conventions: the fixed twin changes exactly the
# first cause. The tensor-parallel, two-tower, IWAE, sparse-table and covariance pairs keep their dumps
# (each file < 160 KB); the WaveNet, attention-only-remat and Lion pairs keep none.


# 25.1 tensor-parallel MLP stack whose hidden activations are constrained to be replicated


def _tp_hidden_builder(mesh, tokens, d_model, d_ff, depth, hidden_spec):
    """Megatron-style tensor parallelism over the 1-D mesh: up-projections column-sharded [L, D, F/n],
    down-projections row-sharded [L, F/n, D], tokens replicated (one data-parallel replica). The block
    pins the hidden activation with with_sharding_constraint(hidden, hidden_spec): P() gathers the whole
    [T, F] hidden onto every device after the up-projection; P(None, 'd') keeps it column-sharded."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hidden_spec = P(*hidden_spec)

    def ffn_block(x, w):
        hid = jax.lax.with_sharding_constraint(x @ w["col"], NamedSharding(mesh, hidden_spec))
        act = jax.lax.with_sharding_constraint(jax.nn.gelu(hid), NamedSharding(mesh, hidden_spec))
        return (x + act @ w["row"]).astype(bf), None

    def tp_train_step(stack, x, y):
        def mse(stack):
            h, _ = jax.lax.scan(ffn_block, x, stack)
            return jnp.mean((h.astype(f32) - y) ** 2)

        loss, g = jax.value_and_grad(mse)(stack)
        return _tm(lambda p, g: (p - 3e-4 * g).astype(p.dtype), stack, g), loss

    stack = {"col": sds((depth, d_model, d_ff), bf, mesh, P(None, None, "d")),
             "row": sds((depth, d_ff, d_model), bf, mesh, P(None, "d", None))}
    x = sds((tokens, d_model), bf, mesh, P())
    y = sds((tokens, d_model), bf, mesh, P())
    return tp_train_step, (stack, x, y), {"donate_argnums": (0,)}


pair(
    "tp_hidden_replicated", "v5e", "v5e:2x2",
    "Tensor-parallel MLP stack (8 blocks, d=4096, d_ff=16384, bf16) over the 4 devices, 16384 tokens, "
    "whose hidden activations are pinned with with_sharding_constraint(..., P()) after the column-parallel "
    "matmul: every device holds the whole bf16[16384,16384] hidden and its GELU (512 MiB each) per block for "
    "the backward pass, beyond 15.75G.",
    "Fixed variant of tp_hidden_replicated_v5e: the hidden pinned with P(None, 'd') (column-sharded, as the "
    "weights are); fits.",
    dict(category="aggregate", causes=["replicated_tensor", "no_remat"]),
    _tp_hidden_builder, dict(tokens=16384, d_model=4096, d_ff=16384, depth=8, hidden_spec=()),
    dict(tokens=16384, d_model=4096, d_ff=16384, depth=8, hidden_spec=(None, "d")),
    dump=True,
)


# 25.2 a two-tower retrieval model whose item tower runs over per-row sampled negatives


def _two_tower_builder(mesh, queries, negatives, feat, hidden, out_dim, shared):
    """Sampled-softmax two-tower retrieval: a query tower and an item tower (2-layer MLPs, bf16) over
    item feature rows f32->bf16 [items, feat]. shared=False: each query row draws its own `negatives`
    items (ids [B, K]) and the item tower runs on the gathered [B, K, feat] rows; shared=True: one set of
    K negatives per step (ids [K]) is encoded once and scored against every query ([B, K] logits)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def tower(w, h):
        return jax.nn.relu(h @ w["w1"]) @ w["w2"]

    def retrieval_step(towers, catalog, qfeat, pos_ids, neg_ids):
        def sampled_softmax(towers):
            q = tower(towers["query"], qfeat)                                     # [B, E]
            pos = tower(towers["item"], jnp.take(catalog, pos_ids, axis=0))       # [B, E]
            negf = jnp.take(catalog, neg_ids, axis=0)                             # [B, K, F] or [K, F]
            neg = tower(towers["item"], negf)
            if shared:
                neg_logit = (q @ neg.T).astype(f32)                               # [B, K]
            else:
                neg_logit = jnp.einsum("be,bke->bk", q, neg).astype(f32)
            pos_logit = jnp.sum(q * pos, -1).astype(f32)
            logits = jnp.concatenate([pos_logit[:, None], neg_logit], 1)
            return -jnp.mean(jax.nn.log_softmax(logits, -1)[:, 0])

        loss, g = jax.value_and_grad(sampled_softmax)(towers)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), towers, g), loss

    mlp = lambda: {"w1": sds((feat, hidden), bf, mesh, P()), "w2": sds((hidden, out_dim), bf, mesh, P())}
    towers = {"query": mlp(), "item": mlp()}
    catalog = sds((1 << 20, feat), bf, mesh, P())
    n = mesh.devices.size * queries
    qfeat = sds((n, feat), bf, mesh, P("d"))
    pos_ids = sds((n,), jnp.int32, mesh, P("d"))
    neg_ids = (sds((negatives,), jnp.int32, mesh, P()) if shared
               else sds((n, negatives), jnp.int32, mesh, P("d")))
    return retrieval_step, (towers, catalog, qfeat, pos_ids, neg_ids), {"donate_argnums": (0,)}


pair(
    "per_row_negatives_tower", "v6e", "v6e:2x2",
    "Two-tower retrieval with sampled softmax: 16384 queries per device, each with its own 512 sampled "
    "negative items run through the item tower (256 features -> 2048 -> 256, bf16): 8M item rows per device, "
    "bf16[16384,512,2048] hidden activations (16 GiB) kept for the backward pass, beyond 31.25G.",
    "Fixed variant of per_row_negatives_tower_v6e: one set of 512 negatives per step, encoded once and "
    "shared by every query; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _two_tower_builder, dict(queries=16384, negatives=512, feat=256, hidden=2048, out_dim=256, shared=False),
    dict(queries=16384, negatives=512, feat=256, hidden=2048, out_dim=256, shared=True),
    dump=True,
)


# 25.3 a WaveNet-style dilated causal stack over raw audio, computed in f32


def _wavenet_builder(mesh, clips, samples, channels, depth, dtype):
    """WaveNet-style stack: `depth` gated residual layers with dilations 1, 2, ..., 512 (repeated),
    each y = x W_now + shift(x, d) W_past -> tanh * sigmoid -> residual and skip 1x1 projections; a
    256-way mu-law softmax head on the summed skips. Params and activations in `dtype`."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dt = getattr(jnp, dtype)
    C = channels

    def waveform_step(net, audio, target):
        def nll(net):
            x = (audio[..., None] * net["inp"]).astype(dt)                         # [B, T, C]
            skip = jnp.zeros(x.shape, dt)
            for i in range(depth):
                w = _tm(lambda a: a[i], net["layers"])
                d = 2 ** (i % 10)
                past = jnp.pad(x, ((0, 0), (d, 0), (0, 0)))[:, :-d]
                pre = x @ w["now"] + past @ w["past"]                              # [B, T, 2C]
                z = jnp.tanh(pre[..., :C]) * jax.nn.sigmoid(pre[..., C:])
                x = (x + z @ w["res"]).astype(dt)
                skip = (skip + z @ w["skip"]).astype(dt)
            logits = (jax.nn.relu(skip) @ net["head"]).astype(f32)                 # [B, T, 256]
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, target[..., None], -1))

        loss, g = jax.value_and_grad(nll)(net)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), net, g), loss

    L = depth
    net = {"inp": sds((C,), dt, mesh, P()), "head": sds((C, 256), dt, mesh, P()),
           "layers": {"now": sds((L, C, 2 * C), dt, mesh, P()), "past": sds((L, C, 2 * C), dt, mesh, P()),
                      "res": sds((L, C, C), dt, mesh, P()), "skip": sds((L, C, C), dt, mesh, P())}}
    n = mesh.devices.size * clips
    audio = sds((n, samples), dt, mesh, P("d"))
    target = sds((n, samples), jnp.int32, mesh, P("d"))
    return waveform_step, (net, audio, target), {"donate_argnums": (0,)}


pair(
    "wavenet_f32", "v4", "v4:2x2x1",
    "WaveNet-style vocoder (32 gated dilated layers, 256 residual channels) trained on 4 clips of 40960 "
    "samples per TensorCore with params and activations in f32: every layer keeps f32[4,40960,512] "
    "pre-activations and f32[4,40960,256] gates for the backward pass, beyond 15.25G.",
    "Fixed variant of wavenet_f32_v4: params, audio and activations in bf16 (the loss in f32); fits.",
    dict(category="aggregate", causes=["f32_precision", "batch_too_large", "no_remat"]),
    _wavenet_builder, dict(clips=4, samples=40960, channels=256, depth=32, dtype="float32"),
    dict(clips=4, samples=40960, channels=256, depth=32, dtype="bfloat16"),
    dump=False,
)


# 25.4 an importance-weighted autoencoder with too many images per device


def _iwae_builder(mesh, images, k_samples, pixels, latent, hidden):
    """IWAE: an MLP encoder q(z|x), k_samples reparameterized latents per image, an MLP decoder p(x|z)
    with a Bernoulli likelihood over `pixels`, the importance-weighted bound (logsumexp over samples).
    bf16 matmuls, f32 likelihood."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def iwae_step(vae, pics, eps):
        def neg_bound(vae):
            h = jax.nn.relu(pics @ vae["enc1"])
            stats = (h @ vae["enc2"]).astype(f32)
            mu, logvar = stats[:, :latent], stats[:, latent:]
            z = (mu[:, None] + jnp.exp(0.5 * logvar)[:, None] * eps).astype(bf)      # [B, K, Z]
            d1 = jax.nn.relu(z @ vae["dec1"])
            d2 = jax.nn.relu(d1 @ vae["dec2"])
            logits = (d2 @ vae["dec3"]).astype(f32)                                  # [B, K, pixels]
            x = pics.astype(f32)[:, None]
            ll = jnp.sum(x * jax.nn.log_sigmoid(logits) + (1 - x) * jax.nn.log_sigmoid(-logits), -1)
            e = eps.astype(f32)
            lw = ll - 0.5 * jnp.sum(z.astype(f32) ** 2, -1) + 0.5 * jnp.sum(e ** 2 + logvar[:, None], -1)
            return -jnp.mean(jax.nn.logsumexp(lw, 1) - jnp.log(k_samples))

        loss, g = jax.value_and_grad(neg_bound)(vae)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), vae, g), loss

    w = lambda *s: sds(s, bf, mesh, P())
    vae = {"enc1": w(pixels, hidden), "enc2": w(hidden, 2 * latent),
           "dec1": w(latent, hidden), "dec2": w(hidden, hidden), "dec3": w(hidden, pixels)}
    n = mesh.devices.size * images
    pics = sds((n, pixels), bf, mesh, P("d"))
    eps = sds((n, k_samples, latent), bf, mesh, P("d"))
    return iwae_step, (vae, pics, eps), {"donate_argnums": (0,)}


pair(
    "iwae_images_per_device", "v5p", "v5p:2x2x1",
    "Importance-weighted autoencoder on 32x32x3 images (3072 pixels) with 512 importance samples each, "
    "16384 images per device: the decoder runs on 8M latent samples per device, bf16[16384,512,4096] "
    "hidden activations (64 GiB) kept for the backward pass, beyond 95.74G.",
    "Fixed variant of iwae_images_per_device_v5p: 2048 images per device (the same 512 samples each); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["batch_too_large", "large_activation", "no_remat"]),
    _iwae_builder, dict(images=16384, k_samples=512, pixels=3072, latent=128, hidden=4096),
    dict(images=2048, k_samples=512, pixels=3072, latent=128, hidden=4096),
    dump=True,
)


# 25.5 a sparse embedding-table update written without donation


def _sparse_table_builder(mesh, rows_per_device, dim, lookups, donate):
    """Model-parallel embedding table (rows sharded over the devices, f32), trained with sparse SGD in
    jax.shard_map: every device looks up its own (already routed) ids, a small bf16 scorer is applied,
    the gradient w.r.t. the looked-up rows is scattered back with table.at[ids].add. donate=True:
    donate_argnums=(0,), the scatter updates the table in place."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def local_update(table, probe, ids, labels):
        def loss_rows(rows):
            score = (rows.astype(bf) @ probe).astype(f32)[:, 0]
            return jnp.mean(jax.nn.softplus(-labels * score))

        rows = table[ids]
        loss, g_rows = jax.value_and_grad(loss_rows)(rows)
        table = table.at[ids].add(-0.05 * g_rows)
        return table, jax.lax.pmean(loss, "d")

    step = jax.shard_map(local_update, mesh=mesh, in_specs=(P("d", None), P(), P("d"), P("d")),
                         out_specs=(P("d", None), P()), check_vma=False)

    def sparse_sgd_step(table, probe, ids, labels):
        return step(table, probe, ids, labels)

    n = mesh.devices.size
    table = sds((n * rows_per_device, dim), f32, mesh, P("d", None))
    probe = sds((dim, 1), bf, mesh, P())
    ids = sds((n * lookups,), jnp.int32, mesh, P("d"))
    labels = sds((n * lookups,), f32, mesh, P("d"))
    return sparse_sgd_step, (table, probe, ids, labels), ({"donate_argnums": (0,)} if donate else {})


pair(
    "sparse_table_no_donation", "v5e", "v5e:2x2",
    "Sparse SGD on a model-parallel f32 embedding table (4.5M rows x 512 per device, 8.6 GiB) in "
    "shard_map, updated with table.at[ids].add on 65536 looked-up rows per device, the step jitted without "
    "donate_argnums: the updated table is a second 8.6 GiB buffer next to the input one, beyond 15.75G.",
    "Fixed variant of sparse_table_no_donation_v5e: donate_argnums=(0,), the scatter updates the table in "
    "place; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["no_donation"]),
    _sparse_table_builder, dict(rows_per_device=4_500_000, dim=512, lookups=65536, donate=False),
    dict(rows_per_device=4_500_000, dim=512, lookups=65536, donate=True),
    dump=True,
)


# 25.6 a transformer whose jax.checkpoint covers only the attention sub-layer


def _attn_only_remat_builder(mesh, seqs, seq, d_model, heads, d_ff, depth, remat):
    """Pre-LN transformer encoder (bf16, scanned over `depth` blocks) with a wide GELU MLP. remat='attn':
    jax.checkpoint wraps only the attention sub-layer (the MLP's activations are saved for the backward
    pass); remat='block': jax.checkpoint wraps the whole block."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def norm(x):
        x32 = x.astype(f32)
        return ((x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-6)).astype(bf)

    def attention(x, w):
        b, s, _ = x.shape
        qkv = (norm(x) @ w["qkv"]).reshape(b, s, 3, heads, hd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        a = jax.nn.softmax((jnp.einsum("bqhd,bkhd->bhqk", q, k) / hd ** 0.5).astype(f32), -1).astype(bf)
        o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, s, d_model)
        return o @ w["proj"]

    def mlp(x, w):
        return jax.nn.gelu(norm(x) @ w["up"]) @ w["down"]

    attn_fn = jax.checkpoint(attention) if remat == "attn" else attention

    def block(x, w):
        x = (x + attn_fn(x, w)).astype(bf)
        return (x + mlp(x, w)).astype(bf), None

    body = jax.checkpoint(block) if remat == "block" else block

    def encoder_step(enc, tokens_in, target):
        def mse(enc):
            h, _ = jax.lax.scan(body, tokens_in, enc)
            return jnp.mean((h.astype(f32) - target) ** 2)

        loss, g = jax.value_and_grad(mse)(enc)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), enc, g), loss

    L, D, F = depth, d_model, d_ff
    w = lambda *s: sds(s, bf, mesh, P())
    enc = {"qkv": w(L, D, 3 * D), "proj": w(L, D, D), "up": w(L, D, F), "down": w(L, F, D)}
    n = mesh.devices.size * seqs
    tokens_in = sds((n, seq, D), bf, mesh, P("d"))
    target = sds((n, seq, D), bf, mesh, P("d"))
    return encoder_step, (enc, tokens_in, target), {"donate_argnums": (0,)}


pair(
    "attn_only_remat", "v4", "v4:2x2x1",
    "Transformer encoder (24 blocks, d=1024, 16 heads, d_ff=8192, bf16) on 64 sequences of 512 tokens per "
    "TensorCore with jax.checkpoint around the attention sub-layer only: every block's MLP activations "
    "bf16[64,512,8192] (512 MiB, twice) stay saved for the backward pass, beyond 15.25G.",
    "Fixed variant of attn_only_remat_v4: jax.checkpoint around the whole scanned block; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["no_remat", "batch_too_large"]),
    _attn_only_remat_builder, dict(seqs=64, seq=512, d_model=1024, heads=16, d_ff=8192, depth=24, remat="attn"),
    dict(seqs=64, seq=512, d_model=1024, heads=16, d_ff=8192, depth=24, remat="block"),
    dump=False,
)


# 25.7 second-order (covariance) pooling over 130 channels


def _cov_pool_builder(mesh, images, positions, channels, classes):
    """Bilinear / second-order pooling head on frozen backbone features [B, N, C_in]: a 1x1 reduction to
    `channels`, the per-image covariance [B, C, C] (einsum 'bnc,bnd->bcd'), signed square root and L2
    normalization, a linear classifier on the flattened C*C features. f32 head."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def cov_head_step(head, feats, labels):
        def xent(head):
            r = jax.nn.relu(feats @ head["reduce"])                                  # [B, N, C]
            cov = jnp.einsum("bnc,bnd->bcd", r, r) / positions                      # [B, C, C]
            cov = jnp.sign(cov) * jnp.sqrt(jnp.abs(cov) + 1e-6)
            flat = cov.reshape(cov.shape[0], -1)
            flat = flat * jax.lax.rsqrt(jnp.sum(flat * flat, -1, keepdims=True) + 1e-6)
            logits = flat @ head["cls"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[:, None], -1))

        loss, g = jax.value_and_grad(xent)(head)
        return _tm(lambda p, g: p - 1e-3 * g, head, g), loss

    c_in = 512
    head = {"reduce": sds((c_in, channels), f32, mesh, P()),
            "cls": sds((channels * channels, classes), f32, mesh, P())}
    n = mesh.devices.size * images
    feats = sds((n, positions, c_in), f32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    return cov_head_step, (head, feats, labels), {"donate_argnums": (0,)}


pair(
    "cov_pool_130ch", "v6e", "v6e:2x2",
    "Second-order (covariance) pooling head over 130 reduced channels, 65536 images per device of 49 "
    "positions: the per-image covariances f32[65536,130,130] (4.1 GiB) are tiled (8,128), the 130-wide "
    "minor dimension padded to 256, beyond 31.25G.",
    "Fixed variant of cov_pool_130ch_v6e: the 1x1 reduction to 128 channels, a multiple of 128; fits.",
    dict(category="aggregate", causes=["padding", "batch_too_large"]),
    _cov_pool_builder, dict(images=86016, positions=49, channels=130, classes=200),
    dict(images=86016, positions=49, channels=128, classes=200),
    dump=True,
)


# 25.8 a Lion optimizer whose momentum is kept replicated in f32 while the params are FSDP-sharded


def _lion_state_builder(mesh, depth, width, rows, state_spec):
    """Deep bf16 MLP with params FSDP-sharded (stacked [L, D, D], rows over the devices), trained with
    Lion written out (sign of the interpolated momentum, decoupled weight decay). The momentum trace is an
    f32 pytree placed with P(*state_spec): () replicates it on every device; ('d', None) shards it like
    the params. Params and state donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def lion_step(weights, trace, xb, yb):
        def mse(weights):
            def layer(h, w):
                return jax.nn.silu(h @ w).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), xb, weights["mats"])
            return jnp.mean((h.astype(f32) - yb) ** 2)

        loss, g = jax.value_and_grad(mse)(weights)
        b1, b2, lr, wd = 0.9, 0.99, 1e-4, 0.1
        upd = _tm(lambda m, g: jnp.sign(b1 * m + (1 - b1) * g.astype(f32)), trace, g)
        new_w = _tm(lambda p, u: (p.astype(f32) * (1 - lr * wd) - lr * u).astype(p.dtype), weights, upd)
        new_trace = _tm(lambda m, g: b2 * m + (1 - b2) * g.astype(f32), trace, g)
        return new_w, new_trace, loss

    weights = {"mats": sds((depth, width, width), bf, mesh, P(None, "d", None))}
    trace = {"mats": sds((depth, width, width), f32, mesh, P(None, *state_spec) if state_spec else P())}
    n = mesh.devices.size * rows
    xb = sds((n, width), bf, mesh, P("d"))
    yb = sds((n, width), bf, mesh, P("d"))
    out = (_shardings(weights), _shardings(trace), NamedSharding(mesh, P()))
    return lion_step, (weights, trace, xb, yb), {"donate_argnums": (0, 1), "out_shardings": out}


pair(
    "lion_trace_replicated", "v5e", "v5e:4x4",
    "Lion optimizer on a 32-layer bf16 MLP (d=8192, 4 GiB of params FSDP-sharded over the 16 chips of a "
    "v5e:4x4) whose f32 momentum trace is placed replicated (P()): 8 GiB of state on every chip, and its "
    "updated f32 copy, beyond 15.75G.",
    "Fixed variant of lion_trace_replicated_v5e: the momentum trace sharded like the params, "
    "P(None, 'd', None); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["optimizer_state_unsharded", "replicated_tensor", "f32_precision"]),
    _lion_state_builder, dict(depth=32, width=8192, rows=2048, state_spec=()),
    dict(depth=32, width=8192, rows=2048, state_spec=("d", None)),
    dump=False,
)


# ---- 26. more broken/fixed pairs (batch tpu15): other models, other names ---------------------
#
# Programs of kinds sections 13-25 do not have (a 2-D mesh whose weights are sharded on the small
# batch axis and the batch on the tensor axis, a diffusion U-Net's self-attention at the 64x64 latent
# level in f32, a reward model scoring K sampled responses per prompt concatenated along the batch, a
# streaming state-space decoder whose per-layer recurrent states travel as a tuple of f32 arrays never
# donated, a row-sharded embedding table whose dense gradient is pinned replicated, a video-text
# contrastive model that projects every patch of every frame before pooling). The same conventions:
# the fixed twin changes exactly the first cause. The swapped-mesh and embedding-gradient pairs keep
# their dumps (each file < 160 KB); the U-Net attention, reward-model, video-text and SSM pairs keep none
# (their after-optimizations modules are 198-362 KB).


# 26.1 a 2-D mesh whose weight and batch axes are swapped


def _swapped_axes_builder(mesh, seqs, width, ffn, depth, weight_axis, batch_axis):
    """A residual MLP stack trained with SGD over a (2, 8) mesh ("rep", "shard"): the weights are
    [depth, width, ffn] / [depth, ffn, width] bf16 with the ffn dimension sharded on `weight_axis`,
    the sequences (rows) sharded on `batch_axis`. Meant: weights on "shard" (8-way), rows on "rep"."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    grid = Mesh(mesh.devices.reshape(2, mesh.devices.size // 2), ("rep", "shard"))

    def mlp_block(h, w):
        return (h + jax.nn.gelu(h @ w["up"]) @ w["down"]).astype(bf), None

    def sgd_update(mlp, rows, goal):
        def l2(mlp):
            h, _ = jax.lax.scan(mlp_block, rows, mlp)
            return jnp.mean((h.astype(f32) - goal) ** 2)

        loss, g = jax.value_and_grad(l2)(mlp)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), mlp, g), loss

    mlp = {"up": sds((depth, width, ffn), bf, grid, P(None, None, weight_axis)),
           "down": sds((depth, ffn, width), bf, grid, P(None, weight_axis, None))}
    rows = sds((seqs, width), bf, grid, P(batch_axis))
    goal = sds((seqs, width), bf, grid, P(batch_axis))
    return sgd_update, (mlp, rows, goal), {"donate_argnums": (0,)}


pair(
    "mesh_axes_swapped", "v5e", "v5e:4x4",
    "Residual MLP stack (20 blocks, d=8192, ffn=32768, bf16, 20 GiB of weights) on a (2, 8) mesh "
    "('rep', 'shard') with the axis names swapped: the weights' ffn dimension is sharded on 'rep' (2-way, "
    "10 GiB per device, replicated across the 8 'shard' devices) and the rows on 'shard'; weights plus "
    "gradients exceed 15.75G.",
    "Fixed variant of mesh_axes_swapped_v5e: weights sharded on 'shard' (8-way), rows on 'rep'; fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _swapped_axes_builder, dict(seqs=8192, width=8192, ffn=32768, depth=20, weight_axis="rep", batch_axis="shard"),
    dict(seqs=8192, width=8192, ffn=32768, depth=20, weight_axis="shard", batch_axis="rep"),
    dump=True,
)


# 26.2 a diffusion U-Net's self-attention blocks at the 64x64 latent level, in f32


def _latent_attn_builder(mesh, images, side, channels, heads, blocks, dtype):
    """The self-attention blocks of a latent-diffusion U-Net at the highest resolution (side x side
    latent pixels = tokens), trained on the epsilon-prediction MSE; no remat. Params and activations in
    `dtype`, the loss in f32."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dt = getattr(jnp, dtype)
    C, H = channels, heads
    hd = C // H

    def denoise_step(unet, latents, noise):
        def eps_mse(unet):
            b = latents.shape[0]
            x = latents.reshape(b, side * side, C).astype(dt)
            for i in range(blocks):
                w = _tm(lambda a: a[i], unet)
                qkv = (x @ w["qkv"]).reshape(b, side * side, 3, H, hd)
                q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
                att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(hd).astype(dt), -1)
                o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, side * side, C)
                x = (x + o @ w["proj"]).astype(dt)
            return jnp.mean((x.astype(f32) - noise.reshape(x.shape).astype(f32)) ** 2)

        loss, g = jax.value_and_grad(eps_mse)(unet)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), unet, g), loss

    unet = {"qkv": sds((blocks, C, 3 * C), dt, mesh, P()), "proj": sds((blocks, C, C), dt, mesh, P())}
    n = mesh.devices.size * images
    latents = sds((n, side, side, C), dt, mesh, P("d"))
    noise = sds((n, side, side, C), dt, mesh, P("d"))
    return denoise_step, (unet, latents, noise), {"donate_argnums": (0,)}


pair(
    "unet_latent_attn_f32", "v5e", "v5e:2x2",
    "Latent-diffusion U-Net self-attention blocks at the 64x64 latent level (4096 tokens, 320 channels, "
    "8 heads, 4 blocks), 16 images per device, params and activations in f32 with no remat: the "
    "f32[16,8,4096,4096] attention scores and probabilities (8 GiB each) kept for the backward pass share "
    "two 8 GiB slots, beyond 15.75G.",
    "Fixed variant of unet_latent_attn_f32_v5e: params, latents and activations in bf16 (the loss in f32); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "large_activation", "no_remat"]),
    _latent_attn_builder, dict(images=16, side=64, channels=320, heads=8, blocks=4, dtype="float32"),
    dict(images=16, side=64, channels=320, heads=8, blocks=4, dtype="bfloat16"),
    dump=False,
)


# 26.3 a reward model scoring K sampled responses per prompt, concatenated along the batch


def _reward_k_builder(mesh, prompts, k_resp, seq, d_model, depth):
    """A reward model (scanned pre-LN transformer-ish blocks: causal single-head-group attention over
    `seq` tokens and a 4x MLP, bf16, jax.checkpoint per block) trained with a Bradley-Terry loss over
    K sampled responses per prompt: the [prompts * K, seq] token ids are scored in one batch."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    D = d_model

    @jax.checkpoint
    def rm_block(h, w):
        a = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", h @ w["wq"], h @ w["wk"]).astype(f32) / 64.0
                           + jnp.triu(jnp.full((seq, seq), -1e9, f32), 1), -1).astype(bf)
        h = (h + jnp.einsum("bqk,bkd->bqd", a, h @ w["wv"]) @ w["wo"]).astype(bf)
        return (h + jax.nn.gelu(h @ w["w1"]) @ w["w2"]).astype(bf), None

    def preference_step(rm, tokens, rank):
        def bt_loss(rm):
            h = jnp.take(rm["embed"], tokens, axis=0)                           # [B*K, S, D]
            h, _ = jax.lax.scan(rm_block, h, rm["blocks"])
            r = (h[:, -1] @ rm["head"]).astype(f32).reshape(-1, k_resp)          # [B, K]
            diff = r[:, :, None] - r[:, None, :]
            better = (rank[:, :, None] < rank[:, None, :]).astype(f32)
            return -jnp.sum(better * jax.nn.log_sigmoid(diff)) / jnp.maximum(jnp.sum(better), 1.0)

        loss, g = jax.value_and_grad(bt_loss)(rm)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), rm, g), loss

    L = depth
    blk = lambda *s: sds((L,) + s, bf, mesh, P())
    rm = {"embed": sds((32768, D), bf, mesh, P()), "head": sds((D,), bf, mesh, P()),
          "blocks": {"wq": blk(D, D), "wk": blk(D, D), "wv": blk(D, D), "wo": blk(D, D),
                     "w1": blk(D, 4 * D), "w2": blk(4 * D, D)}}
    n = mesh.devices.size * prompts
    tokens = sds((n * k_resp, seq), jnp.int32, mesh, P("d"))
    rank = sds((n, k_resp), jnp.int32, mesh, P("d"))
    return preference_step, (rm, tokens, rank), {"donate_argnums": (0,)}


pair(
    "reward_k_responses", "v5p", "v5p:2x2x1",
    "Reward model (24 checkpointed blocks, d=2048, bf16) trained with a Bradley-Terry loss on 64 prompts "
    "per device, each with 16 sampled responses of 1024 tokens concatenated along the batch: 1M tokens per "
    "device, the per-block residuals bf16[24,1024,1024,2048] (96 GiB) kept for the backward pass, beyond 95.74G.",
    "Fixed variant of reward_k_responses_v5p: 16 prompts per device (the same 16 responses each); fits.",
    dict(category="single_large_allocation", causes=["batch_too_large", "large_activation"]),
    _reward_k_builder, dict(prompts=64, k_resp=16, seq=1024, d_model=2048, depth=24),
    dict(prompts=16, k_resp=16, seq=1024, d_model=2048, depth=24),
    dump=False,
)


# 26.4 a streaming state-space decoder whose recurrent states are never donated


def _ssm_stream_builder(mesh, streams, d_model, d_inner, d_state, layers, donate):
    """One decoding step of a Mamba-style stacked selective-SSM language model: the per-layer
    recurrent state is a Python tuple of (f32[B, d_inner, d_state] ssm state, f32[B, d_inner, 4] conv
    window), passed in and returned every step. donate=True: donate_argnums=(1,), the new states reuse
    the old buffers."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def stream_decode(lm, carry, tok):
        x = jnp.take(lm["embed"], tok, axis=0)                                       # [B, D]
        out = []
        for i in range(layers):
            ssm, conv = carry[i]
            w = _tm(lambda a: a[i], lm["layers"])
            xz = (x @ w["inp"]).astype(f32)
            u, z = xz[:, :d_inner], xz[:, d_inner:]
            conv = jnp.concatenate([conv[:, :, 1:], u[:, :, None]], -1)
            u = jax.nn.silu(jnp.sum(conv * w["conv"].astype(f32), -1))
            bc = (u.astype(bf) @ w["bc"]).astype(f32)                                 # [B, 2N]
            dt = jax.nn.softplus(u)[:, :, None]
            ssm = jnp.exp(-dt * jnp.exp(w["a_log"].astype(f32))) * ssm + dt * u[:, :, None] * bc[:, None, :d_state]
            y = jnp.sum(ssm * bc[:, None, d_state:], -1) * jax.nn.silu(z)
            x = (x + y.astype(bf) @ w["out"]).astype(bf)
            out.append((ssm, conv))
        logits = (x @ lm["embed"].T).astype(f32)
        return jnp.argmax(logits, -1).astype(jnp.int32), tuple(out)

    L = layers
    lw = lambda *s: sds((L,) + s, bf, mesh, P())
    lm = {"embed": sds((32000, d_model), bf, mesh, P()),
          "layers": {"inp": lw(d_model, 2 * d_inner), "conv": lw(d_inner, 4), "bc": lw(d_inner, 2 * d_state),
                     "a_log": lw(d_inner, d_state), "out": lw(d_inner, d_model)}}
    n = mesh.devices.size * streams
    carry = tuple((sds((n, d_inner, d_state), f32, mesh, P("d")), sds((n, d_inner, 4), f32, mesh, P("d")))
                  for _ in range(L))
    tok = sds((n,), jnp.int32, mesh, P("d"))
    return stream_decode, (lm, carry, tok), ({"donate_argnums": (1,)} if donate else {})


pair(
    "ssm_stream_states_undonated", "v4", "v4:2x2x1",
    "Streaming decode step of a Mamba-style SSM language model (32 layers, d_inner=4096, d_state=16) "
    "serving 1024 streams per TensorCore: the per-layer f32 recurrent states (a tuple of 32 "
    "f32[1024,4096,16] ssm states and f32[1024,4096,4] conv windows, 10 GiB) are passed in and returned without donation, "
    "so old and new states are both live, beyond 15.25G.",
    "Fixed variant of ssm_stream_states_undonated_v4: donate_argnums=(1,), the new states reuse the old "
    "buffers; fits.",
    dict(category="aggregate", causes=["no_donation"]),
    _ssm_stream_builder, dict(streams=1024, d_model=2048, d_inner=4096, d_state=16, layers=32, donate=False),
    dict(streams=1024, d_model=2048, d_inner=4096, d_state=16, layers=32, donate=True),
    dump=False,
)


# 26.5 a video-text contrastive model that projects every patch of every frame before pooling


def _video_text_builder(mesh, clips, frames, patches, vis_dim, proj_hidden, embed, captions_len, pool_first):
    """Video-text contrastive training on frozen per-frame patch features [B, T, P, C] (bf16, an
    argument): a 2-layer projection MLP (C -> hidden -> E) and mean pooling to one clip embedding, a
    small caption encoder (token embeddings, mean), InfoNCE over the per-device batch.
    pool_first=False: the MLP runs on every patch of every frame, then pools; True: patches are
    mean-pooled per frame, the MLP runs on [B, T, C], then frames are pooled."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def clip_text_step(proj, feats, caption):
        def info_nce(proj):
            f = jnp.mean(feats, 2) if pool_first else feats                             # [B,T,C] / [B,T,P,C]
            e = jax.nn.gelu(f @ proj["v1"]) @ proj["v2"]
            v = jnp.mean(e.reshape(e.shape[0], -1, e.shape[-1]), 1).astype(f32)        # [B, E]
            t = jnp.mean(jnp.take(proj["tok"], caption, axis=0), 1).astype(f32)          # [B, E]
            v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)
            t = t / jnp.linalg.norm(t, axis=-1, keepdims=True)
            logits = v @ t.T / 0.07
            lab = jnp.arange(logits.shape[0])
            return -0.5 * (jnp.mean(jax.nn.log_softmax(logits, 1)[lab, lab])
                           + jnp.mean(jax.nn.log_softmax(logits, 0)[lab, lab]))

        loss, g = jax.value_and_grad(info_nce)(proj)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), proj, g), loss

    proj = {"v1": sds((vis_dim, proj_hidden), bf, mesh, P()), "v2": sds((proj_hidden, embed), bf, mesh, P()),
            "tok": sds((49408, embed), bf, mesh, P())}
    n = mesh.devices.size * clips
    feats = sds((n, frames, patches, vis_dim), bf, mesh, P("d"))
    caption = sds((n, captions_len), jnp.int32, mesh, P("d"))
    return clip_text_step, (proj, feats, caption), {"donate_argnums": (0,)}


pair(
    "video_patch_proj_before_pool", "v6e", "v6e:2x2",
    "Video-text contrastive model on frozen ViT patch features, 512 clips per device x 16 frames x 256 "
    "patches x 1024 channels: the projection MLP (1024 -> 8192 -> 512) runs on all 2M patch rows per "
    "device before pooling, keeping bf16[512,16,256,8192] hidden activations (32 GiB each) for the "
    "backward pass, beyond 31.25G.",
    "Fixed variant of video_patch_proj_before_pool_v6e: patches mean-pooled per frame before the "
    "projection MLP; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _video_text_builder, dict(clips=512, frames=16, patches=256, vis_dim=1024, proj_hidden=8192, embed=512,
                              captions_len=32, pool_first=False),
    dict(clips=512, frames=16, patches=256, vis_dim=1024, proj_hidden=8192, embed=512, captions_len=32,
         pool_first=True),
    dump=False,
)


# 26.6 a row-sharded embedding table whose gradient is pinned replicated before the update


def _bag_grad_builder(mesh, buckets, dim, bags, bag_len, classes, grad_spec):
    """A bag-of-embeddings text classifier: an f32 table [buckets, dim] row-sharded over the devices,
    mean-pooled lookups of [bags, bag_len] hashed ids (bags sharded), a small bf16 classifier. The table's
    gradient (the dense scatter-add of the lookups) is pinned with with_sharding_constraint(g, grad_spec)
    "so that every replica sees the all-reduced gradient": P() replicates the full [buckets, dim] gradient
    on every device; P('d', None) keeps it sharded like the table."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def bag_sgd_step(emb, clf, ids, label):
        def xent(emb, clf):
            pooled = jnp.mean(jnp.take(emb, ids, axis=0), 1)                            # [B, D]
            logits = (pooled.astype(bf) @ clf).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), label[:, None], -1))

        loss, (g_emb, g_clf) = jax.value_and_grad(xent, argnums=(0, 1))(emb, clf)
        g_emb = jax.lax.with_sharding_constraint(g_emb, NamedSharding(mesh, P(*grad_spec)))
        return emb - 0.05 * g_emb, (clf - 1e-3 * g_clf).astype(bf), loss

    emb = sds((buckets, dim), f32, mesh, P("d", None))
    clf = sds((dim, classes), bf, mesh, P())
    n = mesh.devices.size * bags
    ids = sds((n, bag_len), jnp.int32, mesh, P("d"))
    label = sds((n,), jnp.int32, mesh, P("d"))
    return bag_sgd_step, (emb, clf, ids, label), {"donate_argnums": (0, 1)}


pair(
    "bag_embed_grad_replicated", "v6e", "v6e:2x2",
    "Bag-of-embeddings text classifier with an f32 hashed-feature table of 4194304 buckets x 2048 (32 GiB), "
    "row-sharded over the 4 devices (8 GiB each), whose gradient is pinned with "
    "with_sharding_constraint(g, P()) before the SGD update: every device holds the whole dense "
    "f32[4194304,2048] gradient (32 GiB), beyond 31.25G.",
    "Fixed variant of bag_embed_grad_replicated_v6e: the gradient pinned P('d', None), sharded like the "
    "table; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor"]),
    _bag_grad_builder, dict(buckets=4194304, dim=2048, bags=4096, bag_len=64, classes=1024, grad_spec=()),
    dict(buckets=4194304, dim=2048, bags=4096, bag_len=64, classes=1024, grad_spec=("d", None)),
    dump=True,
)


# ---- 27. more broken/fixed pairs (batch tpu16): other models, other names ---------------------
#
# Programs of kinds sections 13-26 do not have (sliding-window attention written as full [L, L]
# scores under a band mask, an S4 layer in convolution mode that builds the [H, L, L] Toeplitz matrix
# of its kernel). The same conventions: the fixed twin changes exactly the first cause. (A reversible
# network trained by plain autodiff and a pair potential over all [S, N, N] atom pairs were written
# but not compiled in the batch's time; see the README.)


# 27.1 sliding-window attention computed as full [L, L] scores with a band mask


def _swa_builder(mesh, docs, seq_len, heads, head_dim, window, depth, chunked):
    """A byte-level long-context LM (vocab 256) with sliding-window causal attention (each position
    sees the previous `window` bytes) and a 4x MLP per layer, bf16, softmax in f32, no remat.
    chunked=False: full [B, H, L, L] scores with a band mask; True: the sequence cut into blocks of
    `window`, each block attending to itself and the block before ([B, n, H, W, 2W] scores)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    H, hd, W, L = heads, head_dim, window, seq_len
    D = H * hd

    def local_attn(q, k, v):
        b = q.shape[0]
        if not chunked:
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) / jnp.sqrt(float(hd))
            i = jnp.arange(L)
            band = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < W)
            p = jax.nn.softmax(jnp.where(band, s, -1e9), -1).astype(bf)
            return jnp.einsum("bhqk,bkhd->bqhd", p, v)
        n = L // W
        qb, kb, vb = (t.reshape(b, n, W, H, hd) for t in (q, k, v))
        prev = lambda t: jnp.concatenate([jnp.zeros_like(t[:, :1]), t[:, :-1]], 1)
        kk = jnp.concatenate([prev(kb), kb], 2)                                     # [b, n, 2W, H, hd]
        vv = jnp.concatenate([prev(vb), vb], 2)
        s = jnp.einsum("bnqhd,bnkhd->bnhqk", qb, kk).astype(f32) / jnp.sqrt(float(hd))
        qpos = jnp.arange(W)[:, None] + W
        kpos = jnp.arange(2 * W)[None, :]
        band = (qpos >= kpos) & (qpos - kpos < W)
        band = band[None] & ((jnp.arange(n)[:, None, None] > 0) | (kpos >= W)[None])  # no block before 0
        p = jax.nn.softmax(jnp.where(band[None, :, None], s, -1e9), -1).astype(bf)
        return jnp.einsum("bnhqk,bnkhd->bnqhd", p, vv).reshape(b, L, H, hd)

    def byte_lm_step(net, seq):
        def nll(net):
            x = jnp.take(net["bytes"], seq[:, :-1], axis=0)                           # [B, L, D]
            b = x.shape[0]
            for i in range(depth):
                lyr = _tm(lambda a: a[i], net["layers"])
                q, k, v = ((x @ lyr[m]).reshape(b, L, H, hd) for m in ("q", "k", "v"))
                x = (x + local_attn(q, k, v).reshape(b, L, D) @ lyr["o"]).astype(bf)
                x = (x + jax.nn.gelu(x @ lyr["up"]) @ lyr["dn"]).astype(bf)
            logits = (x @ net["bytes"].T).astype(f32)                                 # [B, L, 256]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), seq[:, 1:, None], -1))

        loss, g = jax.value_and_grad(nll)(net)
        return _tm(lambda p, g: (p - 3e-4 * g).astype(p.dtype), net, g), loss

    lw = lambda *s: sds((depth,) + s, bf, mesh, P())
    net = {"bytes": sds((256, D), bf, mesh, P()),
           "layers": {"q": lw(D, D), "k": lw(D, D), "v": lw(D, D), "o": lw(D, D),
                      "up": lw(D, 4 * D), "dn": lw(4 * D, D)}}
    seq = sds((mesh.devices.size * docs, L + 1), jnp.int32, mesh, P("d"))
    return byte_lm_step, (net, seq), {"donate_argnums": (0,)}


pair(
    "swa_band_mask_full", "v6e", "v6e:2x2",
    "Byte-level LM with sliding-window attention (window 512) over 16384-byte documents, 4 documents per "
    "device, 2 layers of 8 heads: the window is applied as a band mask on the full f32[4,8,16384,16384] "
    "scores (32 GiB each), kept with the probabilities for the backward pass, beyond 31.25G.",
    "Fixed variant of swa_band_mask_full_v6e: the sequence cut into 512-byte blocks, each attending to "
    "itself and the block before ([B, 32, H, 512, 1024] scores); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large", "no_remat"]),
    _swa_builder, dict(docs=4, seq_len=16384, heads=8, head_dim=128, window=512, depth=2, chunked=False),
    dict(docs=4, seq_len=16384, heads=8, head_dim=128, window=512, depth=2, chunked=True),
    dump=False,
)


# 27.2 an S4 layer in convolution mode that materialises the [H, L, L] Toeplitz matrix of its kernel


def _s4_conv_builder(mesh, seqs, seq_len, channels, state, depth, classes, fft):
    """An S4D-style sequence classifier (long-range-arena shape): per layer the diagonal SSM's
    convolution kernel K[H, L] = sum_n C*B*exp(-dt*A*l) is generated from the parameters, then applied
    causally along the sequence, plus the skip D*u, gelu and a channel mix; mean pooling and a linear
    head. f32 throughout. fft=False: K is expanded into the Toeplitz matrix T[h, i, j] = K[h, i-j]
    (f32[H, L, L]) and applied with an einsum; True: the causal convolution by rfft/irfft of length 2L."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    L, Hc = seq_len, channels

    def ssm_kernel(lyr):
        dt = jnp.exp(lyr["log_dt"])[:, None, None]                                  # [H, 1, 1]
        a = jnp.exp(lyr["log_a"])[:, :, None]                                        # [H, N, 1]
        decay = jnp.exp(-dt * a * jnp.arange(L, dtype=f32)[None, None, :])           # [H, N, L]
        return jnp.einsum("hn,hnl->hl", lyr["c"] * lyr["b"], decay)                  # [H, L]

    def causal_conv(u, kern):                                                        # u [B, L, H]
        if fft:
            uf = jnp.fft.rfft(u, n=2 * L, axis=1)
            kf = jnp.fft.rfft(kern, n=2 * L, axis=-1).T                              # [L+1, H]
            return jnp.fft.irfft(uf * kf[None], n=2 * L, axis=1)[:, :L]
        lag = jnp.arange(L)[:, None] - jnp.arange(L)[None, :]
        toep = jnp.where(lag[None] >= 0, kern[:, jnp.clip(lag, 0, L - 1)], 0.0)      # [H, L, L]
        return jnp.einsum("hij,bjh->bih", toep, u)

    def lra_step(s4, signal, target):
        def xent(s4):
            u = signal @ s4["enc"]                                                   # [B, L, H]
            for i in range(depth):
                lyr = _tm(lambda a: a[i], s4["layers"])
                y = causal_conv(u, ssm_kernel(lyr)) + lyr["skip"] * u
                u = u + jax.nn.gelu(y) @ lyr["mix"]
            logits = jnp.mean(u, 1) @ s4["head"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), target[:, None], -1))

        loss, g = jax.value_and_grad(xent)(s4)
        return _tm(lambda p, g: p - 1e-3 * g, s4, g), loss

    lw = lambda *s: sds((depth,) + s, f32, mesh, P())
    s4 = {"enc": sds((8, Hc), f32, mesh, P()), "head": sds((Hc, classes), f32, mesh, P()),
          "layers": {"log_dt": lw(Hc), "log_a": lw(Hc, state), "b": lw(Hc, state), "c": lw(Hc, state),
                     "skip": lw(Hc), "mix": lw(Hc, Hc)}}
    n = mesh.devices.size * seqs
    signal = sds((n, L, 8), f32, mesh, P("d"))
    target = sds((n,), jnp.int32, mesh, P("d"))
    return lra_step, (s4, signal, target), {"donate_argnums": (0,)}


pair(
    "s4_toeplitz_kernel", "v4", "v4:2x2x1",
    "S4D sequence classifier (4 layers, 128 channels, state 64) on 8192-step signals, 4 sequences per "
    "TensorCore, f32: each layer expands its generated convolution kernel into the Toeplitz matrix "
    "f32[128,8192,8192] (32 GiB) and applies it with an einsum, beyond 15.25G.",
    "Fixed variant of s4_toeplitz_kernel_v4: the causal convolution done by rfft/irfft of length 2L; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _s4_conv_builder, dict(seqs=4, seq_len=8192, channels=128, state=64, depth=4, classes=10, fft=False),
    dict(seqs=4, seq_len=8192, channels=128, state=64, depth=4, classes=10, fft=True),
    dump=False,
)


# ---- 28. more broken/fixed pairs (batch tpu17): other models, other names ---------------------
#
# Programs of kinds sections 13-27 do not have (a pmap-to-jit migration whose parameters keep their
# leading replica axis and are replicated on every device, an inference server blending the old and the
# new checkpoint during a hot swap without donating the live weights, a LoRA fine-tune whose frozen f32
# base is replicated while only the adapters are sharded, a two-tower retrieval model whose item tower
# table gets PartitionSpec() by mistake, Adam on a 2-D mesh whose moments are sharded on one axis only,
# an Adam fine-tune whose checkpoint was restored without shardings, so its f32 parameters arrive
# replicated). The same conventions: the fixed twin changes exactly the first cause. The pmap-migration
# and 2-D-mesh Adam pairs keep their dumps (each file < 160 KB); the others keep none (the two-tower
# after-optimizations module is 228 KB). A mixer whose activations were pinned P() mid-network compiled
# (see the README) and is not here.


# 28.1 a pmap-to-jit migration: the parameters keep their leading replica axis, replicated


def _pmap_axis_builder(mesh, depth, width, hidden, rows, replica_spec):
    """A residual MLP written for pmap (parameters stacked [n_replicas, depth, ...] by
    jax.device_put_replicated, gradients averaged with lax.pmean over the "replica" axis), moved to
    jit by swapping pmap for vmap(axis_name="replica"). replica_spec P() leaves the stacked copies
    replicated on every device (each device holds all n copies); P('d') gives each device its own."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n = mesh.devices.size

    def replica_step(net, xb, yb):
        def sq_err(net):
            def blk(h, w):
                return (h + jax.nn.relu(h @ w["fc_a"]) @ w["fc_b"]).astype(bf), None

            h, _ = jax.lax.scan(blk, xb, net)
            return jnp.mean((h.astype(f32) - yb.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(sq_err)(net)
        g = jax.lax.pmean(g, "replica")
        return _tm(lambda p, g: (p - 3e-4 * g).astype(p.dtype), net, g), jax.lax.pmean(loss, "replica")

    step = jax.vmap(replica_step, axis_name="replica")
    rs = P(*replica_spec)
    net = {"fc_a": sds((n, depth, width, hidden), bf, mesh, rs),
           "fc_b": sds((n, depth, hidden, width), bf, mesh, rs)}
    xb = sds((n, rows, width), bf, mesh, P("d"))
    yb = sds((n, rows, width), bf, mesh, P("d"))
    return step, (net, xb, yb), {"donate_argnums": (0,)}


pair(
    "pmap_replica_axis_replicated", "v5e", "v5e:2x2",
    "Residual MLP (18 blocks, d=4096, hidden=16384, bf16, 4.5 GiB per copy) migrated from pmap to "
    "jit(vmap(axis_name='replica')): the parameters keep their leading replica axis [4, ...] and are "
    "placed with PartitionSpec(), so every device holds all 4 copies (18 GiB), beyond 15.75G.",
    "Fixed variant of pmap_replica_axis_replicated_v5e: the stacked parameters placed P('d'), each device "
    "holding its own copy as under pmap; fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed"]),
    _pmap_axis_builder, dict(depth=18, width=4096, hidden=16384, rows=1024, replica_spec=()),
    dict(depth=18, width=4096, hidden=16384, rows=1024, replica_spec=("d",)),
    dump=True,
)


# 28.2 an inference server blending the old and the new checkpoint, live weights not donated


def _hot_swap_builder(mesh, layers, d_model, d_ff, canary_rows, donate):
    """Hot swap of a tensor-parallel decoder's weights on a serving slice: the live weights and the
    incoming checkpoint (both bf16, column/row-sharded over 'd') are blended live = (1-a)*live + a*new,
    then a canary batch runs through the blended weights. donate=True: donate_argnums=(0,), the blended
    weights reuse the live buffers."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def hot_swap(live, incoming, canary, mix):
        blended = _tm(lambda o, n: ((1.0 - mix) * o.astype(f32) + mix * n.astype(f32)).astype(bf), live, incoming)

        def layer(h, w):
            a = (h @ w["attn_in"])[..., :d_model]
            h = (h + a @ w["attn_out"]).astype(bf)
            return (h + jax.nn.gelu(h @ w["mlp_in"]) @ w["mlp_out"]).astype(bf), None

        h, _ = jax.lax.scan(layer, canary, blended)
        return blended, jnp.mean(h.astype(f32), -1)

    L, D, F = layers, d_model, d_ff
    col = lambda *s: sds((L,) + s, bf, mesh, P(None, None, "d"))
    row = lambda *s: sds((L,) + s, bf, mesh, P(None, "d", None))
    mk = lambda: {"attn_in": col(D, 3 * D), "attn_out": row(D, D), "mlp_in": col(D, F), "mlp_out": row(F, D)}
    canary = sds((canary_rows, D), bf, mesh, P())
    mix = sds((), f32, mesh, P())
    return hot_swap, (mk(), mk(), canary, mix), ({"donate_argnums": (0,)} if donate else {})


pair(
    "hot_swap_blend_undonated", "v6e", "v6e:2x2",
    "Serving-side hot swap of a 26B-parameter tensor-parallel decoder (36 layers, d=8192, ffn=28672, bf16, "
    "12.4 GiB per device): live and incoming checkpoints are blended (1-a)*live + a*new and a canary batch "
    "runs on the result, with no donation, so the live, incoming and blended weights (37 GiB) are all "
    "resident, beyond 31.25G.",
    "Fixed variant of hot_swap_blend_undonated_v6e: donate_argnums=(0,), the blended weights reuse the "
    "live buffers; fits.",
    dict(category="aggregate", causes=["no_donation"]),
    _hot_swap_builder, dict(layers=36, d_model=8192, d_ff=28672, canary_rows=64, donate=False),
    dict(layers=36, d_model=8192, d_ff=28672, canary_rows=64, donate=True),
    dump=False,
)


# 28.3 a LoRA fine-tune whose frozen base is f32 and replicated, only the adapters sharded


def _lora_base_builder(mesh, layers, d_model, d_ff, rank, rows, base_spec):
    """LoRA fine-tuning of a decoder's projections: the frozen base weights (f32, as loaded from the
    checkpoint, cast to bf16 per layer inside the scan) placed with `base_spec` on their last-but-one
    or last dimension, the rank-r adapters sharded over 'd'; jax.checkpoint per block, gradients only for the
    adapters, SGD on them. base_spec () replicates the base on every device."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def adapter_step(frozen, adapters, x, y):
        def mse(adapters):
            @jax.checkpoint
            def blk(h, ws):
                w, a = ws
                q = h @ w["proj_q"].astype(bf) + (h @ a["q_down"]) @ a["q_up"]
                h = (h + q).astype(bf)
                u = jax.nn.silu(h @ w["ffn_in"].astype(bf) + (h @ a["f_down"]) @ a["f_up"])
                return (h + u.astype(bf) @ w["ffn_out"].astype(bf)).astype(bf), None

            h, _ = jax.lax.scan(blk, x, (frozen, adapters))
            return jnp.mean((h.astype(f32) - y.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(mse)(adapters)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), adapters, g), loss

    L, D, F, R = layers, d_model, d_ff, rank
    bs = P(*base_spec)
    frozen = {"proj_q": sds((L, D, D), f32, mesh, bs), "ffn_in": sds((L, D, F), f32, mesh, bs),
              "ffn_out": sds((L, F, D), f32, mesh, bs)}
    ad = lambda *s: sds((L,) + s, bf, mesh, P(None, None, "d"))
    adapters = {"q_down": ad(D, R), "q_up": ad(R, D), "f_down": ad(D, R), "f_up": ad(R, F)}
    n = mesh.devices.size * rows
    x = sds((n, D), bf, mesh, P("d"))
    y = sds((n, D), bf, mesh, P("d"))
    return adapter_step, (frozen, adapters, x, y), {"donate_argnums": (1,)}


pair(
    "lora_frozen_base_replicated", "v5p", "v5p:2x2x1",
    "LoRA fine-tune (rank 64) of a 28B-parameter decoder (48 blocks, d=8192, ffn=28672): the frozen base "
    "kept in f32 as loaded and placed with PartitionSpec() (105 GiB on every device) while only the "
    "adapters are sharded, beyond 95.74G.",
    "Fixed variant of lora_frozen_base_replicated_v5p: the frozen base sharded P(None, 'd', None) over the "
    "4 devices (still f32); fits.",
    dict(category="arguments", causes=["replicated_tensor", "f32_precision", "arguments_exceed"]),
    _lora_base_builder, dict(layers=48, d_model=8192, d_ff=28672, rank=64, rows=4096, base_spec=()),
    dict(layers=48, d_model=8192, d_ff=28672, rank=64, rows=4096, base_spec=(None, "d", None)),
    dump=False,
)


# 28.4 a two-tower retrieval model whose item tower table is replicated by mistake


def _two_tower_builder(mesh, n_users, n_items, dim, queries, item_spec):
    """Two-tower retrieval trained with in-batch sampled softmax: a user id table and an item id table
    (f32 [rows, dim]) each followed by a small bf16 MLP; the user table is row-sharded P('d', None), the
    item table placed with `item_spec` (P() by mistake: the whole table and its dense gradient on every
    device). Adagrad-free plain SGD, tables donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def retrieval_step(towers, who, what):
        def sampled_softmax(towers):
            u = jnp.take(towers["user_ids"], who, axis=0).astype(bf)
            v = jnp.take(towers["item_ids"], what, axis=0).astype(bf)
            u = jax.nn.gelu(u @ towers["user_mlp"])
            v = jax.nn.gelu(v @ towers["item_mlp"])
            s = (u @ v.T).astype(f32) / 0.05
            return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(s, -1)))

        loss, g = jax.value_and_grad(sampled_softmax)(towers)
        return _tm(lambda p, g: (p - 0.01 * g).astype(p.dtype), towers, g), loss

    towers = {"user_ids": sds((n_users, dim), f32, mesh, P("d", None)),
              "item_ids": sds((n_items, dim), f32, mesh, P(*item_spec)),
              "user_mlp": sds((dim, dim), bf, mesh, P()), "item_mlp": sds((dim, dim), bf, mesh, P())}
    n = mesh.devices.size * queries
    who = sds((n,), jnp.int32, mesh, P("d"))
    what = sds((n,), jnp.int32, mesh, P("d"))
    return retrieval_step, (towers, who, what), {"donate_argnums": (0,)}


pair(
    "two_tower_item_table_replicated", "v4", "v4:2x2x1",
    "Two-tower retrieval model with f32 id tables of 20M users and 10M items x 256: the user table is "
    "row-sharded over the 8 TensorCores but the item table is placed with PartitionSpec() by mistake, so "
    "every core holds the whole 9.5 GiB item table and its dense 9.5 GiB gradient, beyond 15.25G.",
    "Fixed variant of two_tower_item_table_replicated_v4: the item table row-sharded P('d', None) like the "
    "user table; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor"]),
    _two_tower_builder, dict(n_users=20_000_000, n_items=10_000_000, dim=256, queries=4096, item_spec=()),
    dict(n_users=20_000_000, n_items=10_000_000, dim=256, queries=4096, item_spec=("d", None)),
    dump=False,
)


# 28.5 Adam on a 2-D mesh whose moments are sharded on one axis only


def _adam_one_axis_builder(mesh, depth, width, hidden, rows, moment_axes):
    """An MLP stack trained with Adam (written out) on a (4, 4) mesh ('data', 'model'): the f32 params
    [depth, width, hidden] / [depth, hidden, width] sharded over both axes (16-way), the batch on 'data';
    the f32 first and second moments placed with `moment_axes`: ('model',) shards them on 'model' only
    (4-way, 4 copies along 'data'); ('data', 'model') shards them 16-way exactly like the params.
    in_shardings = out_shardings (what the user asked for), weights and moments donated."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    grid = Mesh(mesh.devices.reshape(4, mesh.devices.size // 4), ("data", "model"))

    def fit_step(weights, moments, feats, target):
        def huber(weights):
            def blk(h, w):
                return (h + jax.nn.gelu(h @ w["expand"].astype(bf)) @ w["project"].astype(bf)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(blk), feats, weights)
            return jnp.mean(optax_huber(h.astype(f32) - target.astype(f32)))

        def optax_huber(e):
            a = jnp.abs(e)
            return jnp.where(a < 1.0, 0.5 * e * e, a - 0.5)

        loss, g = jax.value_and_grad(huber)(weights)
        new, moments = adam_update(weights, g, moments, lr=2e-4)
        return new, moments, loss

    ax = dict(data="data" in moment_axes, model="model" in moment_axes)
    w = {"expand": sds((depth, width, hidden), f32, grid, P(None, "data", "model")),
         "project": sds((depth, hidden, width), f32, grid, P(None, "model", "data"))}
    mk = lambda: {"expand": sds((depth, width, hidden), f32, grid,
                                P(None, "data" if ax["data"] else None, "model" if ax["model"] else None)),
                  "project": sds((depth, hidden, width), f32, grid,
                                 P(None, "model" if ax["model"] else None, "data" if ax["data"] else None))}
    moments = {"count": sds((), jnp.int32, grid, P()), "mu": mk(), "nu": mk()}
    feats = sds((rows, width), bf, grid, P("data"))
    target = sds((rows, width), bf, grid, P("data"))
    kw = {"out_shardings": (_shardings(w), _shardings(moments), NamedSharding(grid, P())),
          "donate_argnums": (0, 1)}
    return fit_step, (w, moments, feats, target), kw


pair(
    "adam_moments_one_axis", "v5e", "v5e:4x4",
    "MLP stack (48 blocks, d=4096, hidden=16384, f32, 6.4B parameters) trained with Adam on a (4, 4) mesh "
    "('data', 'model'): the params are sharded over both axes (1.6 GiB per device) but the f32 moments only "
    "over 'model', so each device holds a quarter of mu and of nu (12.9 GiB), beyond 15.75G.",
    "Fixed variant of adam_moments_one_axis_v5e: the moments sharded over ('data', 'model') like the params; fits.",
    dict(category="aggregate", causes=["optimizer_state_unsharded", "replicated_tensor"]),
    _adam_one_axis_builder, dict(depth=48, width=4096, hidden=16384, rows=4096, moment_axes=("model",)),
    dict(depth=48, width=4096, hidden=16384, rows=4096, moment_axes=("data", "model")),
    dump=True,
)


# 28.6 a fine-tune whose restored checkpoint arrives replicated (restored without its shardings)


def _restored_replicated_builder(mesh, depth, width, hidden, rows, param_spec):
    """Fine-tuning with Adam after restoring a checkpoint: the optimizer moments are created fresh and
    sharded FSDP-style over 'd' on their hidden dimension, but the f32 parameters were restored without
    restore shardings (a plain restore onto the default placement, then device_put with P()), so they
    arrive with `param_spec` () = P(): replicated on every device, and so are their gradients;
    "like_moments" places them as the moments.
    in_shardings = out_shardings; params and moments donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def finetune_step(ckpt, adam_state, seq_feats, seq_goal):
        def loss_fn(ckpt):
            @jax.checkpoint
            def blk(h, w):
                return (h + jax.nn.silu(h @ w["w_gate"].astype(bf)) @ w["w_proj"].astype(bf)).astype(bf), None

            h, _ = jax.lax.scan(blk, seq_feats, ckpt)
            return jnp.mean((h.astype(f32) - seq_goal.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(ckpt)
        ckpt, adam_state = adam_update(ckpt, g, adam_state, lr=1e-5)
        return ckpt, adam_state, loss

    fs = lambda: {"w_gate": sds((depth, width, hidden), f32, mesh, P(None, None, "d")),
                  "w_proj": sds((depth, hidden, width), f32, mesh, P(None, "d", None))}
    ckpt = fs() if param_spec == "like_moments" else {
        "w_gate": sds((depth, width, hidden), f32, mesh, P(*param_spec)),
        "w_proj": sds((depth, hidden, width), f32, mesh, P(*param_spec))}
    adam_state = {"count": sds((), jnp.int32, mesh, P()), "mu": fs(), "nu": fs()}
    n = mesh.devices.size * rows
    seq_feats = sds((n, width), bf, mesh, P("d"))
    seq_goal = sds((n, width), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(ckpt), _shardings(adam_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return finetune_step, (ckpt, adam_state, seq_feats, seq_goal), kw


pair(
    "restored_ckpt_replicated", "v5p", "v5p:2x2x1",
    "Adam fine-tune of a 10.7B-parameter MLP stack (40 blocks, d=8192, hidden=16384, f32) after a checkpoint "
    "restore without shardings: the parameters (40 GiB) arrive replicated P() on every device while the "
    "fresh Adam moments are sharded over 'd' (20 GiB per device); parameters, their replicated gradients "
    "and the update temporaries exceed 95.74G.",
    "Fixed variant of restored_ckpt_replicated_v5p: the checkpoint restored with the moments' shardings "
    "(parameters P(None, None, 'd') / P(None, 'd', None)); fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _restored_replicated_builder, dict(depth=40, width=8192, hidden=16384, rows=2048, param_spec=()),
    dict(depth=40, width=8192, hidden=16384, rows=2048, param_spec="like_moments"),
    dump=False,
)


# ---- 29. more broken/fixed pairs (batch tpu18): other models, other names ---------------------
#
# Programs of kinds sections 13-28 do not have (a shard_map'd MLP whose in_specs replicate weights that
# are sharded at rest, a face-recognition model whose margin-softmax class centres are replicated, a
# tensor-parallel server whose mesh was built (4, 1) so its 'model' axis has size 1, online hard-example
# mining with a global quantile of per-pixel losses, a chunked LM loss whose chunks are jax.vmap'ed
# instead of looped, greedy NMS over the pairwise IoU of all anchors, momentum SGD whose bf16 velocity is
# promoted to f32 by the update so its donation is unusable). The same conventions: the fixed twin
# changes exactly the first cause. The shard_map, chunked-loss and OHEM pairs keep their dumps (each
# file < 160 KB); the others keep none. Dropped (see the README): momentum SGD whose out_shardings put the
# weights on the other dimension (the compiler aliased the donated buffers anyway: equal byte sizes), an
# exact Gaussian process (the Cholesky's gradient compile was killed for host memory).


# 29.1 a shard_map'd MLP whose in_specs say P() for weights that are sharded at rest


def _smap_inspec_builder(mesh, depth, d_model, d_ff, tokens, tp_in_specs):
    """A residual MLP stack written by hand with jax.shard_map: the f32 weights live sharded at rest
    (w_up P(None, None, 'd') columns, w_down P(None, 'd', None) rows), the tokens sharded over 'd'.
    tp_in_specs=False: in_specs=(P(), P('d')), i.e. "the weights are replicated inside the kernel", so
    jax reshards (all-gathers) the whole stack onto every device and the weight cotangent is the full
    stack too. tp_in_specs=True: in_specs follow the at-rest shardings and the block does a Megatron
    psum of its partial outputs (the tokens all-gathered per block instead)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mlp_local(ws, xs):
        def blk(h, w):
            u = jax.nn.gelu(h @ w["w_up"].astype(bf))
            return (h + u @ w["w_down"].astype(bf)).astype(bf), None

        h, _ = jax.lax.scan(jax.checkpoint(blk), xs, ws)
        return h

    def mlp_tp(ws, xs):
        xs = jax.lax.all_gather(xs, "d", tiled=True)

        def blk(h, w):
            u = jax.nn.gelu(h @ w["w_up"].astype(bf))
            return (h + jax.lax.psum(u @ w["w_down"].astype(bf), "d")).astype(bf), None

        h, _ = jax.lax.scan(jax.checkpoint(blk), xs, ws)
        n = jax.lax.axis_index("d")
        rows = xs.shape[0] // mesh.devices.size
        return jax.lax.dynamic_slice_in_dim(h, n * rows, rows)

    wspec = {"w_up": P(None, None, "d"), "w_down": P(None, "d", None)}
    if tp_in_specs:
        fwd = jax.shard_map(mlp_tp, mesh=mesh, in_specs=(wspec, P("d")), out_specs=P("d"), check_vma=False)
    else:
        fwd = jax.shard_map(mlp_local, mesh=mesh, in_specs=({"w_up": P(), "w_down": P()}, P("d")),
                            out_specs=P("d"), check_vma=False)

    def smap_train_step(ws, xs, ys):
        def l2(ws):
            return jnp.mean((fwd(ws, xs).astype(f32) - ys.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(l2)(ws)
        return _tm(lambda p, g: p - 1e-3 * g, ws, g), loss

    ws = {"w_up": sds((depth, d_model, d_ff), f32, mesh, wspec["w_up"]),
          "w_down": sds((depth, d_ff, d_model), f32, mesh, wspec["w_down"])}
    n = mesh.devices.size * tokens
    xs = sds((n, d_model), bf, mesh, P("d"))
    ys = sds((n, d_model), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(ws), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return smap_train_step, (ws, xs, ys), kw


pair(
    "smap_inspec_replicated", "v5e", "v5e:2x2",
    "Residual MLP stack (8 blocks, d=8192, ffn=32768, f32 weights, 16 GiB) trained through a hand-written "
    "jax.shard_map whose in_specs give the weights P() while they are sharded at rest (4 GiB per device): "
    "every device receives the whole all-gathered stack and its full cotangent, beyond 15.75G.",
    "Fixed variant of smap_inspec_replicated_v5e: in_specs follow the at-rest shardings (columns / rows over "
    "'d') and each block psums its partial outputs; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["replicated_tensor"]),
    _smap_inspec_builder, dict(depth=8, d_model=8192, d_ff=32768, tokens=2048, tp_in_specs=False),
    dict(depth=8, d_model=8192, d_ff=32768, tokens=2048, tp_in_specs=True),
    dump=True,
)


# 29.2 face recognition: the margin-softmax class centres replicated


def _margin_head_builder(mesh, identities, emb, feat, faces, centre_spec):
    """Face recognition with an additive angular margin softmax (ArcFace-style) over `identities`
    classes: a small bf16 embedding MLP on precomputed backbone features (data parallel), the f32 class
    centres [emb, identities] placed with `centre_spec` (P() = replicated on every core; P(None, 'd')
    = partial-FC, classes split over the cores). SGD, centres and embedder donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def face_id_step(model, feats, ident):
        def margin_ce(model):
            e = jax.nn.relu(feats @ model["embed_a"]) @ model["embed_b"]
            e = e.astype(f32)
            e = e / jnp.linalg.norm(e, axis=-1, keepdims=True)
            c = model["centres"]
            c = c / jnp.linalg.norm(c, axis=0, keepdims=True)
            cos = e.astype(bf) @ c.astype(bf)
            cos = cos.astype(f32)
            tgt = jnp.take_along_axis(cos, ident[:, None], axis=1)[:, 0]
            theta = jnp.arccos(jnp.clip(tgt, -1 + 1e-6, 1 - 1e-6))
            lse = jax.nn.logsumexp(64.0 * cos, axis=-1)
            return jnp.mean(lse - 64.0 * jnp.cos(theta + 0.5))

        loss, g = jax.value_and_grad(margin_ce)(model)
        return _tm(lambda p, g: (p - 0.1 * g).astype(p.dtype), model, g), loss

    model = {"embed_a": sds((feat, feat), bf, mesh, P()), "embed_b": sds((feat, emb), bf, mesh, P()),
             "centres": sds((emb, identities), f32, mesh, P(*centre_spec))}
    n = mesh.devices.size * faces
    feats = sds((n, feat), bf, mesh, P("d"))
    ident = sds((n,), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(model), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return face_id_step, (model, feats, ident), kw


pair(
    "margin_centres_replicated", "v4", "v4:2x2x1",
    "Face recognition with an additive angular margin softmax over 6.3M identities: the f32 class centres "
    "[512, 6291456] (12 GiB) are placed with PartitionSpec() on every TensorCore while the faces are data "
    "parallel (128 per core); the centres plus the logits of every core's faces against all identities and "
    "their bf16 copies exceed 15.25G.",
    "Fixed variant of margin_centres_replicated_v4: the class centres split over the cores, "
    "P(None, 'd') (partial FC); fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor"]),
    _margin_head_builder, dict(identities=6291456, emb=512, feat=1024, faces=128, centre_spec=()),
    dict(identities=6291456, emb=512, feat=1024, faces=128, centre_spec=(None, "d")),
    dump=False,
)


# 29.3 a chunked LM loss whose chunks are jax.vmap'ed (all at once) instead of looped


def _vmapped_chunks_builder(mesh, tokens, d_model, vocab, chunk, loop):
    """The LM-head cross-entropy 'chunked' to avoid the [tokens, vocab] logits: the final hidden states
    are reshaped into [n_chunks, chunk, d] and a jax.checkpoint'ed per-chunk loss is applied with
    jax.vmap (loop=False: every chunk at once, so the f32 logits of all chunks exist together, forward
    and in the rematerialised backward) or jax.lax.map (loop=True: one chunk at a time)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    @jax.checkpoint
    def piece_nll(hc, yc, unembed):
        z = (hc @ unembed).astype(f32)
        return jnp.sum(jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, yc[:, None], -1)[:, 0])

    def head_loss_step(unembed, hidden, nxt):
        def total(unembed, hidden):
            hc = hidden.reshape(-1, chunk, d_model)
            yc = nxt.reshape(-1, chunk)
            if loop:
                per = jax.lax.map(lambda a: piece_nll(a[0], a[1], unembed), (hc, yc))
            else:
                per = jax.vmap(piece_nll, in_axes=(0, 0, None))(hc, yc, unembed)
            return jnp.sum(per) / nxt.size

        loss, (gu, gh) = jax.value_and_grad(total, argnums=(0, 1))(unembed, hidden)
        return (unembed - 1e-4 * gu).astype(bf), gh, loss

    n = mesh.devices.size * tokens
    unembed = sds((d_model, vocab), bf, mesh, P())
    hidden = sds((n, d_model), bf, mesh, P("d"))
    nxt = sds((n,), jnp.int32, mesh, P("d"))
    return head_loss_step, (unembed, hidden, nxt), {"donate_argnums": (0,)}


pair(
    "loss_chunks_vmapped", "v5p", "v5p:2x2x1",
    "LM-head cross-entropy (vocabulary 131072, d=4096, 163840 tokens per device) written in 2048-token "
    "chunks with a jax.checkpoint'ed per-chunk loss, but the chunks are applied with jax.vmap: the f32 "
    "logits of all 80 chunks ([80, 2048, 131072], 80 GiB) exist at once, beyond 95.74G.",
    "Fixed variant of loss_chunks_vmapped_v5p: the chunks applied one at a time with jax.lax.map "
    "(the same checkpointed per-chunk loss); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision", "batch_too_large"]),
    _vmapped_chunks_builder, dict(tokens=163840, d_model=4096, vocab=131072, chunk=2048, loop=False),
    dict(tokens=163840, d_model=4096, vocab=131072, chunk=2048, loop=True),
    dump=True,
)


# 29.4 greedy NMS over the pairwise IoU of every anchor


def _nms_builder(mesh, images, anchors, keep, pre_nms):
    """Detection post-processing: greedy non-maximum suppression (100 boxes per image, a fori_loop that
    takes the best remaining box and suppresses its overlaps) on the pairwise IoU matrix, vmapped over
    the images of each device. pre_nms=None: the IoU of all `anchors` x `anchors` boxes; pre_nms=K: the
    K best-scoring boxes are selected with lax.top_k first."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def pair_iou(b):
        x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        area = (x1 - x0) * (y1 - y0)
        iw = jnp.clip(jnp.minimum(x1[:, None], x1[None]) - jnp.maximum(x0[:, None], x0[None]), 0)
        ih = jnp.clip(jnp.minimum(y1[:, None], y1[None]) - jnp.maximum(y0[:, None], y0[None]), 0)
        inter = iw * ih
        return inter / (area[:, None] + area[None] - inter + 1e-9)

    def greedy(b, s):
        if pre_nms:
            s, idx = jax.lax.top_k(s, pre_nms)
            b = b[idx]
        ov = pair_iou(b)

        def pick(i, st):
            sc, kept = st
            j = jnp.argmax(sc)
            kept = kept.at[i].set(j)
            sc = jnp.where(ov[j] > 0.5, -jnp.inf, sc).at[j].set(-jnp.inf)
            return sc, kept

        _, kept = jax.lax.fori_loop(0, keep, pick, (s, jnp.zeros((keep,), jnp.int32)))
        return b[kept]

    def postprocess(boxes, scores):
        return jax.vmap(greedy)(boxes, scores)

    n = mesh.devices.size * images
    boxes = sds((n, anchors, 4), f32, mesh, P("d"))
    scores = sds((n, anchors), f32, mesh, P("d"))
    return postprocess, (boxes, scores), {}


pair(
    "nms_all_anchors", "v6e", "v6e:2x2",
    "Detector post-processing: greedy NMS (100 boxes per image) over all 36864 anchors of each image, "
    "vmapped over 8 images per device: the f32 pairwise IoU [8, 36864, 36864] (40.5 GiB) is built before "
    "the loop, beyond 31.25G.",
    "Fixed variant of nms_all_anchors_v6e: the 4096 best-scoring boxes per image kept with lax.top_k before "
    "the IoU (pre-NMS top-k); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _nms_builder, dict(images=8, anchors=36864, keep=100, pre_nms=None),
    dict(images=8, anchors=36864, keep=100, pre_nms=4096),
    dump=False,
)


# 29.5 online hard-example mining with a global quantile of the per-pixel losses


def _ohem_builder(mesh, images, classes, height, width, local):
    """Semantic segmentation loss with online hard-example mining: the per-pixel cross-entropy of the
    logits [B, C, H, W] (batch sharded over 'd') is thresholded at its 70% quantile and only the pixels
    above it are averaged. local=False: jnp.quantile on the global (sharded) loss map, so the partitioner
    gathers every device's losses to sort them; local=True: the quantile of each device's own pixels
    in a shard_map (per-shard OHEM), then the mean over devices."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def pixel_ce(lg, lab):
        z = lg.astype(f32)
        return jax.nn.logsumexp(z, 1) - jnp.take_along_axis(z, lab[:, None], 1)[:, 0]

    def hard_mean(ce):
        thr = jax.lax.stop_gradient(jnp.quantile(ce, 0.7))
        hard = ce >= thr
        return jnp.sum(jnp.where(hard, ce, 0.0)) / jnp.maximum(jnp.sum(hard), 1)

    def ohem_grad(seg_logits, seg_labels):
        def loss(seg_logits):
            if local:
                per = jax.shard_map(lambda a, b: jax.lax.pmean(hard_mean(pixel_ce(a, b)), "d"), mesh=mesh,
                                    in_specs=(P("d"), P("d")), out_specs=P(), check_vma=False)
                return per(seg_logits, seg_labels)
            return hard_mean(pixel_ce(seg_logits, seg_labels))

        l, g = jax.value_and_grad(loss)(seg_logits)
        return g, l

    n = mesh.devices.size * images
    seg_logits = sds((n, classes, height, width), bf, mesh, P("d"))
    seg_labels = sds((n, height, width), jnp.int32, mesh, P("d"))
    return ohem_grad, (seg_logits, seg_labels), {}


pair(
    "ohem_global_quantile", "v5e", "v5e:4x4",
    "Segmentation loss with online hard-example mining (70% quantile of the per-pixel cross-entropy, "
    "8 classes, 512x512, 480 images per device on 16 chips): jnp.quantile on the batch-sharded loss map "
    "gathers all 2.01G pixel losses (7.5 GiB f32) onto every device to sort them, beyond 15.75G.",
    "Fixed variant of ohem_global_quantile_v5e: the quantile taken on each device's own pixels in a "
    "shard_map (per-shard OHEM) and the losses averaged with pmean; fits.",
    dict(category="aggregate", category_also=["single_large_allocation"], causes=["replicated_tensor", "large_activation"]),
    _ohem_builder, dict(images=480, classes=8, height=512, width=512, local=False),
    dict(images=480, classes=8, height=512, width=512, local=True),
    dump=True,
)


# 29.6 momentum SGD with a bf16 velocity that the update silently promotes to f32: donation unusable


def _velocity_upcast_builder(mesh, depth, d_model, d_ff, rows, keep_dtype):
    """An MLP stack trained with SGD + momentum: f32 weights, the velocity kept in bf16 to save memory,
    both sharded P(None, 'd', None) and donated. keep_dtype=False: `0.9 * v + g` with the f32 gradient
    promotes the new velocity to f32, so it cannot reuse its donated bf16 buffer (the limit line shows
    aliased_output below the arguments) and the old bf16 and the new f32 velocity coexist; keep_dtype=True: the
    new velocity cast back to v.dtype, aliased to its input."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def momentum_step(kernels, velocity, inp, tgt):
        def mse(kernels):
            def blk(h, k):
                return (h + jax.nn.relu(h @ k["k_in"].astype(bf)) @ k["k_out"].astype(bf)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(blk), inp, kernels)
            return jnp.mean((h.astype(f32) - tgt.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(mse)(kernels)
        if keep_dtype:
            velocity = _tm(lambda v, g: (0.9 * v + g).astype(v.dtype), velocity, g)
        else:
            velocity = _tm(lambda v, g: 0.9 * v + g, velocity, g)
        kernels = _tm(lambda k, v: k - 1e-3 * v, kernels, velocity)
        return kernels, velocity, loss

    rs = P(None, "d", None)
    mk = lambda dt: {"k_in": sds((depth, d_model, d_ff), dt, mesh, rs),
                     "k_out": sds((depth, d_ff, d_model), dt, mesh, rs)}
    kernels, velocity = mk(f32), mk(bf)
    n = mesh.devices.size * rows
    inp = sds((n, d_model), bf, mesh, P("d"))
    tgt = sds((n, d_model), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(kernels), _shardings(velocity), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return momentum_step, (kernels, velocity, inp, tgt), kw


pair(
    "velocity_upcast_undonated", "v5p", "v5p:2x2x1",
    "MLP stack (56 blocks, d=8192, ffn=32768, 30B parameters) trained with SGD + momentum: f32 weights "
    "(28 GiB per device) and a bf16 velocity (14 GiB), donated, but `0.9 * v + g` with the f32 gradient "
    "returns an f32 velocity that cannot reuse the donated bf16 buffer; old and new velocity coexist with "
    "the gradient, beyond 95.74G.",
    "Fixed variant of velocity_upcast_undonated_v5p: the new velocity cast back to bf16 (v.dtype), so it "
    "aliases its donated input; fits.",
    dict(category="aggregate", causes=["no_donation"]),
    _velocity_upcast_builder, dict(depth=56, d_model=8192, d_ff=32768, rows=2048, keep_dtype=False),
    dict(depth=56, d_model=8192, d_ff=32768, rows=2048, keep_dtype=True),
    dump=False,
)


# 29.7 a tensor-parallel server whose mesh was built (4, 1): the 'model' axis has size 1


def _tp_mesh_builder(mesh, layers, d_model, d_ff, batch, seq, grid):
    """Prefill of a tensor-parallel decoder MLP stack on a 2-D mesh ('data', 'model') built from the
    slice's devices with shape `grid`: weights bf16 column/row-sharded over 'model'
    (P(None, None, 'model') / P(None, 'model', None)), the prompts over 'data'. grid=(4, 1) (the
    create_device_mesh arguments in the wrong order) leaves 'model' of size 1, so the 'sharded'
    weights are whole on every device; grid=(1, 4) splits them 4 ways."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf = jnp.bfloat16
    g = Mesh(mesh.devices.reshape(grid), ("data", "model"))

    def prefill(weights, prompt):
        def blk(h, w):
            return (h + jax.nn.gelu(h @ w["fc_up"]) @ w["fc_down"]).astype(bf), None

        h, _ = jax.lax.scan(blk, prompt, weights)
        return h[:, -1]

    weights = {"fc_up": sds((layers, d_model, d_ff), bf, g, P(None, None, "model")),
               "fc_down": sds((layers, d_ff, d_model), bf, g, P(None, "model", None))}
    prompt = sds((batch, seq, d_model), bf, g, P("data"))
    return prefill, (weights, prompt), {}


pair(
    "tp_mesh_model_axis_one", "v6e", "v6e:2x2",
    "Prefill of a tensor-parallel 25B-parameter MLP stack (48 blocks, d=8192, ffn=32768, bf16, 48 GiB) on a "
    "('data', 'model') mesh whose shape was given as (4, 1): the weights are written P(None, None, 'model') / "
    "P(None, 'model', None), but 'model' has size 1, so every device holds all of them, beyond 31.25G.",
    "Fixed variant of tp_mesh_model_axis_one_v6e: the mesh built (1, 4), the weights split 4 ways over "
    "'model'; fits.",
    dict(category="arguments", category_also=["single_large_allocation"], causes=["replicated_tensor", "arguments_exceed"]),
    _tp_mesh_builder, dict(layers=48, d_model=8192, d_ff=32768, batch=8, seq=2048, grid=(4, 1)),
    dict(layers=48, d_model=8192, d_ff=32768, batch=8, seq=2048, grid=(1, 4)),
    dump=False,
)



# ---- 30. more broken/fixed pairs (batch tpu19): other models, other names ---------------------
#
# Programs of kinds sections 13-29 do not have (a soft VQ quantizer that computes the distance of every latent
# to every codebook entry at once, a conv net trained with RMSprop whose squared-gradient averages are
# replicated while the kernels are sharded, a data-parallel momentum step that returns the gradients and
# does not donate, beam search whose cross-attention cache is kept per beam and reordered every step, a
# contrastive audio-text model whose audio tower is left replicated while the text tower is FSDP-sharded,
# an edge-list message-passing network scanned over its rounds without jax.checkpoint, a ConvNeXt stage whose
# f32 layer-scale vector promotes the bf16 residual stream to f32).
# The same conventions: the fixed twin changes exactly the first cause. The VQ and returned-gradients
# pairs keep their dumps (each file < 160 KB); the others keep none. Dropped (see the README): a hard-argmin
# VQ tokenizer (the compiler never materialised the distances), a DINO-style EMA teacher left out of
# donate_argnums (the saving was too small a share of the requirement).


# 30.1 a soft VQ (dVAE-style) quantizer: the distance of every latent vector to every codebook entry at once


def _vq_codebook_builder(mesh, images, side, code_dim, codes, chunk):
    """Training the quantizer of a soft VQ autoencoder (dVAE-style relaxed assignment): the encoder's
    latents [n, side, side, code_dim] (bf16, batch over 'd') are assigned to the `codes` f32 codebook
    entries (replicated) by a softmax over minus their squared distances, the quantized latents are
    the probability-weighted codes, and the reconstruction loss is differentiated with respect to the
    codebook and the latents. chunk=None: the distances and probabilities of all latents against all
    codes, [n*side*side, codes] f32, at once (saved for the backward pass); chunk=K: jax.lax.map over
    blocks of K latents, each block under jax.checkpoint."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def soft_vq_grads(codebook, latents):
        def recon(codebook, latents):
            z = latents.reshape(-1, code_dim).astype(f32)
            sq = jnp.sum(codebook * codebook, -1)

            def block(zc):
                dist = jnp.sum(zc * zc, -1, keepdims=True) - 2.0 * zc @ codebook.T + sq[None]
                prob = jax.nn.softmax(-dist, -1)
                return jnp.sum((prob @ codebook - zc) ** 2)

            if chunk:
                per = jax.lax.map(jax.checkpoint(block), z.reshape(-1, chunk, code_dim))
                return jnp.sum(per) / z.shape[0]
            return block(z) / z.shape[0]

        loss, (g_cb, g_lat) = jax.value_and_grad(recon, argnums=(0, 1))(codebook, latents)
        return codebook - 1e-3 * g_cb, g_lat, loss

    n = mesh.devices.size * images
    codebook = sds((codes, code_dim), f32, mesh, P())
    latents = sds((n, side, side, code_dim), jnp.bfloat16, mesh, P("d"))
    return soft_vq_grads, (codebook, latents), {}


# 30.2 a conv net trained with RMSprop: kernels sharded over output channels, the averages replicated


def _rmsprop_conv_builder(mesh, blocks, ch, images, side, avg_spec):
    """A residual 3x3 conv stack (f32 kernels [blocks, 3, 3, ch, ch] sharded over the output channels,
    bf16 compute, jax.checkpoint per block) trained with RMSprop. The running averages of the squared
    gradients are placed with `avg_spec` (P() = replicated, what an optimizer state initialised from
    jnp.zeros without a sharding gets) and donated with the kernels."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def conv_rms_step(kernels, sq_avg, imgs, target):
        def l2(kernels):
            def blk(h, k):
                y = jax.lax.conv_general_dilated(h, k.astype(bf), (1, 1), "SAME",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
                return (h + jax.nn.relu(y)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(blk), imgs, kernels)
            return jnp.mean((h.astype(f32) - target.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(l2)(kernels)
        sq_avg = 0.9 * sq_avg + 0.1 * g * g
        kernels = kernels - 1e-3 * g / (jnp.sqrt(sq_avg) + 1e-8)
        return kernels, sq_avg, loss

    kspec = P(None, None, None, None, "d")
    kernels = sds((blocks, 3, 3, ch, ch), f32, mesh, kspec)
    sq_avg = sds((blocks, 3, 3, ch, ch), f32, mesh, P(*avg_spec))
    n = mesh.devices.size * images
    imgs = sds((n, side, side, ch), bf, mesh, P("d"))
    target = sds((n, side, side, ch), bf, mesh, P("d"))
    kw = {"out_shardings": (kernels.sharding, sq_avg.sharding, NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return conv_rms_step, (kernels, sq_avg, imgs, target), kw


# 30.3 a data-parallel momentum step that returns the gradients (for a host-side hook), nothing donated


def _grads_out_builder(mesh, depth, width, hidden, rows, donate):
    """A gated MLP regressor trained data parallel (f32 weights and momentum replicated, rows over
    'd') with heavy-ball momentum; the step returns the new weights, the new momentum and the gradients
    themselves (a host-side hook logs their histograms). donate=False: no donate_argnums, so the old
    weights and momentum stay alive beside the new ones and the returned gradients."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def dp_momentum_step(theta, mom, feats, labels):
        def risk(theta):
            def layer(h, t):
                a = h @ t["gate_in"].astype(bf)
                b = h @ t["val_in"].astype(bf)
                return (h + (jax.nn.silu(a) * b) @ t["proj_out"].astype(bf)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), feats, theta)
            return jnp.mean((h.astype(f32) - labels.astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(risk)(theta)
        mom = _tm(lambda m, g: 0.9 * m + g, mom, grads)
        theta = _tm(lambda t, m: t - 1e-2 * m, theta, mom)
        return theta, mom, grads, loss

    mk = lambda: {"gate_in": sds((depth, width, hidden), f32, mesh, P()),
                  "val_in": sds((depth, width, hidden), f32, mesh, P()),
                  "proj_out": sds((depth, hidden, width), f32, mesh, P())}
    theta, mom = mk(), mk()
    n = mesh.devices.size * rows
    feats = sds((n, width), bf, mesh, P("d"))
    labels = sds((n, width), bf, mesh, P("d"))
    kw = {"donate_argnums": (0, 1)} if donate else {}
    return dp_momentum_step, (theta, mom, feats, labels), kw


# 30.4 beam search whose cross-attention cache is kept per beam and reordered every step


def _beam_cross_cache_builder(mesh, layers, d_model, src_len, seqs, beams, vocab, steps, per_beam):
    """Beam-search decoding of an encoder-decoder model (decoder reduced to its cross-attention and a
    vocabulary head): the cross-attention keys/values of every layer are computed once from the encoder
    output. per_beam=True: the encoder output is jnp.repeat'ed for every beam first, and the cache
    [layers, seqs*beams, src_len, d] is reordered by the parent beams every step like the self-attention
    cache; per_beam=False: the cache [layers, seqs, src_len, d] is kept once per source sequence (it is
    the same for all beams) and the beams attend to it with an einsum."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def beam_decode(dec, enc_out, bos):
        n = enc_out.shape[0]
        mem = jnp.repeat(enc_out, beams, axis=0) if per_beam else enc_out
        ck = jnp.einsum("nsd,lde->lnse", mem, dec["xk"])
        cv = jnp.einsum("nsd,lde->lnse", mem, dec["xv"])

        def attend(q, k, v):
            if per_beam:
                qb = q.reshape(n * beams, 1, d_model)
                s = jnp.einsum("bqd,bsd->bqs", qb, k).astype(f32) / d_model ** 0.5
                o = jnp.einsum("bqs,bsd->bqd", jax.nn.softmax(s, -1).astype(bf), v)
                return o.reshape(n, beams, d_model)
            s = jnp.einsum("nbd,nsd->nbs", q, k).astype(f32) / d_model ** 0.5
            return jnp.einsum("nbs,nsd->nbd", jax.nn.softmax(s, -1).astype(bf), v)

        def step(i, st):
            h, score, ck, cv = st
            x = h
            for l in range(layers):
                q = x @ dec["xq"][l]
                x = (x + attend(q, ck[l], cv[l]) @ dec["xo"][l]).astype(bf)
            logp = jax.nn.log_softmax((x @ dec["head"]).astype(f32), -1)
            cand = (score[:, :, None] + logp).reshape(n, beams * vocab)
            score, flat = jax.lax.top_k(cand, beams)
            parent, tok = flat // vocab, flat % vocab
            h = jnp.take_along_axis(x, parent[:, :, None], 1) + dec["embed"][tok]
            if per_beam:
                rows = (jnp.arange(n)[:, None] * beams + parent).reshape(-1)
                ck, cv = ck[:, rows], cv[:, rows]
            return h.astype(bf), score, ck, cv

        h0 = jnp.broadcast_to(dec["embed"][bos][:, None], (n, beams, d_model)).astype(bf)
        s0 = jnp.zeros((n, beams), f32).at[:, 1:].set(-1e9)
        _, score, _, _ = jax.lax.fori_loop(0, steps, step, (h0, s0, ck, cv))
        return score

    mat = lambda: sds((layers, d_model, d_model), bf, mesh, P())
    dec = {"xq": mat(), "xk": mat(), "xv": mat(), "xo": mat(),
           "head": sds((d_model, vocab), bf, mesh, P()), "embed": sds((vocab, d_model), bf, mesh, P())}
    n = mesh.devices.size * seqs
    enc_out = sds((n, src_len, d_model), bf, mesh, P("d"))
    bos = sds((n,), jnp.int32, mesh, P("d"))
    return beam_decode, (dec, enc_out, bos), {}


# 30.5 a contrastive audio-text model: the text tower FSDP-sharded, the audio tower left replicated


def _audio_text_builder(mesh, depth, width, ff, clips, frames, tokens, audio_spec):
    """CLAP-style contrastive pre-training: an audio tower over spectrogram-patch embeddings and a text
    tower over token embeddings (both residual MLP stacks, f32 weights with f32 momentum, bf16 compute,
    jax.checkpoint per block), mean-pooled, InfoNCE over the global batch. The text tower's weights and
    momentum are FSDP-sharded P(None, 'd', None); the audio tower's are placed with `audio_spec`
    (P() = replicated on every device, as left by a port that only annotated the text tower). SGD with
    momentum, everything donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def tower(blocks, x):
        def blk(h, b):
            return (h + jax.nn.gelu(h @ b["fc_a"].astype(bf)) @ b["fc_b"].astype(bf)).astype(bf), None

        h, _ = jax.lax.scan(jax.checkpoint(blk), x, blocks)
        e = jnp.mean(h.astype(f32), 1)
        return e / jnp.linalg.norm(e, axis=-1, keepdims=True)

    def clap_step(towers, velocity, spec_patches, tok_embeds):
        def info_nce(towers):
            a = tower(towers["audio"], spec_patches)
            t = tower(towers["text"], tok_embeds)
            sim = a @ t.T / 0.07
            idx = jnp.arange(sim.shape[0])
            return 0.5 * (jnp.mean(jax.nn.logsumexp(sim, 1) - sim[idx, idx])
                          + jnp.mean(jax.nn.logsumexp(sim, 0) - sim[idx, idx]))

        loss, g = jax.value_and_grad(info_nce)(towers)
        velocity = _tm(lambda v, g: 0.9 * v + g, velocity, g)
        towers = _tm(lambda p, v: p - 1e-3 * v, towers, velocity)
        return towers, velocity, loss

    fsdp = P(None, "d", None)
    aud = P(*audio_spec)
    mk = lambda: {"audio": {"fc_a": sds((depth, width, ff), f32, mesh, aud),
                            "fc_b": sds((depth, ff, width), f32, mesh, aud)},
                  "text": {"fc_a": sds((depth, width, ff), f32, mesh, fsdp),
                           "fc_b": sds((depth, ff, width), f32, mesh, fsdp)}}
    towers, velocity = mk(), mk()
    n = mesh.devices.size * clips
    spec_patches = sds((n, frames, width), bf, mesh, P("d"))
    tok_embeds = sds((n, tokens, width), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(towers), _shardings(velocity), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return clap_step, (towers, velocity, spec_patches, tok_embeds), kw


# 30.6 an edge-list message-passing network scanned over its rounds without jax.checkpoint


def _mpnn_builder(mesh, rounds, feat, graphs, nodes, edges, remat):
    """A message-passing network (MPNN) on edge lists: node states [graphs, nodes, feat] (bf16, graphs over
    'd'), int32 senders / receivers [graphs, edges]; each round gathers the sender and receiver states of
    every edge, runs an edge MLP on their concatenation and segment-sums the messages into the receivers,
    then a node update. The rounds are a lax.scan over stacked f32 weights; remat=False: no
    jax.checkpoint, so every round's per-edge gathers and hidden messages [graphs, edges, ...] are stacked
    for the backward pass; remat=True: jax.checkpoint around the round."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def one_graph(h, snd, rcv, w):
        m_in = jnp.concatenate([h[snd], h[rcv]], -1)
        msg = jax.nn.gelu(m_in @ w["edge_mlp"].astype(bf))
        agg = jax.ops.segment_sum(msg, rcv, num_segments=nodes)
        return (h + jax.nn.gelu(agg @ w["node_mlp"].astype(bf))).astype(bf)

    def mpnn_grads(weights, states, senders, receivers, energy):
        def loss(weights):
            def rnd(h, w):
                return jax.vmap(one_graph, in_axes=(0, 0, 0, None))(h, senders, receivers, w), None

            h, _ = jax.lax.scan(jax.checkpoint(rnd) if remat else rnd, states, weights)
            pred = jnp.sum(h.astype(f32), (1, 2))
            return jnp.mean((pred - energy) ** 2)

        l, g = jax.value_and_grad(loss)(weights)
        return _tm(lambda w, g: w - 1e-4 * g, weights, g), l

    weights = {"edge_mlp": sds((rounds, 2 * feat, feat), f32, mesh, P()),
               "node_mlp": sds((rounds, feat, feat), f32, mesh, P())}
    n = mesh.devices.size * graphs
    states = sds((n, nodes, feat), bf, mesh, P("d"))
    senders = sds((n, edges), jnp.int32, mesh, P("d"))
    receivers = sds((n, edges), jnp.int32, mesh, P("d"))
    energy = sds((n,), f32, mesh, P("d"))
    return mpnn_grads, (weights, states, senders, receivers, energy), {"donate_argnums": (0,)}


# 30.7 a ConvNeXt stage whose f32 layer-scale vector silently promotes the bf16 residual stream to f32


def _layerscale_builder(mesh, blocks, ch, images, side, classes, cast_gamma):
    """A ConvNeXt-style stage (7x7 depthwise conv, LayerNorm, pointwise MLP 4x, layer scale) trained data
    parallel, blocks written as a Python loop (no jax.checkpoint), f32 master weights replicated. The
    kernels are cast to the activations' dtype (`w.astype(h.dtype)`), the input is bf16.
    cast_gamma=False: the layer-scale vector is used as stored (f32), so `h + gamma * y` promotes the
    residual stream to f32 after the first block and every later block (kernels cast to h.dtype) runs
    and saves its activations in f32; cast_gamma=True: gamma.astype(h.dtype), the stage stays bf16."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def ln(x):
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-6)

    def convnext_step(stage, pix_feats, cls):
        def xent(stage):
            h = pix_feats
            for i in range(blocks):
                dw = stage["dw_kernel"][i].astype(h.dtype)
                y = jax.lax.conv_general_dilated(h, dw, (1, 1), "SAME", feature_group_count=ch,
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
                y = ln(y)
                y = jax.nn.gelu(y @ stage["pw_up"][i].astype(h.dtype)) @ stage["pw_down"][i].astype(h.dtype)
                gamma = stage["ls_gamma"][i]
                if cast_gamma:
                    gamma = gamma.astype(h.dtype)
                h = h + gamma * y
            logits = jnp.mean(h, (1, 2)).astype(f32) @ stage["head"]
            return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, cls[:, None], -1)[:, 0])

        loss, g = jax.value_and_grad(xent)(stage)
        return _tm(lambda p, g: p - 1e-3 * g, stage, g), loss

    stage = {"dw_kernel": sds((blocks, 7, 7, 1, ch), f32, mesh, P()),
             "pw_up": sds((blocks, ch, 4 * ch), f32, mesh, P()),
             "pw_down": sds((blocks, 4 * ch, ch), f32, mesh, P()),
             "ls_gamma": sds((blocks, ch), f32, mesh, P()),
             "head": sds((ch, classes), f32, mesh, P())}
    n = mesh.devices.size * images
    pix_feats = sds((n, side, side, ch), bf, mesh, P("d"))
    cls = sds((n,), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(stage), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return convnext_step, (stage, pix_feats, cls), kw


pair(
    "vq_codebook_all_distances", "v5e", "v5e:2x2",
    "Soft VQ (dVAE-style) quantizer training, 32768-entry f32 codebook of 32-dim codes, 96 images of 32x32 "
    "latents per device: the squared distances and softmax assignments of all 98304 latents to all codes, "
    "f32[98304, 32768] (12 GiB each), exist at once and are saved for the backward pass, beyond 15.75G.",
    "Fixed variant of vq_codebook_all_distances_v5e: the same loss over blocks of 4096 latents "
    "(jax.lax.map, each block under jax.checkpoint); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _vq_codebook_builder, dict(images=96, side=32, code_dim=32, codes=32768, chunk=None),
    dict(images=96, side=32, code_dim=32, codes=32768, chunk=4096),
    dump=True,
)

pair(
    "rmsprop_sq_avg_replicated", "v4", "v4:2x2x1",
    "Residual 3x3 conv stack (64 blocks, 2048 channels, f32 kernels 9 GiB, sharded over the output "
    "channels) trained with RMSprop whose squared-gradient averages are replicated P() on every "
    "TensorCore: the 9 GiB averages, their update and the gathered squared gradients exceed 15.25G.",
    "Fixed variant of rmsprop_sq_avg_replicated_v4: the squared-gradient averages sharded like the "
    "kernels, P(None, None, None, None, 'd'); fits.",
    dict(category="single_large_allocation", causes=["optimizer_state_unsharded", "replicated_tensor"]),
    _rmsprop_conv_builder, dict(blocks=64, ch=2048, images=8, side=32, avg_spec=()),
    dict(blocks=64, ch=2048, images=8, side=32, avg_spec=(None, None, None, None, "d")),
    dump=False,
)

pair(
    "grads_returned_undonated", "v5e", "v5e:2x2",
    "Data-parallel gated MLP (10 layers, d=4096, hidden 8192, f32 weights and momentum replicated, 3.75 GiB "
    "each) whose step returns the new weights, the new momentum and the gradients for a host-side hook, "
    "with no donate_argnums: old and new weights and momentum coexist with the returned gradients, "
    "beyond 15.75G.",
    "Fixed variant of grads_returned_undonated_v5e: donate_argnums=(0, 1), the new weights and momentum "
    "reuse the old buffers (the gradients are still returned); fits.",
    dict(category="aggregate", causes=["no_donation"]),
    _grads_out_builder, dict(depth=10, width=4096, hidden=8192, rows=1024, donate=False),
    dict(depth=10, width=4096, hidden=8192, rows=1024, donate=True),
    dump=True,
)

pair(
    "beam_cross_cache_per_beam", "v5p", "v5p:2x2x1",
    "Beam search (8 beams, 12 source sequences of 4096 tokens per device) in an encoder-decoder with 24 "
    "cross-attention layers (d=2048, bf16): the encoder output is repeated per beam, so the cross-attention "
    "keys/values [24, 96, 4096, 2048] (2 x 36 GiB) are per beam and reordered every step, beyond 95.74G.",
    "Fixed variant of beam_cross_cache_per_beam_v5p: the cross-attention cache kept once per source "
    "sequence, [24, 12, 4096, 2048], and attended by all beams with an einsum (not reordered); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _beam_cross_cache_builder, dict(layers=24, d_model=2048, src_len=4096, seqs=12, beams=8, vocab=8192,
                                    steps=16, per_beam=True),
    dict(layers=24, d_model=2048, src_len=4096, seqs=12, beams=8, vocab=8192, steps=16, per_beam=False),
    dump=False,
)



pair(
    "audio_tower_replicated", "v6e", "v6e:2x2",
    "CLAP-style audio-text contrastive training (two residual MLP towers of 40 blocks, d=4096, ffn=8192, f32 "
    "weights and momentum, 10 GiB each per tower): the text tower is FSDP-sharded P(None, 'd', None), the "
    "audio tower's weights and momentum are replicated P() on every device; with its full gradient and bf16 "
    "copies they exceed 31.25G.",
    "Fixed variant of audio_tower_replicated_v6e: the audio tower's weights and momentum sharded like the "
    "text tower's, P(None, 'd', None); fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _audio_text_builder, dict(depth=40, width=4096, ff=8192, clips=16, frames=512, tokens=128, audio_spec=()),
    dict(depth=40, width=4096, ff=8192, clips=16, frames=512, tokens=128, audio_spec=(None, "d", None)),
    dump=False,
)


pair(
    "mpnn_rounds_no_remat", "v6e", "v6e:2x2",
    "Edge-list message-passing network (16 rounds, 256 features, bf16 states) on 4 graphs of 65536 nodes and "
    "262144 edges per device, the rounds a lax.scan without jax.checkpoint: every round's gathered sender / "
    "receiver states and edge messages are stacked for the backward pass, beyond 31.25G.",
    "Fixed variant of mpnn_rounds_no_remat_v6e: jax.checkpoint around each round; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["no_remat", "large_activation"]),
    _mpnn_builder, dict(rounds=16, feat=256, graphs=4, nodes=65536, edges=262144, remat=False),
    dict(rounds=16, feat=256, graphs=4, nodes=65536, edges=262144, remat=True),
    dump=False,
)


pair(
    "layerscale_f32_promotion", "v4", "v4:2x2x1",
    "ConvNeXt-style stage (12 blocks, 256 channels at 56x56, 72 images per TensorCore, no remat) whose f32 "
    "layer-scale vector multiplies the bf16 block output: `h + gamma * y` promotes the residual stream to "
    "f32 and every later block (kernels cast to h.dtype) runs and saves its activations in f32, beyond 15.25G.",
    "Fixed variant of layerscale_f32_promotion_v4: gamma.astype(h.dtype), the stage stays bf16; fits.",
    dict(category="aggregate", causes=["f32_precision", "large_activation", "no_remat"]),
    _layerscale_builder, dict(blocks=12, ch=256, images=72, side=56, classes=1000, cast_gamma=False),
    dict(blocks=12, ch=256, images=72, side=56, classes=1000, cast_gamma=True),
    dump=False,
)


# ---- 31. more broken/fixed pairs (batch tpu20): other models, other names ---------------------
#
# Programs of kinds sections 13-30 do not have (a speech encoder whose blocks are sharded but whose large
# frame-level output projection over a wordpiece vocabulary and its Adam moments are replicated, mixed
# precision whose bf16 working weights are FSDP-sharded but whose f32 master copy is replicated, an
# optax.MultiSteps-style gradient accumulator carried between calls replicated beside sharded weights, a
# Monte-Carlo dropout evaluation that vmaps all stochastic passes at once, a dense retrieval step that keeps
# the corpus embeddings in f32, a reward model that computes f32 vocabulary logits at every position).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu20 for which pairs keep their dumps and what did not go as first written.


# 31.1 a speech encoder whose blocks are sharded but whose vocabulary projection is replicated


def _asr_vocab_proj_builder(mesh, blocks, d_model, ff, vocab, utts, frames, proj_spec):
    """A frame-level speech recogniser (conformer-style feed-forward blocks, f32 weights
    [blocks, d_model, ff] / [blocks, ff, d_model] sharded over the last axis, bf16 compute, jax.checkpoint
    per block via lax.scan) trained with cross-entropy against forced-alignment wordpiece targets and Adam
    (written out). The output projection `tok_proj` f32[d_model, vocab] and its Adam moments are placed
    with `proj_spec`: () = replicated on every TensorCore; (None, 'd') = split over the vocabulary like the
    blocks are split. Weights and optimizer state donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def asr_adam_step(acoustic, adam, feats, align):
        def frame_xent(acoustic):
            def block(h, w):
                y = jax.nn.silu(h @ w[0].astype(bf)) @ w[1].astype(bf)
                return (h + y).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), feats, (acoustic["ff_in"], acoustic["ff_out"]))
            logits = (h @ acoustic["tok_proj"].astype(bf)).astype(f32)
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, align[..., None], -1))

        loss, g = jax.value_and_grad(frame_xent)(acoustic)
        acoustic, adam = adam_update(acoustic, g, adam)
        return acoustic, adam, loss

    specs = {"ff_in": P(None, None, "d"), "ff_out": P(None, None, "d"), "tok_proj": P(*proj_spec)}
    shapes = {"ff_in": (blocks, d_model, ff), "ff_out": (blocks, ff, d_model), "tok_proj": (d_model, vocab)}
    acoustic = {k: sds(shapes[k], f32, mesh, specs[k]) for k in shapes}
    adam = {"count": sds((), jnp.int32, mesh, P()),
            "mu": {k: sds(shapes[k], f32, mesh, specs[k]) for k in shapes},
            "nu": {k: sds(shapes[k], f32, mesh, specs[k]) for k in shapes}}
    n = mesh.devices.size * utts
    feats = sds((n, frames, d_model), bf, mesh, P("d"))
    align = sds((n, frames), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(acoustic), _shardings(adam), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return asr_adam_step, (acoustic, adam, feats, align), kw


# 31.2 mixed precision: bf16 working weights FSDP-sharded, the f32 master copy replicated


def _master_copy_builder(mesh, layers, width, tokens, master_spec):
    """A residual MLP language-model trunk in mixed precision: the bf16 working weights
    [layers, width, width] are FSDP-sharded P(None, 'd', None) and used for the forward/backward pass
    (lax.scan, jax.checkpoint per layer); the optimizer keeps an f32 master copy (`master_spec`: () =
    replicated, what `jax.device_put(params32)` without a sharding gives; (None, 'd', None) = like the
    working weights) and an f32 momentum sharded like the working weights. The step updates the master
    copy and re-derives the bf16 working weights from it. All three donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mp_momentum_step(work_bf16, master, velocity, toks, target):
        def mse(work_bf16):
            def layer(h, w):
                return (h + jax.nn.gelu(h @ w)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), toks, work_bf16)
            return jnp.mean((h.astype(f32) - target.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(mse)(work_bf16)
        velocity = 0.9 * velocity + g.astype(f32)
        master = master - 1e-3 * velocity
        return master.astype(bf), master, velocity, loss

    wspec = P(None, "d", None)
    work_bf16 = sds((layers, width, width), bf, mesh, wspec)
    master = sds((layers, width, width), f32, mesh, P(*master_spec))
    velocity = sds((layers, width, width), f32, mesh, wspec)
    n = mesh.devices.size * tokens
    toks = sds((n, width), bf, mesh, P("d"))
    target = sds((n, width), bf, mesh, P("d"))
    kw = {"out_shardings": (work_bf16.sharding, master.sharding, velocity.sharding, NamedSharding(mesh, P())),
          "donate_argnums": (0, 1, 2)}
    return mp_momentum_step, (work_bf16, master, velocity, toks, target), kw


# 31.3 a gradient accumulator (optax.MultiSteps-style state) carried between calls, replicated


def _multisteps_acc_builder(mesh, depth, d_in, d_hid, rows, acc_spec):
    """Gradient accumulation across calls, as optax.MultiSteps keeps it: `micro_step(weights, acc_grads,
    batch)` adds this micro-batch's gradient to the accumulator, which is an input and an output of the
    step (donated) and applied every k calls by another function. The gated-MLP weights (f32,
    [depth, d_in, d_hid] x2 and [depth, d_hid, d_in]) are sharded P(None, None, 'd') / P(None, 'd', None);
    the accumulator is placed with `acc_spec`: 'replicated' = P() for every leaf (built with
    jax.tree.map(jnp.zeros_like, ...) on the host and device_put without a sharding); 'like' = the
    weights' own shardings."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def micro_step(weights, acc_grads, batch):
        def mse(weights):
            def blk(h, w):
                gate, up, down = w
                y = (jax.nn.silu(h @ gate.astype(bf)) * (h @ up.astype(bf))) @ down.astype(bf)
                return (h + y).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(blk), batch["x"],
                                (weights["gate"], weights["up"], weights["down"]))
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, g = jax.value_and_grad(mse)(weights)
        return _tm(lambda a, b: a + b, acc_grads, g), loss

    wspecs = {"gate": P(None, None, "d"), "up": P(None, None, "d"), "down": P(None, "d", None)}
    shapes = {"gate": (depth, d_in, d_hid), "up": (depth, d_in, d_hid), "down": (depth, d_hid, d_in)}
    weights = {k: sds(shapes[k], f32, mesh, wspecs[k]) for k in shapes}
    acc_grads = {k: sds(shapes[k], f32, mesh, P() if acc_spec == "replicated" else wspecs[k]) for k in shapes}
    n = mesh.devices.size * rows
    batch = {"x": sds((n, d_in), bf, mesh, P("d")), "y": sds((n, d_in), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(acc_grads), NamedSharding(mesh, P())), "donate_argnums": (1,)}
    return micro_step, (weights, acc_grads, batch), kw


# 31.4 Monte-Carlo dropout evaluation: all stochastic passes vmapped at once


def _mc_dropout_builder(mesh, passes, rows, feat, hidden, classes, sequential):
    """Uncertainty estimate by Monte-Carlo dropout: an f32 MLP classifier (3 hidden layers, dropout 0.2
    kept on at evaluation, weights replicated) run `passes` times with different keys on a batch sharded
    over the devices; returns the mean predictive distribution and its entropy. sequential=False:
    jax.vmap over the keys, all passes' activations and dropout masks at once; sequential=True:
    jax.lax.map over the keys, one pass at a time, the probabilities summed."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def one_pass(clf, x, key):
        h = x
        for i, w in enumerate(clf["hidden"]):
            h = jax.nn.relu(h @ w)
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.8, h.shape)
            h = jnp.where(keep, h / 0.8, 0.0)
        return jax.nn.softmax(h @ clf["out"], -1)

    def mc_predict(clf, x, seed):
        keys = jax.random.split(jax.random.key(seed), passes)
        if sequential:
            probs = jnp.mean(jax.lax.map(lambda k: one_pass(clf, x, k), keys), 0)
        else:
            probs = jnp.mean(jax.vmap(lambda k: one_pass(clf, x, k))(keys), 0)
        entropy = -jnp.sum(probs * jnp.log(probs + 1e-9), -1)
        return probs, entropy

    clf = {"hidden": [sds((feat, hidden), f32, mesh, P()), sds((hidden, hidden), f32, mesh, P()),
                      sds((hidden, hidden), f32, mesh, P())],
           "out": sds((hidden, classes), f32, mesh, P())}
    x = sds((mesh.devices.size * rows, feat), f32, mesh, P("d"))
    seed = sds((), jnp.uint32, mesh, P())
    return mc_predict, (clf, x, seed), {}


# 31.5 dense retrieval: the corpus embedding matrix kept in f32


def _dense_retrieval_builder(mesh, docs, dim, queries, k, corpus_dtype):
    """Dense passage retrieval served from device memory: the corpus embeddings [docs, dim] are
    row-sharded over the devices ('d'), a batch of bf16 query embeddings is replicated, and each device
    scores its shard (shard_map) and keeps its local top-k, which are returned for a host-side merge.
    corpus_dtype float32: the corpus is stored as the encoder wrote it, so the scores are f32 too;
    bfloat16: the corpus cast once to bf16 when it was loaded."""
    jax, jnp, NamedSharding, P = _jax()

    def local_topk(passages, q):
        scores = q @ passages.T.astype(jnp.promote_types(q.dtype, passages.dtype))
        val, idx = jax.lax.top_k(scores, k)
        return val.astype(jnp.float32), idx

    def search(passages, q):
        return jax.shard_map(local_topk, mesh=mesh, in_specs=(P("d", None), P()),
                             out_specs=(P(None, "d"), P(None, "d")), check_vma=False)(passages, q)

    passages = sds((docs, dim), jnp.dtype(corpus_dtype), mesh, P("d", None))
    q = sds((queries, dim), jnp.bfloat16, mesh, P())
    return search, (passages, q), {}


# 31.6 a reward model that computes f32 vocabulary logits at every position


def _reward_logits_builder(mesh, layers, width, vocab, seqs, seq_len, last_only):
    """A reward model initialised from a language model: its transformer-style MLP trunk (bf16 weights
    replicated, lax.scan with jax.checkpoint per layer) is followed by the LM head, and the reward is the
    log-odds of a "yes" token against a "no" token at each sequence's last real token (`pair_lens`), trained with a Bradley-Terry
    loss over (chosen, rejected) pairs. last_only=False: the LM head is applied to every position in f32
    (logits [pairs, 2, seq_len, vocab]), then the last real position is gathered; last_only=True: the
    last real position's hidden state is gathered first, then the head."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    YES, NO = 9891, 2360

    def bt_step(rm, pair_toks, pair_lens):
        last = (pair_lens - 1)[:, :, None, None]                                 # [B, 2, 1, 1]

        def bt_loss(rm):
            h = jnp.take(rm["embed"], pair_toks, axis=0)                       # [B, 2, T, D] bf16

            def layer(h, w):
                return (h + jax.nn.gelu(h @ w[0]) @ w[1]).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), h, (rm["up"], rm["down"]))
            if last_only:
                h_last = jnp.take_along_axis(h, last, axis=2)[:, :, 0]           # [B, 2, D]
                logits = (h_last @ rm["lm_head"]).astype(f32)                   # [B, 2, V]
            else:
                logits = (h @ rm["lm_head"]).astype(f32)                        # [B, 2, T, V]
                logits = jnp.take_along_axis(logits, last, axis=2)[:, :, 0]     # -> last real token
            lp = jax.nn.log_softmax(logits, -1)
            r = lp[..., YES] - lp[..., NO]                                       # [B, 2]
            return -jnp.mean(jax.nn.log_sigmoid(r[:, 0] - r[:, 1]))

        loss, g = jax.value_and_grad(bt_loss)(rm)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), rm, g), loss

    rm = {"embed": sds((vocab, width), bf, mesh, P()),
          "up": sds((layers, width, 4 * width), bf, mesh, P()),
          "down": sds((layers, 4 * width, width), bf, mesh, P()),
          "lm_head": sds((width, vocab), bf, mesh, P())}
    pair_toks = sds((mesh.devices.size * seqs, 2, seq_len), jnp.int32, mesh, P("d"))
    pair_lens = sds((mesh.devices.size * seqs, 2), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(rm), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return bt_step, (rm, pair_toks, pair_lens), kw


pair(
    "asr_vocab_proj_replicated", "v4", "v4:2x2x1",
    "Frame-level speech recogniser (4 feed-forward blocks d=4096, ff=8192, split over the 8 TensorCores) "
    "trained with Adam, whose wordpiece output projection f32[4096, 327680] (5 GiB) and its two Adam "
    "moments are replicated P() on every TensorCore: 15 GiB of arguments, their updates and the full "
    "gradient exceed 15.25G.",
    "Fixed variant of asr_vocab_proj_replicated_v4: the output projection and its moments split over the "
    "vocabulary, P(None, 'd'), like the blocks; fits.",
    dict(category="arguments", causes=["replicated_tensor", "optimizer_state_unsharded", "arguments_exceed"]),
    _asr_vocab_proj_builder, dict(blocks=4, d_model=4096, ff=8192, vocab=327680, utts=4, frames=256,
                                  proj_spec=()),
    dict(blocks=4, d_model=4096, ff=8192, vocab=327680, utts=4, frames=256, proj_spec=(None, "d")),
    dump=False,
)

pair(
    "master_f32_replicated", "v6e", "v6e:2x2",
    "Mixed-precision residual MLP trunk (64 layers of bf16[8192, 8192] working weights FSDP-sharded "
    "P(None, 'd', None)) whose f32 master copy (16 GiB) is replicated P() on every device: the master, "
    "its update and the gathered f32 momentum exceed 31.25G.",
    "Fixed variant of master_f32_replicated_v6e: the f32 master copy sharded like the working weights, "
    "P(None, 'd', None); fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _master_copy_builder, dict(layers=64, width=8192, tokens=2048, master_spec=()),
    dict(layers=64, width=8192, tokens=2048, master_spec=(None, "d", None)),
    dump=True,
)

pair(
    "multisteps_acc_replicated", "v5e", "v5e:2x2",
    "Gated-MLP regression (16 blocks, 4096 -> 16384, f32 weights 12 GiB sharded over the 4 devices) "
    "trained with gradient accumulation across calls (optax.MultiSteps-style): the accumulated gradients "
    "(12 GiB) are an input and output of the step replicated P() on every device, beyond 15.75G.",
    "Fixed variant of multisteps_acc_replicated_v5e: the accumulator placed with the weights' own "
    "shardings; fits.",
    dict(category="aggregate", category_also=["arguments"],
         causes=["optimizer_state_unsharded", "replicated_tensor", "arguments_exceed"]),
    _multisteps_acc_builder, dict(depth=16, d_in=4096, d_hid=16384, rows=2048, acc_spec="replicated"),
    dict(depth=16, d_in=4096, d_hid=16384, rows=2048, acc_spec="like"),
    dump=True,
)

pair(
    "mc_dropout_vmap_passes", "v5e", "v5e:4x4",
    "Monte-Carlo dropout evaluation of an f32 MLP classifier (hidden 16384), 8192 rows per device, 32 "
    "stochastic passes jax.vmap'ed over their keys: the activations and dropout masks of all 32 passes "
    "([32, 8192, 16384], 16 GiB in f32) exist at once, beyond 15.75G.",
    "Fixed variant of mc_dropout_vmap_passes_v5e: jax.lax.map over the keys, one pass at a time; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _mc_dropout_builder, dict(passes=32, rows=8192, feat=1024, hidden=16384, classes=1000, sequential=False),
    dict(passes=32, rows=8192, feat=1024, hidden=16384, classes=1000, sequential=True),
    dump=False,
)

pair(
    "retrieval_corpus_f32", "v6e", "v6e:2x2",
    "Dense passage retrieval over 24M f32 passage embeddings of 1024 dims (24 GiB per device, row-sharded), "
    "1024 bf16 queries scored per shard: the corpus and the f32 scores [1024, 6M] exceed 31.25G.",
    "Fixed variant of retrieval_corpus_f32_v6e: the corpus stored in bf16 (cast once when loaded), the "
    "scores bf16; fits.",
    dict(category="single_large_allocation", causes=["f32_precision", "large_activation"]),
    _dense_retrieval_builder, dict(docs=4 * 6291456, dim=1024, queries=1024, k=100, corpus_dtype="float32"),
    dict(docs=4 * 6291456, dim=1024, queries=1024, k=100, corpus_dtype="bfloat16"),
    dump=False,
)

pair(
    "reward_logits_every_position", "v5p", "v5p:2x2x1",
    "Reward model from an LM (8 layers d=2048, vocabulary 131072) trained with a Bradley-Terry loss, 12 "
    "(chosen, rejected) pairs of 8192 tokens per device: the LM head is applied at every position in f32 "
    "and the last real token's logits gathered from them, logits [12, 2, 8192, 131072] kept for the backward pass, beyond 95.74G.",
    "Fixed variant of reward_logits_every_position_v5p: the last real position's hidden state gathered "
    "before the LM head; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision"]),
    _reward_logits_builder, dict(layers=8, width=2048, vocab=131072, seqs=12, seq_len=8192, last_only=False),
    dict(layers=8, width=2048, vocab=131072, seqs=12, seq_len=8192, last_only=True),
    dump=False,
)


# ---- 32. more broken/fixed pairs (batch tpu21): other models, other names ---------------------
#
# Programs of kinds sections 13-31 do not have (an Adam step whose donate_argnames are silently
# ignored because a timing decorator hides the step's signature, an offline knowledge-distillation
# step whose precomputed teacher logits are fed replicated, a PointNet segmenting one large LiDAR scene
# whose points are replicated because the batch of one cannot be split, L2-PGD adversarial training
# that differentiates through the attack, a tensor-fusion network's three-way outer product).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu21 for which pairs keep their dumps and what did not go as first written.


# 32.1 donate_argnames silently ignored: a decorator without functools.wraps hides the signature


def _timed_donation_builder(mesh, layers, width, tokens, wraps):
    """A residual GELU MLP trunk (f32 weights [layers, width, width], FSDP-sharded P(None, 'd', None),
    bf16 compute, lax.scan with jax.checkpoint per layer) trained with Adam (written out). The training
    script wraps the step in a `timed` logging decorator and jits it with
    `donate_argnames=("params", "opt_state")`. wraps=False: the decorator is a plain `def wrapper(*args,
    **kwargs)`, so jax sees only *args/**kwargs, accepts the names (they could be keyword arguments) and,
    the step being called positionally, donates nothing; wraps=True: `functools.wraps(fn)`, so
    inspect.signature follows __wrapped__, the names map to positions 0 and 1 and both are donated."""
    import functools

    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    step_times = []

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            step_times.append(time.perf_counter() - t0)
            return out

        return functools.wraps(fn)(wrapper) if wraps else wrapper

    @timed
    def lm_adam_step(params, opt_state, batch):
        def mse(params):
            def layer(h, w):
                return (h + jax.nn.gelu(h @ w.astype(bf))).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), batch["x"], params["trunk"])
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(mse)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    spec = P(None, "d", None)
    shape = (layers, width, width)
    params = {"trunk": sds(shape, f32, mesh, spec)}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {"trunk": sds(shape, f32, mesh, spec)},
                 "nu": {"trunk": sds(shape, f32, mesh, spec)}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnames": ("params", "opt_state")}
    return lm_adam_step, (params, opt_state, batch), kw


# 32.2 offline knowledge distillation: the precomputed teacher logits fed replicated


def _offline_kd_builder(mesh, seqs, seq_len, vocab, d_model, layers, temp, teacher_spec):
    """Offline distillation of a small language model from teacher logits computed earlier and streamed
    from disk (bf16 [seqs, seq_len, vocab] global). The student (bf16 embedding, a scanned MLP trunk
    under jax.checkpoint, an untied head; weights replicated, plain data parallelism) is trained with the
    temperature-scaled KL divergence to the teacher's distribution. The token ids are split over the
    batch P('d'); the teacher logits are placed with `teacher_spec`: () = replicated (the input pipeline
    put them with a sharding built for the weights), ('d',) = split over the batch like the tokens."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def kd_step(student, tokens, teacher_logits):
        def kd_loss(student):
            h = jnp.take(student["embed"], tokens, axis=0)

            def layer(h, w):
                return (h + jax.nn.gelu(h @ w[0]) @ w[1]).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), h, (student["up"], student["down"]))
            s = (h @ student["head"]).astype(f32) / temp
            t = jax.nn.softmax(teacher_logits.astype(f32) / temp, -1)
            return temp ** 2 * jnp.mean(jnp.sum(t * (jnp.log(t + 1e-9) - jax.nn.log_softmax(s, -1)), -1))

        loss, g = jax.value_and_grad(kd_loss)(student)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), student, g), loss

    student = {"embed": sds((vocab, d_model), bf, mesh, P()),
               "up": sds((layers, d_model, 4 * d_model), bf, mesh, P()),
               "down": sds((layers, 4 * d_model, d_model), bf, mesh, P()),
               "head": sds((d_model, vocab), bf, mesh, P())}
    n = mesh.devices.size * seqs
    tokens = sds((n, seq_len), jnp.int32, mesh, P("d"))
    teacher_logits = sds((n, seq_len, vocab), bf, mesh, P(*teacher_spec))
    kw = {"out_shardings": (_shardings(student), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return kd_step, (student, tokens, teacher_logits), kw


# 32.3 PointNet on one large LiDAR scene: the points replicated because the batch of one cannot be split


def _pointnet_scene_builder(mesh, points, classes, point_spec):
    """PointNet part/semantic segmentation trained on one LiDAR scene per step (batch 1, `points`
    points): a shared per-point MLP 3 -> 64 -> 128 -> 1024, a max-pool to the global feature, the global
    feature concatenated to every point's 64-d local feature, a 1088 -> 512 -> 256 -> classes head, f32
    weights replicated, SGD. The scene's xyz f32[1, N, 3] and labels int32[1, N] are placed with
    `point_spec`: () = replicated (P('d') on a batch of 1 is refused, so the user dropped the sharding);
    (None, 'd') = split over the points axis, the max-pool becoming a cross-device max."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dims = [(3, 64), (64, 128), (128, 1024), (1088, 512), (512, 256), (256, classes)]

    def pointnet_seg_step(net, xyz, seg):
        def seg_loss(net):
            h1 = jax.nn.relu(xyz @ net[0]["w"] + net[0]["b"])                 # [1, N, 64]
            h = jax.nn.relu(h1 @ net[1]["w"] + net[1]["b"])
            h = jax.nn.relu(h @ net[2]["w"] + net[2]["b"])                     # [1, N, 1024]
            g = jnp.max(h, axis=1, keepdims=True)                              # [1, 1, 1024]
            h = jnp.concatenate([h1, jnp.broadcast_to(g, h.shape[:2] + (1024,))], -1)
            h = jax.nn.relu(h @ net[3]["w"] + net[3]["b"])
            h = jax.nn.relu(h @ net[4]["w"] + net[4]["b"])
            logits = h @ net[5]["w"] + net[5]["b"]
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, seg[..., None], -1))

        loss, g = jax.value_and_grad(seg_loss)(net)
        return _tm(lambda p, g: p - 1e-3 * g, net, g), loss

    net = [{"w": sds(d, f32, mesh, P()), "b": sds((d[1],), f32, mesh, P())} for d in dims]
    xyz = sds((1, points, 3), f32, mesh, P(*point_spec))
    seg = sds((1, points), jnp.int32, mesh, P(*point_spec))
    kw = {"out_shardings": (_shardings(net), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return pointnet_seg_step, (net, xyz, seg), kw


# 32.4 L2-PGD adversarial training that differentiates through the attack


def _pgd_adv_builder(mesh, rows, feat, hidden, depth, classes, steps, stop_attack_grad):
    """Madry-style adversarial training of an f32 MLP classifier on flattened 32x32x3 images (weights
    replicated, batch split over the devices): each step crafts L2-PGD adversarial examples (`steps`
    normalised-gradient steps of size 0.1, projected onto the eps=0.5 ball) and trains on them.
    stop_attack_grad=False: the attack runs inside the differentiated loss and its result is used
    directly, so jax.grad differentiates through every attack step (second order, each step's forward
    and backward kept); True: `jax.lax.stop_gradient` on the adversarial examples, as the method means."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def xent(clf, x, y):
        h = x
        for w in clf["hidden"]:
            h = jax.nn.relu(h @ w)
        lp = jax.nn.log_softmax(h @ clf["out"], -1)
        return -jnp.mean(jnp.take_along_axis(lp, y[:, None], -1))

    def adv_train_step(clf, images, labels):
        def robust_loss(clf):
            x = images
            for _ in range(steps):
                g = jax.grad(xent, argnums=1)(clf, x, labels)
                g = g / (jnp.linalg.norm(g, axis=-1, keepdims=True) + 1e-12)
                d = x + 0.1 * g - images
                d = d * jnp.minimum(1.0, 0.5 / (jnp.linalg.norm(d, axis=-1, keepdims=True) + 1e-12))
                x = jnp.clip(images + d, 0.0, 1.0)
            if stop_attack_grad:
                x = jax.lax.stop_gradient(x)
            return xent(clf, x, labels)

        loss, g = jax.value_and_grad(robust_loss)(clf)
        return _tm(lambda p, g: p - 1e-2 * g, clf, g), loss

    dims = [feat] + [hidden] * depth
    clf = {"hidden": [sds((a, b), f32, mesh, P()) for a, b in zip(dims[:-1], dims[1:])],
           "out": sds((hidden, classes), f32, mesh, P())}
    n = mesh.devices.size * rows
    images = sds((n, feat), f32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(clf), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return adv_train_step, (clf, images, labels), kw


# 32.5 a tensor-fusion network: the three-way outer product of the modality embeddings


def _tensor_fusion_builder(mesh, rows, d_audio, d_video, d_text, d_fuse, out, rank, low_rank):
    """Multimodal sentiment regression (Tensor Fusion Network, Zadeh et al. 2017): audio, video and text
    utterance features are projected to d_fuse each, a 1 is appended to each, and the fused
    representation is their three-way outer product [B, d+1, d+1, d+1] flattened, followed by a linear
    layer to `out` and a regression head (f32, weights replicated, batch split over the devices, SGD).
    low_rank=False: the outer product is materialised (einsum 'bi,bj,bk->bijk'); True: low-rank
    multimodal fusion (Liu et al. 2018), the fusion weight factorised per modality with `rank` factors,
    the product taken after each modality's projection to `out`."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    d1 = d_fuse + 1

    def tfn_step(fusion, audio, video, text, target):
        def mse(fusion):
            def embed(x, w):
                z = jax.nn.relu(x @ w)
                return jnp.concatenate([z, jnp.ones(z.shape[:-1] + (1,), f32)], -1)

            a = embed(audio, fusion["a_proj"])
            v = embed(video, fusion["v_proj"])
            t = embed(text, fusion["t_proj"])
            if low_rank:
                fa = jnp.einsum("bi,rio->rbo", a, fusion["a_fac"])
                fv = jnp.einsum("bi,rio->rbo", v, fusion["v_fac"])
                ft = jnp.einsum("bi,rio->rbo", t, fusion["t_fac"])
                h = jnp.einsum("r,rbo->bo", fusion["mix"], fa * fv * ft)
            else:
                z = jnp.einsum("bi,bj,bk->bijk", a, v, t).reshape(a.shape[0], -1)
                h = z @ fusion["fuse"]
            h = jax.nn.relu(h)
            pred = (h @ fusion["head"])[:, 0]
            return jnp.mean((pred - target) ** 2)

        loss, g = jax.value_and_grad(mse)(fusion)
        return _tm(lambda p, g: p - 1e-3 * g, fusion, g), loss

    fusion = {"a_proj": sds((d_audio, d_fuse), f32, mesh, P()),
              "v_proj": sds((d_video, d_fuse), f32, mesh, P()),
              "t_proj": sds((d_text, d_fuse), f32, mesh, P()),
              "head": sds((out, 1), f32, mesh, P())}
    if low_rank:
        for m in "avt":
            fusion[f"{m}_fac"] = sds((rank, d1, out), f32, mesh, P())
        fusion["mix"] = sds((rank,), f32, mesh, P())
    else:
        fusion["fuse"] = sds((d1 * d1 * d1, out), f32, mesh, P())
    n = mesh.devices.size * rows
    audio = sds((n, d_audio), f32, mesh, P("d"))
    video = sds((n, d_video), f32, mesh, P("d"))
    text = sds((n, d_text), f32, mesh, P("d"))
    target = sds((n,), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(fusion), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return tfn_step, (fusion, audio, video, text, target), kw


# 32.6 a GAN whose generator is FSDP-sharded but whose discriminator and its Adam state are replicated


def _gan_disc_placement_builder(mesh, layers, width, noise_rows, disc_spec):
    """A non-saturating GAN on feature vectors (an MLP generator and an MLP discriminator, each `layers`
    residual blocks of f32[width, width] weights stacked for lax.scan with jax.checkpoint, bf16 compute),
    one alternating step: the discriminator's Adam update on real vs generated rows, then the generator's.
    The generator's weights and Adam moments are FSDP-sharded P(None, 'd', None); the discriminator's
    weights and moments are placed with `disc_spec`: () = replicated (its shardings were never added to
    the config when the discriminator was grown), (None, 'd', None) = like the generator's. Both donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mlp(ws, h):
        def blk(h, w):
            return (h + jax.nn.leaky_relu(h @ w.astype(bf), 0.2)).astype(bf), None

        h, _ = jax.lax.scan(jax.checkpoint(blk), h.astype(bf), ws)
        return h

    def critic(d_ws, x):
        return jnp.mean(mlp(d_ws, x).astype(f32), -1)

    def gan_step(gen, gen_opt, disc, disc_opt, real, z):
        def d_loss(disc):
            fake = jax.lax.stop_gradient(mlp(gen["blocks"], z))
            return (jnp.mean(jax.nn.softplus(-critic(disc["blocks"], real)))
                    + jnp.mean(jax.nn.softplus(critic(disc["blocks"], fake))))

        def g_loss(gen):
            return jnp.mean(jax.nn.softplus(-critic(disc["blocks"], mlp(gen["blocks"], z))))

        ld, gd = jax.value_and_grad(d_loss)(disc)
        disc, disc_opt = adam_update(disc, gd, disc_opt, lr=2e-4, b1=0.5)
        lg, gg = jax.value_and_grad(g_loss)(gen)
        gen, gen_opt = adam_update(gen, gg, gen_opt, lr=2e-4, b1=0.5)
        return gen, gen_opt, disc, disc_opt, ld, lg

    shape = (layers, width, width)

    def tree(spec):
        p = {"blocks": sds(shape, f32, mesh, spec)}
        o = {"count": sds((), jnp.int32, mesh, P()), "mu": {"blocks": sds(shape, f32, mesh, spec)},
             "nu": {"blocks": sds(shape, f32, mesh, spec)}}
        return p, o

    gen, gen_opt = tree(P(None, "d", None))
    disc, disc_opt = tree(P(*disc_spec))
    n = mesh.devices.size * noise_rows
    real = sds((n, width), bf, mesh, P("d"))
    z = sds((n, width), bf, mesh, P("d"))
    rep = NamedSharding(mesh, P())
    kw = {"out_shardings": (_shardings(gen), _shardings(gen_opt), _shardings(disc), _shardings(disc_opt), rep, rep),
          "donate_argnums": (0, 1, 2, 3)}
    return gan_step, (gen, gen_opt, disc, disc_opt, real, z), kw

pair(
    "timed_donate_argnames", "v5e", "v5e:2x2",
    "Residual GELU MLP trunk (48 layers of f32[8192, 8192], FSDP-sharded over the 4 devices) trained with "
    "Adam, jitted with donate_argnames=('params', 'opt_state') around a `timed` logging decorator that "
    "lacks functools.wraps: jax sees only *args/**kwargs and donates nothing, so the 9 GiB of weights and "
    "moments exist twice, beyond 15.75G.",
    "Fixed variant of timed_donate_argnames_v5e: the decorator uses functools.wraps, the names map to the "
    "step's parameters and both are donated; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _timed_donation_builder, dict(layers=48, width=8192, tokens=2048, wraps=False),
    dict(layers=48, width=8192, tokens=2048, wraps=True),
    dump=True,
)

pair(
    "kd_teacher_logits_replicated", "v5e", "v5e:4x4",
    "Offline distillation of a small LM (d=1024, 4 MLP layers, vocabulary 32768) from precomputed bf16 "
    "teacher logits [128, 2048, 32768] (16 GiB global) fed replicated P() on each of the 16 devices while "
    "the token ids are split over the batch: the full 16 GiB teacher tensor on every device, beyond 15.75G.",
    "Fixed variant of kd_teacher_logits_replicated_v5e: the teacher logits split over the batch, P('d'), "
    "like the token ids; fits.",
    dict(category="arguments", category_also=["single_large_allocation"], causes=["replicated_tensor", "arguments_exceed"]),
    _offline_kd_builder, dict(seqs=8, seq_len=2048, vocab=32768, d_model=1024, layers=4, temp=2.0,
                              teacher_spec=()),
    dict(seqs=8, seq_len=2048, vocab=32768, d_model=1024, layers=4, temp=2.0, teacher_spec=("d",)),
    dump=False,
)

pair(
    "pointnet_scene_replicated", "v4", "v4:2x2x1",
    "PointNet segmentation trained on one LiDAR scene of 2M points per step: the batch of one cannot be "
    "split, so xyz f32[1, 2097152, 3] and the labels are replicated P() and every TensorCore computes the "
    "per-point features of the whole scene ([2M, 1024] f32, 8 GiB each), beyond 15.25G.",
    "Fixed variant of pointnet_scene_replicated_v4: the points axis split over the 8 TensorCores, "
    "P(None, 'd'), the max-pool a cross-device max; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["replicated_tensor", "batch_too_large"]),
    _pointnet_scene_builder, dict(points=2097152, classes=16, point_spec=()),
    dict(points=2097152, classes=16, point_spec=(None, "d")),
    dump=False,
)

pair(
    "pgd_attack_unstopped", "v5e", "v5e:2x2",
    "L2-PGD adversarial training (10 attack steps) of an f32 MLP classifier (4 x 4096 hidden) on 16384 "
    "flattened CIFAR images per device, with no stop_gradient on the adversarial examples: jax.grad "
    "differentiates through every attack step, keeping each step's forward and backward, beyond 15.75G.",
    "Fixed variant of pgd_attack_unstopped_v5e: jax.lax.stop_gradient on the adversarial examples; fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large"]),
    _pgd_adv_builder, dict(rows=16384, feat=3072, hidden=4096, depth=4, classes=10, steps=10,
                           stop_attack_grad=False),
    dict(rows=16384, feat=3072, hidden=4096, depth=4, classes=10, steps=10, stop_attack_grad=True),
    dump=False,
)

pair(
    "tensor_fusion_outer", "v5e", "v5e:2x2",
    "Tensor Fusion Network for multimodal sentiment (audio 74, video 35, text 768 features, each projected "
    "to 128, a 1 appended), 2048 utterances per device: the three-way outer product [2048, 129, 129, 129] "
    "in f32 (16 GiB) feeds the fusion layer, beyond 15.75G.",
    "Fixed variant of tensor_fusion_outer_v5e: low-rank multimodal fusion (rank 4), no outer product; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _tensor_fusion_builder, dict(rows=2048, d_audio=74, d_video=35, d_text=768, d_fuse=128, out=128, rank=4,
                                 low_rank=False),
    dict(rows=2048, d_audio=74, d_video=35, d_text=768, d_fuse=128, out=128, rank=4, low_rank=True),
    dump=False,
)


pair(
    "gan_disc_adam_replicated", "v6e", "v6e:2x2",
    "Feature-space GAN (generator and discriminator each 32 residual blocks of f32[8192, 8192]) trained "
    "with Adam: the generator's weights and moments are FSDP-sharded over the 4 devices, the "
    "discriminator's 8 GiB of weights and its two Adam moments are replicated P(): 30 GiB of arguments per "
    "device and the full-size gradients and updates, beyond 31.25G.",
    "Fixed variant of gan_disc_adam_replicated_v6e: the discriminator and its moments sharded like the "
    "generator's, P(None, 'd', None); fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _gan_disc_placement_builder, dict(layers=32, width=8192, noise_rows=2048, disc_spec=()),
    dict(layers=32, width=8192, noise_rows=2048, disc_spec=(None, "d", None)),
    dump=False,
)


# ---- 33. more broken/fixed pairs (batch tpu22): other models, other names ---------------------
#
# Programs of kinds sections 13-32 do not have (stochastic weight averaging whose running average is
# replicated beside FSDP weights, sequence parallelism left out of the input placement on a
# ('data', 'seq') mesh, an Adam step whose donate_argnums sit on an inner jax.jit called from an outer
# jit that donates nothing, one replicated NamedSharding given as out_shardings for a whole output
# tuple, LAMB with f32 moments for bf16 weights, GMFlow-style global matching on 1/4-resolution
# features, a flash-style Pallas attention kernel whose K/V block is the whole sequence). The same
# conventions: the fixed twin changes exactly the first cause. See the README section of batch tpu22
# for which pairs keep their dumps and what did not go as first written.


# 33.1 stochastic weight averaging: the running average of the weights replicated beside FSDP weights


def _swa_builder(mesh, layers, width, tokens, swa_spec):
    """A residual SiLU MLP regressor (f32 weights [layers, width, width] stacked for lax.scan with
    jax.checkpoint, bf16 compute) trained with Adam (written out), weights and moments FSDP-sharded
    P(None, 'd', None). Stochastic weight averaging (Izmailov et al. 2018) keeps `swa_params`, the running
    mean of the weights, and `swa_n`, the number of models averaged, updated every step after the
    optimizer. swa_spec: () = the average replicated (built with `jax.device_put(params, replicated)` in the
    SWA callback), (None, 'd', None) = sharded like the weights. Everything donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def swa_train_step(params, opt_state, swa_params, swa_n, batch):
        def mse(params):
            def block(h, w):
                return (h + jax.nn.silu(h @ w.astype(bf))).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), batch["x"], params["blocks"])
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(mse)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        n = swa_n.astype(f32)
        swa_params = _tm(lambda a, p: a + (p - a) / (n + 1.0), swa_params, params)
        return params, opt_state, swa_params, swa_n + 1, loss

    spec = P(None, "d", None)
    shape = (layers, width, width)
    params = {"blocks": sds(shape, f32, mesh, spec)}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {"blocks": sds(shape, f32, mesh, spec)},
                 "nu": {"blocks": sds(shape, f32, mesh, spec)}}
    swa_params = {"blocks": sds(shape, f32, mesh, P(*swa_spec))}
    swa_n = sds((), jnp.int32, mesh, P())
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    rep = NamedSharding(mesh, P())
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), _shardings(swa_params), rep, rep),
          "donate_argnums": (0, 1, 2, 3)}
    return swa_train_step, (params, opt_state, swa_params, swa_n, batch), kw


# 33.2 sequence parallelism left out: the 'seq' mesh axis exists but the inputs are placed P('data', None)


def _seq_axis_builder(mesh, seqs, seq_len, d_model, layers, input_spec):
    """The feed-forward trunk of a long-context model (pre-RMSNorm SwiGLU blocks, bf16 weights
    [layers, d, 4d] replicated, lax.scan with jax.checkpoint per block), trained on a 2-D mesh
    ('data', 'seq') = (4, 4) built for sequence parallelism: the token embeddings [seqs, seq_len, d] bf16
    and the targets are placed with `input_spec`: ('data', None, None) = split over the batch only, so
    every device of a 'seq' group holds and computes the whole sequence; ('data', 'seq', None) = split
    over the sequence as the mesh was meant. SGD, weights donated."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    grid = Mesh(mesh.devices.reshape(4, mesh.devices.size // 4), ("data", "seq"))

    def ffn_trunk_step(weights, embeds, targets):
        def loss_fn(weights):
            def block(h, w):
                x = h.astype(f32)
                x = (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)).astype(bf) * w["norm"]
                u = jax.nn.silu(x @ w["gate"]) * (x @ w["up"])
                return (h + u @ w["down"]).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), embeds, weights)
            return jnp.mean((h.astype(f32) - targets.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(weights)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), weights, g), loss

    ff = 4 * d_model
    weights = {"norm": sds((layers, d_model), bf, grid, P()),
               "gate": sds((layers, d_model, ff), bf, grid, P()),
               "up": sds((layers, d_model, ff), bf, grid, P()),
               "down": sds((layers, ff, d_model), bf, grid, P())}
    embeds = sds((seqs, seq_len, d_model), bf, grid, P(*input_spec))
    targets = sds((seqs, seq_len, d_model), bf, grid, P(*input_spec))
    kw = {"out_shardings": (_shardings(weights), NamedSharding(grid, P())), "donate_argnums": (0,)}
    return ffn_trunk_step, (weights, embeds, targets), kw


# 33.3 donate_argnums on an inner jax.jit: the outer jit that calls it donates nothing


def _nested_jit_donation_builder(mesh, layers, width, tokens, donate_outer):
    """A denoising autoencoder's residual trunk (f32 weights [layers, width, width] FSDP-sharded
    P(None, 'd', None), bf16 compute, lax.scan with jax.checkpoint) trained with Adam (written out). The
    training step `dae_train_step` is jitted with `donate_argnums=(0, 1)`, but the loop calls it from an
    outer `jax.jit(train_and_log)` that also computes the metrics: inside another jit the inner jit is
    inlined and its donation means nothing, so the outer program's params and opt_state are not donated
    (donate_outer=False). donate_outer=True: `donate_argnums=(0, 1)` on the outer jit as well."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def dae_train_step(params, opt_state, batch):
        def recon(params):
            def block(h, w):
                return (h + jax.nn.gelu(h @ w.astype(bf))).astype(bf), None

            noisy = batch["x"] + (0.1 * batch["noise"]).astype(bf)
            h, _ = jax.lax.scan(jax.checkpoint(block), noisy, params["trunk"])
            return jnp.mean((h.astype(f32) - batch["x"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(recon)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    inner = jax.jit(dae_train_step, donate_argnums=(0, 1))

    def train_and_log(params, opt_state, batch):
        params, opt_state, loss = inner(params, opt_state, batch)
        metrics = {"loss": loss, "count": opt_state["count"]}
        return params, opt_state, metrics

    spec = P(None, "d", None)
    shape = (layers, width, width)
    params = {"trunk": sds(shape, f32, mesh, spec)}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {"trunk": sds(shape, f32, mesh, spec)},
                 "nu": {"trunk": sds(shape, f32, mesh, spec)}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "noise": sds((n, width), bf, mesh, P("d"))}
    rep = NamedSharding(mesh, P())
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), {"count": rep, "loss": rep})}
    if donate_outer:
        kw["donate_argnums"] = (0, 1)
    return train_and_log, (params, opt_state, batch), kw


# 33.4 LAMB whose moments are kept in f32 for bf16 weights


def _lamb_state_builder(mesh, layers, width, tokens, state_dtype):
    """A bf16 residual MLP trunk (weights bf16[layers, width, width] FSDP-sharded P(None, 'd', None),
    lax.scan with jax.checkpoint) trained with LAMB (You et al. 2019, written out: Adam moments, weight
    decay, a per-layer trust ratio ||w|| / ||update||). The moments `m` and `v` are created as
    `jnp.zeros_like(p, dtype=state_dtype)`: float32 = twice the bytes of the weights each (the update is
    computed in f32 and cast back); bfloat16 = the weights' dtype. Weights and state donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    sdt = jnp.dtype(state_dtype)

    def lamb_step(params, opt_state, batch):
        def mse(params):
            def layer(h, w):
                return (h + jax.nn.gelu(h @ w)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(layer), batch["x"], params["trunk"])
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(mse)(params)
        b1, b2, lr, wd = 0.9, 0.999, 1e-3, 0.01
        count = opt_state["count"] + 1
        c = count.astype(f32)
        m = _tm(lambda m, g: (b1 * m + (1 - b1) * g.astype(m.dtype)).astype(sdt), opt_state["m"], grads)
        v = _tm(lambda v, g: (b2 * v + (1 - b2) * jnp.square(g.astype(v.dtype))).astype(sdt), opt_state["v"], grads)

        def apply(p, m, v):
            u = (m.astype(f32) / (1 - b1 ** c)) / (jnp.sqrt(v.astype(f32) / (1 - b2 ** c)) + 1e-6) + wd * p.astype(f32)
            w_norm = jnp.sqrt(jnp.sum(jnp.square(p.astype(f32)), axis=(1, 2), keepdims=True))
            u_norm = jnp.sqrt(jnp.sum(jnp.square(u), axis=(1, 2), keepdims=True))
            trust = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
            return (p.astype(f32) - lr * trust * u).astype(p.dtype)

        params = _tm(apply, params, m, v)
        return params, {"count": count, "m": m, "v": v}, loss

    spec = P(None, "d", None)
    shape = (layers, width, width)
    params = {"trunk": sds(shape, bf, mesh, spec)}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "m": {"trunk": sds(shape, sdt, mesh, spec)},
                 "v": {"trunk": sds(shape, sdt, mesh, spec)}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return lamb_step, (params, opt_state, batch), kw


# 33.5 GMFlow-style global matching: the all-pairs correlation of 1/4-resolution features


def _global_matching_builder(mesh, pairs, height, width, channels, depth, stride):
    """Optical flow by global matching (GMFlow, Xu et al. 2022): both frames are patch-embedded with
    stride `stride` (a stride x stride patchify conv written as a reshape and a matmul) and refined by
    `depth` residual MLP blocks (f32, weights replicated), then the all-pairs correlation
    [B, h*w, h*w] = f1 f2^T / sqrt(C) is turned into a flow by a softmax over the second frame's
    positions (soft-argmax of the pixel grid). Supervised by the ground-truth flow average-pooled to the
    feature resolution (L1), SGD. stride=4 = features at 1/4 resolution (the correlation of 4 pairs of
    512x1024 frames: [4, 32768, 32768] f32); stride=8 = 1/8 resolution, as GMFlow computes it."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    h, w = height // stride, width // stride

    def flow_step(net, frame1, frame2, flow_gt):
        def embed(img):
            b = img.shape[0]
            x = img.reshape(b, h, stride, w, stride, 3).transpose(0, 1, 3, 2, 4, 5).reshape(b, h * w, -1)
            f = x @ net["patch"]
            for blk in net["blocks"]:
                f = f + jax.nn.gelu(f @ blk["w1"]) @ blk["w2"]
            return f

        def epe(net):
            f1, f2 = embed(frame1), embed(frame2)
            corr = jnp.einsum("bnc,bmc->bnm", f1, f2) / jnp.sqrt(float(channels))
            prob = jax.nn.softmax(corr, axis=-1)
            yy, xx = jnp.meshgrid(jnp.arange(h, dtype=f32), jnp.arange(w, dtype=f32), indexing="ij")
            grid = jnp.stack([xx, yy], -1).reshape(h * w, 2)
            flow = prob @ grid - grid
            gt = flow_gt.reshape(-1, h, stride, w, stride, 2).mean((2, 4)).reshape(-1, h * w, 2) / stride
            return jnp.mean(jnp.abs(flow - gt))

        loss, g = jax.value_and_grad(epe)(net)
        return _tm(lambda p, g: p - 1e-4 * g, net, g), loss

    net = {"patch": sds((stride * stride * 3, channels), f32, mesh, P()),
           "blocks": [{"w1": sds((channels, 2 * channels), f32, mesh, P()),
                       "w2": sds((2 * channels, channels), f32, mesh, P())} for _ in range(depth)]}
    n = mesh.devices.size * pairs
    frame1 = sds((n, height, width, 3), f32, mesh, P("d"))
    frame2 = sds((n, height, width, 3), f32, mesh, P("d"))
    flow_gt = sds((n, height, width, 2), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(net), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return flow_step, (net, frame1, frame2, flow_gt), kw


# 33.6 a Pallas attention kernel whose K/V block is the whole sequence


def _pallas_attention_builder(mesh, heads, seq_len, head_dim, block_q, block_k):
    """Causal-free attention forward as a Pallas TPU kernel in the flash style: grid (heads, S/block_q,
    S/block_k), one query block against one key/value block per step, a running max, sum and f32
    accumulator in VMEM scratch (online softmax), the output written at the last key block; run per
    device under jax.shard_map with the heads over 'd'. block_k = seq_len (the author's first version:
    "K and V fit in VMEM, so load them whole") makes each step hold the whole K and V (double-buffered)
    beside the query, output and scratch blocks; block_k = 512 streams them."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    nk = seq_len // block_k
    scale = head_dim ** -0.5

    def flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                      preferred_element_type=jnp.float32)
        m_ref[...] = m_new

        @pl.when(pl.program_id(2) == nk - 1)
        def _():
            o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)

    def per_shard(q, k, v):
        return pl.pallas_call(
            flash_kernel,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid=(q.shape[0], seq_len // block_q, nk),
            in_specs=[pl.BlockSpec((None, block_q, head_dim), lambda h, i, j: (h, i, 0)),
                      pl.BlockSpec((None, block_k, head_dim), lambda h, i, j: (h, j, 0)),
                      pl.BlockSpec((None, block_k, head_dim), lambda h, i, j: (h, j, 0))],
            out_specs=pl.BlockSpec((None, block_q, head_dim), lambda h, i, j: (h, i, 0)),
            scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32), pltpu.VMEM((block_q, 1), jnp.float32),
                            pltpu.VMEM((block_q, head_dim), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(q, k, v)

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"), P("d"), P("d")), out_specs=P("d"),
                       check_vma=False)

    def flash_attention(q, k, v):
        return fn(q, k, v)

    shape = (mesh.devices.size * heads, seq_len, head_dim)
    q = sds(shape, jnp.bfloat16, mesh, P("d"))
    k = sds(shape, jnp.bfloat16, mesh, P("d"))
    v = sds(shape, jnp.bfloat16, mesh, P("d"))
    return flash_attention, (q, k, v), {}


# 33.7 one NamedSharding given as out_shardings for the whole output tuple: new weights and state replicated


def _out_shardings_single_builder(mesh, layers, width, images, per_output):
    """A ResMLP-style image classifier's trunk (f32 weights [layers, width, width] FSDP-sharded
    P(None, 'd', None), bf16 compute, lax.scan with jax.checkpoint, mean-pooled patches into a linear
    head) trained with Adam (written out), weights and moments donated. per_output=False: the script
    passes `out_shardings=NamedSharding(mesh, P())` (meant for the loss) as the single sharding of the
    whole output tuple, so jax applies it to every leaf: the new weights and both moments come out
    replicated on every device; per_output=True: a tuple of the weights' and moments' own shardings and
    P() for the loss."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def resmlp_step(params, opt_state, patches, labels):
        def xent(params):
            def block(h, w):
                return (h + jax.nn.gelu(h @ w.astype(bf))).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), patches, params["blocks"])
            logits = jnp.mean(h, axis=1).astype(f32) @ params["head"]
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], -1))

        loss, grads = jax.value_and_grad(xent)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    spec = P(None, "d", None)
    shape = (layers, width, width)
    params = {"blocks": sds(shape, f32, mesh, spec), "head": sds((width, 1000), f32, mesh, P())}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {"blocks": sds(shape, f32, mesh, spec), "head": sds((width, 1000), f32, mesh, P())},
                 "nu": {"blocks": sds(shape, f32, mesh, spec), "head": sds((width, 1000), f32, mesh, P())}}
    n = mesh.devices.size * images
    patches = sds((n, 196, width), bf, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    rep = NamedSharding(mesh, P())
    outs = (_shardings(params), _shardings(opt_state), rep) if per_output else rep
    kw = {"out_shardings": outs, "donate_argnums": (0, 1)}
    return resmlp_step, (params, opt_state, patches, labels), kw


pair(
    "swa_average_replicated", "v6e", "v6e:2x2",
    "Stochastic weight averaging of a residual SiLU MLP regressor (64 layers of f32[8192, 8192]) trained "
    "with Adam: weights and moments FSDP-sharded over the 4 devices, but the SWA running average "
    "swa_params (16 GiB) is replicated P(): it and its full-size update on every device, beyond 31.25G.",
    "Fixed variant of swa_average_replicated_v6e: swa_params sharded like the weights, P(None, 'd', None); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["replicated_tensor"]),
    _swa_builder, dict(layers=64, width=8192, tokens=2048, swa_spec=()),
    dict(layers=64, width=8192, tokens=2048, swa_spec=(None, "d", None)),
    dump=False,
)

pair(
    "seq_axis_unsharded", "v5e", "v5e:4x4",
    "Feed-forward trunk of a long-context model (16 SwiGLU blocks, d=2048, bf16, jax.checkpoint per block) "
    "on a ('data', 'seq') = (4, 4) mesh meant for sequence parallelism, with the embeddings [8, 131072, 2048] "
    "placed P('data', None, None): each device holds the whole 131072-token sequences of its batch slice "
    "(262144 tokens) and their per-block residuals, beyond 15.75G.",
    "Fixed variant of seq_axis_unsharded_v5e: embeddings and targets placed P('data', 'seq', None), "
    "65536 tokens per device; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["replicated_tensor", "batch_too_large"]),
    _seq_axis_builder, dict(seqs=8, seq_len=131072, d_model=2048, layers=16, input_spec=("data", None, None)),
    dict(seqs=8, seq_len=131072, d_model=2048, layers=16, input_spec=("data", "seq", None)),
    dump=False,
)

pair(
    "nested_jit_inner_donation", "v5e", "v5e:2x2",
    "Denoising-autoencoder trunk (44 layers of f32[8192, 8192], FSDP-sharded over the 4 devices) trained "
    "with Adam: the step is jitted with donate_argnums=(0, 1) but called from an outer jax.jit(train_and_log) "
    "without donation, where the inner donation is ignored: the 8.25 GiB of weights and moments exist twice, "
    "beyond 15.75G.",
    "Fixed variant of nested_jit_inner_donation_v5e: donate_argnums=(0, 1) on the outer jit too; weights "
    "and moments aliased; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _nested_jit_donation_builder, dict(layers=44, width=8192, tokens=2048, donate_outer=False),
    dict(layers=44, width=8192, tokens=2048, donate_outer=True),
    dump=True,
)

pair(
    "lamb_state_f32", "v5e", "v5e:2x2",
    "LAMB training of a bf16 residual MLP trunk (80 layers of bf16[8192, 8192], FSDP-sharded over the 4 "
    "devices) whose moments m and v are created in float32: 10 GiB of f32 state per device beside 2.5 GiB "
    "of weights, plus the f32 update, beyond 15.75G.",
    "Fixed variant of lamb_state_f32_v5e: m and v kept in bfloat16 like the weights; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["f32_precision"]),
    _lamb_state_builder, dict(layers=80, width=8192, tokens=2048, state_dtype="float32"),
    dict(layers=80, width=8192, tokens=2048, state_dtype="bfloat16"),
    dump=False,
)

pair(
    "global_matching_quarter_res", "v5e", "v5e:2x2",
    "GMFlow-style optical flow by global matching on 4 pairs of 512x1024 frames per device, features at "
    "1/4 resolution (32768 positions, 256 channels, f32): the all-pairs correlation [4, 32768, 32768] f32 "
    "(16 GiB) and its softmax, kept for the backward pass, beyond 15.75G.",
    "Fixed variant of global_matching_quarter_res_v5e: features at 1/8 resolution (stride-8 patches, "
    "8192 positions), as GMFlow matches; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation", "batch_too_large"]),
    _global_matching_builder, dict(pairs=4, height=512, width=1024, channels=256, depth=4, stride=4),
    dict(pairs=4, height=512, width=1024, channels=256, depth=4, stride=8),
    dump=True,
)


pair(
    "pallas_attention_kv_whole", "v5e", "v5e:2x2",
    "A flash-style Pallas attention kernel (bf16, head_dim 128, 16384 tokens, 8 heads per device) whose "
    "K/V BlockSpec is the whole sequence (block_k = 16384): each grid step holds K and V whole, "
    "double-buffered (16 MiB), beside the query, output and scratch blocks: 17 MiB, beyond the 16 MiB scoped "
    "VMEM limit.",
    "Fixed variant of pallas_attention_kv_whole_v5e: block_k = 512, K and V streamed through the online "
    "softmax; fits.",
    dict(category="vmem", causes=["kernel_tiling"]),
    _pallas_attention_builder, dict(heads=8, seq_len=16384, head_dim=128, block_q=512, block_k=16384),
    dict(heads=8, seq_len=16384, head_dim=128, block_q=512, block_k=512),
    dump=False,
)


pair(
    "out_shardings_single_replicated", "v5e", "v5e:2x2",
    "ResMLP-style classifier trunk (16 blocks of f32[8192, 8192], FSDP-sharded over the 4 devices) trained "
    "with Adam, jitted with out_shardings=NamedSharding(mesh, P()) (meant for the loss) as the single sharding "
    "of the whole output tuple: the new weights and both moments (12 GiB) come out replicated on every "
    "device, beyond 15.75G.",
    "Fixed variant of out_shardings_single_replicated_v5e: out_shardings a tuple of the weights' and moments' "
    "own shardings and P() for the loss; fits.",
    dict(category="aggregate", causes=["replicated_tensor", "optimizer_state_unsharded", "no_donation"]),
    _out_shardings_single_builder, dict(layers=16, width=8192, images=32, per_output=False),
    dict(layers=16, width=8192, images=32, per_output=True),
    dump=False,
)


# ---- 34. more broken/fixed pairs (batch tpu23): other models, other names ---------------------
#
# Programs of kinds sections 13-33 do not have (a jitted init function without out_shardings whose
# weights and Adam moments come out replicated, an Adagrad accumulator replicated beside a row-sharded
# embedding table, donate_argnums left at (0, 1) after an rng argument was put first, a mixture-of-softmaxes
# LM head whose [B, S, K, V] component distributions are materialised, a scan over micro-batches whose
# every micro-batch's activations are kept for the backward pass, a tensor-parallel decode server whose
# KV cache is replicated while the heads are sharded, per-layer RoPE tables computed in f32 for the
# maximum position and stacked for the layer scan). The same conventions: the fixed twin changes exactly
# the first cause. See the README section of batch tpu23 for which pairs keep their dumps and what did not go
# as first written.


# 34.1 a jitted init function without out_shardings: the weights and Adam moments come out replicated


def _init_replicated_builder(mesh, layers, width, sharded_out):
    """`init_train_state(rng)`: the initialiser of a residual MLP trunk (f32 weights [layers, width, width],
    LeCun-normal, stacked for lax.scan) and of its Adam state (zero moments), jitted on its own as
    `jax.jit(init_train_state)` before the training loop. sharded_out=False: no out_shardings, so with a
    replicated rng key as the only input every output is replicated on every device (the training step
    that would have sharded them FSDP-style never runs); sharded_out=True: out_shardings = the FSDP
    shardings P(None, 'd', None) of the training step."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def init_train_state(rng):
        k_blocks, k_head = jax.random.split(jax.random.wrap_key_data(rng))
        blocks = jax.random.normal(k_blocks, (layers, width, width), f32) * (1.0 / width) ** 0.5
        head = jax.random.normal(k_head, (width, 1024), f32) * (1.0 / width) ** 0.5
        params = {"blocks": blocks, "head": head}
        opt_state = {"count": jnp.zeros((), jnp.int32),
                     "mu": _tm(jnp.zeros_like, params), "nu": _tm(jnp.zeros_like, params)}
        return params, opt_state

    rng = sds((2,), jnp.uint32, mesh, P())
    kw = {}
    if sharded_out:
        fsdp, rep = NamedSharding(mesh, P(None, "d", None)), NamedSharding(mesh, P())
        ps = {"blocks": fsdp, "head": rep}
        kw["out_shardings"] = (ps, {"count": rep, "mu": ps, "nu": ps})
    return init_train_state, (rng,), kw


# 34.2 an Adagrad accumulator replicated beside a row-sharded embedding table


def _adagrad_accum_builder(mesh, vocab, dim, batch, hotness, accum_spec):
    """A click-through-rate model in the DLRM style: one large item-embedding table f32[vocab, dim]
    row-sharded P('d', None), multi-hot bags of `hotness` ids per example sum-pooled, concatenated with
    dense features, a small MLP (replicated) and a logistic loss. Trained with Adagrad (written out as
    optax.adagrad: `accumulators` of squared gradients, initial value 0.1), everything donated.
    accum_spec: () = the accumulator of the table replicated (created with `jnp.full_like` under a
    jit without out_shardings, then passed back in as it came out); ('d', None) = sharded like the table."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def ctr_adagrad_step(params, accumulators, ids, dense, clicks):
        def bce(params):
            bags = jnp.take(params["item_embedding"], ids, axis=0).sum(1)             # [B, dim]
            x = jnp.concatenate([bags, dense], -1)
            h = jax.nn.relu(x @ params["mlp"]["w1"])
            logit = (h @ params["mlp"]["w2"])[:, 0]
            return jnp.mean(jnp.logaddexp(0.0, logit) - clicks * logit)

        loss, grads = jax.value_and_grad(bce)(params)
        accumulators = _tm(lambda a, g: a + g * g, accumulators, grads)
        params = _tm(lambda p, g, a: p - 0.05 * g / jnp.sqrt(a + 1e-7), params, grads, accumulators)
        return params, accumulators, loss

    params = {"item_embedding": sds((vocab, dim), f32, mesh, P("d", None)),
              "mlp": {"w1": sds((2 * dim, 1024), f32, mesh, P()), "w2": sds((1024, 1), f32, mesh, P())}}
    accumulators = {"item_embedding": sds((vocab, dim), f32, mesh, P(*accum_spec)),
                    "mlp": {"w1": sds((2 * dim, 1024), f32, mesh, P()), "w2": sds((1024, 1), f32, mesh, P())}}
    n = mesh.devices.size * batch
    ids = sds((n, hotness), jnp.int32, mesh, P("d"))
    dense = sds((n, dim), f32, mesh, P("d"))
    clicks = sds((n,), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), _shardings(accumulators), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return ctr_adagrad_step, (params, accumulators, ids, dense, clicks), kw


# 34.3 donate_argnums left at (0, 1) after an rng argument was put first in the step's signature


def _donate_shifted_builder(mesh, layers, width, tokens, donate):
    """A residual MLP denoiser trunk with dropout (bf16 weights [layers, width, width] FSDP-sharded
    P(None, 'd', None), f32 Adam moments, lax.scan with jax.checkpoint), trained with Adam (written out,
    the update in f32 and cast back to bf16). The step was `step(params, opt_state, batch)` jitted with
    `donate_argnums=(0, 1)`; dropout added `rng` as the first argument, `step(rng, params, opt_state,
    batch)`, and the donate_argnums stayed (0, 1): the key and the weights are donated, the optimizer
    state is not (donate=(0, 1)); donate=(1, 2) is what was meant."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def step(rng, params, opt_state, batch):
        def mse(params):
            keys = jax.random.split(jax.random.wrap_key_data(rng), layers)

            def block(h, xs):
                w, k = xs
                u = jax.nn.gelu(h @ w)
                keep = jax.random.bernoulli(k, 0.9, u.shape)
                return (h + jnp.where(keep, u / 0.9, 0)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), batch["x"], (params["trunk"], keys))
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(mse)(params)
        grads32 = _tm(lambda g: g.astype(f32), grads)
        p32 = _tm(lambda p: p.astype(f32), params)
        new32, opt_state = adam_update(p32, grads32, opt_state)
        params = _tm(lambda n, p: n.astype(p.dtype), new32, params)
        new_rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(rng))[0])
        return new_rng, params, opt_state, loss

    spec = P(None, "d", None)
    shape = (layers, width, width)
    rng = sds((2,), jnp.uint32, mesh, P())
    params = {"trunk": sds(shape, bf, mesh, spec)}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {"trunk": sds(shape, f32, mesh, spec)},
                 "nu": {"trunk": sds(shape, f32, mesh, spec)}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    rep = NamedSharding(mesh, P())
    kw = {"out_shardings": (rep, _shardings(params), _shardings(opt_state), rep), "donate_argnums": donate}
    return step, (rng, params, opt_state, batch), kw


# 34.4 a mixture-of-softmaxes LM head whose [B, S, K, V] component distributions are materialised


def _mos_builder(mesh, seqs, seq_len, d_model, vocab, mixtures, per_component):
    """The output layer of a mixture-of-softmaxes language model (Yang et al. 2018, "Breaking the
    softmax bottleneck"): from the last hidden states h [B, S, d] (bf16), a prior pi = softmax(h W_pi) over
    K components and K context vectors tanh(h W_k) [B, S, K, d], each projected onto the tied vocabulary
    (bf16 [V, d]) and normalised; the loss is -log sum_k pi_k softmax_k[target]. per_component=False: as
    the paper's code writes it, all component logits [B, S, K, V] at once, softmax over V in f32, the
    mixture taken by a weighted sum over K; per_component=True: a lax.scan over the K components under
    jax.checkpoint, each giving log softmax_k[target] [B, S] from its own logits, combined by logsumexp
    with log pi. SGD on the head weights, donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def mos_loss_step(head, hidden, targets):
        def nll(head):
            log_prior = jax.nn.log_softmax((hidden @ head["prior"]).astype(f32), -1)           # [B, S, K]
            ctx = jnp.tanh(jnp.einsum("bsd,kde->bske", hidden, head["latent"]))              # [B, S, K, d]
            if not per_component:
                logits = jnp.einsum("bske,ve->bskv", ctx, head["embedding"]).astype(f32)      # [B, S, K, V]
                probs = jax.nn.softmax(logits, -1)
                mix = jnp.einsum("bsk,bskv->bsv", jnp.exp(log_prior), probs)
                tgt = jnp.take_along_axis(mix, targets[..., None], -1)[..., 0]
                return -jnp.mean(jnp.log(tgt + 1e-9))

            def component(carry, c):                                                           # c [B, S, d]
                logits = (c @ head["embedding"].T).astype(f32)                                  # [B, S, V]
                lse = jax.nn.logsumexp(logits, -1)
                tgt = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
                return carry, tgt - lse

            _, comp = jax.lax.scan(jax.checkpoint(component), None, jnp.moveaxis(ctx, 2, 0))  # [K, B, S]
            return -jnp.mean(jax.nn.logsumexp(jnp.moveaxis(comp, 0, -1) + log_prior, -1))

        loss, g = jax.value_and_grad(nll)(head)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), head, g), loss

    head = {"prior": sds((d_model, mixtures), bf, mesh, P()),
            "latent": sds((mixtures, d_model, d_model), bf, mesh, P()),
            "embedding": sds((vocab, d_model), bf, mesh, P())}
    n = mesh.devices.size * seqs
    hidden = sds((n, seq_len, d_model), bf, mesh, P("d"))
    targets = sds((n, seq_len), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(head), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return mos_loss_step, (head, hidden, targets), kw


# 34.5 a scan over micro-batches whose every micro-batch's activations are kept for the backward pass


def _microbatch_scan_builder(mesh, micro, tokens, width, layers, remat):
    """Gradient accumulation written as one jax.value_and_grad of a lax.scan over `micro` micro-batches
    (the loss summed in the carry), the micro-batch input [micro, tokens, width] bf16 split over the
    devices on the token axis. The model is a bf16 residual GELU MLP (weights [layers, width, width]
    replicated, data parallel) scanned over its layers. remat=False: the micro-batch body is not
    rematerialised, so the backward pass of the outer scan keeps every layer's activations of every
    micro-batch (what the micro-batching was meant to avoid); remat=True: jax.checkpoint on the
    micro-batch body, one micro-batch's activations at a time. SGD, weights donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def accumulate_step(weights, micro_x, micro_y):
        def total_loss(weights):
            def one_microbatch(acc, xy):
                x, y = xy

                def layer(h, w):
                    return (h + jax.nn.gelu(h @ w)).astype(bf), None

                h, _ = jax.lax.scan(layer, x, weights["blocks"])
                return acc + jnp.mean((h.astype(f32) - y.astype(f32)) ** 2), None

            body = jax.checkpoint(one_microbatch) if remat else one_microbatch
            total, _ = jax.lax.scan(body, jnp.zeros((), f32), (micro_x, micro_y))
            return total / micro

        loss, g = jax.value_and_grad(total_loss)(weights)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), weights, g), loss

    weights = {"blocks": sds((layers, width, width), bf, mesh, P())}
    n = mesh.devices.size * tokens
    micro_x = sds((micro, n, width), bf, mesh, P(None, "d"))
    micro_y = sds((micro, n, width), bf, mesh, P(None, "d"))
    kw = {"out_shardings": (_shardings(weights), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return accumulate_step, (weights, micro_x, micro_y), kw


# 34.6 a tensor-parallel decode server whose KV cache is replicated while the heads are sharded


def _kv_cache_tp_builder(mesh, layers, batch, max_len, heads, head_dim, cache_spec):
    """One decode step of a multi-head-attention decoder served tensor-parallel over the 4 devices: the
    attention weights are sharded over heads (wq, wk, wv [layers, d, heads*head_dim] P(None, None, 'd'),
    wo [layers, heads*head_dim, d] P(None, 'd', None)), the MLP column/row parallel, bf16. The KV cache
    `kv_cache` = {"k", "v"} bf16[layers, batch, max_len, heads, head_dim] is updated in place at `pos`
    (donated) and attended over. cache_spec: () = the cache replicated (allocated with
    `jnp.zeros(...)` under a jit without out_shardings), (None, None, None, 'd', None) = split over heads
    like the attention weights."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    d = heads * head_dim

    def decode_step(weights, kv_cache, tokens_embed, pos):
        def layer(h, xs):
            w, k_cache, v_cache = xs
            q = (h @ w["wq"]).reshape(batch, heads, head_dim)
            k = (h @ w["wk"]).reshape(batch, 1, heads, head_dim)
            v = (h @ w["wv"]).reshape(batch, 1, heads, head_dim)
            k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, pos, 0, 0))
            v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, pos, 0, 0))
            s = jnp.einsum("bhd,bshd->bhs", q, k_cache).astype(f32) * head_dim ** -0.5
            s = jnp.where(jnp.arange(max_len)[None, None, :] <= pos, s, -1e30)
            a = jnp.einsum("bhs,bshd->bhd", jax.nn.softmax(s, -1).astype(bf), v_cache)
            h = h + a.reshape(batch, d) @ w["wo"]
            h = h + jax.nn.gelu(h @ w["w_in"]) @ w["w_out"]
            return h.astype(bf), (k_cache, v_cache)

        h, (k_new, v_new) = jax.lax.scan(layer, tokens_embed, (weights, kv_cache["k"], kv_cache["v"]))
        return {"k": k_new, "v": v_new}, h

    col, row = P(None, None, "d"), P(None, "d", None)
    weights = {"wq": sds((layers, d, d), bf, mesh, col), "wk": sds((layers, d, d), bf, mesh, col),
               "wv": sds((layers, d, d), bf, mesh, col), "wo": sds((layers, d, d), bf, mesh, row),
               "w_in": sds((layers, d, 4 * d), bf, mesh, col), "w_out": sds((layers, 4 * d, d), bf, mesh, row)}
    shape = (layers, batch, max_len, heads, head_dim)
    kv_cache = {"k": sds(shape, bf, mesh, P(*cache_spec)), "v": sds(shape, bf, mesh, P(*cache_spec))}
    tokens_embed = sds((batch, d), bf, mesh, P())
    pos = sds((), jnp.int32, mesh, P())
    kw = {"out_shardings": (_shardings(kv_cache), NamedSharding(mesh, P())), "donate_argnums": (1,)}
    return decode_step, (weights, kv_cache, tokens_embed, pos), kw


pair(
    "init_no_out_shardings", "v5e", "v5e:2x2",
    "Initialiser of a residual MLP trunk (24 layers of f32[8192, 8192]) and its Adam state, jitted on its own "
    "as jax.jit(init_train_state) without out_shardings: with only a replicated rng key as input, the weights and "
    "both zero moments (6 GiB each) come out replicated on every device, 18 GiB of outputs, beyond 15.75G.",
    "Fixed variant of init_no_out_shardings_v5e: out_shardings = the training step's FSDP shardings "
    "P(None, 'd', None) for the blocks and both moments; fits.",
    dict(category="aggregate", causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _init_replicated_builder, dict(layers=24, width=8192, sharded_out=False),
    dict(layers=24, width=8192, sharded_out=True),
    dump=False,
)

pair(
    "adagrad_accum_replicated", "v5e", "v5e:2x2",
    "DLRM-style click-through-rate model trained with Adagrad: the item-embedding table f32[16777216, 128] "
    "(8 GiB) is row-sharded over the 4 devices, but its Adagrad accumulator is replicated P(): 8 GiB of "
    "accumulator and its full-size update on every device beside the table's shard, beyond 15.75G.",
    "Fixed variant of adagrad_accum_replicated_v5e: the table's Adagrad accumulator sharded like the "
    "table, P('d', None); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["optimizer_state_unsharded", "replicated_tensor"]),
    _adagrad_accum_builder, dict(vocab=16 * 1024 * 1024, dim=128, batch=8192, hotness=32, accum_spec=()),
    dict(vocab=16 * 1024 * 1024, dim=128, batch=8192, hotness=32, accum_spec=("d", None)),
    dump=False,
)

pair(
    "donate_argnums_shifted", "v5e", "v5e:2x2",
    "Adam training of a bf16 residual MLP denoiser trunk with dropout (52 layers of bf16[8192, 8192], FSDP-sharded, "
    "f32 moments): dropout put an rng key first in the step's signature, step(rng, params, opt_state, batch), "
    "and donate_argnums stayed (0, 1): the key and the weights are donated, the 6.5 GiB of f32 moments per "
    "device are not and exist twice, beyond 15.75G.",
    "Fixed variant of donate_argnums_shifted_v5e: donate_argnums=(1, 2), the weights and the optimizer "
    "state; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _donate_shifted_builder, dict(layers=52, width=8192, tokens=2048, donate=(0, 1)),
    dict(layers=52, width=8192, tokens=2048, donate=(1, 2)),
    dump=False,
)

pair(
    "mixture_of_softmaxes_head", "v5e", "v5e:2x2",
    "Mixture-of-softmaxes LM head (15 components, vocabulary 32768, d=1024, bf16) on 16 sequences of 1024 "
    "tokens per device: all component logits [16, 1024, 15, 32768] are materialised (15 GiB) before the "
    "softmax over the vocabulary and the weighted sum over components, beyond 15.75G.",
    "Fixed variant of mixture_of_softmaxes_head_v5e: a lax.scan over the components under jax.checkpoint, "
    "each giving log softmax_k[target] from its own [B, S, V] logits; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation", "batch_too_large"]),
    _mos_builder, dict(seqs=16, seq_len=1024, d_model=1024, vocab=32768, mixtures=15, per_component=False),
    dict(seqs=16, seq_len=1024, d_model=1024, vocab=32768, mixtures=15, per_component=True),
    dump=False,
)

pair(
    "microbatch_scan_no_remat", "v5e", "v5e:2x2",
    "Gradient accumulation over 8 micro-batches written as one jax.value_and_grad of a lax.scan over them "
    "(a bf16 residual GELU MLP, 16 layers of bf16[4096, 4096] scanned, 4096 tokens per device per micro-batch), "
    "the micro-batch body not rematerialised: the backward pass keeps every layer's activations of all 8 "
    "micro-batches (4 GiB slots of bf16[8, 16, 4096, 4096]), beyond 15.75G.",
    "Fixed variant of microbatch_scan_no_remat_v5e: jax.checkpoint on the micro-batch body, one "
    "micro-batch's activations at a time; fits.",
    dict(category="aggregate", causes=["no_remat", "batch_too_large"]),
    _microbatch_scan_builder, dict(micro=8, tokens=4096, width=4096, layers=16, remat=False),
    dict(micro=8, tokens=4096, width=4096, layers=16, remat=True),
    dump=True,
)

pair(
    "kv_cache_replicated_tp", "v5e", "v5e:2x2",
    "One decode step of a 24-layer multi-head decoder (d=4096, 32 heads) served tensor-parallel over the 4 "
    "devices: the attention and MLP weights are sharded over heads, but the bf16 KV cache "
    "[24, 4, 8192, 32, 128] (6 GiB each for K and V) is replicated P(): 14.25 GiB of arguments per device and "
    "the cache's per-head copies while it is updated, beyond 15.75G.",
    "Fixed variant of kv_cache_replicated_tp_v5e: the KV cache split over heads like the attention weights, "
    "P(None, None, None, 'd', None); fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["replicated_tensor"]),
    _kv_cache_tp_builder, dict(layers=24, batch=4, max_len=8192, heads=32, head_dim=128, cache_spec=()),
    dict(layers=24, batch=4, max_len=8192, heads=32, head_dim=128, cache_spec=(None, None, None, "d", None)),
    dump=True,
)


# 34.7 rotary (RoPE) tables computed per layer for the maximum position, in f32, stacked for the layer scan


def _rope_tables_builder(mesh, seqs, seq_len, d_model, heads, layers, table_len):
    """A decoder with interleaved local and global attention layers (Gemma-style: each layer has its own
    rotary base, `rope_theta` f32[layers] from the config, e.g. 1e4 for local and 1e6 for global layers),
    bf16 weights replicated, data parallel, lax.scan over the layers with jax.checkpoint per block. Before
    the scan, `rope_cos` and `rope_sin` are computed in f32 for every layer for `table_len` positions
    ([layers, table_len, head_dim / 2] each) and passed to the scan as xs beside the weights; each block
    slices the first seq_len rows. table_len = max_position_embeddings (1048576, the config's maximum
    context) vs table_len = seq_len (the tables for the positions of this batch only). SGD, weights donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def rope_lm_step(weights, rope_theta, embeds, targets):
        half = hd // 2
        inv_freq = 1.0 / (rope_theta[:, None] ** (jnp.arange(half, dtype=f32)[None, :] * 2.0 / hd))  # [L, half]
        pos = jnp.arange(table_len, dtype=f32)
        angles = pos[None, :, None] * inv_freq[:, None, :]                                           # [L, T, half]
        rope_cos, rope_sin = jnp.cos(angles), jnp.sin(angles)

        def rotate(x, cos, sin):
            x1, x2 = x[..., :half].astype(f32), x[..., half:].astype(f32)
            c, s = cos[None, :seq_len, None, :], sin[None, :seq_len, None, :]
            return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1).astype(bf)

        def loss_fn(weights):
            def block(h, xs):
                w, cos, sin = xs
                b = h.shape[0]
                q = rotate((h @ w["wq"]).reshape(b, seq_len, heads, hd), cos, sin)
                k = rotate((h @ w["wk"]).reshape(b, seq_len, heads, hd), cos, sin)
                v = (h @ w["wv"]).reshape(b, seq_len, heads, hd)
                s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * hd ** -0.5
                s = jnp.where(jnp.tril(jnp.ones((seq_len, seq_len), bool)), s, -1e30)
                a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(b, seq_len, d_model)
                h = h + a @ w["wo"]
                h = h + jax.nn.gelu(h @ w["w_in"]) @ w["w_out"]
                return h.astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), embeds, (weights, rope_cos, rope_sin))
            return jnp.mean((h.astype(f32) - targets.astype(f32)) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(weights)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), weights, g), loss

    d = d_model
    weights = {"wq": sds((layers, d, d), bf, mesh, P()), "wk": sds((layers, d, d), bf, mesh, P()),
               "wv": sds((layers, d, d), bf, mesh, P()), "wo": sds((layers, d, d), bf, mesh, P()),
               "w_in": sds((layers, d, 4 * d), bf, mesh, P()), "w_out": sds((layers, 4 * d, d), bf, mesh, P())}
    rope_theta = sds((layers,), f32, mesh, P())
    n = mesh.devices.size * seqs
    embeds = sds((n, seq_len, d), bf, mesh, P("d"))
    targets = sds((n, seq_len, d), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(weights), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return rope_lm_step, (weights, rope_theta, embeds, targets), kw


pair(
    "rope_tables_max_len", "v5e", "v5e:2x2",
    "Decoder with interleaved local/global attention (24 layers, d=2048, per-layer rotary bases rope_theta), "
    "2 sequences of 2048 tokens per device: the per-layer RoPE tables rope_cos and rope_sin are computed in f32 "
    "for max_position_embeddings = 1048576 positions, f32[24, 1048576, 64] (6 GiB each), and fed to the layer "
    "scan beside the weights, beyond 15.75G.",
    "Fixed variant of rope_tables_max_len_v5e: the per-layer rotary tables computed for the batch's 2048 "
    "positions only ([24, 2048, 64] f32); fits.",
    dict(category="aggregate", causes=["large_activation", "f32_precision"]),
    _rope_tables_builder, dict(seqs=2, seq_len=2048, d_model=2048, heads=16, layers=24, table_len=1048576),
    dict(seqs=2, seq_len=2048, d_model=2048, heads=16, layers=24, table_len=2048),
    dump=False,
)


# ---- 35. more broken/fixed pairs (batch tpu24): other models, other names ---------------------
#
# Programs of kinds sections 13-34 do not have, on generations and topologies other than v5e:2x2 (a
# DINO-style EMA teacher update jitted on its own whose old teacher is not donated, Kahan-summation
# compensation buffers of bf16 weights replicated, a model soup whose stacked fine-tuned checkpoints are replicated,
# a neural HMM whose edge potentials [B, S, K, K] are built up front, DeepSeek-style sparse attention that
# gathers the selected keys for every query at once, ColBERT-style late interaction that scores every query
# token against every document token of the global batch at once).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu24 for which pairs keep their dumps and what did not go as first written.


# 35.1 a DINO-style EMA teacher update jitted on its own, the teacher not donated


def _ema_teacher_builder(mesh, layers, width, prototypes, donate):
    """Self-distillation without labels (DINO / BYOL): after each student step the teacher follows the
    student by EMA, written as its own function `update_teacher(teacher, student, momentum)` and jitted
    as `jax.jit(update_teacher)` (the teacher momentum follows a cosine schedule from 0.996 to 1, passed
    as an argument). Both networks are f32 residual MLP trunks (blocks [layers, width, width]) with a
    prototype head, FSDP-sharded P(None, 'd', None). donate=(): the old teacher is not donated, so the old
    and the new teacher live side by side beside the student; donate=(0,): the teacher donated."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def update_teacher(teacher, student, momentum):
        return _tm(lambda t, s: momentum * t + (1.0 - momentum) * s, teacher, student)

    def net():
        return {"blocks": sds((layers, width, width), f32, mesh, P(None, "d", None)),
                "head": sds((width, prototypes), f32, mesh, P(None, "d"))}

    teacher, student = net(), net()
    momentum = sds((), f32, mesh, P())
    kw = {"out_shardings": _shardings(teacher), "donate_argnums": donate}
    return update_teacher, (teacher, student, momentum), kw


# 35.2 Kahan-summation compensation buffers of bf16 weights kept replicated


def _kahan_builder(mesh, layers, width, tokens, comp_spec):
    """Pure-bf16 training with Kahan summation (the optimizer keeps, per weight, a bf16 compensation
    buffer `kahan_comp` holding the low-order bits lost by each bf16 update, as in "Revisiting BFloat16
    Training"): bf16 weights [layers, width, width] FSDP-sharded P(None, 'd', None), SGD with a bf16
    momentum sharded like the weights, everything donated. comp_spec: () = the compensation buffers
    replicated (created by `jax.tree.map(jnp.zeros_like, params)` under a jit without out_shardings and
    passed back in as they came out); (None, 'd', None) = sharded like the weights."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def kahan_sgd_step(params, opt_state, batch):
        def mse(params):
            def block(h, w):
                return (h + jax.nn.gelu(h @ w)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), batch["x"], params["layers"])
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(mse)(params)
        momentum = _tm(lambda m, g: (0.9 * m + g).astype(bf), opt_state["momentum"], grads)

        def kahan_add(p, m, c):
            y = (-1e-3 * m - c).astype(bf)
            t = (p + y).astype(bf)
            c = ((t - p) - y).astype(bf)
            return t, c

        out = _tm(kahan_add, params, momentum, opt_state["kahan_comp"])
        params = jax.tree_util.tree_map(lambda o: o[0], out, is_leaf=lambda x: isinstance(x, tuple))
        comp = jax.tree_util.tree_map(lambda o: o[1], out, is_leaf=lambda x: isinstance(x, tuple))
        return params, {"momentum": momentum, "kahan_comp": comp}, loss

    shape = (layers, width, width)
    params = {"layers": sds(shape, bf, mesh, P(None, "d", None))}
    opt_state = {"momentum": {"layers": sds(shape, bf, mesh, P(None, "d", None))},
                 "kahan_comp": {"layers": sds(shape, bf, mesh, P(*comp_spec))}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return kahan_sgd_step, (params, opt_state, batch), kw


# 35.3 a model soup: the stacked fine-tuned checkpoints replicated on every device


def _soup_builder(mesh, checkpoints, layers, width, stack_spec):
    """Weight averaging of fine-tuned checkpoints (a "model soup" / task-arithmetic merge): the K
    checkpoints of a bf16 residual MLP trunk are restored and stacked, `soup_stack` {"blocks":
    bf16[K, layers, width, width]}, and merged with learned per-checkpoint coefficients (softmax of
    `soup_logits` f32[K]) in f32, the merged weights sharded FSDP-style over the 16 devices.
    stack_spec: () = the stack replicated (jnp.stack of the restored arrays, placed with
    jax.device_put(stack, NamedSharding(mesh, P()))); (None, None, 'd', None) = sharded like the merged
    weights."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def merge_soup(soup_stack, soup_logits):
        coeffs = jax.nn.softmax(soup_logits)
        return _tm(lambda s: jnp.einsum("k,k...->...", coeffs, s.astype(f32)).astype(bf), soup_stack)

    soup_stack = {"blocks": sds((checkpoints, layers, width, width), bf, mesh, P(*stack_spec))}
    soup_logits = sds((checkpoints,), f32, mesh, P())
    kw = {"out_shardings": {"blocks": NamedSharding(mesh, P(None, "d", None))}}
    return merge_soup, (soup_stack, soup_logits), kw


# 35.4 a neural HMM whose edge potentials [B, S, K, K] are built before the forward algorithm


def _hmm_potentials_builder(mesh, seqs, seq_len, states, d_model, upfront):
    """A neural hidden Markov model (a latent-state language model): emission scores from a bf16 encoder
    state h [B, S, d] projected onto K states, a learned log transition matrix [K, K], the log-likelihood by
    the forward algorithm (lax.scan over positions, logsumexp over the previous state), data parallel.
    upfront=True: as a linear-chain CRF library takes its input, the edge potentials
    log_potentials[b, t, i, j] = transition[i, j] + emission[b, t, j] are built for the whole sequence in
    f32 ([B, S, K, K]) and scanned over; upfront=False: the potentials of one position are formed inside
    the scan body (under jax.checkpoint), [B, K, K] at a time. SGD on the parameters, donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def hmm_step(params, hidden):
        def neg_log_lik(params):
            emission = jax.nn.log_softmax((hidden @ params["emit"]).astype(f32), -1)          # [B, S, K]
            trans = jax.nn.log_softmax(params["transition"], -1)                               # [K, K]
            b = hidden.shape[0]
            alpha0 = jnp.full((b, states), -jnp.log(float(states)), f32) + emission[:, 0]
            if upfront:
                log_potentials = trans[None, None] + emission[:, 1:, None, :]                  # [B, S-1, K, K]

                def fwd(alpha, pot):
                    return jax.nn.logsumexp(alpha[:, :, None] + pot, 1), None

                alpha, _ = jax.lax.scan(fwd, alpha0, jnp.moveaxis(log_potentials, 1, 0))
            else:
                def fwd(alpha, em):
                    return jax.nn.logsumexp(alpha[:, :, None] + trans[None] + em[:, None, :], 1), None

                alpha, _ = jax.lax.scan(jax.checkpoint(fwd), alpha0, jnp.moveaxis(emission[:, 1:], 1, 0))
            return -jnp.mean(jax.nn.logsumexp(alpha, -1))

        loss, g = jax.value_and_grad(neg_log_lik)(params)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), params, g), loss

    params = {"emit": sds((d_model, states), bf, mesh, P()), "transition": sds((states, states), f32, mesh, P())}
    n = mesh.devices.size * seqs
    hidden = sds((n, seq_len, d_model), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return hmm_step, (params, hidden), kw


# 35.5 DeepSeek-style sparse attention that gathers the selected keys for every query at once


def _sparse_attn_gather_builder(mesh, seqs, seq_len, heads, latent_dim, rope_dim, topk, index_dim, q_block):
    """Prefill of one attention layer with a lightning indexer (DeepSeek-V3.2-style sparse attention): a
    cheap low-dim indexer scores every key for every query (bf16 [B, S, S]), the top-k keys per query are
    selected (causal), and multi-head attention runs over the shared compressed KV latent (MLA, one latent
    [B, S, latent_dim + rope_dim] for all heads) of the selected keys only. q_block=None: the selected
    latents are gathered for every query at once, kv_selected [B, S, topk, latent_dim + rope_dim];
    q_block=N: lax.map over blocks of N queries, each gathering only its own selection. Inference (no
    gradient), batch sharded."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    dk = latent_dim + rope_dim

    def sparse_prefill(q_latent, kv_latent, q_index, k_index):
        def attend(q, qi, rows):
            s_idx = jnp.einsum("bqe,bke->bqk", qi, k_index)                                   # [B, q, S]
            causal = jnp.arange(seq_len)[None, None, :] <= rows[None, :, None]
            s_idx = jnp.where(causal, s_idx, jnp.asarray(-jnp.inf, s_idx.dtype))
            _, sel = jax.lax.top_k(s_idx, topk)                                                  # [B, q, k]
            kv_sel = jax.vmap(lambda kv, i: kv[i])(kv_latent, sel)                               # [B, q, k, dk]
            s = jnp.einsum("bqhd,bqkd->bqhk", q, kv_sel).astype(f32) * dk ** -0.5
            p = jax.nn.softmax(s, -1).astype(bf)
            return jnp.einsum("bqhk,bqkd->bqhd", p, kv_sel[..., :latent_dim])

        rows = jnp.arange(seq_len)
        if q_block is None:
            return attend(q_latent, q_index, rows)
        nb = seq_len // q_block
        b = q_latent.shape[0]
        qs = q_latent.reshape(b, nb, q_block, heads, dk).swapaxes(0, 1)
        qis = q_index.reshape(b, nb, q_block, index_dim).swapaxes(0, 1)
        out = jax.lax.map(lambda a: attend(a[0], a[1], a[2]), (qs, qis, rows.reshape(nb, q_block)))
        return out.swapaxes(0, 1).reshape(b, seq_len, heads, latent_dim)

    n = mesh.devices.size * seqs
    q_latent = sds((n, seq_len, heads, dk), bf, mesh, P("d"))
    kv_latent = sds((n, seq_len, dk), bf, mesh, P("d"))
    q_index = sds((n, seq_len, index_dim), bf, mesh, P("d"))
    k_index = sds((n, seq_len, index_dim), bf, mesh, P("d"))
    kw = {"out_shardings": NamedSharding(mesh, P("d"))}
    return sparse_prefill, (q_latent, kv_latent, q_index, k_index), kw


pair(
    "ema_teacher_update_undonated", "v6e", "v6e:2x2",
    "DINO-style EMA teacher update jitted on its own, jax.jit(update_teacher)(teacher, student, momentum), on "
    "v6e: teacher and student are f32 residual MLP trunks (192 blocks of f32[8192, 8192] each, FSDP-sharded, "
    "12 GiB per device each); the teacher is not donated, so the old and the new teacher live beside the "
    "student, 36 GiB, beyond 31.25G.",
    "Fixed variant of ema_teacher_update_undonated_v6e: donate_argnums=(0,), the old teacher donated; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["no_donation"]),
    _ema_teacher_builder, dict(layers=192, width=8192, prototypes=8192, donate=()),
    dict(layers=192, width=8192, prototypes=8192, donate=(0,)),
    dump=True,
)

pair(
    "kahan_comp_replicated", "v4", "v4:2x2x1",
    "Pure-bf16 training with Kahan summation on v4 (8 TensorCores): 64 layers of bf16[8192, 8192] FSDP-sharded, "
    "SGD momentum sharded like them, but the bf16 Kahan compensation buffers kahan_comp (8 GiB) are replicated on "
    "every core, and the compensated update is computed full-size (old and new kahan_comp in one 8 GiB slot), "
    "beyond 15.25G.",
    "Fixed variant of kahan_comp_replicated_v4: kahan_comp sharded like the weights, P(None, 'd', None); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["optimizer_state_unsharded", "replicated_tensor"]),
    _kahan_builder, dict(layers=64, width=8192, tokens=1024, comp_spec=()),
    dict(layers=64, width=8192, tokens=1024, comp_spec=(None, "d", None)),
    dump=False,
)

pair(
    "soup_stack_replicated", "v5e", "v5e:4x4",
    "Model soup on v5e:4x4 (16 devices): 20 fine-tuned checkpoints of a bf16 residual MLP trunk (28 blocks of "
    "bf16[4096, 4096], 896 MiB each) stacked as soup_stack bf16[20, 28, 4096, 4096] and placed replicated P() "
    "(17.5 GiB on every device), merged in f32 with softmax(soup_logits) coefficients, beyond 15.75G.",
    "Fixed variant of soup_stack_replicated_v5e: the stacked checkpoints sharded like the merged weights, "
    "P(None, None, 'd', None); fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed"]),
    _soup_builder, dict(checkpoints=20, layers=28, width=4096, stack_spec=()),
    dict(checkpoints=20, layers=28, width=4096, stack_spec=(None, None, "d", None)),
    dump=False,
)

pair(
    "hmm_edge_potentials", "v5e", "v5e:4x4",
    "Neural HMM (512 latent states) trained by the forward algorithm on v5e:4x4 (16 devices), 8 sequences of "
    "1024 positions per device: the edge potentials transition + emission are built up front in f32, "
    "[8, 1023, 512, 512] (8 GiB per device), and scanned over, beyond 15.75G.",
    "Fixed variant of hmm_edge_potentials_v5e: the potentials of one position formed inside the forward scan "
    "body (under jax.checkpoint), [8, 512, 512] at a time; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation", "f32_precision"]),
    _hmm_potentials_builder, dict(seqs=8, seq_len=1024, states=512, d_model=1024, upfront=True),
    dict(seqs=8, seq_len=1024, states=512, d_model=1024, upfront=False),
    dump=False,
)

pair(
    "sparse_attn_gather_all_queries", "v5p", "v5p:2x2x1",
    "Prefill of a DeepSeek-style sparse attention layer (lightning indexer, top-2048 keys per query, MLA latent "
    "of 576) on v5p, 2 sequences of 32768 tokens per device: the selected KV latents are gathered for every "
    "query at once, kv_selected bf16[2, 32768, 2048, 576] (144 GiB per device), beyond 95.74G.",
    "Fixed variant of sparse_attn_gather_all_queries_v5p: lax.map over blocks of 2048 queries, each gathering "
    "only its own selection; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _sparse_attn_gather_builder, dict(seqs=2, seq_len=32768, heads=16, latent_dim=512, rope_dim=64, topk=2048,
                                      index_dim=128, q_block=None),
    dict(seqs=2, seq_len=32768, heads=16, latent_dim=512, rope_dim=64, topk=2048, index_dim=128, q_block=2048),
    dump=False,
)


# 35.6 ColBERT-style late interaction with in-batch negatives: all query-token x doc-token scores at once


def _colbert_builder(mesh, queries, q_len, d_len, dim, doc_block):
    """Training a ColBERT-style retriever: query and document token embeddings (bf16 [B, S, dim], L2-normalised
    outputs of the encoder, here given as inputs with a learned bf16 projection [dim, dim] applied), the
    late-interaction score MaxSim(q, d) = sum_i max_j <q_i, d_j>, and a softmax cross-entropy over in-batch
    negatives: every device scores its queries against the documents of the whole global batch (all-gathered).
    doc_block=None: the token-pair scores [Bq, Bd, Sq, Sd] of all query/document pairs at once (f32);
    doc_block=N: lax.map over blocks of N documents under jax.checkpoint, each giving its [Bq, N] MaxSim
    scores. SGD on the projection, donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def colbert_step(proj, q_tokens, d_tokens):
        def loss_fn(proj):
            q = q_tokens @ proj["w"]
            d = d_tokens @ proj["w"]
            d_all = jax.lax.with_sharding_constraint(d, NamedSharding(mesh, P()))             # in-batch negatives

            def maxsim(d_blk):
                s = jnp.einsum("qid,pjd->qpij", q, d_blk).astype(f32)                        # [Bq, Bd, Sq, Sd]
                return jnp.sum(jnp.max(s, -1), -1)                                            # [Bq, Bd]

            if doc_block is None:
                scores = maxsim(d_all)
            else:
                nd = d_all.shape[0] // doc_block
                blocks = d_all.reshape(nd, doc_block, d_len, dim)
                scores = jax.lax.map(jax.checkpoint(maxsim), blocks)                         # [nd, Bq, blk]
                scores = jnp.moveaxis(scores, 0, 1).reshape(q.shape[0], nd * doc_block)
            n = q.shape[0]
            labels = jnp.arange(n)                                                            # the positive of query i is doc i
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(scores, -1), labels[:, None], -1))

        loss, g = jax.value_and_grad(loss_fn)(proj)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), proj, g), loss

    n = mesh.devices.size * queries
    proj = {"w": sds((dim, dim), bf, mesh, P())}
    q_tokens = sds((n, q_len, dim), bf, mesh, P("d"))
    d_tokens = sds((n, d_len, dim), bf, mesh, P("d"))
    kw = {"out_shardings": (_shardings(proj), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return colbert_step, (proj, q_tokens, d_tokens), kw


pair(
    "colbert_token_pair_scores", "v4", "v4:2x2x1",
    "Training a ColBERT-style retriever on v4 (8 TensorCores), 256 queries of 32 tokens and 256 documents of 512 "
    "tokens per core, in-batch negatives over the global batch: the late-interaction token-pair scores of every "
    "query against all 2048 documents, [256, 2048, 32, 512] (16 GiB per core in bf16), are materialised before "
    "the max over document tokens, beyond 15.25G.",
    "Fixed variant of colbert_token_pair_scores_v4: lax.map over blocks of 64 documents under jax.checkpoint, "
    "each giving its [256, 64] MaxSim scores; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "batch_too_large"]),
    _colbert_builder, dict(queries=256, q_len=32, d_len=512, dim=128, doc_block=None),
    dict(queries=256, q_len=32, d_len=512, dim=128, doc_block=64),
    dump=False,
)

# ---- 36. more broken/fixed pairs (batch tpu25): other models, other names ---------------------
#
# Programs of kinds sections 13-35 do not have (an elastic-weight-consolidation penalty whose Fisher diagonal
# and anchor weights are replicated beside FSDP weights, regex partition rules ported from another codebase whose
# stale name leaves the MLP down projection and its Adam moments replicated, a ZeRO-Offload-style optimizer
# whose moments were meant for host memory but are placed in HBM, skip-gram embedding tables sharded by rows
# whose lookups are computed for the global batch on every device, a restarted GMRES solve whose Krylov basis
# grows with the restart length, a fused Pallas cross-entropy kernel whose block spans the whole vocabulary,
# evolution strategies whose population noise is drawn at once).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu25 for which pairs keep their dumps and what did not go as first written.


def _lm_block(h, w, heads, f32, bf):
    """One pre-norm decoder block (causal multi-head attention + SwiGLU MLP), bf16 activations; the
    weights are Llama-named: attn/{q,k,v,o}_proj, mlp/{gate,up,down}_proj."""
    import jax
    import jax.numpy as jnp

    def rms(x):
        x = x.astype(f32)
        return (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)).astype(bf)

    b, s, d = h.shape
    hd = d // heads
    x = rms(h)
    q = (x @ w["attn/q_proj"].astype(bf)).reshape(b, s, heads, hd)
    k = (x @ w["attn/k_proj"].astype(bf)).reshape(b, s, heads, hd)
    v = (x @ w["attn/v_proj"].astype(bf)).reshape(b, s, heads, hd)
    sc = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * hd ** -0.5
    sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, -1).astype(bf), v).reshape(b, s, d)
    h = h + a @ w["attn/o_proj"].astype(bf)
    x = rms(h)
    g = jax.nn.silu(x @ w["mlp/gate_proj"].astype(bf)) * (x @ w["mlp/up_proj"].astype(bf))
    return (h + g @ w["mlp/down_proj"].astype(bf)).astype(bf)


def _lm_block_shapes(layers, d_model, d_ff):
    return {"attn/q_proj": (layers, d_model, d_model), "attn/k_proj": (layers, d_model, d_model),
            "attn/v_proj": (layers, d_model, d_model), "attn/o_proj": (layers, d_model, d_model),
            "mlp/gate_proj": (layers, d_model, d_ff), "mlp/up_proj": (layers, d_model, d_ff),
            "mlp/down_proj": (layers, d_ff, d_model)}


# 36.1 elastic weight consolidation: the Fisher diagonal and the anchor weights replicated beside FSDP weights


def _ewc_builder(mesh, layers, d_model, d_ff, heads, seqs, seq_len, ewc_spec):
    """Continual fine-tuning of a decoder LM on a new task with an elastic-weight-consolidation penalty
    (Kirkpatrick et al.): loss = next-task MSE-on-hidden-states stand-in + lambda/2 * sum F * (theta -
    theta_star)^2, where `ewc_state = {"fisher": ..., "anchor_params": ...}` holds the previous task's
    Fisher diagonal and its final weights (f32, shaped like the weights). The f32 weights and the Adam
    moments are FSDP-sharded P(None, 'd', None) and donated; the EWC state is read-only. ewc_spec: () = the
    Fisher and the anchor replicated (computed after the previous task by a jitted function without
    out_shardings and saved/restored as they came out); (None, 'd', None) = sharded like the weights."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    ewc_lambda = 100.0

    def ewc_train_step(params, opt_state, ewc_state, batch):
        def loss_fn(params):
            blk = jax.checkpoint(lambda h, w: (_lm_block(h, w, heads, f32, bf), None))
            h, _ = jax.lax.scan(blk, batch["hidden"], params)
            task = jnp.mean((h.astype(f32) - batch["target"].astype(f32)) ** 2)
            penalty = sum(jnp.sum(f * (p - a) ** 2) for f, p, a in zip(
                jax.tree.leaves(ewc_state["fisher"]), jax.tree.leaves(params),
                jax.tree.leaves(ewc_state["anchor_params"])))
            return task + 0.5 * ewc_lambda * penalty

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    shapes = _lm_block_shapes(layers, d_model, d_ff)
    params = {k: sds(v, f32, mesh, P(None, "d", None)) for k, v in shapes.items()}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {k: sds(v, f32, mesh, P(None, "d", None)) for k, v in shapes.items()},
                 "nu": {k: sds(v, f32, mesh, P(None, "d", None)) for k, v in shapes.items()}}
    ewc_state = {"fisher": {k: sds(v, f32, mesh, P(*ewc_spec)) for k, v in shapes.items()},
                 "anchor_params": {k: sds(v, f32, mesh, P(*ewc_spec)) for k, v in shapes.items()}}
    n = mesh.devices.size * seqs
    batch = {"hidden": sds((n, seq_len, d_model), bf, mesh, P("d")),
             "target": sds((n, seq_len, d_model), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return ewc_train_step, (params, opt_state, ewc_state, batch), kw


# 36.2 regex partition rules ported from another codebase: a stale name leaves mlp/down_proj replicated


def _partition_rules_builder(mesh, layers, d_model, d_ff, heads, seqs, seq_len, down_rule):
    """Megatron-style tensor parallelism over the 8 TensorCores, the specs given by regex partition rules
    matched against the '/'-joined parameter names (as t5x / EasyLM / levanter do), the last rule a
    catch-all `('.*', P())`. The rules were written for T5-style names (mlp/wi_0, mlp/wi_1, mlp/wo) and
    ported to a Llama checkpoint (mlp/gate_proj, mlp/up_proj, mlp/down_proj) by renaming the first two only:
    down_rule='mlp/wo' (the stale rule) leaves mlp/down_proj, and its Adam moments that follow the same
    rules, replicated on every core; down_rule='mlp/down_proj' shards it over its input (row) axis.
    f32 weights and Adam state, donated; the batch is replicated (pure tensor parallelism)."""
    import re

    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    rules = [(r"attn/(q|k|v)_proj", P(None, None, "d")), (r"attn/o_proj", P(None, "d", None)),
             (r"mlp/(gate|up)_proj", P(None, None, "d")), (down_rule, P(None, "d", None)), (r".*", P())]

    def match_partition_rules(names):
        return {n: next(spec for pat, spec in rules if re.search(pat, n)) for n in names}

    shapes = _lm_block_shapes(layers, d_model, d_ff)
    specs = match_partition_rules(shapes)

    def tp_train_step(params, opt_state, batch):
        def loss_fn(params):
            blk = jax.checkpoint(lambda h, w: (_lm_block(h, w, heads, f32, bf), None))
            h, _ = jax.lax.scan(blk, batch["hidden"], params)
            return jnp.mean((h.astype(f32) - batch["target"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    params = {k: sds(v, f32, mesh, specs[k]) for k, v in shapes.items()}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {k: sds(v, f32, mesh, specs[k]) for k, v in shapes.items()},
                 "nu": {k: sds(v, f32, mesh, specs[k]) for k, v in shapes.items()}}
    batch = {"hidden": sds((seqs, seq_len, d_model), bf, mesh, P()),
             "target": sds((seqs, seq_len, d_model), bf, mesh, P())}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return tp_train_step, (params, opt_state, batch), kw


# 36.3 ZeRO-Offload-style optimizer whose moments were meant for host memory but are placed in HBM


def _optimizer_offload_builder(mesh, layers, width, tokens, moments_memory):
    """FSDP training of a bf16 residual MLP trunk (blocks [layers, width, width], P(None, 'd', None)) with
    Adam whose f32 moments are meant to live in host memory (the config's offload_optimizer=True, as in
    ZeRO-Offload / MaxText's optimizer_memory_host_offload): the gradients are moved to pinned host memory,
    the moment update and the Adam direction are computed on the host (compute_on('device_host')), and only
    the bf16 direction comes back to HBM. moments_memory='device' (the moments' shardings built without
    memory_kind, so they are placed in HBM, and the update runs on the device); 'pinned_host' (the
    shardings carry memory_kind='pinned_host'). Weights and moments donated."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental.compute_on import compute_on
    bf, f32 = jnp.bfloat16, jnp.float32
    spec = P(None, "d", None)
    on_host = moments_memory == "pinned_host"

    def adam_moments(mu, nu, g):
        g = g.astype(f32)
        mu = 0.9 * mu + 0.1 * g
        nu = 0.999 * nu + 0.001 * g * g
        return mu, nu, (mu / (jnp.sqrt(nu) + 1e-8)).astype(bf)

    def offload_train_step(params, opt_state, batch):
        def mse(params):
            def block(h, w):
                return (h + jax.nn.gelu(h @ w)).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), batch["x"], params["blocks"])
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(mse)(params)
        mu, nu = opt_state["mu"]["blocks"], opt_state["nu"]["blocks"]
        g = grads["blocks"]
        if on_host:
            g = jax.device_put(g, NamedSharding(mesh, spec, memory_kind="pinned_host"))
            mu, nu, direction = compute_on("device_host")(jax.jit(adam_moments))(mu, nu, g)
            direction = jax.device_put(direction, NamedSharding(mesh, spec, memory_kind="device"))
        else:
            mu, nu, direction = adam_moments(mu, nu, g)
        params = {"blocks": (params["blocks"] - 1e-4 * direction).astype(bf)}
        return params, {"mu": {"blocks": mu}, "nu": {"blocks": nu}}, loss

    def arr(dtype, memory_kind="device"):
        return jax.ShapeDtypeStruct((layers, width, width), dtype,
                                    sharding=NamedSharding(mesh, spec, memory_kind=memory_kind))

    params = {"blocks": arr(bf)}
    opt_state = {"mu": {"blocks": arr(f32, moments_memory)}, "nu": {"blocks": arr(f32, moments_memory)}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return offload_train_step, (params, opt_state, batch), kw


# 36.4 a restarted GMRES solve whose Krylov basis grows with the restart length


def _gmres_restart_builder(mesh, fields, grid, restart):
    """Pressure projection of a batch of incompressible-flow simulations: the Poisson-like system
    (I - nu * Laplacian) p = div, a 7-point matrix-free stencil (jnp.roll) on periodic [grid]^3 f32 fields,
    the batch of fields sharded over the devices and solved as one block-diagonal system with
    jax.scipy.sparse.linalg.gmres(..., restart=restart, maxiter=...). GMRES keeps its whole Krylov basis,
    restart + 1 vectors shaped like the right-hand side, in the loop carry. Inference only."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def helmholtz(p):
        lap = sum(jnp.roll(p, s, a) for a in (1, 2, 3) for s in (1, -1)) - 6.0 * p
        return p - 0.1 * lap

    def pressure_solve(div, p_prev):
        p, _ = jax.scipy.sparse.linalg.gmres(helmholtz, div, x0=p_prev, tol=1e-6, restart=restart,
                                             maxiter=4, solve_method="incremental")
        return p

    shape = (mesh.devices.size * fields, grid, grid, grid)
    div = sds(shape, f32, mesh, P("d"))
    p_prev = sds(shape, f32, mesh, P("d"))
    return pressure_solve, (div, p_prev), {"out_shardings": NamedSharding(mesh, P("d"))}


# 36.5 a fused Pallas cross-entropy kernel whose block spans the whole vocabulary


def _pallas_xent_builder(mesh, rows, vocab, block_t, block_v):
    """Fused softmax cross-entropy over precomputed bf16 logits [T, V] as a Pallas TPU kernel (per device
    under jax.shard_map, tokens over 'd'): grid (T/block_t, V/block_v), a running max and sum-exp per row
    in VMEM scratch (online logsumexp) and the target logit picked in the block that holds it; the loss
    written at the last vocabulary block. block_v = vocab (the first version: "one row block holds the
    whole vocabulary, no online update needed") makes each step hold [block_t, V] bf16 (double-buffered)
    and its f32 exp; block_v = 8192 streams the vocabulary."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    nv = vocab // block_v

    def xent_kernel(logits_ref, tgt_ref, loss_ref, m_ref, l_ref, t_ref):
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            t_ref[...] = jnp.zeros_like(t_ref)

        x = logits_ref[...].astype(jnp.float32)
        m_new = jnp.maximum(m_ref[...], jnp.max(x, axis=-1, keepdims=True))
        l_ref[...] = jnp.exp(m_ref[...] - m_new) * l_ref[...] + jnp.sum(jnp.exp(x - m_new), -1, keepdims=True)
        m_ref[...] = m_new
        cols = j * block_v + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
        t_ref[...] += jnp.sum(jnp.where(cols == tgt_ref[...], x, 0.0), -1, keepdims=True)

        @pl.when(j == nv - 1)
        def _():
            loss_ref[...] = m_ref[...] + jnp.log(l_ref[...]) - t_ref[...]

    def per_shard(logits, targets):
        t = logits.shape[0]
        return pl.pallas_call(
            xent_kernel,
            out_shape=jax.ShapeDtypeStruct((t, 1), jnp.float32),
            grid=(t // block_t, nv),
            in_specs=[pl.BlockSpec((block_t, block_v), lambda i, j: (i, j)),
                      pl.BlockSpec((block_t, 1), lambda i, j: (i, 0))],
            out_specs=pl.BlockSpec((block_t, 1), lambda i, j: (i, 0)),
            scratch_shapes=[pltpu.VMEM((block_t, 1), jnp.float32)] * 3,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        )(logits, targets)

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"), check_vma=False)

    def fused_cross_entropy(logits, targets):
        return jnp.mean(fn(logits, targets))

    n = mesh.devices.size * rows
    logits = sds((n, vocab), jnp.bfloat16, mesh, P("d"))
    targets = sds((n, 1), jnp.int32, mesh, P("d"))
    return fused_cross_entropy, (logits, targets), {}


# 36.6 OpenAI-style evolution strategies: the perturbations of the whole population drawn at once


def _es_builder(mesh, population, obs_dim, hidden, act_dim, episodes, regenerate):
    """Evolution strategies (OpenAI-ES / evosax-style ask-evaluate-tell) fitting a policy MLP
    (obs_dim -> hidden -> hidden -> hidden -> act_dim, tanh) as a flat parameter vector `es_state["mean"]`
    (f32 [D], replicated, unravelled by a parameter reshaper), antithetic Gaussian perturbations, fitness
    = -MSE to expert actions on a batch of observations, centred-rank fitness shaping, an SGD step on the
    mean. The population is sharded over the devices. regenerate=False: `ask` draws the noise of the whole
    (device-local) population at once, eps f32 [pop, D], and the perturbed parameter vectors are evaluated
    with jax.vmap; regenerate=True: the standard seed trick, each member's noise regenerated from its key
    inside lax.map, once to evaluate and once to accumulate the gradient estimate."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    shapes = [(obs_dim, hidden), (hidden,), (hidden, hidden), (hidden,), (hidden, hidden), (hidden,),
              (hidden, act_dim), (act_dim,)]
    sizes = [int(jnp.prod(jnp.array(sh))) for sh in shapes]
    dim = sum(sizes)

    def unravel(flat):
        out, i = [], 0
        for sh, n in zip(shapes, sizes):
            out.append(flat[i:i + n].reshape(sh))
            i += n
        return out

    def policy(flat, obs):
        w = unravel(flat)
        h = obs
        for k in range(0, len(w) - 2, 2):
            h = jnp.tanh(h @ w[k] + w[k + 1])
        return h @ w[-2] + w[-1]

    def fitness(flat, obs, expert):
        return -jnp.mean((policy(flat, obs) - expert) ** 2)

    def per_shard(mean, sigma, member_keys, obs, expert):
        pop = member_keys.shape[0]
        if regenerate:
            def eval_member(k):
                eps = jax.random.normal(k, (dim,), f32)
                return fitness(mean + sigma * eps, obs, expert) - fitness(mean - sigma * eps, obs, expert)

            diff = jax.lax.map(eval_member, member_keys)                              # [pop]
            def acc(g, kw):
                k, w = kw
                return g + w * jax.random.normal(k, (dim,), f32), None

            ranks = jnp.argsort(jnp.argsort(diff)).astype(f32) / (pop - 1) - 0.5
            grad, _ = jax.lax.scan(acc, jnp.zeros((dim,), f32), (member_keys, ranks))
        else:
            eps = jax.vmap(lambda k: jax.random.normal(k, (dim,), f32))(member_keys)    # [pop, D]
            f_pos = jax.vmap(fitness, in_axes=(0, None, None))(mean + sigma * eps, obs, expert)
            f_neg = jax.vmap(fitness, in_axes=(0, None, None))(mean - sigma * eps, obs, expert)
            diff = f_pos - f_neg
            ranks = jnp.argsort(jnp.argsort(diff)).astype(f32) / (pop - 1) - 0.5
            grad = ranks @ eps
        grad = jax.lax.psum(grad, "d") / (2 * sigma * pop * mesh.devices.size)
        return mean + 0.01 * grad, jax.lax.pmean(jnp.mean(diff), "d")

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(), P("d"), P(), P()), out_specs=(P(), P()),
                       check_vma=False)

    def es_generation(es_state, member_keys, obs, expert):
        mean, stat = fn(es_state["mean"], es_state["sigma"], member_keys, obs, expert)
        return {"mean": mean, "sigma": es_state["sigma"]}, stat

    es_state = {"mean": sds((dim,), f32, mesh, P()), "sigma": sds((), f32, mesh, P())}
    member_keys = jax.ShapeDtypeStruct((mesh.devices.size * population, 2), jnp.uint32,
                                       sharding=NamedSharding(mesh, P("d")))
    obs = sds((episodes, obs_dim), f32, mesh, P())
    expert = sds((episodes, act_dim), f32, mesh, P())
    kw = {"out_shardings": (_shardings(es_state), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return es_generation, (es_state, member_keys, obs, expert), kw


# 36.7 skip-gram with negative sampling: vocabulary-parallel (row-sharded) tables looked up by global ids


def _sgns_builder(mesh, pairs, negatives, vocab, dim, table_spec):
    """word2vec-style skip-gram with negative sampling (SGNS): f32 input and output embedding tables
    `params = {"in_embed", "out_embed"}` [vocab, dim], a batch of (center, context) id pairs and K sampled
    negatives per pair (sharded over 'd'), the logistic loss of the dot products, plain SGD, tables
    donated. table_spec=('d', None): the tables sharded vocabulary-parallel, by rows (the usual choice for
    a large vocabulary): a row-sharded gather cannot be done locally, so the SPMD partitioner gathers the
    ids of every device and computes masked lookups for the whole global batch on each device, and the
    gradients' scatter-add likewise; (None, 'd'): sharded over the embedding dimension, every device
    looks up its columns of the rows it needs."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def sgns_step(params, batch):
        def loss_fn(params):
            c = params["in_embed"][batch["center"]]                                     # [B, dim]
            o = params["out_embed"][batch["context"]]                                   # [B, dim]
            n = params["out_embed"][batch["negatives"]]                                 # [B, K, dim]
            pos = jnp.sum(c * o, -1)
            neg = jnp.einsum("bd,bkd->bk", c, n)
            return -jnp.mean(jax.nn.log_sigmoid(pos) + jnp.sum(jax.nn.log_sigmoid(-neg), -1))

        loss, g = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 0.025 * g, params, g), loss

    params = {"in_embed": sds((vocab, dim), f32, mesh, P(*table_spec)),
              "out_embed": sds((vocab, dim), f32, mesh, P(*table_spec))}
    b = mesh.devices.size * pairs
    batch = {"center": sds((b,), jnp.int32, mesh, P("d")), "context": sds((b,), jnp.int32, mesh, P("d")),
             "negatives": sds((b, negatives), jnp.int32, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return sgns_step, (params, batch), kw


pair(
    "ewc_fisher_anchor_replicated", "v6e", "v6e:2x2",
    "Continual fine-tuning of a decoder LM (12 Llama-style blocks, d_model 4096, d_ff 16384, f32 weights and "
    "Adam moments FSDP-sharded) with an elastic-weight-consolidation penalty on v6e: the previous task's Fisher "
    "diagonal and anchor weights (ewc_state, f32, 12 GiB each) are replicated on every device, 33.06G of "
    "arguments, beyond 31.25G.",
    "Fixed variant of ewc_fisher_anchor_replicated_v6e: ewc_state sharded like the weights, "
    "P(None, 'd', None); fits.",
    dict(category="arguments", category_also=["aggregate"], causes=["replicated_tensor", "arguments_exceed"]),
    _ewc_builder, dict(layers=12, d_model=4096, d_ff=16384, heads=32, seqs=2, seq_len=2048, ewc_spec=()),
    dict(layers=12, d_model=4096, d_ff=16384, heads=32, seqs=2, seq_len=2048, ewc_spec=(None, "d", None)),
    dump=False,
)

pair(
    "partition_rules_stale_name", "v4", "v4:2x2x1",
    "Tensor-parallel training of a Llama-style decoder (12 blocks, d_model 4096, d_ff 14336, f32 weights and "
    "Adam) on v4 (8 TensorCores) whose regex partition rules were ported from T5 names: the stale rule "
    "'mlp/wo' matches nothing, so mlp/down_proj and its two Adam moments fall through to ('.*', P()) and are "
    "replicated on every core, beyond 15.25G.",
    "Fixed variant of partition_rules_stale_name_v4: the rule renamed to 'mlp/down_proj', the down projection "
    "and its moments sharded over their input axis; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _partition_rules_builder, dict(layers=12, d_model=4096, d_ff=14336, heads=32, seqs=4, seq_len=2048,
                                   down_rule="mlp/wo"),
    dict(layers=12, d_model=4096, d_ff=14336, heads=32, seqs=4, seq_len=2048, down_rule="mlp/down_proj"),
    dump=False,
)

pair(
    "optimizer_offload_in_hbm", "v5p", "v5p:2x2x1",
    "FSDP training of a bf16 residual MLP trunk (160 blocks of bf16[16384, 16384]) with Adam on v5p whose "
    "config asks for optimizer offload, but the f32 moments' shardings carry no memory_kind: mu and nu (40 GiB "
    "each per device) are placed in HBM and updated on the device, 100.06G of arguments, beyond 95.74G.",
    "Fixed variant of optimizer_offload_in_hbm_v5p: the moments' shardings with memory_kind='pinned_host', "
    "the gradients moved to the host and the moment update computed there (compute_on('device_host')); fits.",
    dict(category="arguments", causes=["arguments_exceed", "f32_precision"],
         basis="the fixed twin's memory_analysis peak counts the 80 GiB of pinned_host moments "
               "(host_argument_size_in_bytes); in HBM it logs XLA::TPU program HBM usage: 45.09G / 95.74G "
               "beside 20.06 GiB of arguments"),
    _optimizer_offload_builder, dict(layers=160, width=16384, tokens=1024, moments_memory="device"),
    dict(layers=160, width=16384, tokens=1024, moments_memory="pinned_host"),
    dump=True,
)

pair(
    "gmres_restart_basis", "v5e", "v5e:4x4",
    "Pressure projection of a batch of flow simulations on v5e:4x4 (16 devices), 2 periodic 256^3 f32 fields "
    "per device, solved with jax.scipy.sparse.linalg.gmres(restart=127): the Krylov basis of 128 vectors, "
    "f32[2, 256, 256, 256, 128] (16 GiB per device), is carried through the Arnoldi loop, beyond 15.75G.",
    "Fixed variant of gmres_restart_basis_v5e: restart=30, a basis of 31 vectors; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _gmres_restart_builder, dict(fields=2, grid=256, restart=127), dict(fields=2, grid=256, restart=30),
    dump=False,
)

pair(
    "pallas_xent_vocab_block", "v6e", "v6e:2x2",
    "A fused Pallas cross-entropy kernel over bf16 logits [4096, 262144] per device on v6e whose block is "
    "128 rows by the whole vocabulary: the double-buffered input window (128 MiB) and the register "
    "allocator's spill slots for the f32 row block exceed the core's 127.94M of VMEM.",
    "Fixed variant of pallas_xent_vocab_block_v6e: block_v = 8192, the vocabulary streamed through an "
    "online logsumexp; fits.",
    dict(category="vmem", causes=["kernel_tiling"]),
    _pallas_xent_builder, dict(rows=4096, vocab=262144, block_t=128, block_v=262144),
    dict(rows=4096, vocab=262144, block_t=128, block_v=8192),
    dump=True,
)


pair(
    "es_population_noise_upfront", "v5e", "v5e:2x2",
    "Evolution strategies (antithetic OpenAI-ES) on a policy MLP of 8558608 parameters as a flat f32 vector, "
    "512 population members per device on v5e: ask() draws the noise of the whole population at once, eps "
    "f32[512, 8558608] (16.32 GiB per device), and the perturbed vectors are evaluated with jax.vmap, beyond "
    "15.75G.",
    "Fixed variant of es_population_noise_upfront_v5e: each member's noise regenerated from its key inside "
    "lax.map (the seed trick), once for the fitness and once for the gradient estimate; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _es_builder, dict(population=512, obs_dim=64, hidden=2048, act_dim=16, episodes=256, regenerate=False),
    dict(population=512, obs_dim=64, hidden=2048, act_dim=16, episodes=256, regenerate=True),
    dump=False,
)


pair(
    "sgns_vocab_parallel_lookup", "v5e", "v5e:4x4",
    "word2vec skip-gram with negative sampling on v5e:4x4 (16 devices): f32 input and output embedding tables "
    "[4194304, 512] sharded by rows (vocabulary-parallel), 49152 (center, context) pairs and 5 negatives per "
    "pair per device: the row-sharded lookups are computed masked for the global batch of 786432 pairs on "
    "every device (f32[786432, 5, 512] slots), beyond 15.75G.",
    "Fixed variant of sgns_vocab_parallel_lookup_v5e: the tables sharded over the embedding dimension, "
    "P(None, 'd'), each device looking up its columns; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "batch_too_large"]),
    _sgns_builder, dict(pairs=49152, negatives=5, vocab=4194304, dim=512, table_spec=("d", None)),
    dict(pairs=49152, negatives=5, vocab=4194304, dim=512, table_spec=(None, "d")),
    dump=False,
)


# ---- 37. more broken/fixed pairs (batch tpu26): other models, other names ---------------------
#
# Programs of kinds sections 13-36 do not have (a synchronized batch norm written with an all_gather of the
# activations, a multi-tenant LoRA server whose adapter pool was meant for host memory but sits in HBM, the
# Muon optimizer whose Newton-Schulz step runs on momentum gathered for every layer, a paged-attention decode
# kernel whose block table is scalar-prefetched into SMEM, a MuZero-style tree search whose tree stores every
# node's latent state in f32, a full-resolution denoising conv net whose 32 feature channels are padded to 128
# lanes).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu26 for which pairs keep their dumps and what did not go as first written.


# 37.1 synchronized batch norm written as an all_gather of the activations (global batch on every core)


def _syncbn_builder(mesh, images, size, width, blocks, classes, stats):
    """A ResNet-style conv net (3x3 convs, NHWC, bf16 weights and activations, BN statistics in f32) trained
    data-parallel with synchronized batch norm, written per device under jax.shard_map (pmap-style code):
    stats='all_gather' (the first version: `xg = lax.all_gather(x, 'batch', tiled=True)` and the mean and
    variance taken over the gathered global batch, as a port of torch's SyncBatchNorm might read);
    stats='psum' (the per-device sum and sum of squares all-reduced, only [C] vectors cross devices).
    The loss is differentiated through the shard_map; SGD on replicated params, donated."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n_dev = mesh.devices.size

    def batch_norm(x, gamma, beta):
        x32 = x.astype(f32)
        if stats == "all_gather":
            xg = jax.lax.all_gather(x32, "d", axis=0, tiled=True)            # [global batch, H, W, C]
            mean = jnp.mean(xg, (0, 1, 2))
            var = jnp.mean(jnp.square(xg - mean), (0, 1, 2))
        else:
            cnt = x.shape[0] * x.shape[1] * x.shape[2] * n_dev
            mean = jax.lax.psum(jnp.sum(x32, (0, 1, 2)), "d") / cnt
            var = jax.lax.psum(jnp.sum(jnp.square(x32), (0, 1, 2)), "d") / cnt - jnp.square(mean)
        return ((x32 - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta).astype(bf)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w.astype(bf), (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def forward(params, imgs, labels):
        h = jax.nn.relu(batch_norm(conv(imgs, params["stem"]["kernel"]), params["stem"]["bn_scale"],
                                   params["stem"]["bn_bias"]))
        for i in range(blocks):
            p = params[f"block_{i}"]
            y = jax.nn.relu(batch_norm(conv(h, p["conv1"]["kernel"]), p["bn1"]["scale"], p["bn1"]["bias"]))
            y = batch_norm(conv(y, p["conv2"]["kernel"]), p["bn2"]["scale"], p["bn2"]["bias"])
            h = jax.nn.relu(h + y)
        logits = jnp.mean(h.astype(f32), (1, 2)) @ params["head"]["kernel"]
        xent = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))
        return jax.lax.pmean(xent, "d")

    loss_fn = jax.shard_map(forward, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=P())

    def train_step(params, imgs, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, imgs, labels)
        return _tm(lambda p, g: p - 0.1 * g, params, grads), loss

    def r(*shape):
        return sds(shape, f32, mesh, P())

    params = {"stem": {"kernel": r(3, 3, 3, width), "bn_scale": r(width), "bn_bias": r(width)},
              "head": {"kernel": r(width, classes)}}
    for i in range(blocks):
        params[f"block_{i}"] = {"conv1": {"kernel": r(3, 3, width, width)}, "bn1": {"scale": r(width), "bias": r(width)},
                                "conv2": {"kernel": r(3, 3, width, width)}, "bn2": {"scale": r(width), "bias": r(width)}}
    n = n_dev * images
    imgs = sds((n, size, size, 3), bf, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return train_step, (params, imgs, labels), kw


# 37.2 a multi-tenant LoRA server whose adapter pool was meant for host memory but is placed in HBM


def _lora_pool_builder(mesh, layers, d_model, d_ff, heads, rank, n_adapters, seqs, seq_len, pool_memory):
    """S-LoRA / multi-LoRA serving of a tensor-parallel bf16 decoder (heads and MLP sharded over 'd'): every
    request of the batch names its adapter (`adapter_ids`), the LoRA deltas on q_proj and v_proj are applied
    per request, (x A[id]) B[id]. The pool of all tenants' adapters `lora_pool = {"q_proj": {"lora_A",
    "lora_B"}, "v_proj": ...}` [n_adapters, layers, ...] is sharded over the model dimension like the base.
    pool_memory='device': the config's adapters_on_host=True was not carried into the pool's shardings (no
    memory_kind), the whole pool is resident in HBM; 'pinned_host': the pool lives in pinned host memory, the
    batch's adapters are gathered there (compute_on('device_host')) and only they are brought to HBM."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental.compute_on import compute_on
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    on_host = pool_memory == "pinned_host"

    def take(pool, ids):
        return _tm(lambda a: a[ids], pool)

    def prefill(base, lora_pool, adapter_ids, hidden):
        if on_host:
            ids = jax.device_put(adapter_ids, NamedSharding(mesh, P(), memory_kind="pinned_host"))
            active = compute_on("device_host")(jax.jit(take))(lora_pool, ids)
            active = _tm(lambda a, s: jax.device_put(a, NamedSharding(mesh, s.spec, memory_kind="device")),
                         active, pool_sh)
        else:
            active = take(lora_pool, adapter_ids)                          # [B, L, ...] per request
        act = _tm(lambda a: jnp.moveaxis(a, 1, 0), active)                 # layer-major for the scan

        def block(h, w):
            b, s, d = h.shape
            x = h * jax.lax.rsqrt(jnp.mean(jnp.square(h.astype(f32)), -1, keepdims=True) + 1e-6).astype(bf)

            def lora(name):
                return jnp.einsum("bsr,brd->bsd", jnp.einsum("bsd,bdr->bsr", x, w[name]["lora_A"]),
                                  w[name]["lora_B"])

            q = (x @ w["q_proj"] + lora("lora_q")).reshape(b, s, heads, hd)
            k = (x @ w["k_proj"]).reshape(b, s, heads, hd)
            v = (x @ w["v_proj"] + lora("lora_v")).reshape(b, s, heads, hd)
            sc = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * hd ** -0.5
            sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
            a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, -1).astype(bf), v).reshape(b, s, d)
            h = h + a @ w["o_proj"]
            x = h * jax.lax.rsqrt(jnp.mean(jnp.square(h.astype(f32)), -1, keepdims=True) + 1e-6).astype(bf)
            g = jax.nn.silu(x @ w["gate_proj"]) * (x @ w["up_proj"])
            return h + g @ w["down_proj"], None

        ws = dict(base)
        ws["lora_q"], ws["lora_v"] = act["q_proj"], act["v_proj"]
        h, _ = jax.lax.scan(block, hidden, ws)
        return h[:, -1]

    col, row = P(None, None, "d"), P(None, "d", None)
    base = {"q_proj": sds((layers, d_model, d_model), bf, mesh, col),
            "k_proj": sds((layers, d_model, d_model), bf, mesh, col),
            "v_proj": sds((layers, d_model, d_model), bf, mesh, col),
            "o_proj": sds((layers, d_model, d_model), bf, mesh, row),
            "gate_proj": sds((layers, d_model, d_ff), bf, mesh, col),
            "up_proj": sds((layers, d_model, d_ff), bf, mesh, col),
            "down_proj": sds((layers, d_ff, d_model), bf, mesh, row)}
    # lora_A [n, L, D, r] over the input dim (like the row-parallel input), lora_B [n, L, r, D] over the output
    pool_sh = {"q_proj": {"lora_A": NamedSharding(mesh, P(None, None, "d", None)),
                          "lora_B": NamedSharding(mesh, P(None, None, None, "d"))}}
    pool_sh["v_proj"] = dict(pool_sh["q_proj"])
    mk = "pinned_host" if on_host else "device"
    shapes = {"lora_A": (n_adapters, layers, d_model, rank), "lora_B": (n_adapters, layers, rank, d_model)}
    lora_pool = {m: {k: jax.ShapeDtypeStruct(shapes[k], bf, sharding=NamedSharding(
        mesh, pool_sh[m][k].spec, memory_kind=mk)) for k in shapes} for m in ("q_proj", "v_proj")}
    adapter_ids = sds((seqs,), jnp.int32, mesh, P())
    hidden = sds((seqs, seq_len, d_model), bf, mesh, P())
    return prefill, (base, lora_pool, adapter_ids, hidden), {"out_shardings": NamedSharding(mesh, P())}


# 37.3 a paged-attention decode kernel whose block table is scalar-prefetched into SMEM


def _paged_attention_builder(mesh, seqs, max_len, page_size, heads, head_dim, pool_pages):
    """Decode-step attention over a paged KV cache (vLLM / JetStream-style serving) as a Pallas TPU kernel,
    per device under jax.shard_map (sequences over 'd'): multi-query attention, q [B, H, hd], one K and one V
    page pool [num_pages, page_size, hd] per device, `block_tables` int32 [B, max_len // page_size] and
    `seq_lens` int32 [B] passed as scalar-prefetch operands (PrefetchScalarGridSpec), so they are copied to
    SMEM before the grid runs; the K/V index maps read the page number from the table. Grid (B, pages per
    sequence), an online softmax over the pages in VMEM scratch, pages past the length skipped. The number
    of pages per sequence is max_len / page_size."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    bf, f32 = jnp.bfloat16, jnp.float32
    pages_per_seq = max_len // page_size

    def kernel(lens_ref, tables_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        b, p = pl.program_id(0), pl.program_id(1)

        @pl.when(p == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        @pl.when(p * page_size < lens_ref[b])
        def _():
            q = q_ref[0]                                                            # [H, hd]
            k = k_ref[0]                                                            # [page, hd]
            s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=f32)
            pos = p * page_size + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(pos < lens_ref[b], s * head_dim ** -0.5, -1e30)
            m_new = jnp.maximum(m_ref[...], jnp.max(s, -1, keepdims=True))
            e = jnp.exp(s - m_new)
            alpha = jnp.exp(m_ref[...] - m_new)
            l_ref[...] = alpha * l_ref[...] + jnp.sum(e, -1, keepdims=True)
            acc_ref[...] = alpha * acc_ref[...] + jnp.dot(e.astype(bf), v_ref[0], preferred_element_type=f32)
            m_ref[...] = m_new

        @pl.when(p == pages_per_seq - 1)
        def _():
            o_ref[0] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)

    def per_shard(seq_lens, block_tables, q, k_pages, v_pages):
        b = q.shape[0]
        page_map = lambda i, p, lens, tables: (tables[i, p], 0, 0)
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2,
                grid=(b, pages_per_seq),
                in_specs=[pl.BlockSpec((1, heads, head_dim), lambda i, p, lens, tables: (i, 0, 0)),
                          pl.BlockSpec((1, page_size, head_dim), page_map),
                          pl.BlockSpec((1, page_size, head_dim), page_map)],
                out_specs=pl.BlockSpec((1, heads, head_dim), lambda i, p, lens, tables: (i, 0, 0)),
                scratch_shapes=[pltpu.VMEM((heads, 1), f32), pltpu.VMEM((heads, 1), f32),
                                pltpu.VMEM((heads, head_dim), f32)]),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        )(seq_lens, block_tables, q, k_pages, v_pages)

    fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"),) * 5, out_specs=P("d"), check_vma=False)

    def paged_decode_attention(seq_lens, block_tables, q, k_pages, v_pages):
        return fn(seq_lens, block_tables, q, k_pages, v_pages)

    nd = mesh.devices.size
    n = nd * seqs
    seq_lens = sds((n,), jnp.int32, mesh, P("d"))
    block_tables = sds((n, pages_per_seq), jnp.int32, mesh, P("d"))
    q = sds((n, heads, head_dim), bf, mesh, P("d"))
    k_pages = sds((nd * pool_pages, page_size, head_dim), bf, mesh, P("d"))
    v_pages = sds((nd * pool_pages, page_size, head_dim), bf, mesh, P("d"))
    return paged_decode_attention, (seq_lens, block_tables, q, k_pages, v_pages), {}


# 37.4 a MuZero-style tree search whose tree stores every node's latent state, in f32


def _mcts_builder(mesh, batch, sims, board, channels, emb_dtype):
    """Acting with a MuZero-style search (an mctx-like batched tree in arrays): the representation net turns
    each position into a latent state [board, board, channels]; every simulation selects a node (PUCT over
    the expanded nodes), expands it with the dynamics net (two 3x3 convs on latent + action plane) and the
    prediction net, writes the new node's latent into `tree.embeddings` [B, sims + 1, latent] and backs the
    value up. The tree is the carry of a lax.fori_loop over the simulations. The nets are f32 (as the
    reference pseudocode has them); emb_dtype: the dtype of the stored latents (f32 as the nets give them, or
    bf16, cast when written and upcast when read back)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n_nodes = sims + 1
    A = board * board + 1
    lat = board * board * channels

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def dynamics(params, s, action):
        plane = jax.nn.one_hot(action, board * board, dtype=f32).reshape(-1, board, board, 1)
        x = jnp.concatenate([s, plane], -1)
        h = jax.nn.relu(conv(x, params["dyn_conv1"]))
        return jax.nn.relu(conv(h, params["dyn_conv2"]) + s)

    def prediction(params, s):
        pooled = jnp.mean(s, (1, 2))
        return pooled @ params["policy_head"], jnp.tanh(pooled @ params["value_head"])[:, 0]

    def search(params, observations):
        b = observations.shape[0]
        s0 = jax.nn.relu(conv(observations, params["repr_conv"]))
        logits0, v0 = prediction(params, s0)
        emb = jnp.zeros((b, n_nodes, lat), emb_dtype).at[:, 0].set(s0.reshape(b, lat).astype(emb_dtype))
        tree = {"embeddings": emb,
                "node_visits": jnp.zeros((b, n_nodes), f32).at[:, 0].set(1.0),
                "node_values": jnp.zeros((b, n_nodes), f32).at[:, 0].set(v0),
                "children_prior": jnp.zeros((b, n_nodes, A), f32).at[:, 0].set(jax.nn.softmax(logits0)),
                "children_visits": jnp.zeros((b, n_nodes, A), f32)}

        def simulate(sim, tree):
            expanded = jnp.arange(n_nodes) <= sim
            q = tree["node_values"] / jnp.maximum(tree["node_visits"], 1.0)
            score = jnp.where(expanded, q + 1.25 / (1.0 + tree["node_visits"]), -jnp.inf)
            parent = jnp.argmax(score, -1)                                            # [B]
            rows = jnp.arange(b)
            prior = tree["children_prior"][rows, parent]
            visits = tree["children_visits"][rows, parent]
            action = jnp.argmax(prior / (1.0 + visits), -1)
            s = tree["embeddings"][rows, parent].astype(f32).reshape(b, board, board, channels)
            s_new = dynamics(params, s, action)
            logits, v = prediction(params, s_new)
            node = sim + 1
            return {"embeddings": jax.lax.dynamic_update_index_in_dim(
                        tree["embeddings"], s_new.reshape(b, lat).astype(emb_dtype), node, 1),
                    "node_visits": tree["node_visits"].at[:, node].set(1.0).at[rows, parent].add(1.0),
                    "node_values": tree["node_values"].at[:, node].set(v).at[rows, parent].add(v),
                    "children_prior": tree["children_prior"].at[:, node].set(jax.nn.softmax(logits)),
                    "children_visits": tree["children_visits"].at[rows, parent, action].add(1.0)}

        tree = jax.lax.fori_loop(0, sims, simulate, tree)
        root_visits = tree["children_visits"][:, 0]
        return root_visits / jnp.maximum(jnp.sum(root_visits, -1, keepdims=True), 1.0), tree["node_values"][:, 0]

    params = {"repr_conv": sds((3, 3, 17, channels), f32, mesh, P()),
              "dyn_conv1": sds((3, 3, channels + 1, channels), f32, mesh, P()),
              "dyn_conv2": sds((3, 3, channels, channels), f32, mesh, P()),
              "policy_head": sds((channels, A), f32, mesh, P()),
              "value_head": sds((channels, 1), f32, mesh, P())}
    observations = sds((mesh.devices.size * batch, board, board, 17), f32, mesh, P("d"))
    kw = {"out_shardings": (NamedSharding(mesh, P("d")), NamedSharding(mesh, P("d")))}
    return search, (params, observations), kw


# 37.5 Muon: the Newton-Schulz orthogonalization run on momentum gathered (replicated) for every layer at once


def _muon_builder(mesh, layers, width, tokens, ortho_spec):
    """FSDP training (weights P(None, 'd', None), f32, donated) of a residual MLP trunk scanned over `layers`
    blocks with the Muon optimizer: momentum `muon_momentum` (f32, sharded like the weights) and the update
    orthogonalized by 5 Newton-Schulz iterations in bf16 (the quintic of Keller Jordan's reference), vmapped
    over the stacked layers. The Newton-Schulz matmuls need whole matrices, so the momentum is resharded
    first: ortho_spec=() (the first version: `with_sharding_constraint(m, P())`, every matrix of every layer
    gathered on every device); ortho_spec=('d', None, None): the matrices distributed over the devices by
    layer (each device orthogonalizes whole matrices of its layers), the result resharded back."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    spec = P(None, "d", None)

    def newton_schulz(g, steps=5):
        a, b, c = 3.4445, -4.7750, 2.0315
        x = g.astype(bf)
        x = x / (jnp.linalg.norm(x.astype(f32)) + 1e-7).astype(bf)
        for _ in range(steps):
            A = x @ x.T
            B = b * A + c * A @ A
            x = a * x + B @ x
        return x

    def muon_train_step(params, muon_momentum, batch):
        def loss_fn(params):
            def block(h, w):
                return (h + jax.nn.gelu(h @ w.astype(bf))).astype(bf), None

            h, _ = jax.lax.scan(jax.checkpoint(block), batch["x"], params["mlp"]["kernel"])
            return jnp.mean((h.astype(f32) - batch["y"].astype(f32)) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        m = 0.95 * muon_momentum["mlp"]["kernel"] + grads["mlp"]["kernel"]
        m_o = jax.lax.with_sharding_constraint(m, NamedSharding(mesh, P(*ortho_spec)))
        u = jax.vmap(newton_schulz)(m_o)
        u = jax.lax.with_sharding_constraint(u, NamedSharding(mesh, spec))
        new = params["mlp"]["kernel"] - 0.02 * u.astype(f32)
        return {"mlp": {"kernel": new}}, {"mlp": {"kernel": m}}, loss

    params = {"mlp": {"kernel": sds((layers, width, width), f32, mesh, spec)}}
    muon_momentum = {"mlp": {"kernel": sds((layers, width, width), f32, mesh, spec)}}
    n = mesh.devices.size * tokens
    batch = {"x": sds((n, width), bf, mesh, P("d")), "y": sds((n, width), bf, mesh, P("d"))}
    kw = {"out_shardings": (_shardings(params), _shardings(muon_momentum), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return muon_train_step, (params, muon_momentum, batch), kw


# 37.6 a full-resolution denoising conv net with 32 feature channels: every activation padded to 128 lanes


def _denoiser_builder(mesh, images, size, channels, depth, s2d):
    """A DnCNN-style image denoiser (a stack of 3x3 conv + ReLU, residual learning: the net predicts the
    noise) trained data-parallel on noisy/clean RGB crops, bf16 activations, f32 params replicated and
    donated, SGD. s2d=1: the convs run at full resolution with `channels` feature maps (NHWC, so the
    feature axis, 32 wide, is the minor, 128-lane tiled dimension of every activation); s2d=2: the image is
    pixel-unshuffled first (space-to-depth, 2x2 pixels into the channels: [B, H/2, W/2, 12]), the convs run
    with 4 * channels feature maps on the half-resolution grid (the same number of activation values per
    layer, 128 lanes filled), and the predicted noise is shuffled back (depth-to-space)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    cin = 3 * s2d * s2d
    feat = channels * s2d * s2d

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w.astype(bf), (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def unshuffle(x):
        b, h, w, c = x.shape
        x = x.reshape(b, h // s2d, s2d, w // s2d, s2d, c)
        return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, h // s2d, w // s2d, s2d * s2d * c)

    def shuffle(x):
        b, h, w, c = x.shape
        x = x.reshape(b, h, w, s2d, s2d, c // (s2d * s2d))
        return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, h * s2d, w * s2d, c // (s2d * s2d))

    def denoise_train_step(params, noisy, clean):
        def loss_fn(params):
            x = noisy.astype(bf)
            if s2d > 1:
                x = unshuffle(x)
            h = jax.nn.relu(conv(x, params["conv_in"]["kernel"]))
            for i in range(depth):
                h = jax.nn.relu(conv(h, params[f"conv_{i}"]["kernel"]))
            noise = conv(h, params["conv_out"]["kernel"])
            if s2d > 1:
                noise = shuffle(noise)
            return jnp.mean(jnp.square(noisy - noise.astype(f32) - clean))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"conv_in": {"kernel": sds((3, 3, cin, feat), f32, mesh, P())},
              "conv_out": {"kernel": sds((3, 3, feat, cin), f32, mesh, P())}}
    for i in range(depth):
        params[f"conv_{i}"] = {"kernel": sds((3, 3, feat, feat), f32, mesh, P())}
    n = mesh.devices.size * images
    noisy = sds((n, size, size, 3), f32, mesh, P("d"))
    clean = sds((n, size, size, 3), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return denoise_train_step, (params, noisy, clean), kw


pair(
    "syncbn_all_gather_stats", "v4", "v4:2x2x1",
    "A ResNet-style conv net (3 conv-BN layers of width 128 on 512x512 images, 12 per TensorCore) trained "
    "data-parallel on v4 (8 TensorCores) with synchronized batch norm written under shard_map as an all_gather "
    "of the activations: every core holds the f32 activations of the global batch of 96 images, "
    "f32[96, 512, 512, 128] (12 GiB), beyond 15.25G.",
    "Fixed variant of syncbn_all_gather_stats_v4: the batch-norm statistics from the per-core sum and sum of "
    "squares, psum'd ([C] vectors); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "large_activation", "batch_too_large"]),
    _syncbn_builder, dict(images=12, size=512, width=128, blocks=1, classes=1000, stats="all_gather"),
    dict(images=12, size=512, width=128, blocks=1, classes=1000, stats="psum"),
    dump=False,
)

pair(
    "lora_adapter_pool_in_hbm", "v6e", "v6e:2x2",
    "Multi-tenant LoRA serving (S-LoRA style) of a tensor-parallel 32-layer bf16 decoder (d_model 4096) on v6e: "
    "the pool of 2048 tenants' rank-64 q_proj/v_proj adapters was meant for host memory, but its shardings carry "
    "no memory_kind, so the pool (32 GiB per device) sits in HBM beside the base weights, 35.14G of arguments, "
    "beyond 31.25G.",
    "Fixed variant of lora_adapter_pool_in_hbm_v6e: the pool's shardings with memory_kind='pinned_host', the "
    "batch's adapters gathered on the host (compute_on('device_host')) and only they moved to HBM; fits.",
    dict(category="arguments", causes=["arguments_exceed"],
         basis="the fixed twin's memory_analysis peak counts the 32 GiB pinned_host adapter pool; in HBM it logs "
               "XLA::TPU program HBM usage: 1.48G / 31.25G beside the base weights"),
    _lora_pool_builder, dict(layers=32, d_model=4096, d_ff=11008, heads=32, rank=64, n_adapters=2048, seqs=8,
                             seq_len=2048, pool_memory="device"),
    dict(layers=32, d_model=4096, d_ff=11008, heads=32, rank=64, n_adapters=2048, seqs=8, seq_len=2048,
         pool_memory="pinned_host"),
    dump=False,
)

pair(
    "muon_ortho_gathered", "v5p", "v5p:2x2x1",
    "FSDP training of a residual MLP trunk (192 blocks of f32[8192, 8192]) with the Muon optimizer on v5p: the "
    "momentum is constrained to P() before the vmapped Newton-Schulz orthogonalization, so every device holds "
    "the whole f32[192, 8192, 8192] momentum (48 GiB) and its bf16 iterates, beyond 95.74G.",
    "Fixed variant of muon_ortho_gathered_v5p: the momentum resharded by layer, P('d', None, None), each device "
    "orthogonalizing whole matrices of its 48 layers; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _muon_builder, dict(layers=192, width=8192, tokens=4096, ortho_spec=()),
    dict(layers=192, width=8192, tokens=4096, ortho_spec=("d", None, None)),
    dump=False,
)

pair(
    "paged_attention_block_table_smem", "v5e", "v5e:2x2",
    "A Pallas paged-attention decode kernel on v5e (256 sequences per device, up to 32768 tokens, 16-token "
    "pages): the block table int32[256, 2048] is a scalar-prefetch operand, copied to SMEM (2 MiB) before the "
    "grid runs, beyond the 1 MiB of SMEM.",
    "Fixed variant of paged_attention_block_table_smem_v5e: 64-token pages, a block table of int32[256, 512] "
    "(512 KiB); fits.",
    dict(category="vmem", causes=["kernel_tiling"]),
    _paged_attention_builder, dict(seqs=256, max_len=32768, page_size=16, heads=16, head_dim=128, pool_pages=65536),
    dict(seqs=256, max_len=32768, page_size=64, heads=16, head_dim=128, pool_pages=16384),
    dump=True,
)

pair(
    "mcts_tree_latents_f32", "v5e", "v5e:4x4",
    "Acting with a MuZero-style tree search on v5e:4x4 (16 devices), 96 Go positions per device and 400 "
    "simulations: the tree stores every node's 19x19x256 latent state in f32, tree.embeddings "
    "f32[96, 401, 92416] (13.25 GiB per device), carried through the simulation loop, beyond 15.75G.",
    "Fixed variant of mcts_tree_latents_f32_v5e: the latents stored in bfloat16 (cast when written, upcast when "
    "read); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "large_activation", "batch_too_large"]),
    _mcts_builder, dict(batch=96, sims=400, board=19, channels=256, emb_dtype="float32"),
    dict(batch=96, sims=400, board=19, channels=256, emb_dtype="bfloat16"),
    dump=True,
)

pair(
    "denoiser_32ch_full_res", "v5e", "v5e:2x2",
    "A DnCNN-style denoiser (14 3x3 convs with 32 feature maps, bf16 activations) trained on 1024x1024 RGB crops, "
    "4 per device on v5e: NHWC activations whose minor dimension is the 32 feature channels are tiled to 128 "
    "lanes, every activation slot padded about 4x, beyond 15.75G.",
    "Fixed variant of denoiser_32ch_full_res_v5e: the crops pixel-unshuffled 2x2 first (space-to-depth), the "
    "convs run with 128 feature maps on the half-resolution grid (the same number of activation values, 128 "
    "lanes filled), depth-to-space at the end; fits.",
    dict(category="aggregate", causes=["padding", "batch_too_large", "no_remat"]),
    _denoiser_builder, dict(images=4, size=1024, channels=32, depth=12, s2d=1),
    dict(images=4, size=1024, channels=32, depth=12, s2d=2),
    dump=False,
)


# ---- 38. more broken/fixed pairs (batch tpu27): other models, other names ---------------------
#
# Programs of kinds sections 13-37 do not have (a circular (vmapped-stage) pipeline whose stacked stage
# weights are left replicated; a FedAvg round simulated on one slice whose per-client model copies are
# replicated; a Mixtral-style MoE decoder served on a slice too small for its weights; a latent-diffusion VAE
# decoder run in f32 because of its force_upcast setting; a VoxelNet-style LiDAR backbone that scatters its
# points into a dense 3-D voxel grid).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu27 for which pairs keep their dumps and what did not go as first written.


# 38.1 a circular pipeline (stages vmapped over a stage axis) whose stacked stage weights are left replicated


def _pipeline_builder(mesh, stages, layers_per_stage, d_model, d_ff, microbatches, mb_tokens, stage_spec):
    """GPipe-style pipeline parallelism written the praxis / MaxText way: the weights of all stages stacked
    `params["stages"]["w_in"|"w_out"]` [S, layers per stage, ...], the pipeline state [S, mb, D] constrained
    to P('d') on its stage axis, every tick a jax.vmap of the stage function over the stage axis, then a
    jnp.roll passes each stage's output to the next and the next micro-batch enters stage 0; S + M - 1 ticks
    under lax.scan, the last stage's outputs collected. f32 weights, bf16 compute, SGD, donated.
    stage_spec=() (the first version: the stacked weights placed P(), every device holds every stage);
    stage_spec=('d',): the stage axis of the weights over the devices, like the pipeline state."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    state_sh = NamedSharding(mesh, P("d"))

    def stage_fn(w, x):
        def layer(h, lw):
            y = jax.nn.gelu(h.astype(bf) @ lw["w_in"].astype(bf)) @ lw["w_out"].astype(bf)
            return h + y.astype(f32), None

        h, _ = jax.lax.scan(jax.checkpoint(layer), x, w)
        return h

    def pipeline_train_step(params, microbatch_inputs, microbatch_targets):
        def loss_fn(params):
            ticks = microbatches + stages - 1

            def tick(state, t):
                x_in = jax.lax.dynamic_index_in_dim(microbatch_inputs, jnp.minimum(t, microbatches - 1), 0,
                                                    keepdims=False)
                state = jax.lax.with_sharding_constraint(state.at[0].set(x_in), state_sh)
                state = jax.vmap(stage_fn)(params["stages"], state)
                out = state[-1]
                return jax.lax.with_sharding_constraint(jnp.roll(state, 1, axis=0), state_sh), out

            state0 = jnp.zeros((stages, mb_tokens, d_model), f32)
            _, outs = jax.lax.scan(tick, state0, jnp.arange(ticks))
            return jnp.mean(jnp.square(outs[stages - 1:] - microbatch_targets))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-2 * g, params, grads), loss

    spec = P(*stage_spec)
    params = {"stages": {"w_in": sds((stages, layers_per_stage, d_model, d_ff), f32, mesh, spec),
                         "w_out": sds((stages, layers_per_stage, d_ff, d_model), f32, mesh, spec)}}
    mb_in = sds((microbatches, mb_tokens, d_model), f32, mesh, P())
    mb_tgt = sds((microbatches, mb_tokens, d_model), f32, mesh, P())
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return pipeline_train_step, (params, mb_in, mb_tgt), kw


# 38.2 federated averaging simulated on one slice: the per-client model copies replicated


def _fedavg_builder(mesh, clients, layers, width, local_steps, client_tokens, client_spec):
    """A FedAvg round simulated on one TPU slice (FedJAX-style): every client of the round starts from the
    server model, runs `local_steps` of SGD on its own data (jax.vmap of the local training loop over the
    client axis), and the server averages the client deltas (FedAvg with server learning rate 1). The client
    models are materialised as `client_params` [C, L, W, W] f32 (the server model broadcast to every client)
    and the client data `client_batches` [C, steps, tokens, W] is sharded over the devices by client.
    client_spec=() (the first version: the broadcast client copies constrained to P(), as the single-host
    script had them, so every device holds every client's model and its gradients); client_spec=('d',): the
    client copies distributed over the devices with their data (each device trains its clients)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    c_sh = NamedSharding(mesh, P(*client_spec))

    def local_train(params, batches):
        def loss_fn(p, x):
            def block(h, w):
                return h + jnp.tanh(h @ w.astype(bf)), None

            h, _ = jax.lax.scan(jax.checkpoint(block), x, p)
            return jnp.mean(jnp.square(h.astype(f32) - x.astype(f32)))

        def sgd_step(p, x):
            g = jax.grad(loss_fn)(p, x)
            return p - 0.01 * g, None

        p, _ = jax.lax.scan(sgd_step, params, batches)
        return p

    def fedavg_round(server_params, client_batches):
        w = server_params["dense"]["kernel"]
        client_params = jax.lax.with_sharding_constraint(
            jnp.broadcast_to(w, (clients,) + w.shape), c_sh)
        trained = jax.vmap(local_train)(client_params, client_batches)
        trained = jax.lax.with_sharding_constraint(trained, c_sh)
        delta = jnp.mean(trained - client_params, axis=0)
        return {"dense": {"kernel": w + delta}}

    server_params = {"dense": {"kernel": sds((layers, width, width), f32, mesh, P())}}
    client_batches = sds((clients, local_steps, client_tokens, width), bf, mesh, P("d"))
    kw = {"out_shardings": _shardings(server_params), "donate_argnums": (0,)}
    return fedavg_round, (server_params, client_batches), kw


# 38.3 a Mixtral-style sparse MoE decoder served on a slice too small for its weights


def _moe_serving_builder(mesh, layers, d_model, d_ff, experts, heads, kv_heads, vocab, batch, max_len):
    """One decode step of a Mixtral-8x7B-style sparse MoE decoder (bf16; GQA attention, top-2 routing over
    8 SwiGLU experts per layer, RMSNorm), tensor-parallel over all devices: the expert FFNs sharded over
    d_ff, the attention projections over the model dimension, the embedding and the LM head over the
    vocabulary; the KV cache (bf16, [L, B, S, kv_heads, hd]) sharded over the batch and donated. The same
    program on two slices: v5e:2x2 (4 chips, the first plan) and v5e:4x4 (16 chips)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    rep = heads // kv_heads

    def rms(x, g):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5) * g).astype(bf)

    def decode_step(params, kv_cache, tokens, pos):
        x = params["embed_tokens"][tokens]                                     # [B, D]
        b = x.shape[0]

        def layer(h, lw):
            w, k_cache, v_cache = lw
            a = rms(h, w["input_layernorm"])
            q = (a @ w["q_proj"]).reshape(b, kv_heads, rep, hd)
            k = (a @ w["k_proj"]).reshape(b, 1, kv_heads, hd)
            v = (a @ w["v_proj"]).reshape(b, 1, kv_heads, hd)
            k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k, pos, 1)
            v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v, pos, 1)
            s = jnp.einsum("bgrd,bsgd->bgrs", q, k_cache).astype(f32) * hd ** -0.5
            s = jnp.where(jnp.arange(max_len) <= pos, s, -1e30)
            o = jnp.einsum("bgrs,bsgd->bgrd", jax.nn.softmax(s, -1).astype(bf), v_cache).reshape(b, d_model)
            h = h + o @ w["o_proj"]
            m = rms(h, w["post_attention_layernorm"])
            router = (m @ w["block_sparse_moe"]["gate"]).astype(f32)          # [B, E]
            top_v, top_i = jax.lax.top_k(router, 2)
            gates = jnp.sum(jax.nn.one_hot(top_i, experts, dtype=f32) * jax.nn.softmax(top_v, -1)[..., None], 1)
            e = w["block_sparse_moe"]["experts"]
            g = jax.nn.silu(jnp.einsum("bd,edf->bef", m, e["w1"])) * jnp.einsum("bd,edf->bef", m, e["w3"])
            y = jnp.einsum("bef,efd->bed", g, e["w2"])
            h = h + jnp.einsum("bed,be->bd", y, gates.astype(bf))
            return h, (k_cache, v_cache)

        h, (k_new, v_new) = jax.lax.scan(layer, x, (params["layers"], kv_cache["k"], kv_cache["v"]))
        logits = rms(h, params["norm"]) @ params["lm_head"]
        return jnp.argmax(logits, -1).astype(jnp.int32), {"k": k_new, "v": v_new}

    L, D, F, E = layers, d_model, d_ff, experts
    dcol, drow = P(None, None, "d"), P(None, "d", None)
    params = {
        "embed_tokens": sds((vocab, D), bf, mesh, P("d", None)),
        "norm": sds((D,), f32, mesh, P()),
        "lm_head": sds((D, vocab), bf, mesh, P(None, "d")),
        "layers": {
            "input_layernorm": sds((L, D), f32, mesh, P()),
            "post_attention_layernorm": sds((L, D), f32, mesh, P()),
            "q_proj": sds((L, D, D), bf, mesh, dcol),
            "k_proj": sds((L, D, kv_heads * hd), bf, mesh, drow),
            "v_proj": sds((L, D, kv_heads * hd), bf, mesh, drow),
            "o_proj": sds((L, D, D), bf, mesh, drow),
            "block_sparse_moe": {
                "gate": sds((L, D, E), bf, mesh, P()),
                "experts": {"w1": sds((L, E, D, F), bf, mesh, P(None, None, None, "d")),
                            "w3": sds((L, E, D, F), bf, mesh, P(None, None, None, "d")),
                            "w2": sds((L, E, F, D), bf, mesh, P(None, None, "d", None))}}}}
    cache_spec = P(None, "d")
    kv_cache = {"k": sds((L, batch, max_len, kv_heads, hd), bf, mesh, cache_spec),
                "v": sds((L, batch, max_len, kv_heads, hd), bf, mesh, cache_spec)}
    tokens = sds((batch,), jnp.int32, mesh, P())
    pos = sds((), jnp.int32, mesh, P())
    kw = {"out_shardings": (NamedSharding(mesh, P()), _shardings(kv_cache)), "donate_argnums": (1,)}
    return decode_step, (params, kv_cache, tokens, pos), kw


# 38.4 a latent-diffusion VAE decoder run in f32 (force_upcast) at full resolution


def _vae_decode_builder(mesh, images, latent_size, base, dtype):
    """The image decoder of a latent-diffusion VAE (the SD/SDXL AutoencoderKL layout: conv_in to 4*base
    channels at the latent resolution, then up blocks of two 3x3 convs (+ residual) with nearest 2x
    upsampling, channel multipliers (4, 4, 2, 1) from the bottom, GroupNorm-free here, conv_out to RGB),
    inference only, latents [B, latent_size, latent_size, 4] per device (8x upsampled: 144 -> 1152x1152 images).
    The weights are stored f32.
    dtype='float32' (the first version: the pipeline's `force_upcast` setting makes the decode run with the
    latents and the weights upcast to f32); dtype='bfloat16': the weights cast to bf16 once and the decode
    run in bf16, the image returned in f32."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dt = jnp.dtype(dtype)
    mults = (4, 4, 2, 1)

    def conv(x, w, b):
        y = jax.lax.conv_general_dilated(x, w.astype(dt), (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + b.astype(dt)

    def upsample(x):
        b, h, w, c = x.shape
        return jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c)).reshape(b, 2 * h, 2 * w, c)

    def vae_decode(decoder_params, latents):
        p = decoder_params
        h = conv(latents.astype(dt) / 0.13025, p["conv_in"]["kernel"], p["conv_in"]["bias"])
        for i in range(len(mults)):
            blk = p[f"up_blocks_{i}"]
            if "conv_shortcut" in blk:
                skip = conv(h, blk["conv_shortcut"]["kernel"], blk["conv_shortcut"]["bias"])
            else:
                skip = h
            y = conv(jax.nn.silu(h), blk["conv1"]["kernel"], blk["conv1"]["bias"])
            y = conv(jax.nn.silu(y), blk["conv2"]["kernel"], blk["conv2"]["bias"])
            h = skip + y
            if i < len(mults) - 1:
                h = upsample(h)
                h = conv(h, blk["upsampler"]["kernel"], blk["upsampler"]["bias"])
        img = conv(jax.nn.silu(h), p["conv_out"]["kernel"], p["conv_out"]["bias"])
        return jnp.clip(img.astype(f32) * 0.5 + 0.5, 0.0, 1.0)

    def cw(cin, cout):
        return {"kernel": sds((3, 3, cin, cout), f32, mesh, P()), "bias": sds((cout,), f32, mesh, P())}

    params = {"conv_in": cw(4, base * mults[0]), "conv_out": cw(base * mults[-1], 3)}
    cin = base * mults[0]
    for i, m in enumerate(mults):
        cout = base * m
        blk = {"conv1": cw(cin, cout), "conv2": cw(cout, cout)}
        if cin != cout:
            blk["conv_shortcut"] = cw(cin, cout)
        if i < len(mults) - 1:
            blk["upsampler"] = cw(cout, cout)
        params[f"up_blocks_{i}"] = blk
        cin = cout
    n = mesh.devices.size * images
    latents = sds((n, latent_size, latent_size, 4), f32, mesh, P("d"))
    return vae_decode, (params, latents), {"out_shardings": NamedSharding(mesh, P("d"))}


# 38.5 a LiDAR detector that scatters its points into a dense 3-D voxel grid


def _voxel_grid_builder(mesh, scenes, points, grid_xy, grid_z, channels, pillars):
    """A LiDAR 3-D detector backbone trained data-parallel (scenes over 'd', bf16 activations, f32 params
    replicated and donated, SGD): a shared point MLP lifts each point (x, y, z, intensity) to `channels`
    features, the points are scattered (segment-sum by voxel index) into a dense grid, a conv stack runs on
    it and a 1x1 head regresses a BEV centre heatmap. pillars=False (the first version, VoxelNet-style): the
    grid is [B, X, Y, Z, C] with grid_z height bins and a 3x3x3 conv middle layer before the height is
    collapsed; pillars=True (PointPillars-style): the points are scattered straight into [B, X, Y, C] pillars
    (no height bins) and the convs are 2-D."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    nz = 1 if pillars else grid_z

    def train_step(params, point_cloud, voxel_index, heatmap):
        def loss_fn(params):
            f = jax.nn.relu(point_cloud.astype(bf) @ params["pfn"]["kernel"].astype(bf))       # [B, N, C]
            grid = jax.vmap(lambda feat, idx: jax.ops.segment_sum(feat, idx, grid_xy * grid_xy * nz))(
                f, voxel_index)
            if pillars:
                x = grid.reshape(-1, grid_xy, grid_xy, channels)
            else:
                v = grid.reshape(-1, grid_xy, grid_xy, nz, channels)
                v = jax.nn.relu(jax.lax.conv_general_dilated(
                    v, params["middle_conv3d"]["kernel"].astype(bf), (1, 1, 1), "SAME",
                    dimension_numbers=("NDHWC", "DHWIO", "NDHWC")))
                x = jnp.max(v, axis=3)                                                            # collapse Z
            for i in range(2):
                x = jax.nn.relu(jax.lax.conv_general_dilated(
                    x, params[f"bev_conv_{i}"]["kernel"].astype(bf), (1, 1), "SAME",
                    dimension_numbers=("NHWC", "HWIO", "NHWC")))
            pred = (x @ params["head"]["kernel"].astype(bf))[..., 0].astype(f32)
            return jnp.mean(jnp.square(pred - heatmap))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"pfn": {"kernel": sds((4, channels), f32, mesh, P())},
              "bev_conv_0": {"kernel": sds((3, 3, channels, channels), f32, mesh, P())},
              "bev_conv_1": {"kernel": sds((3, 3, channels, channels), f32, mesh, P())},
              "head": {"kernel": sds((channels, 1), f32, mesh, P())}}
    if not pillars:
        params["middle_conv3d"] = {"kernel": sds((3, 3, 3, channels, channels), f32, mesh, P())}
    n = mesh.devices.size * scenes
    point_cloud = sds((n, points, 4), f32, mesh, P("d"))
    voxel_index = sds((n, points), jnp.int32, mesh, P("d"))
    heatmap = sds((n, grid_xy, grid_xy), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return train_step, (params, point_cloud, voxel_index, heatmap), kw


pair(
    "pipeline_stage_weights_replicated", "v4", "v4:2x2x1",
    "A circular (praxis/MaxText-style, vmapped-stage) pipeline of 8 stages x 3 MLP layers (d_model 4096, d_ff "
    "16384, f32 weights) trained on v4 (8 TensorCores): the pipeline state is sharded over the stages but the "
    "stacked stage weights are placed P(), so every core holds all 8 stages' weights (12 GiB) and their whole "
    "gradients, beyond 15.25G.",
    "Fixed variant of pipeline_stage_weights_replicated_v4: the stage axis of the stacked weights over the "
    "devices, P('d'), like the pipeline state (each core holds its stage); fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _pipeline_builder, dict(stages=8, layers_per_stage=3, d_model=4096, d_ff=16384, microbatches=16,
                            mb_tokens=1024, stage_spec=()),
    dict(stages=8, layers_per_stage=3, d_model=4096, d_ff=16384, microbatches=16, mb_tokens=1024,
         stage_spec=("d",)),
    dump=False,
)

pair(
    "fedavg_client_copies_replicated", "v5p", "v5p:2x2x1",
    "A FedAvg round of 20 clients simulated on v5p (4 local SGD steps each, jax.vmap over the clients, a 16-layer "
    "f32[8192, 8192] trunk): the server model broadcast to the clients is constrained to P(), so every device "
    "holds all 20 client copies, f32[20, 16, 8192, 8192] (80 GiB), beyond 95.74G.",
    "Fixed variant of fedavg_client_copies_replicated_v5p: the client copies constrained to P('d') like the "
    "client data (5 clients per device); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "large_activation"]),
    _fedavg_builder, dict(clients=20, layers=16, width=8192, local_steps=4, client_tokens=1024, client_spec=()),
    dict(clients=20, layers=16, width=8192, local_steps=4, client_tokens=1024, client_spec=("d",)),
    dump=False,
)

pair(
    "mixtral_decode_on_v5e_2x2", "v5e", "v5e:2x2",
    "One decode step of a Mixtral-8x7B-style MoE decoder (32 layers, 8 experts of d_ff 14336, GQA, vocabulary "
    "32000, bf16 weights tensor-parallel over all devices, KV cache donated) on v5e:2x2: the 46.7B parameters "
    "are 23.75G of arguments per chip, beyond 15.75G.",
    "Fixed variant of mixtral_decode_on_v5e_2x2_v5e: the same program on v5e:4x4 (16 chips, 5.9 GiB of "
    "arguments each); fits.",
    dict(category="arguments", causes=["arguments_exceed", "device_too_small"]),
    _moe_serving_builder, dict(layers=32, d_model=4096, d_ff=14336, experts=8, heads=32, kv_heads=8, vocab=32000,
                               batch=16, max_len=4096),
    dict(layers=32, d_model=4096, d_ff=14336, experts=8, heads=32, kv_heads=8, vocab=32000, batch=16,
         max_len=4096),
    fixed_topology="v5e:4x4", dump=False,
)

pair(
    "voxelnet_dense_3d_grid", "v6e", "v6e:2x2",
    "A VoxelNet-style LiDAR backbone trained on v6e (4 scenes of 120k points per device): the point features are "
    "scattered into a dense 432x432x40 voxel grid of 64 channels, bf16[4,432,432,40,64], and a 3x3x3 conv runs on "
    "it; its input, output and conv temporaries are slots of 5-11 GiB, beyond 31.25G.",
    "Fixed variant of voxelnet_dense_3d_grid_v6e: PointPillars-style, the points scattered straight into "
    "432x432 pillars (no height bins), 2-D convs only; fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large", "padding"]),
    _voxel_grid_builder, dict(scenes=4, points=120000, grid_xy=432, grid_z=40, channels=64, pillars=False),
    dict(scenes=4, points=120000, grid_xy=432, grid_z=40, channels=64, pillars=True),
    dump=False,
)

pair(
    "vae_decoder_force_upcast_f32", "v5e", "v5e:2x2",
    "The image decoder of a latent-diffusion VAE (SD/SDXL AutoencoderKL layout) decoding 8 latents of 144x144 "
    "(1152x1152 images) per device on v5e with force_upcast: latents and weights upcast to f32, the "
    "full-resolution activations f32[8,1152,1152,256] / [.., 128] in slots of 10.12 and 5.06 GiB, beyond 15.75G.",
    "Fixed variant of vae_decoder_force_upcast_f32_v5e: the weights cast to bf16 once and the decode run in "
    "bf16 (the image returned in f32); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "batch_too_large", "large_activation"]),
    _vae_decode_builder, dict(images=8, latent_size=144, base=128, dtype="float32"),
    dict(images=8, latent_size=144, base=128, dtype="bfloat16"),
    dump=True,
)


# ---- 39. more broken/fixed pairs (batch tpu28): other models, other names ---------------------
#
# Programs of kinds sections 13-38 do not have, training-side (flax-style logical axis rules whose defaults are
# listed before the run's FSDP overrides; gradient accumulation whose micro-batch reshape puts the data-sharded
# axis on the micro-step axis; a MeshGraphNet-style weather GNN whose edge set is passed with in_shardings P();
# a wav2vec 2.0 contrastive loss that gathers the distractor vectors; AlphaFold-style triangle attention without
# chunking; MAML whose meta-batch of tasks is vmapped through the inner loop).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu28 for which pairs keep their dumps and what did not go as first written.


# 39.1 flax logical axis rules: the project's defaults listed before the run's FSDP overrides (first match wins)

_UNASSIGNED_AXIS = object()


def _flax_logical_to_mesh_axes(names, rules):
    """flax.linen.partitioning.logical_to_mesh_axes as flax implements it (flax is not in this venv): the rules
    are read in order; a dimension takes the mesh axis of the FIRST rule that names its logical axis, provided
    the dimension is still unassigned and no other dimension of the array already uses that mesh axis; a
    dimension no rule assigns is None (replicated)."""
    _, _, _, P = _jax()
    res = [_UNASSIGNED_AXIS] * len(names)
    for logical, mesh_axes in rules:
        if logical in names:
            pos = names.index(logical)
            new = set(mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)) - {None}
            used = set()
            for r in res:
                if r is not _UNASSIGNED_AXIS and r is not None:
                    used |= set(r if isinstance(r, tuple) else (r,))
            if res[pos] is _UNASSIGNED_AXIS and not (new & used):
                res[pos] = mesh_axes
    return P(*[None if r is _UNASSIGNED_AXIS else r for r in res])


def _logical_rules_builder(mesh, layers, d_model, d_ff, heads, vocab, seqs, seq_len, overrides_first):
    """A decoder-only LM (t5x / flax-style: parameters annotated with logical axis names, the mesh shardings
    derived from a list of logical-axis rules) trained with Adam on a 1-D ('data',) mesh, params and Adam
    moments donated. The project's DEFAULT_AXIS_RULES are the pure data-parallel preset (only 'batch' -> 'data',
    every parameter axis None); the run adds FSDP_OVERRIDES = [('embed', 'data')] to shard every parameter
    (and its moments) over the data axis.
    overrides_first=False (the first version): rules = DEFAULT_AXIS_RULES + FSDP_OVERRIDES; flax takes the first
    rule that names 'embed', ('embed', None), so the override never applies and every parameter and moment is
    replicated; overrides_first=True: rules = FSDP_OVERRIDES + DEFAULT_AXIS_RULES."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    dmesh = Mesh(mesh.devices, ("data",))
    DEFAULT_AXIS_RULES = [("batch", "data"), ("length", None), ("vocab", None), ("embed", None), ("mlp", None),
                          ("heads", None), ("kv", None), ("joined_kv", None), ("layers", None)]
    FSDP_OVERRIDES = [("embed", "data")]
    rules = FSDP_OVERRIDES + DEFAULT_AXIS_RULES if overrides_first else DEFAULT_AXIS_RULES + FSDP_OVERRIDES
    hd = d_model // heads

    def spec(*names):
        return NamedSharding(dmesh, _flax_logical_to_mesh_axes(names, rules))

    def rms(x, g):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * g).astype(bf)

    def decoder_train_step(params, opt_state, batch):
        def loss_fn(params):
            x = params["token_embedder"]["embedding"].astype(bf)[batch["inputs"]]       # [B, S, D]
            b, s, _ = x.shape

            def block(h, lw):
                a = rms(h, lw["pre_attention_norm"]["scale"])
                qkv = (a @ lw["attention"]["qkv"]["kernel"].astype(bf)).reshape(b, s, 3, heads, hd)
                q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
                sc = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * hd ** -0.5
                sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
                o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, -1).astype(bf), v).reshape(b, s, d_model)
                h = h + o @ lw["attention"]["out"]["kernel"].astype(bf)
                m = rms(h, lw["pre_mlp_norm"]["scale"])
                y = jax.nn.gelu(m @ lw["mlp"]["wi"]["kernel"].astype(bf)) @ lw["mlp"]["wo"]["kernel"].astype(bf)
                return h + y, None

            h, _ = jax.lax.scan(jax.checkpoint(block), x, params["decoder"]["layers"])
            h = rms(h, params["decoder"]["final_norm"]["scale"])
            logits = (h @ params["token_embedder"]["embedding"].astype(bf).T).astype(f32)
            lse = jax.nn.logsumexp(logits, -1)
            tgt = jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
            return jnp.mean(lse - tgt)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        new_params, new_state = adam_update(params, grads, opt_state)
        return new_params, new_state, loss

    L, D, F = layers, d_model, d_ff
    param_axes = {
        "token_embedder": {"embedding": ((vocab, D), ("vocab", "embed"))},
        "decoder": {
            "final_norm": {"scale": ((D,), ("embed",))},
            "layers": {
                "pre_attention_norm": {"scale": ((L, D), ("layers", "embed"))},
                "pre_mlp_norm": {"scale": ((L, D), ("layers", "embed"))},
                "attention": {"qkv": {"kernel": ((L, D, 3 * D), ("layers", "embed", "joined_kv"))},
                              "out": {"kernel": ((L, D, D), ("layers", "joined_kv", "embed"))}},
                "mlp": {"wi": {"kernel": ((L, D, F), ("layers", "embed", "mlp"))},
                        "wo": {"kernel": ((L, F, D), ("layers", "mlp", "embed"))}}}}}
    is_leaf = lambda t: isinstance(t, tuple) and len(t) == 2 and isinstance(t[1], tuple)  # noqa: E731
    params = jax.tree_util.tree_map(
        lambda t: jax.ShapeDtypeStruct(t[0], f32, sharding=spec(*t[1])), param_axes, is_leaf=is_leaf)
    opt_state = {"count": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(dmesh, P())),
                 "mu": params, "nu": params}
    n = dmesh.devices.size * seqs
    tok = jax.ShapeDtypeStruct((n, seq_len), jnp.int32, sharding=spec("batch", "length"))
    batch = {"inputs": tok, "targets": tok}
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(dmesh, P())),
          "donate_argnums": (0, 1)}
    return decoder_train_step, (params, opt_state, batch), kw


# 39.2 gradient accumulation whose micro-batch reshape puts the data-sharded batch axis on the micro-step axis


def _accum_reshape_builder(mesh, micro_steps, rows_per_device, seq_len, d_model, d_ff, layers, rows_major):
    """A data-parallel transformer-MLP encoder (pre-norm residual MLP blocks under lax.scan + jax.checkpoint,
    bf16 compute, f32 params replicated and donated, SGD with momentum) trained with gradient accumulation:
    the per-step batch [B, S, D] (B = devices x rows_per_device, sharded P('d')) is split into `micro_steps`
    micro-batches, scanned, the gradients summed.
    rows_major=False (the first version): `batch.reshape(micro_steps, B // micro_steps, S, D)`: with
    micro_steps a multiple of the device count, the sharded batch axis becomes the micro-step axis, so each
    micro-batch lives on one device and the scan body runs every micro-batch whole (the global micro-batch) on
    every device; rows_major=True: `batch.reshape(B // micro_steps, micro_steps, S, D).swapaxes(0, 1)`, each
    device splits its own rows, the micro-batch axis stays sharded over 'd'."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n = mesh.devices.size
    B = n * rows_per_device

    def block(h, lw):
        x32 = h.astype(f32)
        a = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf)
        y = jax.nn.gelu(a @ lw["wi"].astype(bf)) @ lw["wo"].astype(bf)
        return h + y, None

    def loss_fn(params, x, y):
        h, _ = jax.lax.scan(jax.checkpoint(block), x, params["encoder"])
        pred = h @ params["head"].astype(bf)
        return jnp.mean(jnp.square(pred.astype(f32) - y))

    def accumulate_and_apply(params, momentum, features, targets):
        if rows_major:
            xs = features.reshape(B // micro_steps, micro_steps, seq_len, d_model).swapaxes(0, 1)
            ys = targets.reshape(B // micro_steps, micro_steps, seq_len, 1).swapaxes(0, 1)
        else:
            xs = features.reshape(micro_steps, B // micro_steps, seq_len, d_model)
            ys = targets.reshape(micro_steps, B // micro_steps, seq_len, 1)

        def micro_step(acc, xy):
            g = jax.grad(loss_fn)(params, *xy)
            return _tm(jnp.add, acc, g), None

        zeros = _tm(jnp.zeros_like, params)
        grads, _ = jax.lax.scan(micro_step, zeros, (xs, ys))
        new_m = _tm(lambda m, g: 0.9 * m + g / micro_steps, momentum, grads)
        return _tm(lambda p, m: p - 1e-3 * m, params, new_m), new_m

    rep = P()
    params = {"encoder": {"wi": sds((layers, d_model, d_ff), f32, mesh, rep),
                          "wo": sds((layers, d_ff, d_model), f32, mesh, rep)},
              "head": sds((d_model, 1), f32, mesh, rep)}
    momentum = _tm(lambda a: a, params)
    features = sds((B, seq_len, d_model), bf, mesh, P("d"))
    targets = sds((B, seq_len, 1), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), _shardings(momentum)), "donate_argnums": (0, 1)}
    return accumulate_and_apply, (params, momentum, features, targets), kw


# 39.3 a MeshGraphNet-style weather GNN whose edge set is passed with in_shardings P() (replicated)


def _weather_gnn_builder(mesh, nodes, edges_per_node, latent, rounds, node_vars, edge_spec):
    """One training step of an encode-process-decode mesh GNN (MeshGraphNet / GraphCast processor style) on a
    weather grid: node latents [N, H] from `node_vars` input variables, `rounds` interaction-network rounds
    (edge MLP on [edge, sender, receiver] latents, segment-sum to the receivers, node MLP), a decoder back to
    the variables, MSE to the next state; bf16 latents, f32 params replicated and donated, SGD. The step is
    jitted as `jax.jit(train_step, in_shardings=(params_sh, node_sh, edge_sh, edge_sh, edge_sh), ...)` with the
    grid nodes sharded over 'd'.
    edge_spec=() (the first version: "the graph structure is small, replicate it": senders, receivers and the
    edge features [E, 4] P(), so every device computes the messages of every edge); edge_spec=('d',): the edges
    sharded over the devices too (each device computes its share of the messages)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    E = nodes * edges_per_node
    H = latent

    def mlp(p, x):
        return jax.nn.silu(x @ p["w1"].astype(bf)) @ p["w2"].astype(bf)

    def train_step(params, grid_state, senders, receivers, edge_displacement):
        def loss_fn(params):
            v = mlp(params["node_encoder"], grid_state.astype(bf))                          # [N, H]
            e = mlp(params["edge_encoder"], edge_displacement.astype(bf))                   # [E, H]

            def interaction(carry, p):
                v, e = carry
                m = mlp(p["edge_mlp"], jnp.concatenate([e, v[senders], v[receivers]], -1))
                e = e + m
                agg = jax.ops.segment_sum(m, receivers, nodes)
                v = v + mlp(p["node_mlp"], jnp.concatenate([v, agg], -1))
                return (v, e), None

            (v, _), _ = jax.lax.scan(jax.checkpoint(interaction), (v, e), params["processor"])
            pred = mlp(params["node_decoder"], v).astype(f32)
            return jnp.mean(jnp.square(grid_state + pred - grid_state))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    def mlp_p(lead, din, dout):
        return {"w1": sds(lead + (din, H), f32, mesh, P()), "w2": sds(lead + (H, dout), f32, mesh, P())}

    params = {"node_encoder": mlp_p((), node_vars, H), "edge_encoder": mlp_p((), 4, H),
              "processor": {"edge_mlp": mlp_p((rounds,), 3 * H, H), "node_mlp": mlp_p((rounds,), 2 * H, H)},
              "node_decoder": mlp_p((), H, node_vars)}
    grid_state = sds((nodes, node_vars), f32, mesh, P("d"))
    es = P(*edge_spec)
    senders = sds((E,), jnp.int32, mesh, es)
    receivers = sds((E,), jnp.int32, mesh, es)
    edge_displacement = sds((E, 4), f32, mesh, es)
    args = (params, grid_state, senders, receivers, edge_displacement)
    kw = {"in_shardings": tuple(_shardings(a) for a in args),
          "out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return train_step, args, kw


# 39.4 wav2vec 2.0 contrastive loss that gathers K distractor vectors for every masked frame


def _w2v_negatives_builder(mesh, utts, frames, dim, num_negatives, score_then_gather):
    """The contrastive task of wav2vec 2.0 pre-training (fairseq's `sample_negatives` + `compute_preds`): for
    every frame t of an utterance the context vector c_t is compared, by cosine similarity / temperature 0.1,
    with its quantized target q_t and K distractors q_j sampled from other frames of the same utterance; the
    loss is cross-entropy with the target at index 0. c and q [B, T, D] come from the (not shown) encoder and
    quantizer as inputs; the step returns the loss and its gradients w.r.t. c and q; B utterances per device,
    sharded over 'd'.
    score_then_gather=False (the first version, as fairseq writes it): the distractors are gathered
    q[b, neg_idxs] -> [B, T, K, D] and the similarities computed against them; score_then_gather=True: the
    cosine similarity of every frame with every frame of its utterance [B, T, T] (one batched matmul), then the
    K + 1 scores gathered by index."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def normalize(x):
        return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-8)

    def contrastive_loss(context, quantized, neg_idxs):
        c = normalize(context.astype(f32))
        q = normalize(quantized.astype(f32))
        idx = jnp.concatenate([jnp.broadcast_to(jnp.arange(frames)[None, :, None], (c.shape[0], frames, 1)),
                               neg_idxs], -1)                                              # [B, T, K+1]
        if score_then_gather:
            sim = jnp.einsum("btd,bsd->bts", c, q)                                         # [B, T, T]
            logits = jnp.take_along_axis(sim, idx, -1)
        else:
            targets = jax.vmap(lambda qb, ib: qb[ib])(q, idx)                             # [B, T, K+1, D]
            logits = jnp.einsum("btd,btkd->btk", c, targets)
        logits = logits / 0.1
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

    def w2v_contrastive_step(context, quantized, neg_idxs):
        loss, (gc, gq) = jax.value_and_grad(contrastive_loss, argnums=(0, 1))(context, quantized, neg_idxs)
        return loss, gc, gq

    n = mesh.devices.size * utts
    context = sds((n, frames, dim), jnp.bfloat16, mesh, P("d"))
    quantized = sds((n, frames, dim), jnp.bfloat16, mesh, P("d"))
    neg_idxs = sds((n, frames, num_negatives), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (NamedSharding(mesh, P()), NamedSharding(mesh, P("d")), NamedSharding(mesh, P("d")))}
    return w2v_contrastive_step, (context, quantized, neg_idxs), kw


# 39.5 AlphaFold-style triangle attention over a long chain without chunking


def _triangle_attention_builder(mesh, chains, residues, c_z, heads, head_dim, chunk):
    """Inference through the pair stack of an AlphaFold 2 / OpenFold-style structure model: two blocks of
    triangle attention around the starting node (row-wise) and the ending node (column-wise) on the pair
    representation z [N, N, c_z] (one complex per device, sharded over 'd'), each followed by a pair
    transition; bf16. The attention of row i over (j, k) takes a bias from z[j, k] per head, so its logits are
    [N, H, N, N] for the whole pair map.
    chunk=None (the first version: OpenFold's `chunk_size=None`, every row at once); chunk=R: the rows
    processed R at a time with lax.map (OpenFold's chunk_layer / AlphaFold's `subbatch_size`)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hc = heads * head_dim

    def layer_norm(x):
        x32 = x.astype(f32)
        m = jnp.mean(x32, -1, keepdims=True)
        v = jnp.mean(jnp.square(x32 - m), -1, keepdims=True)
        return ((x32 - m) * jax.lax.rsqrt(v + 1e-5)).astype(bf)

    def tri_att(p, z):
        zn = layer_norm(z)
        bias = jnp.einsum("jkc,ch->hjk", zn, p["linear_b"].astype(bf))                   # [H, N, N]

        def rows(zr):                                                                      # [R, N, c]
            q = (zr @ p["q"].astype(bf)).reshape(zr.shape[0], residues, heads, head_dim)
            k = (zr @ p["k"].astype(bf)).reshape(zr.shape[0], residues, heads, head_dim)
            v = (zr @ p["v"].astype(bf)).reshape(zr.shape[0], residues, heads, head_dim)
            g = jax.nn.sigmoid(zr @ p["g"].astype(bf)).reshape(zr.shape[0], residues, heads, head_dim)
            a = jnp.einsum("rjhd,rkhd->rhjk", q, k).astype(f32) * head_dim ** -0.5 + bias[None].astype(f32)
            o = jnp.einsum("rhjk,rkhd->rjhd", jax.nn.softmax(a, -1).astype(bf), v) * g
            return o.reshape(zr.shape[0], residues, hc) @ p["o"].astype(bf)

        if chunk is None:
            out = rows(zn)
        else:
            out = jax.lax.map(rows, zn.reshape(residues // chunk, chunk, residues, c_z))
            out = out.reshape(residues, residues, c_z)
        return z + out

    def transition(p, z):
        return z + jax.nn.relu(layer_norm(z) @ p["w1"].astype(bf)) @ p["w2"].astype(bf)

    def pair_stack(params, pair_act):
        def one(z):
            for blk in params["pair_blocks"]:
                z = tri_att(blk["triangle_attention_starting_node"], z)
                z = jnp.swapaxes(tri_att(blk["triangle_attention_ending_node"], jnp.swapaxes(z, 0, 1)), 0, 1)
                z = transition(blk["pair_transition"], z)
            return z

        return jax.vmap(one)(pair_act)

    def att_p():
        return {"linear_b": sds((c_z, heads), f32, mesh, P()), "q": sds((c_z, hc), f32, mesh, P()),
                "k": sds((c_z, hc), f32, mesh, P()), "v": sds((c_z, hc), f32, mesh, P()),
                "g": sds((c_z, hc), f32, mesh, P()), "o": sds((hc, c_z), f32, mesh, P())}

    params = {"pair_blocks": [{"triangle_attention_starting_node": att_p(),
                               "triangle_attention_ending_node": att_p(),
                               "pair_transition": {"w1": sds((c_z, 4 * c_z), f32, mesh, P()),
                                                   "w2": sds((4 * c_z, c_z), f32, mesh, P())}}
                              for _ in range(2)]}
    n = mesh.devices.size * chains
    pair_act = sds((n, residues, residues, c_z), bf, mesh, P("d"))
    return pair_stack, (params, pair_act), {"out_shardings": NamedSharding(mesh, P("d"))}


# 39.6 MAML whose meta-batch of tasks is vmapped through the differentiated inner loop


def _maml_builder(mesh, tasks, inner_steps, shots, width, depth, in_dim, per_task_grads):
    """Second-order MAML (Finn et al.) for few-shot regression on a residual MLP: each task adapts a copy of the
    meta-parameters with `inner_steps` SGD steps on its support set, the query loss of the adapted weights is
    differentiated back through the inner loop (lax.scan over the inner steps, the hidden layers stacked and
    scanned) to the meta-parameters; meta-SGD, bf16 compute, f32 params replicated and donated; the tasks sharded
    over 'd' (`tasks` per device).
    per_task_grads=False (the first version, as in most JAX MAML examples): the meta-loss is the mean over
    `jax.vmap(task_query_loss)` of the meta-batch, one jax.grad of it: every task's fast weights and the
    residuals of every inner step of every task are live at once; per_task_grads=True: the meta-gradient of one
    task at a time (jax.grad inside lax.scan over the device's tasks, summed), so only one task's inner-loop
    residuals are live."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def net(w, x):
        h = jnp.tanh(x.astype(bf) @ w["embed"].astype(bf))
        h, _ = jax.lax.scan(lambda h, wl: (h + jnp.tanh(h @ wl.astype(bf)), None), h, w["hidden"])
        return (h @ w["head"].astype(bf)).astype(f32)

    def support_loss(w, x, y):
        return jnp.mean(jnp.square(net(w, x) - y))

    def task_query_loss(meta_params, sx, sy, qx, qy):
        def inner_sgd(fast, _):
            g = jax.grad(support_loss)(fast, sx, sy)
            return _tm(lambda w, gw: w - 0.01 * gw, fast, g), None

        fast, _ = jax.lax.scan(inner_sgd, meta_params, None, length=inner_steps)
        return support_loss(fast, qx, qy)

    def maml_meta_step(meta_params, support_x, support_y, query_x, query_y):
        if per_task_grads:
            n = support_x.shape[0]
            n_dev = n // tasks
            # [tasks, devices, ...]: step t takes task t of every device's share (the device axis stays sharded)
            xs = [a.reshape(n_dev, tasks, *a.shape[1:]).swapaxes(0, 1)
                  for a in (support_x, support_y, query_x, query_y)]
            per_task = jax.vmap(jax.value_and_grad(task_query_loss), in_axes=(None, 0, 0, 0, 0))

            def one(acc, t):
                l, g = per_task(meta_params, *t)
                return (acc[0] + l, _tm(jnp.add, acc[1], g)), None

            acc0 = (jnp.zeros((n_dev,), f32), _tm(lambda w: jnp.zeros((n_dev,) + w.shape, f32), meta_params))
            (lsum, gsum), _ = jax.lax.scan(one, acc0, xs)
            loss = jnp.sum(lsum) / n
            grads = _tm(lambda g: jnp.sum(g, 0) / n, gsum)
        else:
            def meta_loss(mp):
                return jnp.mean(jax.vmap(task_query_loss, in_axes=(None, 0, 0, 0, 0))(
                    mp, support_x, support_y, query_x, query_y))

            loss, grads = jax.value_and_grad(meta_loss)(meta_params)
        return _tm(lambda p, g: p - 1e-3 * g, meta_params, grads), loss

    params = {"embed": sds((in_dim, width), f32, mesh, P()), "hidden": sds((depth, width, width), f32, mesh, P()),
              "head": sds((width, 1), f32, mesh, P())}
    n = mesh.devices.size * tasks
    support_x = sds((n, shots, in_dim), f32, mesh, P("d"))
    support_y = sds((n, shots, 1), f32, mesh, P("d"))
    query_x = sds((n, shots, in_dim), f32, mesh, P("d"))
    query_y = sds((n, shots, 1), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return maml_meta_step, (params, support_x, support_y, query_x, query_y), kw


pair(
    "flax_axis_rules_defaults_first", "v6e", "v6e:2x2",
    "A decoder-only LM (flax-style logical axis names, 10 layers, d_model 4096, d_ff 16384, f32 params, Adam) "
    "trained on v6e: rules = DEFAULT_AXIS_RULES + FSDP_OVERRIDES; flax takes the first rule naming 'embed', "
    "('embed', None), so the override ('embed', 'data') never applies: params and both moments replicated, "
    "beyond 31.25G.",
    "Fixed variant of flax_axis_rules_defaults_first_v6e: rules = FSDP_OVERRIDES + DEFAULT_AXIS_RULES, every "
    "parameter and moment sharded over 'data' on its 'embed' axis; fits.",
    dict(category="aggregate", category_also=["arguments"], causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _logical_rules_builder, dict(layers=10, d_model=4096, d_ff=16384, heads=32, vocab=32768, seqs=4, seq_len=1024,
                                 overrides_first=False),
    dict(layers=10, d_model=4096, d_ff=16384, heads=32, vocab=32768, seqs=4, seq_len=1024, overrides_first=True),
    dump=False,
)

pair(
    "grad_accum_micro_axis_sharded", "v4", "v4:2x2x1",
    "Gradient accumulation in a data-parallel MLP encoder on v4 (8 TensorCores, 256 sequences of 2048 x 1024 per "
    "core, 8 micro-steps): batch.reshape(8, B // 8, S, D) puts the data-sharded batch axis on the micro-step "
    "axis; the whole batch is gathered on every core (bf16[8,256,2048,1024], an 8 GiB slot) and every core runs "
    "every micro-batch whole (256 sequences, not 32) in the scan body, beyond 15.25G.",
    "Fixed variant of grad_accum_micro_axis_sharded_v4: batch.reshape(B // 8, 8, S, D).swapaxes(0, 1), each core "
    "splits its own rows, the micro-batch stays sharded; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "batch_too_large"]),
    _accum_reshape_builder, dict(micro_steps=8, rows_per_device=256, seq_len=2048, d_model=1024, d_ff=4096,
                                 layers=8, rows_major=False),
    dict(micro_steps=8, rows_per_device=256, seq_len=2048, d_model=1024, d_ff=4096, layers=8, rows_major=True),
    dump=True,
)

pair(
    "weather_gnn_edges_replicated", "v5e", "v5e:4x4",
    "A MeshGraphNet-style weather GNN on a 0.25-degree grid (721 x 1440 nodes, padded to 1,038,336 for 16 devices, "
    "8 edges each, latent 256, 8 rounds) trained on v5e:4x4 (16 devices): jax.jit(..., in_shardings=...) shards the grid nodes but passes "
    "senders, receivers and edge features P(), so every device computes every edge's messages, beyond 15.75G.",
    "Fixed variant of weather_gnn_edges_replicated_v5e: the edge arrays sharded P('d') too; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["replicated_tensor", "large_activation"]),
    _weather_gnn_builder, dict(nodes=1038336, edges_per_node=8, latent=256, rounds=8, node_vars=80, edge_spec=()),
    dict(nodes=1038336, edges_per_node=8, latent=256, rounds=8, node_vars=80, edge_spec=("d",)),
    dump=False,
)

pair(
    "w2v_negatives_gathered", "v5e", "v5e:2x2",
    "The wav2vec 2.0 contrastive loss on v5e (32 utterances of 1024 frames per device, 100 distractors, dim "
    "768): the target and distractor vectors are gathered, q[b, idx] -> f32[32, 1024, 101, 768] (a 9.75 GiB "
    "slot), and compared with the context vectors; with the scatter-add of its gradient, beyond 15.75G.",
    "Fixed variant of w2v_negatives_gathered_v5e: the cosine similarity of every frame with every frame of its "
    "utterance [B, T, T], then the 101 scores gathered by index; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation", "batch_too_large"]),
    _w2v_negatives_builder, dict(utts=32, frames=1024, dim=768, num_negatives=100, score_then_gather=False),
    dict(utts=32, frames=1024, dim=768, num_negatives=100, score_then_gather=True),
    dump=True,
)

pair(
    "triangle_attention_unchunked", "v5p", "v5p:2x2x1",
    "Inference through an AlphaFold/OpenFold-style pair stack (2 blocks of triangle attention around the "
    "starting and the ending node, c_z 128, 4 heads) on a 2560-residue complex per v5p device without chunking: "
    "the attention weights of every row at once, bf16[2560, 4, 2560, 2560] in a 125 GiB slot, beyond 95.74G.",
    "Fixed variant of triangle_attention_unchunked_v5p: the rows processed 64 at a time with lax.map (OpenFold's "
    "chunk_size); fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _triangle_attention_builder, dict(chains=1, residues=2560, c_z=128, heads=4, head_dim=32, chunk=None),
    dict(chains=1, residues=2560, c_z=128, heads=4, head_dim=32, chunk=64),
    dump=False,
)

pair(
    "maml_tasks_vmapped", "v6e", "v6e:2x2",
    "Second-order MAML on v6e (64 tasks per device, 5 inner SGD steps, a residual MLP with 8 stacked f32[2048, "
    "2048] hidden layers): the meta-loss is the mean of jax.vmap(task_query_loss) over the meta-batch, so every "
    "task's fast weights of every inner step are live at once (bf16[5,8,64,2048,2048], a 20 GiB slot), beyond "
    "31.25G.",
    "Fixed variant of maml_tasks_vmapped_v6e: the meta-gradient of one task per device at a time (jax.grad inside "
    "lax.scan over the tasks, summed); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation", "batch_too_large"]),
    _maml_builder, dict(tasks=64, inner_steps=5, shots=64, width=2048, depth=8, in_dim=256, per_task_grads=False),
    dict(tasks=64, inner_steps=5, shots=64, width=2048, depth=8, in_dim=256, per_task_grads=True),
    dump=False,
)


# ---- 40. more broken/fixed pairs (batch tpu29): other models, other names ---------------------
#
# Programs of kinds sections 13-38 do not have (a kNN-LM datastore put on the devices with jax.device_put and
# no sharding; a chunked-prefill step that writes into the serving KV cache without donating it; flax-style
# logical-axis rules that shard the attention's head dimension ('kv') instead of its heads; in-graph negative
# sampling with jax.random.choice(replace=False), vmapped over the batch; a DeepONet whose trunk net runs for
# every (function, query point) pair; GraphSAGE-pool over a neighbour-sampled two-hop minibatch with the
# node-feature table and the aggregation in f32).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu29 for which pairs keep their dumps and what did not go as first written.


# 40.1 a kNN-LM datastore put on the devices with jax.device_put(keys) and no sharding (replicated)


def _knn_lm_builder(mesh, datastore_size, key_dim, queries, vocab, k, datastore_spec):
    """One decoding step of a kNN-LM (Khandelwal et al.): the decoder's last hidden state of every sequence
    queries a datastore of `datastore_size` keys (bf16 hidden states of the training corpus) and values (the
    next token of each key); the k nearest neighbours' tokens make a distribution that is interpolated with
    the LM's softmax (lambda 0.25), greedy argmax. The datastore was loaded with np.load and put on the devices
    with `jax.device_put(keys)`: no sharding, so jit places the whole array on every device.
    datastore_spec=() (the first version: P(), as jit received it); datastore_spec=('d',): the same arrays put
    with `jax.device_put(keys, NamedSharding(mesh, P('d', None)))`, sharded over the datastore rows."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def knn_lm_step(datastore, hidden, lm_logits):
        scores = jnp.einsum("bd,nd->bn", hidden.astype(bf), datastore["keys"],
                            preferred_element_type=f32)                               # [B, N]
        top_scores, top_idx = jax.lax.top_k(scores, k)                                # [B, k]
        neighbour_tokens = datastore["values"][top_idx]                               # [B, k]
        w = jax.nn.softmax(top_scores / key_dim ** 0.5, -1)
        p_knn = jnp.zeros((queries, vocab), f32).at[jnp.arange(queries)[:, None], neighbour_tokens].add(w)
        p = 0.75 * jax.nn.softmax(lm_logits.astype(f32), -1) + 0.25 * p_knn
        return jnp.argmax(p, -1).astype(jnp.int32)

    spec = P(*datastore_spec)
    datastore = {"keys": sds((datastore_size, key_dim), bf, mesh, P(*datastore_spec, None) if datastore_spec else P()),
                 "values": sds((datastore_size,), jnp.int32, mesh, spec)}
    hidden = sds((queries, key_dim), f32, mesh, P())
    lm_logits = sds((queries, vocab), bf, mesh, P())
    return knn_lm_step, (datastore, hidden, lm_logits), {"out_shardings": NamedSharding(mesh, P())}


# 40.2 a chunked-prefill step that writes into the serving KV cache without donating it


def _chunked_prefill_builder(mesh, layers, d_model, heads, kv_heads, d_ff, slots, max_len, chunk, donate):
    """Chunked prefill (vLLM / JetStream style) of a Llama-style decoder served tensor-parallel over all devices
    (bf16, GQA, heads and KV heads sharded, SwiGLU MLP sharded over d_ff): one chunk of `chunk` prompt tokens
    of the sequence in cache slot `slot`, at offset `start`, runs through the layers (a Python loop over the
    stacked layer weights), its K/V written into the paged-by-slot cache `kv_cache` [L, slots, max_len, kv_heads, hd]
    with lax.dynamic_update_slice and attended together with the earlier chunks; returns the last token's
    logits and the updated cache. donate=False (the first version: `jax.jit(prefill_chunk)`, the cache in and
    the cache out both live); donate=True: `donate_argnums=(1,)`, the update happens in place."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    rep = heads // kv_heads

    def rms(x):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5)).astype(bf)

    def prefill_chunk(params, kv_cache, chunk_tokens, slot, start):
        x = params["embed"][chunk_tokens]                                                  # [C, D]
        pos = start + jnp.arange(chunk)

        def layer(carry, i):
            h, cache_k, cache_v = carry
            lw = _tm(lambda a: a[i], params["layers"])
            a = rms(h)
            q = (a @ lw["wq"]).reshape(chunk, kv_heads, rep, hd)
            k = (a @ lw["wk"]).reshape(1, 1, chunk, kv_heads, hd)
            v = (a @ lw["wv"]).reshape(1, 1, chunk, kv_heads, hd)
            cache_k = jax.lax.dynamic_update_slice(cache_k, k, (i, slot, start, 0, 0))
            cache_v = jax.lax.dynamic_update_slice(cache_v, v, (i, slot, start, 0, 0))
            ks = jax.lax.dynamic_slice(cache_k, (i, slot, 0, 0, 0), (1, 1, max_len, kv_heads, hd))[0, 0]
            vs = jax.lax.dynamic_slice(cache_v, (i, slot, 0, 0, 0), (1, 1, max_len, kv_heads, hd))[0, 0]
            s = jnp.einsum("cgrd,sgd->grcs", q, ks, preferred_element_type=f32) * hd ** -0.5
            s = jnp.where(jnp.arange(max_len)[None, None, None, :] <= pos[None, None, :, None], s, -1e30)
            o = jnp.einsum("grcs,sgd->cgrd", jax.nn.softmax(s, -1).astype(bf), vs).reshape(chunk, d_model)
            h = h + o @ lw["wo"]
            m = rms(h)
            h = h + (jax.nn.silu(m @ lw["w_gate"]) * (m @ lw["w_up"])) @ lw["w_down"]
            return h, cache_k, cache_v

        carry = (x, kv_cache["k"], kv_cache["v"])
        for i in range(layers):                       # unrolled: the cache updated in place, layer by layer
            carry = layer(carry, i)
        h, ck, cv = carry
        logits = rms(h[-1:]) @ params["lm_head"]
        return logits.astype(f32), {"k": ck, "v": cv}

    L, D, F = layers, d_model, d_ff
    col, row = P(None, None, "d"), P(None, "d", None)
    params = {"embed": sds((32000, D), bf, mesh, P(None, "d")),
              "lm_head": sds((D, 32000), bf, mesh, P(None, "d")),
              "layers": {"wq": sds((L, D, D), bf, mesh, col), "wk": sds((L, D, kv_heads * hd), bf, mesh, col),
                         "wv": sds((L, D, kv_heads * hd), bf, mesh, col), "wo": sds((L, D, D), bf, mesh, row),
                         "w_gate": sds((L, D, F), bf, mesh, col), "w_up": sds((L, D, F), bf, mesh, col),
                         "w_down": sds((L, F, D), bf, mesh, row)}}
    cache_spec = P(None, None, None, "d", None)
    kv_cache = {"k": sds((L, slots, max_len, kv_heads, hd), bf, mesh, cache_spec),
                "v": sds((L, slots, max_len, kv_heads, hd), bf, mesh, cache_spec)}
    chunk_tokens = sds((chunk,), jnp.int32, mesh, P())
    slot = sds((), jnp.int32, mesh, P())
    start = sds((), jnp.int32, mesh, P())
    kw = {"out_shardings": (NamedSharding(mesh, P()), _shardings(kv_cache))}
    if donate:
        kw["donate_argnums"] = (1,)
    return prefill_chunk, (params, kv_cache, chunk_tokens, slot, start), kw


# 40.3 tensor-parallel attention whose logical-axis rules shard the head dimension ('kv') instead of 'heads'


def _logical_rules_attention_builder(mesh, layers, d_model, heads, d_ff, batch, seq, logical_axis_rules):
    """A decoder-only LM trained tensor-parallel over all devices (the batch replicated), parameters annotated
    the flax way with logical axis names (`wq`/`wk`/`wv` ('embed', 'heads', 'kv'), `wo` ('heads', 'kv',
    'embed'), `wi` ('embed', 'mlp'), `wo_mlp` ('mlp', 'embed')) and mapped to mesh axes by `logical_axis_rules`,
    as flax.linen.logical_to_mesh_sharding does; the attention is written out (q k^T scores in f32, causal mask,
    softmax, every layer under jax.checkpoint). bf16 compute, f32 params, SGD, donated.
    The first version's rules map 'kv' (the 128-wide head dimension) to the mesh axis and 'heads' to None: the
    q/k contraction runs over the sharded axis, so every device computes partial scores of all heads, summed
    across devices, [B, H, S, S] whole on every device; the fixed rules map 'heads' to the mesh axis."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    rules = dict(logical_axis_rules)
    hd = d_model // heads

    def logical_to_mesh(names):
        return P(*(rules.get(n) for n in names))

    def layer(h, lw):
        a = h.astype(bf)
        q = jnp.einsum("bsd,dhk->bshk", a, lw["wq"].astype(bf))
        k = jnp.einsum("bsd,dhk->bshk", a, lw["wk"].astype(bf))
        v = jnp.einsum("bsd,dhk->bshk", a, lw["wv"].astype(bf))
        s = jnp.einsum("bqhk,bthk->bhqt", q, k, preferred_element_type=f32) * hd ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -1e30)
        o = jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(s, -1).astype(bf), v)
        h = h + jnp.einsum("bqhk,hkd->bqd", o, lw["wo"].astype(bf)).astype(f32)
        m = jax.nn.gelu(h.astype(bf) @ lw["wi"].astype(bf))
        return h + (m @ lw["wo_mlp"].astype(bf)).astype(f32)

    def lm_train_step(params, inputs, targets):
        def loss_fn(params):
            h = inputs
            for i in range(layers):
                h = jax.checkpoint(layer)(h, params[f"layers_{i}"])
            return jnp.mean(jnp.square(h - targets))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    def w(shape, names):
        return sds(shape, f32, mesh, logical_to_mesh(names))

    params = {f"layers_{i}": {"wq": w((d_model, heads, hd), ("embed", "heads", "kv")),
                              "wk": w((d_model, heads, hd), ("embed", "heads", "kv")),
                              "wv": w((d_model, heads, hd), ("embed", "heads", "kv")),
                              "wo": w((heads, hd, d_model), ("heads", "kv", "embed")),
                              "wi": w((d_model, d_ff), ("embed", "mlp")),
                              "wo_mlp": w((d_ff, d_model), ("mlp", "embed"))} for i in range(layers)}
    inputs = sds((batch, seq, d_model), f32, mesh, P())
    targets = sds((batch, seq, d_model), f32, mesh, P())
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return lm_train_step, (params, inputs, targets), kw


# 40.4 in-graph negative sampling: jax.random.choice(replace=False) vmapped over the batch


def _negative_sampling_builder(mesh, batch, items, dim, negatives, replace):
    """A two-tower recommender (user tower: an MLP over the user features; item tower: an embedding table
    `item_embedding` [items, dim] replicated) trained with sampled softmax; the negatives are drawn inside
    the step, uniformly over the catalogue, `negatives` per example, by
    `jax.vmap(lambda k: jax.random.choice(k, items, (negatives,), replace=replace))(keys)`.
    replace=False (the first version: without replacement jax draws a random permutation of the whole
    catalogue per example (sort-based shuffle) and keeps its first `negatives`, so the vmapped draw sorts
    [B, items] keys and indices); replace=True: independent uniform draws (randint), [B, negatives]."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def two_tower_step(params, user_features, positive_items, rng):
        keys = jax.random.split(rng, user_features.shape[0])
        negative_items = jax.vmap(
            lambda k: jax.random.choice(k, items, (negatives,), replace=replace))(keys)
        negative_items = jax.lax.stop_gradient(negative_items)

        def loss_fn(params):
            u = jax.nn.relu(user_features.astype(bf) @ params["user_tower"]["w0"].astype(bf))
            u = (u @ params["user_tower"]["w1"].astype(bf)).astype(f32)                  # [B, dim]
            table = params["item_embedding"]
            pos = table[positive_items]                                                   # [B, dim]
            neg = table[negative_items]                                                   # [B, K, dim]
            s_pos = jnp.sum(u * pos, -1, keepdims=True)
            s_neg = jnp.einsum("bd,bkd->bk", u, neg)
            logits = jnp.concatenate([s_pos, s_neg], -1)
            return -jnp.mean(jax.nn.log_softmax(logits, -1)[:, 0])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 0.05 * g, params, grads), loss

    params = {"user_tower": {"w0": sds((512, 1024), f32, mesh, P()), "w1": sds((1024, dim), f32, mesh, P())},
              "item_embedding": sds((items, dim), f32, mesh, P())}
    n = mesh.devices.size * batch
    user_features = sds((n, 512), f32, mesh, P("d"))
    positive_items = sds((n,), jnp.int32, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, P())
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return two_tower_step, (params, user_features, positive_items, rng), kw


# 40.5 a DeepONet whose trunk net is evaluated for every (function, query point) pair


def _deeponet_builder(mesh, functions, sensors, grid, width, depth, basis, trunk_per_function):
    """A DeepONet (Lu et al.) learning a solution operator (e.g. of a 2-D Darcy problem) trained
    data-parallel: the branch net encodes each input function from its `sensors` samples [B, m] -> [B, p], the
    trunk net encodes the query coordinates of the solution grid (grid x grid points, (x, y)) -> [Q, p], and the
    prediction is G(u)(y) = <branch(u), trunk(y)>; MSE against the solution on the grid, f32, Adam-free SGD,
    params replicated and donated. trunk_per_function=True (the first version: the query grid broadcast to
    every function of the batch, `jnp.broadcast_to(query_points, (B, Q, 2))`, as in the data loader's
    (function, point) pairs, and the trunk MLP run on [B, Q, width]); False: the trunk run once on the shared
    grid, [Q, width], and the prediction `jnp.einsum('bp,qp->bq', branch, trunk)`."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def mlp(ps, x):
        for i, p in enumerate(ps):
            x = x @ p["kernel"] + p["bias"]
            if i < len(ps) - 1:
                x = jnp.tanh(x)
        return x

    def deeponet_step(params, sensor_values, query_points, solution):
        def loss_fn(params):
            b = mlp(params["branch"], sensor_values)                                       # [B, p]
            if trunk_per_function:
                y = jnp.broadcast_to(query_points, (sensor_values.shape[0],) + query_points.shape)
                t = mlp(params["trunk"], y)                                                # [B, Q, p]
                pred = jnp.einsum("bp,bqp->bq", b, t)
            else:
                t = mlp(params["trunk"], query_points)                                     # [Q, p]
                pred = jnp.einsum("bp,qp->bq", b, t)
            return jnp.mean(jnp.square(pred + params["bias"] - solution))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    def net(sizes):
        return [{"kernel": sds((a, b), f32, mesh, P()), "bias": sds((b,), f32, mesh, P())}
                for a, b in zip(sizes[:-1], sizes[1:])]

    params = {"branch": net([sensors] + [width] * depth + [basis]),
              "trunk": net([2] + [width] * depth + [basis]),
              "bias": sds((), f32, mesh, P())}
    n = mesh.devices.size * functions
    q = grid * grid
    sensor_values = sds((n, sensors), f32, mesh, P("d"))
    query_points = sds((q, 2), f32, mesh, P())
    solution = sds((n, q), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return deeponet_step, (params, sensor_values, query_points, solution), kw


# 40.6 GraphSAGE-pool on a neighbour-sampled two-hop minibatch, node features and aggregation in f32


def _graphsage_builder(mesh, seeds, nodes, feat_dim, hidden, fanout1, fanout2, classes, dtype):
    """GraphSAGE with the max-pool aggregator (Hamilton et al.) trained on neighbour-sampled minibatches (the
    sampler on the host, the node ids of the two hops passed in: `hop1_ids` [B, f1], `hop2_ids` [B, f1, f2]);
    the node-feature table `node_features` [nodes, F] is replicated, the features of every sampled node
    gathered in the step; two SAGE layers (pool MLP on every neighbour, max, concat with self, linear),
    softmax classification; params f32, SGD, donated. dtype='float32' (the first version: the feature table
    and every activation in f32); dtype='bfloat16': the table stored in bf16 and the layers computed in bf16
    (params and loss stay f32)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    dt = jnp.dtype(dtype)

    def sage_layer(p, h_self, h_neigh):
        pooled = jnp.max(jax.nn.relu(h_neigh @ p["pool"]["kernel"].astype(dt)), axis=-2)
        z = jnp.concatenate([h_self, pooled.astype(dt)], -1) @ p["dense"]["kernel"].astype(dt)
        return jax.nn.relu(z)

    def sage_train_step(params, node_features, seed_ids, hop1_ids, hop2_ids, labels):
        def loss_fn(params):
            x0 = node_features[seed_ids]                                                      # [B, F]
            x1 = node_features[hop1_ids]                                                      # [B, f1, F]
            x2 = node_features[hop2_ids]                                                      # [B, f1, f2, F]
            h1_seed = sage_layer(params["sage_0"], x0, x1)                                    # [B, H]
            h1_hop1 = sage_layer(params["sage_0"], x1, x2)                                    # [B, f1, H]
            h2 = sage_layer(params["sage_1"], h1_seed, h1_hop1)                               # [B, H]
            logits = (h2 @ params["classifier"]["kernel"].astype(dt)).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[:, None], -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-2 * g, params, grads), loss

    def dense(i, o):
        return {"kernel": sds((i, o), f32, mesh, P())}

    params = {"sage_0": {"pool": dense(feat_dim, feat_dim), "dense": dense(2 * feat_dim, hidden)},
              "sage_1": {"pool": dense(hidden, hidden), "dense": dense(2 * hidden, hidden)},
              "classifier": dense(hidden, classes)}
    n = mesh.devices.size * seeds
    node_features = sds((nodes, feat_dim), dt, mesh, P())
    seed_ids = sds((n,), jnp.int32, mesh, P("d"))
    hop1_ids = sds((n, fanout1), jnp.int32, mesh, P("d"))
    hop2_ids = sds((n, fanout1, fanout2), jnp.int32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return sage_train_step, (params, node_features, seed_ids, hop1_ids, hop2_ids, labels), kw

pair(
    "knn_lm_datastore_device_put", "v5e", "v5e:2x2",
    "A kNN-LM decoding step on v5e (64 queries, k=1024 neighbours): the datastore of 8M bf16 keys of width 1024 "
    "(16 GiB) and their next tokens was put on the devices with jax.device_put(keys), no sharding, so jit holds "
    "the whole datastore on every device: 16.04G of arguments, beyond 15.75G.",
    "Fixed variant of knn_lm_datastore_device_put_v5e: the datastore put with jax.device_put(keys, "
    "NamedSharding(mesh, P('d', None))), 2M keys per device; fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed"]),
    _knn_lm_builder, dict(datastore_size=8 * 1024 * 1024, key_dim=1024, queries=64, vocab=32000, k=1024,
                          datastore_spec=()),
    dict(datastore_size=8 * 1024 * 1024, key_dim=1024, queries=64, vocab=32000, k=1024, datastore_spec=("d",)),
    dump=True,
)

pair(
    "chunked_prefill_kv_cache_not_donated", "v6e", "v6e:2x2",
    "Chunked prefill (1024-token chunks) of a 4-layer Llama-style decoder served tensor-parallel on v6e: the "
    "KV cache of 144 slots x 32768 tokens (18 GiB per device, K and V 9 GiB each) is passed to the jitted step "
    "and returned updated without donate_argnums, so the old and the new cache are both live, beyond 31.25G.",
    "Fixed variant of chunked_prefill_kv_cache_not_donated_v6e: donate_argnums=(1,), the cache updated in "
    "place; fits.",
    dict(category="aggregate", causes=["no_donation"]),
    _chunked_prefill_builder, dict(layers=4, d_model=4096, heads=32, kv_heads=8, d_ff=14336, slots=144,
                                   max_len=32768, chunk=1024, donate=False),
    dict(layers=4, d_model=4096, heads=32, kv_heads=8, d_ff=14336, slots=144, max_len=32768, chunk=1024,
         donate=True),
    dump=False,
)

pair(
    "logical_rules_head_dim_sharded", "v4", "v4:2x2x1",
    "A 4-layer decoder trained tensor-parallel on v4 (8 TensorCores, 16 sequences of 2048, 32 heads): the "
    "flax-style logical_axis_rules map 'kv' (the head dimension) to the mesh axis and 'heads' to None, so the "
    "q.k contraction is split across cores and every core holds the f32 scores of all 32 heads, "
    "f32[16,32,2048,2048] (8 GiB), beyond 15.25G.",
    "Fixed variant of logical_rules_head_dim_sharded_v4: the rules map 'heads' to the mesh axis and 'kv' to "
    "None (4 heads per core); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "large_activation"]),
    _logical_rules_attention_builder,
    dict(layers=4, d_model=4096, heads=32, d_ff=16384, batch=16, seq=2048,
         logical_axis_rules=(("embed", None), ("heads", None), ("kv", "d"), ("mlp", "d"))),
    dict(layers=4, d_model=4096, heads=32, d_ff=16384, batch=16, seq=2048,
         logical_axis_rules=(("embed", None), ("heads", "d"), ("kv", None), ("mlp", "d"))),
    dump=False,
)

pair(
    "negative_sampling_without_replacement", "v5p", "v5p:2x2x1",
    "A two-tower recommender trained on v5p with 64 uniform negatives per example drawn in the step by "
    "jax.vmap(jax.random.choice(key, 2M items, (64,), replace=False)) over 8192 examples per device: without "
    "replacement jax shuffles the whole catalogue per example, a sort of [8192, 2097152] keys and indices "
    "(64 GiB each), beyond 95.74G.",
    "Fixed variant of negative_sampling_without_replacement_v5p: replace=True (independent uniform draws, "
    "[8192, 64]); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _negative_sampling_builder, dict(batch=8192, items=2097152, dim=128, negatives=64, replace=False),
    dict(batch=8192, items=2097152, dim=128, negatives=64, replace=True),
    dump=False,
)

pair(
    "deeponet_trunk_per_function", "v5e", "v5e:2x2",
    "A DeepONet (branch and trunk MLPs of width 512, 4 layers, 512 basis functions, f32) trained on v5e with "
    "256 input functions per device and a 128x128 solution grid: the query grid is broadcast to every function "
    "and the trunk net run on [256, 16384, 512] activations (8 GiB each), beyond 15.75G.",
    "Fixed variant of deeponet_trunk_per_function_v5e: the trunk net run once on the shared grid [16384, 2] and "
    "the prediction einsum('bp,qp->bq'); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _deeponet_builder, dict(functions=256, sensors=1024, grid=128, width=512, depth=4, basis=512,
                            trunk_per_function=True),
    dict(functions=256, sensors=1024, grid=128, width=512, depth=4, basis=512, trunk_per_function=False),
    dump=True,
)

pair(
    "graphsage_two_hop_f32", "v6e", "v6e:2x2",
    "GraphSAGE-pool (2 layers, fanouts 25 and 10) trained on v6e on 73728 seed nodes per device: the f32 "
    "node-feature table [2M, 256] is gathered for every sampled node, the two-hop features f32[73728,25,10,256] "
    "(17.58 GiB each) and the pool MLP's activations on them in f32, beyond 31.25G.",
    "Fixed variant of graphsage_two_hop_f32_v6e: the node-feature table stored in bf16 and the layers computed "
    "in bf16 (params and loss in f32); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["f32_precision", "large_activation", "batch_too_large"]),
    _graphsage_builder, dict(seeds=73728, nodes=2097152, feat_dim=256, hidden=256, fanout1=25, fanout2=10,
                             classes=64, dtype="float32"),
    dict(seeds=73728, nodes=2097152, feat_dim=256, hidden=256, fanout1=25, fanout2=10, classes=64,
         dtype="bfloat16"),
    dump=False,
)


# ---- 41. more broken/fixed pairs (batch tpu30): other models, other names ---------------------
#
# Programs of kinds sections 13-40 do not have (a dense-retrieval passage index jitted with in_shardings that
# shard its embedding dimension instead of its rows; a DLRM-style model-parallel embedding lookup in shard_map
# whose partial embeddings are combined with psum instead of psum_scatter; param-tree regex partition rules
# anchored at '^params/' so that the Adam moments fall through to the catch-all P(); an EEND speaker-diarization
# loss that scores every speaker permutation on the permuted label tensor; a sequential recommender's
# full-catalogue ranking evaluation that takes the target's rank from an argsort of all item scores; AlphaFold's
# outer-product-mean computed for the whole [N, N, c*c] tensor at once).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu30 for which pairs keep their dumps and what did not go as first written.


# 41.1 a dense-retrieval passage index sharded over its embedding dimension instead of its rows


def _passage_index_builder(mesh, passages, dim, queries, k, index_spec):
    """One search step of a dense passage retriever (DPR / GTR style) served on a slice: the query encoder's
    output `query_emb` [Q, D] (f32, replicated) is scored against the bf16 passage index [N, D] by inner
    product (f32 scores), a two-stage top-k (top-k within each of n equal blocks of the index, then over the
    n*k candidates) picks the k best passages, whose ids are returned. jitted as
    `jax.jit(retrieve_top_passages, in_shardings=(index_sh, ids_sh, query_sh))`.
    index_spec=(None, 'd') (the first version: "D = 768 divides by the device count", the index sharded over
    the embedding dimension: each device holds a slice of every passage vector, the inner products are partial
    sums, so every device ends with the scores of the whole index [Q, N]); index_spec=('d', None): sharded by
    passage rows, each device scores its own block of the index."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n = mesh.devices.size

    def retrieve_top_passages(passage_index, passage_ids, query_emb):
        scores = jnp.einsum("qd,nd->qn", query_emb.astype(bf), passage_index,
                            preferred_element_type=f32)                                # [Q, N]
        blocks = scores.reshape(queries, n, passages // n)
        top_s, top_i = jax.lax.top_k(blocks, k)                                        # [Q, n, k]
        top_i = top_i + (jnp.arange(n) * (passages // n))[None, :, None]
        best_s, best = jax.lax.top_k(top_s.reshape(queries, n * k), k)                 # [Q, k]
        cand = jnp.take_along_axis(top_i.reshape(queries, n * k), best, -1)
        return passage_ids[cand], best_s

    passage_index = sds((passages, dim), bf, mesh, P(*index_spec))
    passage_ids = sds((passages,), jnp.int32, mesh, P(index_spec[0]))
    query_emb = sds((queries, dim), f32, mesh, P())
    args = (passage_index, passage_ids, query_emb)
    kw = {"in_shardings": tuple(_shardings(a) for a in args),
          "out_shardings": (NamedSharding(mesh, P()), NamedSharding(mesh, P()))}
    return retrieve_top_passages, args, kw


# 41.2 a DLRM-style model-parallel embedding lookup in shard_map combined with psum instead of psum_scatter


def _dlrm_psum_builder(mesh, rows_per_device, tables, vocab_per_table, dim, dense_in, top_mlp, scatter):
    """One training step of a DLRM-style click model written with jax.shard_map on a 1-D 'd' mesh: the 26
    embedding tables are stacked [F, V, D] f32 and sharded row-wise over the devices (model-parallel, TorchRec
    style); each device all-gathers the sparse ids of the global batch, looks up the rows it owns (masked),
    and the partial embeddings [B_global, F, D] are combined across devices; the bottom MLP, the dot
    interaction and the top MLP (widths `top_mlp`) run data-parallel, their gradients pmean'ed, SGD, params
    donated.
    scatter=False (the first version: `jax.lax.psum(partial, 'd')`: every device gets the pooled embeddings of
    the whole global batch and runs the interaction and the top MLP on it); scatter=True:
    `jax.lax.psum_scatter(partial, 'd', scatter_dimension=0, tiled=True)`, each device keeps its own rows."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    n = mesh.devices.size
    rows_local_vocab = vocab_per_table // n
    B = rows_per_device * n

    def dense_mlp(ws, x):
        for w in ws[:-1]:
            x = jax.nn.relu(x @ w)
        return x @ ws[-1]

    def local_step(params, dense_x, sparse_ids, clicks):
        me = jax.lax.axis_index("d")
        all_ids = jax.lax.all_gather(sparse_ids, "d", tiled=True)                      # [B_global, F]

        def loss_fn(params):
            local = all_ids - me * rows_local_vocab
            owned = (local >= 0) & (local < rows_local_vocab)
            idx = jnp.clip(local, 0, rows_local_vocab - 1)
            emb = jax.vmap(lambda t, i: t[i], in_axes=(0, 1), out_axes=1)(params["embedding_tables"], idx)
            partial = jnp.where(owned[..., None], emb, 0.0)                            # [B_global, F, D]
            if scatter:
                pooled = jax.lax.psum_scatter(partial, "d", scatter_dimension=0, tiled=True)
                x, y = dense_x, clicks
            else:
                pooled = jax.lax.psum(partial, "d")
                x = jax.lax.all_gather(dense_x, "d", tiled=True)
                y = jax.lax.all_gather(clicks, "d", tiled=True)
            bot = dense_mlp(params["bottom_mlp"], x)                                   # [b, D]
            feats = jnp.concatenate([bot[:, None, :], pooled], 1)                      # [b, F+1, D]
            inter = jnp.einsum("bfd,bgd->bfg", feats, feats)
            iu = jnp.triu_indices(tables + 1, 1)
            z = jnp.concatenate([bot, inter[:, iu[0], iu[1]]], -1)
            logit = dense_mlp(params["top_mlp"], z)[:, 0]
            return jnp.mean(jnp.maximum(logit, 0) - logit * y + jnp.log1p(jnp.exp(-jnp.abs(logit))))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        grads = {k: (v if k == "embedding_tables" else jax.lax.pmean(v, "d")) for k, v in grads.items()}
        new = _tm(lambda p, g: p - 1e-2 * g, params, grads)
        return new, jax.lax.pmean(loss, "d")

    F, D = tables, dim
    inter_dim = D + (F + 1) * F // 2
    bottom = [sds((dense_in, 512), f32, mesh, P()), sds((512, 256), f32, mesh, P()), sds((256, D), f32, mesh, P())]
    widths = [inter_dim] + list(top_mlp) + [1]
    top = [sds((a, b), f32, mesh, P()) for a, b in zip(widths[:-1], widths[1:])]
    params = {"embedding_tables": sds((F, vocab_per_table, D), f32, mesh, P(None, "d", None)),
              "bottom_mlp": bottom, "top_mlp": top}
    param_specs = {"embedding_tables": P(None, "d", None), "bottom_mlp": [P()] * len(bottom),
                   "top_mlp": [P()] * len(top)}
    dense_x = sds((B, dense_in), f32, mesh, P("d"))
    sparse_ids = sds((B, F), jnp.int32, mesh, P("d"))
    clicks = sds((B,), f32, mesh, P("d"))
    dlrm_train_step = jax.shard_map(local_step, mesh=mesh, in_specs=(param_specs, P("d"), P("d"), P("d")),
                                    out_specs=(param_specs, P()), check_vma=False)
    dlrm_train_step.__name__ = "dlrm_train_step"
    return dlrm_train_step, (params, dense_x, sparse_ids, clicks), {"donate_argnums": (0,)}


# 41.3 param-tree regex partition rules anchored at '^params/': the Adam moments fall through to the catch-all P()


def _match_partition_rules(rules, tree):
    """EasyLM-style `match_partition_rules`: every leaf's path is joined with '/' and the first rule whose
    regex `re.search`es it gives the PartitionSpec; scalars are replicated."""
    import re

    jax, jnp, NamedSharding, P = _jax()

    def path_str(path):
        parts = []
        for p in path:
            parts.append(str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))))
        return "/".join(parts)

    def spec(path, leaf):
        if len(leaf.shape) == 0:
            return P()
        name = path_str(path)
        for rule, ps in rules:
            if re.search(rule, name) is not None:
                return ps
        raise ValueError(f"no partition rule for {name}")

    return jax.tree_util.tree_map_with_path(spec, tree)


def _regex_rules_builder(mesh, layers, d_model, d_ff, heads, vocab, seqs, seq_len, anchored):
    """A Llama-style decoder trained with Adam, FSDP over a 1-D mesh axis 'd', its train state
    {"params", "opt_state": {"count", "mu", "nu"}} sharded by regex partition rules (EasyLM's
    `match_partition_rules` on '/'-joined tree paths, catch-all ('.*', P()) last), jitted with in_shardings =
    out_shardings from the rules, the state donated.
    anchored=True (the first version: the rules were written for the params tree alone, as
    r'^params/transformer/layers/attention/(wq|wk|wv|wo)' etc.; the moments' paths start with
    'opt_state/mu/...', no rule matches them but the catch-all, so mu and nu are replicated on every device);
    anchored=False: the same rules without the '^params/' anchor, the moments sharded like their params."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    pre = "^params/" if anchored else ""
    rules = [
        (pre + r"transformer/wte/embedding", P("d", None)),
        (pre + r"transformer/layers/attention/(wq|wk|wv)/kernel", P(None, "d", None)),
        (pre + r"transformer/layers/attention/wo/kernel", P(None, None, "d")),
        (pre + r"transformer/layers/feed_forward/(w1|w3)/kernel", P(None, "d", None)),
        (pre + r"transformer/layers/feed_forward/w2/kernel", P(None, None, "d")),
        (pre + r"lm_head/kernel", P(None, "d")),
        (r".*", P()),
    ]
    L, D, F, H = layers, d_model, d_ff, heads
    hd = D // H

    def rms(x):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf)

    def train_step(state, tokens):
        def loss_fn(params):
            tp = params["transformer"]
            h = tp["wte"]["embedding"].astype(bf)[tokens[:, :-1]]
            b, s, _ = h.shape

            def block(h, lw):
                a = rms(h)
                q = (a @ lw["attention"]["wq"]["kernel"].astype(bf)).reshape(b, s, H, hd)
                k_ = (a @ lw["attention"]["wk"]["kernel"].astype(bf)).reshape(b, s, H, hd)
                v = (a @ lw["attention"]["wv"]["kernel"].astype(bf)).reshape(b, s, H, hd)
                sc = jnp.einsum("bqhd,bkhd->bhqk", q, k_).astype(f32) * hd ** -0.5
                sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
                o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, -1).astype(bf), v).reshape(b, s, D)
                h = h + o @ lw["attention"]["wo"]["kernel"].astype(bf)
                m = rms(h)
                ff = lw["feed_forward"]
                y = (jax.nn.silu(m @ ff["w1"]["kernel"].astype(bf)) * (m @ ff["w3"]["kernel"].astype(bf))) \
                    @ ff["w2"]["kernel"].astype(bf)
                return h + y, None

            h, _ = jax.lax.scan(jax.checkpoint(block), h, tp["layers"])
            logits = (rms(h) @ params["lm_head"]["kernel"].astype(bf)).astype(f32)
            lse = jax.nn.logsumexp(logits, -1)
            tgt = jnp.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0]
            return jnp.mean(lse - tgt)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        new_params, new_opt = adam_update(state["params"], grads, state["opt_state"])
        return {"params": new_params, "opt_state": new_opt}, loss

    shapes = {"transformer": {"wte": {"embedding": (vocab, D)},
                              "layers": {"attention": {"wq": {"kernel": (L, D, D)}, "wk": {"kernel": (L, D, D)},
                                                       "wv": {"kernel": (L, D, D)}, "wo": {"kernel": (L, D, D)}},
                                         "feed_forward": {"w1": {"kernel": (L, D, F)}, "w3": {"kernel": (L, D, F)},
                                                          "w2": {"kernel": (L, F, D)}}}},
              "lm_head": {"kernel": (D, vocab)}}
    is_shape = lambda t: isinstance(t, tuple)  # noqa: E731
    abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, f32), shapes, is_leaf=is_shape)
    state = {"params": abstract,
             "opt_state": {"count": jax.ShapeDtypeStruct((), jnp.int32), "mu": abstract, "nu": abstract}}
    specs = _match_partition_rules(rules, state)
    state = jax.tree_util.tree_map(lambda a, ps: sds(a.shape, a.dtype, mesh, ps), state, specs)
    tokens = sds((mesh.devices.size * seqs, seq_len + 1), jnp.int32, mesh, P("d"))
    state_sh = _shardings(state)
    kw = {"in_shardings": (state_sh, NamedSharding(mesh, P("d"))),
          "out_shardings": (state_sh, NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return train_step, (state, tokens), kw


# 41.4 EEND speaker diarization: permutation-invariant training that scores every permutation on permuted labels


def _eend_pit_builder(mesh, recordings, frames, feat_dim, hidden, speakers, pairwise):
    """One training step of an end-to-end neural diarization model (EEND / SA-EEND style; the encoder reduced to
    a 2-layer MLP over log-mel frames here) with the permutation-invariant BCE loss: the model emits per-frame
    speech-activity logits [B, T, S] for S speakers; the loss is the minimum over the S! speaker permutations of
    the mean BCE against the permuted labels.
    pairwise=False (the first version, as in EEND's `batch_pit_loss`: every permutation of the labels
    `labels[..., perms]` [B, T, S!, S] and the BCE on it); pairwise=True: the [B, S, S] matrix of mean BCEs of
    output i against reference j (softplus(x) - x*y, averaged over frames, one einsum), and each
    permutation's cost summed from it, [B, S!]."""
    import itertools

    import numpy as np

    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    perms = np.array(list(itertools.permutations(range(speakers))), np.int32)          # [S!, S]

    def pit_bce(logits, labels):
        if pairwise:
            sp = jnp.mean(jax.nn.softplus(logits), 1)                                     # [B, S]
            xy = jnp.einsum("bti,btj->bij", logits, labels) / frames                      # [B, S, S]
            pair_cost = sp[:, :, None] - xy                                               # out i vs ref j
            cost = jnp.sum(pair_cost[:, jnp.arange(speakers)[None, :], perms], -1) / speakers   # [B, S!]
        else:
            perm_labels = labels[:, :, perms]                                             # [B, T, S!, S]
            x = logits[:, :, None, :]
            bce = jax.nn.softplus(x) - x * perm_labels
            cost = jnp.mean(bce, (1, 3))                                                  # [B, S!]
        return jnp.mean(jnp.min(cost, -1))

    def eend_train_step(params, log_mel, speaker_activity):
        def loss_fn(params):
            h = jax.nn.relu(log_mel @ params["encoder"]["w1"])
            h = jax.nn.relu(h @ params["encoder"]["w2"])
            logits = h @ params["speaker_head"]
            return pit_bce(logits, speaker_activity)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    params = {"encoder": {"w1": sds((feat_dim, hidden), f32, mesh, P()), "w2": sds((hidden, hidden), f32, mesh, P())},
              "speaker_head": sds((hidden, speakers), f32, mesh, P())}
    B = mesh.devices.size * recordings
    log_mel = sds((B, frames, feat_dim), f32, mesh, P("d"))
    speaker_activity = sds((B, frames, speakers), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return eend_train_step, (params, log_mel, speaker_activity), kw


# 41.5 full-catalogue ranking evaluation of a sequential recommender: the target's rank taken from an argsort


def _full_rank_eval_builder(mesh, users, items, dim, cutoff, count_above):
    """The evaluation step of a SASRec-style sequential recommender with full ranking (no sampled negatives):
    the last hidden state of every user's history [U, D] (sharded over 'd') is scored against the whole item
    catalogue [N, D] (bf16, replicated) and the rank of the held-out next item gives HR@K, NDCG@K and MRR
    (unfiltered: the history items stay in the ranking).
    count_above=False (the first version, as RecBole-style code computes it: `jnp.argsort(-scores, -1)`, then
    the position of the target in the sorted item list: a sort of [U, N] keys with their indices);
    count_above=True: the rank is the number of items scored above the target, `jnp.sum(scores > target_score,
    -1)`, the same metrics without sorting."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def evaluate_full_ranking(item_embedding, user_state, target_item):
        scores = jnp.einsum("ud,nd->un", user_state.astype(bf), item_embedding,
                            preferred_element_type=f32)                                  # [U, N]
        target_score = jnp.take_along_axis(scores, target_item[:, None], -1)
        if count_above:
            rank = jnp.sum(scores > target_score, -1)
        else:
            order = jnp.argsort(-scores, -1)
            rank = jnp.argmax(order == target_item[:, None], -1)
        hit = (rank < cutoff).astype(f32)
        ndcg = hit / jnp.log2(rank.astype(f32) + 2.0)
        return {"hr": jnp.mean(hit), "ndcg": jnp.mean(ndcg), "mrr": jnp.mean(1.0 / (rank + 1.0))}

    n = mesh.devices.size
    item_embedding = sds((items, dim), bf, mesh, P())
    user_state = sds((n * users, dim), f32, mesh, P("d"))
    target_item = sds((n * users,), jnp.int32, mesh, P("d"))
    return evaluate_full_ranking, (item_embedding, user_state, target_item), {}



# 41.6 AlphaFold's outer-product-mean (MSA -> pair) computed for the whole [N, N, c, c] tensor at once


def _outer_product_mean_builder(mesh, msa_depth, residues, c_m, c_hidden, c_z, chunk):
    """A training step of the MSA -> pair communication of an Evoformer block (AlphaFold 2 / OpenFold
    `OuterProductMean`) with a distogram head on the pair update: layer norm of the MSA representation
    [S, N, c_m], linear projections a, b to c_hidden = 32, the outer product averaged over the S sequences,
    einsum('sic,sjd->ijcd') / S, flattened to [N, N, c*c] (f32) and projected to c_z, a 64-bin distogram
    cross-entropy; one protein per device (the proteins sharded over 'd'), f32 params replicated, SGD.
    chunk=None (the first version: the [N, N, 1024] outer products of the whole crop at once, and their
    gradient); chunk=128: OpenFold's chunking, rows of i 128 at a time with lax.map, each chunk under
    jax.checkpoint so the backward pass recomputes it instead of stacking every chunk's outer product."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def outer_product_mean(p, m):
        mu = jnp.mean(m, -1, keepdims=True)
        m = (m - mu) * jax.lax.rsqrt(jnp.var(m, -1, keepdims=True) + 1e-5) * p["norm"]["scale"]
        a = m @ p["linear_1"]                                                            # [S, N, c]
        b = m @ p["linear_2"]

        def rows(a_rows):
            o = jnp.einsum("sic,sjd->ijcd", a_rows, b) / msa_depth                       # [r, N, c, c]
            return o.reshape(o.shape[0], residues, c_hidden * c_hidden) @ p["linear_out"]

        if chunk is None:
            return rows(a)                                                               # [N, N, c_z]
        blocks = a.reshape(msa_depth, residues // chunk, chunk, c_hidden).transpose(1, 0, 2, 3)
        z = jax.lax.map(jax.checkpoint(rows), blocks)                                    # [N/chunk, chunk, N, c_z]
        return z.reshape(residues, residues, c_z)

    def evoformer_opm_step(params, msa_act, distogram_bins):
        def loss_fn(params):
            def one(m, bins):
                z = outer_product_mean(params["outer_product_mean"], m)
                logits = z @ params["distogram_head"]                                    # [N, N, 64]
                lse = jax.nn.logsumexp(logits, -1)
                tgt = jnp.take_along_axis(logits, bins[..., None], -1)[..., 0]
                return jnp.mean(lse - tgt)
            return jnp.mean(jax.vmap(one)(msa_act, distogram_bins))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    rep = P()
    params = {"outer_product_mean": {"norm": {"scale": sds((c_m,), f32, mesh, rep)},
                                     "linear_1": sds((c_m, c_hidden), f32, mesh, rep),
                                     "linear_2": sds((c_m, c_hidden), f32, mesh, rep),
                                     "linear_out": sds((c_hidden * c_hidden, c_z), f32, mesh, rep)},
              "distogram_head": sds((c_z, 64), f32, mesh, rep)}
    n = mesh.devices.size
    msa_act = sds((n, msa_depth, residues, c_m), f32, mesh, P("d"))
    distogram_bins = sds((n, residues, residues), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return evoformer_opm_step, (params, msa_act, distogram_bins), kw

pair(
    "passage_index_sharded_on_dim", "v5e", "v5e:2x2",
    "A dense passage retriever searching 8M passages (bf16 index [8388608, 768]) for 256 queries on v5e, "
    "jitted with in_shardings that shard the index over its embedding dimension, P(None, 'd'): the inner "
    "products are partial sums over the devices and every device holds the f32 scores of the whole index "
    "[256, 8388608] (8 GiB) and the top-k over them, beyond 15.75G.",
    "Fixed variant of passage_index_sharded_on_dim_v5e: the index sharded by passage rows, P('d', None) (2M "
    "passages per device, each device scores its own block); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "large_activation"]),
    _passage_index_builder, dict(passages=8388608, dim=768, queries=256, k=100, index_spec=(None, "d")),
    dict(passages=8388608, dim=768, queries=256, k=100, index_spec=("d", None)),
    dump=True,
)

pair(
    "dlrm_embeddings_psum_not_scattered", "v4", "v4:2x2x1",
    "A DLRM-style click model trained on v4 (8 TensorCores, 32768 rows each) in jax.shard_map: the 26 "
    "row-sharded embedding tables are looked up for the all-gathered global batch and the partial embeddings "
    "combined with jax.lax.psum, so every core runs the dot interaction and the top MLP (8192-8192-2048) on "
    "the whole global batch of 262144 rows (f32[262144,8192] activations, 8 GiB slots), beyond 15.25G.",
    "Fixed variant of dlrm_embeddings_psum_not_scattered_v4: jax.lax.psum_scatter(partial, 'd', "
    "scatter_dimension=0, tiled=True), each core keeps the embeddings of its own 32768 rows; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["replicated_tensor", "batch_too_large"]),
    _dlrm_psum_builder, dict(rows_per_device=32768, tables=26, vocab_per_table=1048576, dim=128, dense_in=13,
                             top_mlp=(8192, 8192, 2048), scatter=False),
    dict(rows_per_device=32768, tables=26, vocab_per_table=1048576, dim=128, dense_in=13,
         top_mlp=(8192, 8192, 2048), scatter=True),
    dump=False,
)

pair(
    "regex_rules_anchored_params_moments_replicated", "v6e", "v6e:2x2",
    "A 2.9B-parameter Llama-style decoder trained with Adam (FSDP over 4 v6e chips) whose train state is "
    "sharded by EasyLM-style regex partition rules written as '^params/transformer/...': the Adam moments' "
    "paths ('opt_state/mu/...') match only the catch-all ('.*', P()), so mu and nu (21.6 GiB) are replicated "
    "on every chip, beyond 31.25G.",
    "Fixed variant of regex_rules_anchored_params_moments_replicated_v6e: the same rules without the "
    "'^params/' anchor, the moments sharded like their parameters; fits.",
    dict(category="aggregate", category_also=["arguments"],
         causes=["optimizer_state_unsharded", "replicated_tensor"]),
    _regex_rules_builder, dict(layers=24, d_model=3072, d_ff=8192, heads=24, vocab=32000, seqs=2, seq_len=2048,
                               anchored=True),
    dict(layers=24, d_model=3072, d_ff=8192, heads=24, vocab=32000, seqs=2, seq_len=2048, anchored=False),
    dump=False,
)

pair(
    "eend_pit_all_permutations", "v5p", "v5p:2x2x1",
    "An EEND speaker-diarization model trained on v5p (256 recordings of 4000 frames per device, 7 speakers) "
    "with the permutation-invariant BCE computed as in EEND's batch_pit_loss: the labels permuted for all "
    "5040 speaker orders, [B, T, 5040, 7], and the BCE on them (34.45 GiB slots), beyond 95.74G.",
    "Fixed variant of eend_pit_all_permutations_v5p: the [B, 7, 7] matrix of mean BCEs of output i against "
    "speaker j (one einsum), each permutation's cost summed from it; fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large"]),
    _eend_pit_builder, dict(recordings=256, frames=4000, feat_dim=345, hidden=256, speakers=7, pairwise=False),
    dict(recordings=256, frames=4000, feat_dim=345, hidden=256, speakers=7, pairwise=True),
    dump=False,
)

pair(
    "full_rank_eval_argsort", "v5e", "v5e:2x2",
    "Full-ranking evaluation (HR@10, NDCG@10, MRR) of a SASRec-style sequential recommender on v5e: 1280 "
    "users per device scored against a 2M-item catalogue, the target's rank taken from jnp.argsort(-scores): "
    "the sort of [1280, 2097152] f32 keys with s32 indices (10 GiB slots), beyond 15.75G.",
    "Fixed variant of full_rank_eval_argsort_v5e: the rank as the number of items scored above the target, "
    "jnp.sum(scores > target_score, -1), no sort; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _full_rank_eval_builder, dict(users=1280, items=2097152, dim=64, cutoff=10, count_above=False),
    dict(users=1280, items=2097152, dim=64, cutoff=10, count_above=True),
    dump=True,
)

pair(
    "outer_product_mean_unchunked", "v6e", "v6e:2x2",
    "The outer-product-mean (MSA -> pair) of an AlphaFold/OpenFold Evoformer block trained on v6e with a "
    "3072-residue crop and 512 MSA sequences per chip: einsum('sic,sjd->ijcd') for the whole crop, "
    "bf16[3072,3072,32,32] (18 GiB slots) and its gradient, beyond 31.25G.",
    "Fixed variant of outer_product_mean_unchunked_v6e: OpenFold's chunking, rows of i 128 at a time with "
    "lax.map, each chunk under jax.checkpoint; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation"]),
    _outer_product_mean_builder, dict(msa_depth=512, residues=3072, c_m=256, c_hidden=32, c_z=128, chunk=None),
    dict(msa_depth=512, residues=3072, c_m=256, c_hidden=32, c_z=128, chunk=128),
    dump=False,
)

# ---- 42. more broken/fixed pairs (batch tpu31): other models, other names ---------------------
#
# Programs of kinds sections 13-40 do not have, sequence models and science (an ESM-style protein language
# model whose embedding-extraction shard_map all-gathers the per-residue embeddings for out_specs=P(); FSDP
# written with shard_map whose per-layer all_gather inside the scan over layers is saved for the backward
# pass; an on-device (Anakin-style) DQN whose replay buffer gets in_shardings P(); a rolling-origin time-series
# backtest that vmaps the forecaster over every forecast origin at once; a protein homology-search evaluation
# that ranks the whole database with jnp.argsort for recall@k; a CTC loss over long audio written as a generic
# HMM forward with a dense [B, S, S] transition matrix).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu31 for which pairs keep their dumps and what did not go as first written.


# 42.1 protein-LM embedding extraction in shard_map: the embeddings all-gathered for out_specs=P()


def _plm_embeddings_builder(mesh, layers, d_model, heads, d_ff, seqs, seq_len, micro_batch, gather_output):
    """Per-residue embedding extraction with an ESM-2-style protein language model (pre-LN encoder, bf16
    weights `esm_layers` stacked [L, ...] and replicated, a lax.scan over the layers) run under jax.shard_map
    over a data-parallel mesh: each device embeds its share of the sequences in micro-batches
    (`jax.lax.map(embed_micro_batch, ...)`) and returns the final layer's f32 representations [N, S, D].
    gather_output=True (the first version: `jax.lax.all_gather(reps, 'd', tiled=True)` with out_specs=P(), so
    that the host reads "the whole array" from any device: every device holds the representations of all
    sequences); False: out_specs=P('d'), no gather, the host reads the shards."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def ln(x, g):
        x32 = x.astype(f32)
        x32 = (x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-5)
        return (x32 * g).astype(bf)

    def esm_layer(h, lw):
        a = ln(h, lw["attn_ln"])
        q = (a @ lw["q_proj"]).reshape(*a.shape[:2], heads, hd)
        k = (a @ lw["k_proj"]).reshape(*a.shape[:2], heads, hd)
        v = (a @ lw["v_proj"]).reshape(*a.shape[:2], heads, hd)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(a.shape)
        h = h + o @ lw["out_proj"]
        m = ln(h, lw["final_ln"])
        return h + jax.nn.gelu(m @ lw["fc1"]) @ lw["fc2"], None

    def embed_micro_batch(params, tokens):
        h = params["embed_tokens"][tokens]                                                  # [mb, S, D]
        h, _ = jax.lax.scan(esm_layer, h, params["esm_layers"])
        return ln(h, params["emb_layer_norm_after"]).astype(f32)

    def per_shard(params, tokens):
        mbs = tokens.reshape(-1, micro_batch, seq_len)
        reps = jax.lax.map(lambda t: embed_micro_batch(params, t), mbs).reshape(-1, seq_len, d_model)
        if gather_output:
            reps = jax.lax.all_gather(reps, "d", tiled=True)
        return reps

    extract = jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P("d")),
                            out_specs=P() if gather_output else P("d"), check_vma=False)

    def extract_residue_embeddings(params, tokens):
        return extract(params, tokens)

    L, D, F = layers, d_model, d_ff
    rep = P()
    params = {"embed_tokens": sds((33, D), bf, mesh, rep),
              "emb_layer_norm_after": sds((D,), f32, mesh, rep),
              "esm_layers": {"attn_ln": sds((L, D), f32, mesh, rep), "final_ln": sds((L, D), f32, mesh, rep),
                             "q_proj": sds((L, D, D), bf, mesh, rep), "k_proj": sds((L, D, D), bf, mesh, rep),
                             "v_proj": sds((L, D, D), bf, mesh, rep), "out_proj": sds((L, D, D), bf, mesh, rep),
                             "fc1": sds((L, D, F), bf, mesh, rep), "fc2": sds((L, F, D), bf, mesh, rep)}}
    tokens = sds((mesh.devices.size * seqs, seq_len), jnp.int32, mesh, P("d"))
    return extract_residue_embeddings, (params, tokens), {}


# 42.2 FSDP in shard_map: the all_gather inside the scan over layers saved for the backward pass (no remat)


def _fsdp_scan_all_gather_builder(mesh, layers, d_model, heads, d_ff, batch, seq, remat):
    """A decoder-only DNA language model (byte-level nucleotides, Llama-style blocks) trained with FSDP
    written by hand in jax.shard_map, as in the JAX shard_map tutorial: the f32 parameters are stacked
    [L, ...] and sharded over their last axis, and the body of the lax.scan over the layers all-gathers
    its layer's weights (cast to bf16) with `jax.lax.all_gather(w, 'd', axis=1, tiled=True)`; the
    gradients come back reduce-scattered (the transpose of all_gather), SGD, donated.
    remat=False (the first version: the scan body is differentiated as it is, so the gathered bf16 weights
    of every layer are residuals kept for the backward pass: the whole model, gathered, on every core);
    remat=True: the body wrapped in jax.checkpoint, the all_gather redone in the backward pass."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads

    def rms(x):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5)).astype(bf)

    def gather(w):
        return jax.lax.all_gather(w.astype(bf), "d", axis=w.ndim - 1, tiled=True)

    def block(h, lw):
        w = {k: gather(v) for k, v in lw.items()}
        a = rms(h)
        q = (a @ w["wq"]).reshape(*a.shape[:2], heads, hd)
        k = (a @ w["wk"]).reshape(*a.shape[:2], heads, hd)
        v = (a @ w["wv"]).reshape(*a.shape[:2], heads, hd)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -1e30)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(a.shape)
        h = h + o @ w["wo"]
        m = rms(h)
        h = h + (jax.nn.silu(m @ w["w_gate"]) * (m @ w["w_up"])) @ w["w_down"]
        return h, None

    body = jax.checkpoint(block) if remat else block

    def local_step(params, tokens, targets):
        def loss_fn(params):
            h = gather(params["embed"])[tokens]                                               # [b, S, D]
            h, _ = jax.lax.scan(body, h, params["layers"])
            logits = (rms(h) @ gather(params["head"])).astype(f32)                            # [b, S, 16]
            lp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(lp, targets[..., None], -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        grads = _tm(lambda g: g / mesh.devices.size, grads)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), jax.lax.pmean(loss, "d")

    L, D, F = layers, d_model, d_ff
    last = P(None, None, "d")
    pspecs = {"embed": P(None, "d"), "head": P(None, "d"),
              "layers": {"wq": last, "wk": last, "wv": last, "wo": last, "w_gate": last, "w_up": last,
                         "w_down": last}}
    shapes = {"embed": (16, D), "head": (D, 128),
              "layers": {"wq": (L, D, D), "wk": (L, D, D), "wv": (L, D, D), "wo": (L, D, D),
                         "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D)}}
    params = {"embed": sds(shapes["embed"], f32, mesh, pspecs["embed"]),
              "head": sds(shapes["head"], f32, mesh, pspecs["head"]),
              "layers": {k: sds(shapes["layers"][k], f32, mesh, last) for k in shapes["layers"]}}
    step = jax.shard_map(local_step, mesh=mesh, in_specs=(pspecs, P("d"), P("d")), out_specs=(pspecs, P()),
                         check_vma=False)

    def fsdp_train_step(params, tokens, targets):
        return step(params, tokens, targets)

    n = mesh.devices.size * batch
    tokens = sds((n, seq), jnp.int32, mesh, P("d"))
    targets = sds((n, seq), jnp.int32, mesh, P("d"))
    return fsdp_train_step, (params, tokens, targets), {"donate_argnums": (0,)}


# 42.3 an on-device (Anakin-style) DQN whose replay buffer is given in_shardings P() (replicated)


def _dqn_replay_builder(mesh, capacity, obs_dim, actions, batch, insert, buffer_spec):
    """An Anakin/Podracer-style DQN update jitted with explicit in_shardings: the replay buffer lives on the
    devices (uint8 Procgen frames 64x64x3 flattened, `replay["observation"]` [capacity, 12288], with actions,
    rewards, discounts), each step writes the actors' newest `insert` transitions at `write_index`
    (`.at[slots].set(...)`), samples a batch uniformly per device, and takes a double-DQN step on an MLP
    Q-network (params and target params replicated, Adam-free SGD); the buffer is donated.
    buffer_spec=() (the first version: `in_shardings=(replicated, replicated, ...)` copied for the buffer from
    the params' entry, `NamedSharding(mesh, P())`: the whole buffer on every device); buffer_spec=('d',):
    `NamedSharding(mesh, P('d', None))`, the buffer's capacity split over the devices."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def q_values(p, obs):
        x = obs.astype(bf) * (1.0 / 255)
        x = jax.nn.relu(x @ p["torso_0"].astype(bf))
        x = jax.nn.relu(x @ p["torso_1"].astype(bf))
        return (x @ p["q_head"].astype(bf)).astype(f32)

    def dqn_update(online_params, target_params, replay, new_transitions, write_index, rng):
        slots = (write_index + jnp.arange(insert)) % capacity
        replay = {k: replay[k].at[slots].set(new_transitions[k]) for k in replay}
        idx = jax.random.randint(rng, (batch,), 0, capacity - 1)
        obs, nxt = replay["observation"][idx], replay["observation"][idx + 1]
        a, r, disc = replay["action"][idx], replay["reward"][idx], replay["discount"][idx]

        def loss_fn(p):
            q = jnp.take_along_axis(q_values(p, obs), a[:, None], -1)[:, 0]
            a_star = jnp.argmax(q_values(p, nxt), -1)
            q_next = jnp.take_along_axis(q_values(target_params, nxt), a_star[:, None], -1)[:, 0]
            target = jax.lax.stop_gradient(r + 0.99 * disc * q_next)
            return jnp.mean(optax_huber(q - target))

        loss, grads = jax.value_and_grad(loss_fn)(online_params)
        return _tm(lambda p, g: p - 1e-4 * g, online_params, grads), replay, loss

    def optax_huber(x, delta=1.0):
        ax = jnp.abs(x)
        return jnp.where(ax < delta, 0.5 * x * x, delta * (ax - 0.5 * delta))

    rep = NamedSharding(mesh, P())
    buf = NamedSharding(mesh, P(*buffer_spec))
    net = {"torso_0": (obs_dim, 1024), "torso_1": (1024, 1024), "q_head": (1024, actions)}
    online = {k: sds(s, f32, mesh, P()) for k, s in net.items()}
    target = {k: sds(s, f32, mesh, P()) for k, s in net.items()}
    replay = {"observation": sds((capacity, obs_dim), jnp.uint8, mesh, P(*buffer_spec, None) if buffer_spec else P()),
              "action": sds((capacity,), jnp.int32, mesh, P(*buffer_spec)),
              "reward": sds((capacity,), f32, mesh, P(*buffer_spec)),
              "discount": sds((capacity,), f32, mesh, P(*buffer_spec))}
    new = {"observation": sds((insert, obs_dim), jnp.uint8, mesh, P()),
           "action": sds((insert,), jnp.int32, mesh, P()), "reward": sds((insert,), f32, mesh, P()),
           "discount": sds((insert,), f32, mesh, P())}
    write_index = sds((), jnp.int32, mesh, P())
    rng = sds((2,), jnp.uint32, mesh, P())
    buf_tree = {"observation": NamedSharding(mesh, P(*buffer_spec, None) if buffer_spec else P()),
                "action": buf, "reward": buf, "discount": buf}
    params_sh = {k: rep for k in net}
    kw = {"in_shardings": (params_sh, params_sh, buf_tree, {k: rep for k in new}, rep, rep),
          "out_shardings": (params_sh, buf_tree, rep), "donate_argnums": (0, 2)}
    return dqn_update, (online, target, replay, new, write_index, rng), kw


# 42.4 a rolling-origin time-series backtest that vmaps the forecaster over every forecast origin at once


def _backtest_builder(mesh, series_len, channels, lookback, patch, d_model, heads, layers, horizon, origins,
                      map_batch):
    """A rolling-origin backtest of a channel-independent patch transformer (PatchTST-style: every channel's
    lookback window cut into patches, embedded, a few pre-LN encoder layers, a linear head to the horizon),
    f32, params replicated: the forecast origins are sharded over the devices and every origin's window is
    cut from the series with lax.dynamic_slice. map_batch=None (the first version:
    `jax.vmap(forecast_at)(origins)`, every origin's encoder activations at once, [origins, C, patches, D]
    and the scores [origins, C, H, patches, patches]); map_batch=k: `jax.lax.map(forecast_at, origins,
    batch_size=k)`, k origins at a time."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    n_patch = lookback // patch
    hd = d_model // heads

    def ln(x):
        return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)

    def encoder_layer(h, lw):
        a = ln(h)
        q = (a @ lw["wq"]).reshape(*a.shape[:-1], heads, hd)
        k = (a @ lw["wk"]).reshape(*a.shape[:-1], heads, hd)
        v = (a @ lw["wv"]).reshape(*a.shape[:-1], heads, hd)
        s = jnp.einsum("cqhd,ckhd->chqk", q, k) * hd ** -0.5
        o = jnp.einsum("chqk,ckhd->cqhd", jax.nn.softmax(s, -1), v).reshape(a.shape)
        h = h + o @ lw["wo"]
        return h + jax.nn.gelu(ln(h) @ lw["w1"]) @ lw["w2"]

    def backtest(params, series, origin_steps):
        def forecast_at(t):
            window = jax.lax.dynamic_slice(series, (t - lookback, 0), (lookback, channels))     # [L, C]
            x = window.T                                                                       # [C, L]
            mu, sd = x.mean(-1, keepdims=True), x.std(-1, keepdims=True) + 1e-5               # RevIN
            x = ((x - mu) / sd).reshape(channels, n_patch, patch)
            h = x @ params["patch_embed"] + params["pos_embed"]                                # [C, N, D]
            for i in range(layers):
                h = encoder_layer(h, params[f"encoder_{i}"])
            y = h.reshape(channels, n_patch * d_model) @ params["head"]                        # [C, horizon]
            truth = jax.lax.dynamic_slice(series, (t, 0), (horizon, channels)).T
            return jnp.mean(jnp.abs(y * sd + mu - truth), -1)                                  # MAE per channel

        if map_batch:
            return jax.lax.map(forecast_at, origin_steps, batch_size=map_batch)
        return jax.vmap(forecast_at)(origin_steps)

    D = d_model
    params = {"patch_embed": sds((patch, D), f32, mesh, P()), "pos_embed": sds((n_patch, D), f32, mesh, P()),
              "head": sds((n_patch * D, horizon), f32, mesh, P())}
    for i in range(layers):
        params[f"encoder_{i}"] = {k: sds(s, f32, mesh, P()) for k, s in
                                  {"wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D),
                                   "w1": (D, 4 * D), "w2": (4 * D, D)}.items()}
    series = sds((series_len, channels), f32, mesh, P())
    origin_steps = sds((mesh.devices.size * origins,), jnp.int32, mesh, P("d"))
    return backtest, (params, series, origin_steps), {"out_shardings": NamedSharding(mesh, P("d"))}


# 42.5 a protein homology-search evaluation that ranks the whole database with jnp.argsort for recall@k


def _homology_recall_builder(mesh, queries, database, dim, k, ranking):
    """Evaluation of a protein embedding model (ESM-style mean-pooled embeddings) for remote-homology search:
    every query protein's embedding is scored against the whole database `db_embeddings` [N, dim] (bf16,
    replicated; the queries sharded over the devices), and recall@k is computed against the known homologs
    (`homolog_ids` [Q, 8]). ranking='argsort' (the first version, as in the notebook it came from:
    `top = jnp.argsort(-scores, axis=-1)[:, :k]`, a full sort of [Q, N] keys and indices);
    ranking='top_k': `_, top = jax.lax.top_k(scores, k)`."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def homology_recall_at_k(db_embeddings, query_embeddings, homolog_ids):
        q = query_embeddings / jnp.linalg.norm(query_embeddings, axis=-1, keepdims=True)
        scores = jnp.einsum("qd,nd->qn", q.astype(bf), db_embeddings, preferred_element_type=f32)  # [Q, N]
        if ranking == "argsort":
            top = jnp.argsort(-scores, axis=-1)[:, :k]
        else:
            _, top = jax.lax.top_k(scores, k)
        hit = jnp.any(top[:, :, None] == homolog_ids[:, None, :], axis=1)                      # [Q, 8]
        return jnp.mean(hit.astype(f32), axis=-1)

    n = mesh.devices.size * queries
    db_embeddings = sds((database, dim), bf, mesh, P())
    query_embeddings = sds((n, dim), f32, mesh, P("d"))
    homolog_ids = sds((n, 8), jnp.int32, mesh, P("d"))
    return homology_recall_at_k, (db_embeddings, query_embeddings, homolog_ids), {
        "out_shardings": NamedSharding(mesh, P("d"))}


# 42.6 a CTC loss over long audio written as a generic HMM forward with a dense [B, S, S] transition matrix


def _ctc_dense_builder(mesh, batch, frames, feat_dim, hidden, vocab, labels, transitions):
    """A CTC speech recogniser (a small conv + MLP acoustic encoder over 80-dim log-mel frames at 40 ms, f32)
    trained data-parallel on long utterances; the CTC loss is the forward (alpha) recursion over the
    2U+1 blank-augmented label states as a lax.scan over the frames, differentiated.
    transitions='dense' (the first version: written as a generic HMM forward, the allowed CTC moves (stay,
    advance, skip a blank) as a log transition matrix [B, S, S] built from the labels, and every step
    `logsumexp(alpha[:, :, None] + log_trans, axis=1)`, so the backward pass keeps a [B, S, S] array for
    every frame); transitions='banded': the usual CTC recursion (alpha, alpha shifted by one, alpha shifted by
    two where the skip is allowed), as optax.ctc_loss does, [B, S] per frame."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    S = 2 * labels + 1
    NEG = -1e30

    def ctc_train_step(params, log_mel, label_ids):
        nb = log_mel.shape[0]                                                             # global batch

        def loss_fn(params):
            x = jax.lax.conv_general_dilated(log_mel, params["conv"], (1,), "SAME",
                                             dimension_numbers=("NWC", "WIO", "NWC"))
            h = jax.nn.gelu(x)
            for i in range(3):
                h = h + jax.nn.gelu(h.astype(bf) @ params[f"ff_{i}"].astype(bf)).astype(f32)
            logp = jax.nn.log_softmax(h @ params["ctc_head"], -1)                           # [B, T, V]
            ext = jnp.zeros((nb, S), jnp.int32).at[:, 1::2].set(label_ids)             # blank-augmented
            emit = jnp.take_along_axis(logp, jnp.broadcast_to(ext[:, None, :], (nb, frames, S)), -1)
            skip_ok = jnp.concatenate([jnp.zeros((nb, 2), bool),
                                       (ext[:, 2:] != 0) & (ext[:, 2:] != ext[:, :-2])], -1)  # [B, S]
            alpha0 = jnp.full((nb, S), NEG).at[:, :2].set(emit[:, 0, :2])
            if transitions == "dense":
                src, dst = jnp.arange(S)[:, None], jnp.arange(S)[None, :]
                allowed = (dst == src) | (dst == src + 1) | ((dst == src + 2) & skip_ok[:, None, :])
                log_trans = jnp.where(allowed, 0.0, NEG)                                    # [B, S, S]

                def step(alpha, e):
                    return jax.nn.logsumexp(alpha[:, :, None] + log_trans, axis=1) + e, None
            else:
                def step(alpha, e):
                    a1 = jnp.concatenate([jnp.full((nb, 1), NEG), alpha[:, :-1]], -1)
                    a2 = jnp.where(skip_ok, jnp.concatenate([jnp.full((nb, 2), NEG), alpha[:, :-2]], -1), NEG)
                    return jnp.logaddexp(jnp.logaddexp(alpha, a1), a2) + e, None

            alpha, _ = jax.lax.scan(step, alpha0, jnp.swapaxes(emit[:, 1:], 0, 1))
            return -jnp.mean(jnp.logaddexp(alpha[:, -1], alpha[:, -2]))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-4 * g, params, grads), loss

    params = {"conv": sds((5, feat_dim, hidden), f32, mesh, P()),
              "ctc_head": sds((hidden, vocab), f32, mesh, P())}
    for i in range(3):
        params[f"ff_{i}"] = sds((hidden, hidden), f32, mesh, P())
    n = mesh.devices.size * batch
    log_mel = sds((n, frames, feat_dim), f32, mesh, P("d"))
    label_ids = sds((n, labels), jnp.int32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), NamedSharding(mesh, P())), "donate_argnums": (0,)}
    return ctc_train_step, (params, log_mel, label_ids), kw



pair(
    "plm_embeddings_out_specs_replicated", "v5e", "v5e:2x2",
    "Per-residue embedding extraction with a 33-layer ESM-2-style protein LM (D=1280, bf16, replicated) in "
    "jax.shard_map on v5e, 1024 sequences of 1024 residues per device: the f32 representations are "
    "all-gathered (jax.lax.all_gather(reps, 'd', tiled=True)) so that out_specs=P() can return them, "
    "f32[4096,1024,1280] (20 GiB) on every device, beyond 15.75G.",
    "Fixed variant of plm_embeddings_out_specs_replicated_v5e: no all_gather, out_specs=P('d') (each device "
    "returns its 1024 sequences, 5 GiB); fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor"]),
    _plm_embeddings_builder, dict(layers=33, d_model=1280, heads=20, d_ff=5120, seqs=1024, seq_len=1024,
                                  micro_batch=8, gather_output=True),
    dict(layers=33, d_model=1280, heads=20, d_ff=5120, seqs=1024, seq_len=1024, micro_batch=8,
         gather_output=False),
    dump=True,
)

pair(
    "fsdp_shard_map_gathered_weights_saved", "v4", "v4:2x2x1",
    "A 32-layer Llama-style DNA LM (D=4096, d_ff=11008) trained with FSDP written in jax.shard_map on v4 "
    "(8 TensorCores): the scan body all-gathers its layer's weights in bf16 and is differentiated without "
    "jax.checkpoint, so the gathered weights of all 32 layers (12 GiB) are kept for the backward pass beside "
    "the activations, beyond 15.25G.",
    "Fixed variant of fsdp_shard_map_gathered_weights_saved_v4: the scan body wrapped in jax.checkpoint, "
    "the all_gather redone in the backward pass; fits.",
    dict(category="aggregate", causes=["no_remat", "replicated_tensor"]),
    _fsdp_scan_all_gather_builder, dict(layers=32, d_model=4096, heads=32, d_ff=11008, batch=2, seq=512,
                                        remat=False),
    dict(layers=32, d_model=4096, heads=32, d_ff=11008, batch=2, seq=512, remat=True),
    dump=False,
)

pair(
    "dqn_replay_buffer_replicated", "v6e", "v6e:2x2",
    "An Anakin-style on-device DQN on v6e whose replay buffer of 2.75M Procgen frames (u8[2883584,12288], "
    "33 GiB) is given in_shardings NamedSharding(mesh, P()) (copied from the params' entry): the whole buffer "
    "on every device, 33.15G of arguments, beyond 31.25G.",
    "Fixed variant of dqn_replay_buffer_replicated_v6e: the buffer's in_shardings/out_shardings "
    "NamedSharding(mesh, P('d', None)), 8.25 GiB per device; fits.",
    dict(category="arguments", causes=["replicated_tensor", "arguments_exceed"]),
    _dqn_replay_builder, dict(capacity=2883584, obs_dim=12288, actions=15, batch=512, insert=1024,
                              buffer_spec=()),
    dict(capacity=2883584, obs_dim=12288, actions=15, batch=512, insert=1024, buffer_spec=("d",)),
    dump=False,
)

pair(
    "homology_search_argsort_recall", "v5e", "v5e:2x2",
    "A remote-homology search eval on v5e: 1024 query proteins per device scored against 2M database "
    "embeddings (bf16, replicated), recall@100 taken from jnp.argsort(-scores)[:, :100], a full sort of the "
    "[1024, 2097152] scores with their indices (8 GiB each), beyond 15.75G.",
    "Fixed variant of homology_search_argsort_recall_v5e: jax.lax.top_k(scores, 100); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["large_activation", "batch_too_large"]),
    _homology_recall_builder, dict(queries=1024, database=2097152, dim=512, k=100, ranking="argsort"),
    dict(queries=1024, database=2097152, dim=512, k=100, ranking="top_k"),
    dump=True,
)

pair(
    "ctc_dense_transition_matrix", "v6e", "v6e:2x2",
    "A CTC speech recogniser trained on v6e on 160 s utterances (4000 frames at 40 ms, 256 labels, 8 "
    "per device) whose CTC forward is written as a generic HMM forward with a dense log transition matrix "
    "[B, 513, 513]: the differentiated lax.scan keeps a f32[8,513,513] array for every frame, beyond 31.25G.",
    "Fixed variant of ctc_dense_transition_matrix_v6e: the banded CTC recursion (stay, advance, skip a "
    "blank), [B, S] per frame, as optax.ctc_loss; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "no_remat"]),
    _ctc_dense_builder, dict(batch=8, frames=4000, feat_dim=80, hidden=512, vocab=1024, labels=256,
                             transitions="dense"),
    dict(batch=8, frames=4000, feat_dim=80, hidden=512, vocab=1024, labels=256, transitions="banded"),
    dump=False,
)

pair(
    "backtest_origins_vmapped", "v5e", "v5e:2x2",
    "A rolling-origin backtest of a PatchTST-style forecaster (321 channels, 32 patches, D=128, 16 heads, "
    "f32) on v5e that jax.vmap's the forecast over 512 origins per device at once: the attention scores "
    "f32[512,321,16,32,32] (10 GiB each) and the layer activations of every origin, beyond 15.75G.",
    "Fixed variant of backtest_origins_vmapped_v5e: jax.lax.map(forecast_at, origins, batch_size=32), "
    "32 origins at a time; fits.",
    dict(category="single_large_allocation", category_also=["aggregate"],
         causes=["batch_too_large", "large_activation"]),
    _backtest_builder, dict(series_len=17544, channels=321, lookback=512, patch=16, d_model=128, heads=16,
                            layers=3, horizon=96, origins=512, map_batch=None),
    dict(series_len=17544, channels=321, lookback=512, patch=16, d_model=128, heads=16, layers=3, horizon=96,
         origins=512, map_batch=32),
    dump=False,
)

# ---- 43. more broken/fixed pairs (batch tpu32): other models, other names ---------------------
#
# Programs of kinds sections 13-42 do not have, LLM training at scale and RL (a Switch-style MoE trained with
# Adam on a 2-D ('data', 'expert') mesh whose expert weights are partitioned over 'expert' only, so weights and
# moments are replicated over 'data'; Megatron-style tensor + sequence parallelism whose layer-norm region is
# constrained to P() (the residual stream gathered) instead of P(None, 'model', None); PPO for an LLM whose GAE
# is written as a dense [B, T, T] discount matrix; a Conformer speech encoder with Shaw-style relative position
# keys gathered into [T, T, d_head] per layer).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu32 for which pairs keep their dumps and what did not go as first written.


# 43.1 a Switch-style MoE on a 2-D ('data', 'expert') mesh: expert weights partitioned over 'expert' only


def _moe_expert_data_builder(mesh, layers, d_model, d_ff, experts, tokens, capacity_factor, expert_spec):
    """A Switch-transformer FFN stack (top-1 routing, einsum dispatch/combine with a capacity) trained with Adam
    on a 2-D mesh ('data', 'expert') built from the slice. The param tree is sharded by a partition-rules table
    in the usual style: ('moe/wi', P('expert', None, None)), ('moe/wo', P('expert', None, None)), ... The
    expert weights (bf16) and their Adam moments (f32) thereby are split over 'expert' only and replicated over
    'data'. expert_spec: the spec of wi/wo and their moments, e.g. ('expert', None, None) (first version) or
    ('expert', 'data', None) (experts' d_model dim also split over 'data', FSDP-style)."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    n = mesh.devices.size
    grid = Mesh(mesh.devices.reshape(2, n // 2), ("data", "expert"))
    bf, f32 = jnp.bfloat16, jnp.float32
    L, D, F, E = layers, d_model, d_ff, experts
    cap = int(capacity_factor * tokens / E)

    def moe_layer(x, lw):
        logits = x.astype(f32) @ lw["router"]                                              # [T, E]
        probs = jax.nn.softmax(logits, -1)
        expert_index = jnp.argmax(probs, -1)
        gate = jnp.max(probs, -1)
        onehot = jax.nn.one_hot(expert_index, E, dtype=f32)
        position = (jnp.cumsum(onehot, 0) - 1.0) * onehot
        keep = onehot * (position < cap)
        dispatch = keep[:, :, None] * jax.nn.one_hot(position.sum(-1).astype(jnp.int32), cap, dtype=f32)[:, None, :]
        combine = (dispatch * gate[:, None, None]).astype(bf)
        dispatch = dispatch.astype(bf)
        expert_in = jnp.einsum("tec,td->ecd", dispatch, x)
        hmid = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", expert_in, lw["wi"]))
        expert_out = jnp.einsum("ecf,efd->ecd", hmid, lw["wo"])
        y = jnp.einsum("tec,ecd->td", combine, expert_out)
        return x + y, None

    def train_step(params, opt_state, batch):
        def loss_fn(params):
            x = params["embed"][batch["ids"]]
            x, _ = jax.lax.scan(moe_layer, x, params["moe"])
            return jnp.mean((x.astype(f32) @ params["head"] - batch["target"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        params = _tm(lambda p, q: p.astype(q.dtype), params, grads)
        return params, opt_state, loss

    es = P(*expert_spec)

    def g(shape, dt, spec):
        return sds(shape, dt, grid, spec)

    params = {"embed": g((32768, D), bf, P(None, "expert")),
              "head": g((D, 8), f32, P()),
              "moe": {"router": g((L, D, E), f32, P()),
                      "wi": g((L, E, D, F), bf, P(None, *es)),
                      "wo": g((L, E, F, D), bf, P(None, *es))}}
    moments = _tm(lambda a: g(a.shape, f32, a.sharding.spec), params)
    opt_state = {"count": g((), jnp.int32, P()), "mu": moments, "nu": moments}
    batch = {"ids": g((tokens,), jnp.int32, P("data")), "target": g((tokens, 8), f32, P("data"))}
    return train_step, (params, opt_state, batch), dict(donate_argnums=(0, 1))


# 43.2 Megatron-style sequence parallelism whose layer-norm region is constrained to P() (residual stream gathered)


def _sp_layernorm_builder(mesh, layers, d_model, heads, d_ff, batch, seq, ln_spec):
    """A GPT block stack trained with Megatron-style tensor parallelism over the slice's single 'model' axis
    (QKV and fc1 column-parallel, out_proj and fc2 row-parallel, heads and d_ff sharded) and sequence parallelism
    in the layer-norm/residual regions, written with jax.lax.with_sharding_constraint. The attention core is under
    jax.checkpoint (Megatron's selective recomputation); the rest is saved for the backward pass.
    ln_spec: the constraint on the residual stream and the layer-norm outputs: () (first version: P(), "layer
    norm needs the whole hidden state", so the residual stream is gathered on every device) or
    (None, 'model', None) (sequence-sharded, as Megatron's SP)."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    grid = Mesh(mesh.devices.reshape(mesh.devices.size), ("model",))
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    sp = NamedSharding(grid, P(*ln_spec))
    wsc = jax.lax.with_sharding_constraint

    def layer_norm(x, g, b):
        x32 = x.astype(f32)
        mu = x32.mean(-1, keepdims=True)
        var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
        return wsc(((x32 - mu) * jax.lax.rsqrt(var + 1e-5) * g + b).astype(bf), sp)

    @jax.checkpoint
    def core_attention(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        mask = jnp.tril(jnp.ones((q.shape[1], q.shape[1]), bool))
        s = jnp.where(mask, s, -1e9)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v)

    def gpt_block(h, lw):
        h = wsc(h, sp)
        a = layer_norm(h, lw["ln1_g"], lw["ln1_b"])
        qkv = (a @ lw["qkv"]).reshape(*a.shape[:2], 3, heads, hd)
        o = core_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).reshape(a.shape)
        h = wsc(h + o @ lw["out_proj"], sp)
        m = layer_norm(h, lw["ln2_g"], lw["ln2_b"])
        h = wsc(h + jax.nn.gelu(m @ lw["fc1"]) @ lw["fc2"], sp)
        return h, None

    def train_step(params, tokens):
        def loss_fn(params):
            h = params["wte"][tokens] + params["wpe"][None, :seq]
            h, _ = jax.lax.scan(gpt_block, h.astype(bf), params["blocks"])
            h = layer_norm(h, params["ln_f_g"], params["ln_f_b"])
            return jnp.mean((h.astype(f32) @ params["probe"]) ** 2)

        return jax.value_and_grad(loss_fn)(params)

    L, D, F = layers, d_model, d_ff

    def g(shape, dt, *spec):
        return sds(shape, dt, grid, P(*spec))

    params = {"wte": g((50304, D), bf, "model", None), "wpe": g((seq, D), bf, None, None),
              "ln_f_g": g((D,), f32), "ln_f_b": g((D,), f32), "probe": g((D, 16), f32, None, None),
              "blocks": {"ln1_g": g((L, D), f32), "ln1_b": g((L, D), f32),
                         "ln2_g": g((L, D), f32), "ln2_b": g((L, D), f32),
                         "qkv": g((L, D, 3 * D), bf, None, None, "model"),
                         "out_proj": g((L, D, D), bf, None, "model", None),
                         "fc1": g((L, D, F), bf, None, None, "model"),
                         "fc2": g((L, F, D), bf, None, "model", None)}}
    tokens = g((batch, seq), jnp.int32, None, None)
    return train_step, (params, tokens), {}


# 43.3 PPO for an LLM whose GAE is a dense [B, T, T] discount matrix instead of a reverse scan


def _ppo_gae_builder(mesh, rollouts, resp_len, d_model, vocab_chunk, gamma, lam, gae):
    """The PPO update of an RLHF run: per-token rewards (KL penalty + the reward model's score on the last token),
    values from the value head, dones marking where each response ends inside the fixed-length rollout buffer.
    Advantages are computed under stop_gradient, then a clipped policy loss and a value loss on a small
    policy/value head over the rollout's final hidden states (bf16 [B, T, D]).
    gae='dense' (first version, "vectorised GAE"): A = sum_k discount[b, t, k] * delta_k as one einsum, with
    the [B, T, T] discount matrix prod_{t <= m < k} gamma*lam*(1 - done[b, m]) built by jnp.cumprod over a
    [B, T, T] matrix of per-step factors;
    gae='scan': the usual reverse jax.lax.scan over time, [B] per step."""
    jax, jnp, NamedSharding, P = _jax()
    f32, bf = jnp.float32, jnp.bfloat16
    T = resp_len

    def compute_gae(rewards, values, dones):
        next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], 1)
        deltas = rewards + gamma * next_values * (1.0 - dones) - values
        if gae == "dense":
            decay = gamma * lam * (1.0 - dones)                                         # [B, T]
            decay_prev = jnp.concatenate([jnp.ones_like(decay[:, :1]), decay[:, :-1]], 1)
            t = jnp.arange(T)
            after = t[None, :] > t[:, None]                                           # m > t
            # discount[b, t, k] = prod_{t <= m < k} gamma*lam*(1 - done[b, m]) for k >= t, else 0
            factors = jnp.where(after[None], decay_prev[:, None, :], 1.0)             # [B, T, T]
            discount = jnp.where(after[None] | (t[None, :] == t[:, None])[None],
                                 jnp.cumprod(factors, -1), 0.0)
            return jnp.einsum("btk,bk->bt", discount, deltas)

        def back(carry, x):
            delta, done = x
            adv = delta + gamma * lam * (1.0 - done) * carry
            return adv, adv

        _, adv = jax.lax.scan(back, jnp.zeros_like(deltas[:, 0]), (deltas.T, dones.T), reverse=True)
        return adv.T

    def ppo_update(head, rollout):
        adv = jax.lax.stop_gradient(compute_gae(rollout["rewards"], rollout["values"], rollout["dones"]))
        returns = adv + rollout["values"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)

        def loss_fn(head):
            hs = rollout["hidden_states"]
            logits = (hs @ head["policy"]).astype(f32)                                # [B, T, vocab_chunk]
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), rollout["actions"][..., None], -1)[..., 0]
            ratio = jnp.exp(logp - rollout["old_logprobs"])
            pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv)
            v = (hs @ head["value"]).astype(f32)[..., 0]
            return jnp.mean(pg * rollout["mask"]) + 0.5 * jnp.mean(((v - returns) ** 2) * rollout["mask"])

        return jax.value_and_grad(loss_fn)(head)

    B = rollouts * mesh.devices.size
    dp = P("d")
    rollout = {"hidden_states": sds((B, T, d_model), bf, mesh, dp),
               "actions": sds((B, T), jnp.int32, mesh, dp), "old_logprobs": sds((B, T), f32, mesh, dp),
               "rewards": sds((B, T), f32, mesh, dp), "values": sds((B, T), f32, mesh, dp),
               "dones": sds((B, T), f32, mesh, dp), "mask": sds((B, T), f32, mesh, dp)}
    head = {"policy": sds((d_model, vocab_chunk), bf, mesh, P()), "value": sds((d_model, 1), bf, mesh, P())}
    return ppo_update, (head, rollout), {}


# 43.4 a Conformer with Shaw-style relative position keys gathered into [T, T, d_head] per layer


def _shaw_relpos_builder(mesh, layers, d_model, heads, d_ff, batch, frames, max_rel, relpos):
    """A Conformer-style speech encoder (macaron FFNs, relative-position self-attention, depthwise conv module,
    bf16, layers stacked for a lax.scan) trained with CTC-free frame classification on long utterances.
    relpos='gather' (first version, Shaw et al. as in many ports): rel_k = rel_pos_emb[clip(j - i) + max_rel]
    gathered into [T, T, d_head] per layer and contracted with q (einsum 'bhid,ijd->bhij'); the gathered table is
    kept for the backward pass of every layer. relpos='shift': the
    scores of q against every relative distance, [B, H, T, 2T-1], moved into place by the Transformer-XL / ESPnet
    rel_shift (pad, reshape, slice), no [T, T, d_head] table."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    R = 2 * max_rel + 1
    rel_idx = jnp.clip(jnp.arange(frames)[None, :] - jnp.arange(frames)[:, None], -max_rel, max_rel) + max_rel
    dist_idx = jnp.clip(jnp.arange(2 * frames - 1) - (frames - 1), -max_rel, max_rel) + max_rel

    def ln(x):
        x32 = x.astype(f32)
        return ((x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-5)).astype(bf)

    def conformer_block(h, lw):
        h = h + 0.5 * (jax.nn.silu(ln(h) @ lw["ff1_in"]) @ lw["ff1_out"])
        a = ln(h)
        B_, T_, _ = a.shape
        q = (a @ lw["wq"]).reshape(B_, T_, heads, hd)
        k = (a @ lw["wk"]).reshape(B_, T_, heads, hd)
        v = (a @ lw["wv"]).reshape(B_, T_, heads, hd)
        s = jnp.einsum("bihd,bjhd->bhij", q, k, preferred_element_type=f32)
        if relpos == "gather":
            rel_k = lw["rel_pos_emb"][rel_idx]                                          # [T, T, hd]
            s = s + jnp.einsum("bihd,ijd->bhij", q, rel_k, preferred_element_type=f32)
        else:
            # Transformer-XL/ESPnet rel_shift: scores against every relative distance -(T-1)..T-1, then the
            # pad-reshape-slice trick moves distance j - i to column j (no [T, T, d_head] table)
            pos_table = lw["rel_pos_emb"][dist_idx]                                       # [2T-1, hd]
            srel = jnp.einsum("bihd,rd->bhir", q, pos_table, preferred_element_type=f32)  # [B, H, T, 2T-1]
            srel = jnp.concatenate([jnp.zeros_like(srel[..., :1]), srel], -1)
            srel = srel.reshape(B_, heads, 2 * T_, T_)[:, :, 1:].reshape(B_, heads, T_, 2 * T_ - 1)[..., :T_]
            s = s + srel
        p = jax.nn.softmax(s * hd ** -0.5, -1).astype(bf)
        h = h + jnp.einsum("bhij,bjhd->bihd", p, v).reshape(a.shape) @ lw["wo"]
        c = ln(h) @ lw["pw_in"]
        c = c[..., :d_model] * jax.nn.sigmoid(c[..., d_model:])
        c = jax.lax.conv_general_dilated(c, lw["dw_kernel"], (1,), [(15, 15)], dimension_numbers=("NWC", "WIO", "NWC"),
                                         feature_group_count=d_model)
        h = h + jax.nn.silu(c) @ lw["pw_out"]
        h = h + 0.5 * (jax.nn.silu(ln(h) @ lw["ff2_in"]) @ lw["ff2_out"])
        return ln(h), None

    def train_step(params, feats, frame_labels):
        def loss_fn(params):
            h = (feats @ params["subsample_proj"]).astype(bf)
            h, _ = jax.lax.scan(conformer_block, h, params["blocks"])
            logits = (h @ params["classifier"]).astype(f32)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), frame_labels[..., None], -1))

        return jax.value_and_grad(loss_fn)(params)

    L, D, F = layers, d_model, d_ff
    rep = P()

    def w(*shape):
        return sds((L, *shape), bf, mesh, rep)

    params = {"subsample_proj": sds((320, D), bf, mesh, rep), "classifier": sds((D, 512), bf, mesh, rep),
              "blocks": {"ff1_in": w(D, F), "ff1_out": w(F, D), "ff2_in": w(D, F), "ff2_out": w(F, D),
                         "wq": w(D, D), "wk": w(D, D), "wv": w(D, D), "wo": w(D, D), "rel_pos_emb": w(R, hd),
                         "pw_in": w(D, 2 * D), "dw_kernel": w(31, 1, D), "pw_out": w(D, D)}}
    n = mesh.devices.size
    feats = sds((batch * n, frames, 320), bf, mesh, P("d"))
    frame_labels = sds((batch * n, frames), jnp.int32, mesh, P("d"))
    return train_step, (params, feats, frame_labels), {}


pair(
    "moe_experts_replicated_over_data", "v5p", "v5p:2x2x1",
    "A Switch-style MoE (8 layers of 32 experts, D=4096, d_ff=8192, bf16 weights, f32 Adam moments) trained on "
    "v5p on a 2-D ('data', 'expert') mesh whose partition rules give the experts' wi/wo and their moments "
    "P('expert', None, None): split over 'expert' only, replicated over 'data', 80.64G of arguments and "
    "8 GiB bf16[8,16,4096,8192] gradients, beyond 95.74G",
    "Fixed variant of moe_experts_replicated_over_data_v5p: the experts' rule P('expert', 'data', None) "
    "(d_model also split over 'data', FSDP-style), each device holds a quarter of the experts and moments; fits",
    dict(category="aggregate", category_also=["arguments"],
         causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _moe_expert_data_builder, dict(layers=8, d_model=4096, d_ff=8192, experts=32, tokens=16384,
                                   capacity_factor=1.25, expert_spec=("expert", None, None)),
    dict(layers=8, d_model=4096, d_ff=8192, experts=32, tokens=16384, capacity_factor=1.25,
         expert_spec=("expert", "data", None)),
    dump=False,
)

pair(
    "seq_parallel_layernorm_gathered", "v4", "v4:2x2x1",
    "A 20-layer GPT (D=4096, 32 heads, d_ff=16384, 8192 tokens) trained on v4 (8 TensorCores) with "
    "Megatron-style tensor + sequence parallelism written with with_sharding_constraint, whose layer-norm / "
    "residual region is constrained to P() instead of P(None, 'model', None): the residual stream and the "
    "f32 layer-norm intermediates of every layer are saved whole on every core (f32[20,1,8192,4096], "
    "2.5 GiB each), beyond 15.25G",
    "Fixed variant of seq_parallel_layernorm_gathered_v4: the layer-norm / residual constraint "
    "P(None, 'model', None) (sequence-sharded, as Megatron's SP); fits",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _sp_layernorm_builder, dict(layers=20, d_model=4096, heads=32, d_ff=16384, batch=1, seq=8192, ln_spec=()),
    dict(layers=20, d_model=4096, heads=32, d_ff=16384, batch=1, seq=8192, ln_spec=(None, "model", None)),
    dump=False,
)

pair(
    "ppo_gae_dense_discount_matrix", "v5e", "v5e:2x2",
    "The PPO update of an RLHF run on v5e (64 rollouts of 8192 response tokens per device) whose GAE is "
    "'vectorised' as an einsum with a [B, T, T] discount matrix built by jnp.cumprod over per-step factors: "
    "f32[64,8192,8192] (16 GiB) on every device, beyond 15.75G",
    "Fixed variant of ppo_gae_dense_discount_matrix_v5e: GAE as the usual reverse jax.lax.scan over the "
    "8192 steps, [B] per step; fits",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _ppo_gae_builder, dict(rollouts=64, resp_len=8192, d_model=1024, vocab_chunk=512, gamma=1.0, lam=0.95,
                           gae="dense"),
    dict(rollouts=64, resp_len=8192, d_model=1024, vocab_chunk=512, gamma=1.0, lam=0.95, gae="scan"),
    dump=True,
)

pair(
    "conformer_shaw_relpos_gathered", "v6e", "v6e:2x2",
    "An 8-layer Conformer speech encoder (D=512, 4 heads of 128, 4096 frames) trained on v6e with Shaw-style "
    "relative-position keys gathered per layer, rel_pos_emb[clip(j - i)] as bf16[4096,4096,128] (4 GiB), "
    "kept for the backward pass of every layer: bf16[8,4096,4096,128] (32 GiB), beyond 31.25G",
    "Fixed variant of conformer_shaw_relpos_gathered_v6e: q against every relative distance "
    "([B, H, T, 2T-1]) and the Transformer-XL / ESPnet rel_shift (pad, reshape, slice); fits",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _shaw_relpos_builder, dict(layers=8, d_model=512, heads=4, d_ff=2048, batch=1, frames=4096, max_rel=128,
                               relpos="gather"),
    dict(layers=8, d_model=512, heads=4, d_ff=2048, batch=1, frames=4096, max_rel=128, relpos="shift"),
    dump=False,
)


# ---- 44. more broken/fixed pairs (batch tpu33): other models, other names ---------------------
#
# Programs of kinds sections 13-42 do not have, inference and other domains (a hashed-feature CTR model whose
# partition helper falls back to replicated because the hash-bucket count is not divisible by the device
# count; a LoRA merge at load time that returns the merged weights in f32; Whisper long-form transcription
# that encodes the whole recording as one sequence instead of 30 s windows; a video DiT sampler whose
# classifier-free guidance concatenates the conditional and unconditional inputs into one doubled batch;
# retrieval in shard_map against a row-sharded index that all-gathers the per-shard scores for one top_k).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch
# tpu33 for which pairs keep their dumps and what did not go as first written.


# 44.1 hashed-feature embedding table whose row count (hash buckets) is not divisible: the partition helper falls back to P()


def _hashed_ctr_fallback_builder(mesh, hash_buckets, emb_dim, features, batch, hidden):
    """A DCN-style click-through-rate model over hashed categorical features (`hashed_feature_embedding`
    [hash_buckets, emb_dim] f32, one table shared by all feature fields, ids = hash(field, value) %
    hash_buckets), trained with Adam, params and state donated. Its shardings come from a partition helper
    of the kind many codebases carry: `shard_rows_if_divisible(shape)` returns P('d', None) when the first
    axis divides by the mesh size and silently falls back to P() (replicated) otherwise.
    hash_buckets=23068673 (the first version: an odd bucket count, as hashing recipes recommend, so the
    table, its Adam moments and its dense gradient are replicated); 23068680: padded to a multiple of 8, the
    helper shards the rows."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    n_dev = mesh.devices.size

    def shard_rows_if_divisible(shape):
        return P("d", *([None] * (len(shape) - 1))) if shape[0] % n_dev == 0 else P()

    def ctr_train_step(params, opt_state, feature_ids, clicks):
        def loss_fn(params):
            e = params["hashed_feature_embedding"][feature_ids].reshape(feature_ids.shape[0], -1)  # [B, F*E]
            x0 = e
            x = x0
            for i in range(2):                                                          # DCN-v2 cross layers
                x = x0 * (x @ params[f"cross_{i}"]) + x
            h = jax.nn.relu(x @ params["deep_0"])
            logit = (h @ params["ctr_head"])[:, 0]
            return jnp.mean(jnp.logaddexp(0.0, logit) - clicks * logit)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    shapes = {"hashed_feature_embedding": (hash_buckets, emb_dim),
              "cross_0": (features * emb_dim, features * emb_dim), "cross_1": (features * emb_dim, features * emb_dim),
              "deep_0": (features * emb_dim, hidden), "ctr_head": (hidden, 1)}
    specs = {k: shard_rows_if_divisible(s) if k == "hashed_feature_embedding" else P() for k, s in shapes.items()}
    params = {k: sds(s, f32, mesh, specs[k]) for k, s in shapes.items()}
    opt_state = {"count": sds((), jnp.int32, mesh, P()),
                 "mu": {k: sds(s, f32, mesh, specs[k]) for k, s in shapes.items()},
                 "nu": {k: sds(s, f32, mesh, specs[k]) for k, s in shapes.items()}}
    n = n_dev * batch
    feature_ids = sds((n, features), jnp.int32, mesh, P("d"))
    clicks = sds((n,), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return ctr_train_step, (params, opt_state, feature_ids, clicks), kw


# 44.2 LoRA adapters merged into the base weights at load time, the merged weights returned in f32


def _lora_merge_f32_builder(mesh, layers, d_model, d_ff, rank, cast_back):
    """Load-time merge of a LoRA fine-tune into a Llama-style model's MLP for serving: the bf16 base
    weights (stacked [L, ...], sharded over the d_ff axis) are donated and replaced by
    W + (alpha / r) * A @ B, computed in f32 "for accuracy" (`base.astype(jnp.float32) + scale *
    jnp.einsum('ldr,lrf->ldf', lora_a.astype(f32), lora_b.astype(f32))`).
    cast_back=False (the first version: the merged weights are returned as computed, f32, twice the
    base's bytes, and the donation cannot be used); True: `.astype(base.dtype)`, bf16, aliased to the base."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    scale = 32.0 / rank

    def merge_lora_weights(base_mlp, lora):
        merged = {}
        for name, w in base_mlp.items():
            delta = jnp.einsum("ldr,lrf->ldf", lora[name]["lora_a"].astype(f32), lora[name]["lora_b"].astype(f32))
            m = w.astype(f32) + scale * delta
            merged[name] = m.astype(w.dtype) if cast_back else m
        return merged

    L, D, F, r = layers, d_model, d_ff, rank
    col, row = P(None, None, "d"), P(None, "d", None)
    base_mlp = {"gate_proj": sds((L, D, F), bf, mesh, col), "up_proj": sds((L, D, F), bf, mesh, col),
                "down_proj": sds((L, F, D), bf, mesh, row)}
    lora = {"gate_proj": {"lora_a": sds((L, D, r), bf, mesh, P()), "lora_b": sds((L, r, F), bf, mesh, col)},
            "up_proj": {"lora_a": sds((L, D, r), bf, mesh, P()), "lora_b": sds((L, r, F), bf, mesh, col)},
            "down_proj": {"lora_a": sds((L, F, r), bf, mesh, row), "lora_b": sds((L, r, D), bf, mesh, P())}}
    out = {k: NamedSharding(mesh, v.sharding.spec) for k, v in base_mlp.items()}
    return merge_lora_weights, (base_mlp, lora), {"out_shardings": out, "donate_argnums": (0,)}


# 44.3 Whisper long-form transcription that encodes the whole recording as one sequence, not 30 s windows


def _whisper_longform_builder(mesh, layers, d_model, heads, minutes, recordings, chunked):
    """The encoder of a Whisper-medium-style speech recogniser (two conv layers, the second with stride 2,
    sinusoidal positions, pre-LN blocks under lax.scan, bf16 weights replicated) run for long-form
    transcription of `recordings` recordings per device, 100 log-mel frames (80 bins) per second.
    chunked=False (the first version: the whole recording's log-mel [B, minutes*6000, 80] is encoded as one
    sequence, full self-attention over minutes*3000 encoder frames); True: the recording is cut into 30 s
    windows (3000 mel frames, 1500 encoder frames), reshaped into the batch, as Whisper's long-form
    (sequential or chunked pipeline) decoding does."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    mel_frames = minutes * 6000

    def ln(x, g):
        x32 = x.astype(f32)
        return ((x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-5) * g).astype(bf)

    def encoder_block(h, lw):
        a = ln(h, lw["attn_ln"])
        q = (a @ lw["q_proj"]).reshape(*a.shape[:2], heads, hd)
        k = (a @ lw["k_proj"]).reshape(*a.shape[:2], heads, hd)
        v = (a @ lw["v_proj"]).reshape(*a.shape[:2], heads, hd)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(a.shape)
        h = h + o @ lw["out_proj"]
        m = ln(h, lw["mlp_ln"])
        return h + jax.nn.gelu(m @ lw["fc1"]) @ lw["fc2"], None

    def whisper_encode_long_form(params, input_features):
        x = input_features
        if chunked:
            x = x.reshape(-1, 3000, 80)                                                    # 30 s windows
        x = x.astype(bf)
        x = jax.nn.gelu(jax.lax.conv_general_dilated(x, params["conv1"], (1,), "SAME",
                                                     dimension_numbers=("NWC", "WIO", "NWC")))
        x = jax.nn.gelu(jax.lax.conv_general_dilated(x, params["conv2"], (2,), [(1, 1)],
                                                     dimension_numbers=("NWC", "WIO", "NWC")))
        n = x.shape[1]
        inv = jnp.exp(-jnp.log(10000.0) * jnp.arange(d_model // 2) / (d_model // 2 - 1))
        ang = jnp.arange(n)[:, None] * inv[None, :]
        x = x + jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], -1).astype(bf)
        h, _ = jax.lax.scan(encoder_block, x, params["layers"])
        h = ln(h, params["ln_post"])
        return h.reshape(input_features.shape[0], -1, d_model)

    L, D = layers, d_model
    rep = P()
    params = {"conv1": sds((3, 80, D), bf, mesh, rep), "conv2": sds((3, D, D), bf, mesh, rep),
              "ln_post": sds((D,), f32, mesh, rep),
              "layers": {"attn_ln": sds((L, D), f32, mesh, rep), "mlp_ln": sds((L, D), f32, mesh, rep),
                         "q_proj": sds((L, D, D), bf, mesh, rep), "k_proj": sds((L, D, D), bf, mesh, rep),
                         "v_proj": sds((L, D, D), bf, mesh, rep), "out_proj": sds((L, D, D), bf, mesh, rep),
                         "fc1": sds((L, D, 4 * D), bf, mesh, rep), "fc2": sds((L, 4 * D, D), bf, mesh, rep)}}
    input_features = sds((mesh.devices.size * recordings, mel_frames, 80), f32, mesh, P("d"))
    return whisper_encode_long_form, (params, input_features), {"out_shardings": NamedSharding(mesh, P("d"))}


# 44.4 a video DiT sampler whose classifier-free guidance concatenates the conditional and unconditional inputs


def _video_dit_cfg_builder(mesh, layers, d_model, heads, frames, height, width, videos, cfg_mode):
    """One denoising step of a video diffusion transformer (full 3-D attention over every latent frame's
    2x2 patches, adaLN-zero blocks under lax.scan, bf16 weights replicated, videos sharded over the devices)
    with classifier-free guidance at scale 6. cfg_mode='concat' (the first version, as in the reference
    sampler: `jnp.concatenate([latents, latents])` with the text and the null-text embeddings, one forward
    on the doubled batch, then `uncond + w * (cond - uncond)`); 'sequential': the two forwards one after
    the other (`jax.lax.map` over the conditioning), the same result at half the activation memory."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    ph, pw = height // 2, width // 2
    N = frames * ph * pw
    C = 16

    def dit_block(h, lw, c):
        shift, scale_, gate = jnp.split((c @ lw["adaln"]).astype(bf)[:, None, :], 3, -1)
        x32 = h.astype(f32)
        a = ((x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-6)).astype(bf)
        a = a * (1 + scale_) + shift
        q = (a @ lw["to_q"]).reshape(*a.shape[:2], heads, hd)
        k = (a @ lw["to_k"]).reshape(*a.shape[:2], heads, hd)
        v = (a @ lw["to_v"]).reshape(*a.shape[:2], heads, hd)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(a.shape)
        h = h + gate * (o @ lw["to_out"])
        return h + jax.nn.gelu(h @ lw["ff_in"]) @ lw["ff_out"]

    def dit_forward(params, latents, t_emb, text_emb):
        B = latents.shape[0]
        x = latents.reshape(B, frames, ph, 2, pw, 2, C).transpose(0, 1, 2, 4, 3, 5, 6).reshape(B, N, 4 * C)
        h = x.astype(bf) @ params["patch_embed"]
        c = jax.nn.silu(t_emb + text_emb)                                                  # [B, D] f32
        h, _ = jax.lax.scan(lambda h, lw: (dit_block(h, lw, c), None), h, params["blocks"])
        return (h @ params["proj_out"]).astype(f32)                                      # [B, N, 4C]

    def cfg_denoise_step(params, latents, t_emb, text_emb, null_text_emb):
        if cfg_mode == "concat":
            out = dit_forward(params, jnp.concatenate([latents, latents]), jnp.concatenate([t_emb, t_emb]),
                              jnp.concatenate([text_emb, null_text_emb]))
            cond, uncond = jnp.split(out, 2)
        else:
            both = jax.lax.map(lambda te: dit_forward(params, latents, t_emb, te),
                               jnp.stack([text_emb, null_text_emb]))
            cond, uncond = both[0], both[1]
        eps = uncond + 6.0 * (cond - uncond)
        x = latents.reshape(latents.shape[0], N, 4 * C) - 0.02 * eps
        return x.reshape(latents.shape)

    L, D = layers, d_model
    rep = P()
    params = {"patch_embed": sds((4 * C, D), bf, mesh, rep), "proj_out": sds((D, 4 * C), bf, mesh, rep),
              "blocks": {"adaln": sds((L, D, 3 * D), f32, mesh, rep),
                         "to_q": sds((L, D, D), bf, mesh, rep), "to_k": sds((L, D, D), bf, mesh, rep),
                         "to_v": sds((L, D, D), bf, mesh, rep), "to_out": sds((L, D, D), bf, mesh, rep),
                         "ff_in": sds((L, D, 4 * D), bf, mesh, rep), "ff_out": sds((L, 4 * D, D), bf, mesh, rep)}}
    n = mesh.devices.size * videos
    latents = sds((n, frames, height, width, C), f32, mesh, P("d"))
    emb = lambda: sds((n, D), f32, mesh, P("d"))
    return cfg_denoise_step, (params, latents, emb(), emb(), emb()), {
        "out_shardings": NamedSharding(mesh, P("d")), "donate_argnums": (1,)}



# 44.5 sharded-index retrieval in shard_map that all-gathers the per-shard scores for one global top_k


def _sharded_topk_gather_builder(mesh, queries, index_rows, dim, k, merge):
    """Serving-time retrieval against a passage index (`passage_embeddings` [N, dim] bf16) whose rows are
    sharded over the devices, written in jax.shard_map: a batch of query embeddings (replicated) is scored
    against the local shard. merge='gather_scores' (the first version: `jax.lax.all_gather(scores, 'd',
    axis=1, tiled=True)` so that one `jax.lax.top_k` sees the whole [Q, N] score matrix, on every device);
    merge='local_topk': the usual two-stage top-k, `jax.lax.top_k` on the local [Q, N/n] scores, then only
    the k candidates per shard (values and global ids) all-gathered and merged with a second top_k."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    n_dev = mesh.devices.size
    shard_rows = index_rows // n_dev

    def per_shard(query_embeddings, passage_embeddings):
        scores = jnp.einsum("qd,nd->qn", query_embeddings.astype(bf), passage_embeddings,
                            preferred_element_type=f32)                                    # [Q, N/n]
        if merge == "gather_scores":
            all_scores = jax.lax.all_gather(scores, "d", axis=1, tiled=True)               # [Q, N]
            best, ids = jax.lax.top_k(all_scores, k)
            return best, ids
        vals, ids = jax.lax.top_k(scores, k)
        ids = ids + jax.lax.axis_index("d") * shard_rows
        vals = jax.lax.all_gather(vals, "d", axis=1, tiled=True)                           # [Q, n*k]
        ids = jax.lax.all_gather(ids, "d", axis=1, tiled=True)
        best, pos = jax.lax.top_k(vals, k)
        return best, jnp.take_along_axis(ids, pos, -1)

    search = jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P("d")), out_specs=(P(), P()),
                           check_vma=False)

    def retrieve_top_passages(query_embeddings, passage_embeddings):
        return search(query_embeddings, passage_embeddings)

    query_embeddings = sds((queries, dim), f32, mesh, P())
    passage_embeddings = sds((index_rows, dim), bf, mesh, P("d"))
    return retrieve_top_passages, (query_embeddings, passage_embeddings), {}


pair(
    "hashed_ctr_table_fallback_replicated", "v5e", "v5e:2x2",
    "A DCN-style CTR model on v5e over hashed categorical features: the hashed_feature_embedding table has an "
    "odd number of hash buckets (23068673 x 64, f32, 5.5 GiB), so the partition helper "
    "shard_rows_if_divisible() falls back to P(): the table, its Adam moments and its dense gradient "
    "replicated on every device, beyond 15.75G.",
    "Fixed variant of hashed_ctr_table_fallback_replicated_v5e: the bucket count padded to a multiple of 8 "
    "(23068680), the helper shards the rows P('d', None); fits.",
    dict(category="arguments", category_also=["single_large_allocation"],
         causes=["replicated_tensor", "arguments_exceed"]),
    _hashed_ctr_fallback_builder, dict(hash_buckets=23068673, emb_dim=64, features=26, batch=2048, hidden=1024),
    dict(hash_buckets=23068680, emb_dim=64, features=26, batch=2048, hidden=1024),
    dump=False,
)

pair(
    "sharded_index_topk_scores_gathered", "v5e", "v5e:2x2",
    "Retrieval in jax.shard_map on v5e against a 4M-passage index sharded by rows: 1024 queries are scored "
    "against each shard and the per-shard scores are all-gathered (jax.lax.all_gather(scores, 'd', axis=1, "
    "tiled=True)) for one jax.lax.top_k: f32[1024,4194304] (16 GiB) on every device, beyond 15.75G.",
    "Fixed variant of sharded_index_topk_scores_gathered_v5e: two-stage top-k, jax.lax.top_k on the local "
    "scores, only the 100 candidates per shard (values and global ids) all-gathered and merged; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "large_activation"]),
    _sharded_topk_gather_builder, dict(queries=1024, index_rows=4194304, dim=128, k=100, merge="gather_scores"),
    dict(queries=1024, index_rows=4194304, dim=128, k=100, merge="local_topk"),
    dump=True,
)

pair(
    "lora_merge_f32_output", "v4", "v4:2x2x1",
    "A load-time LoRA merge on v4 (8 TensorCores) for a 40-layer Llama-style MLP (D=8192, d_ff=28672, bf16, "
    "sharded over d_ff): W + scale * A @ B computed in f32 and returned in f32, twice the base's bytes, the "
    "donated bf16 base unusable for the output, beyond 15.25G.",
    "Fixed variant of lora_merge_f32_output_v4: the merged weights cast back to bf16 (.astype(w.dtype)), "
    "aliased to the donated base; fits.",
    dict(category="aggregate", causes=["f32_precision", "no_donation"]),
    _lora_merge_f32_builder, dict(layers=40, d_model=8192, d_ff=28672, rank=16, cast_back=False),
    dict(layers=40, d_model=8192, d_ff=28672, rank=16, cast_back=True),
    dump=True,
)

pair(
    "whisper_longform_unchunked", "v5p", "v5p:2x2x1",
    "Whisper-medium-style encoder on v5p run for long-form transcription of 10-minute recordings, two per "
    "device, each encoded as one sequence of 30000 encoder frames: the attention scores f32[2,16,30000,30000] "
    "(107 GiB) of a layer, beyond 95.74G.",
    "Fixed variant of whisper_longform_unchunked_v5p: the log-mel cut into 30 s windows (3000 mel frames, "
    "1500 encoder frames) reshaped into the batch; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _whisper_longform_builder, dict(layers=24, d_model=1024, heads=16, minutes=10, recordings=2, chunked=False),
    dict(layers=24, d_model=1024, heads=16, minutes=10, recordings=2, chunked=True),
    dump=False,
)

pair(
    "video_dit_cfg_concat_batch", "v6e", "v6e:2x2",
    "One denoising step of a video DiT on v6e (13 latent frames of 90x64, 2x2 patches: 18720 tokens, full "
    "3-D attention, 16 heads) whose classifier-free guidance concatenates the conditional and unconditional "
    "inputs into one doubled batch: the scores f32[2,16,18720,18720] (41.8 GiB), beyond 31.25G.",
    "Fixed variant of video_dit_cfg_concat_batch_v6e: the conditional and the unconditional forward one "
    "after the other (jax.lax.map over the two text embeddings); fits.",
    dict(category="single_large_allocation", causes=["batch_too_large", "large_activation"]),
    _video_dit_cfg_builder, dict(layers=8, d_model=1152, heads=16, frames=13, height=90, width=64, videos=1,
                                 cfg_mode="concat"),
    dict(layers=8, d_model=1152, heads=16, frames=13, height=90, width=64, videos=1, cfg_mode="sequential"),
    dump=False,
)

# ---- 45. more broken/fixed pairs (batch tpu34): other models, other names ---------------------
#
# Programs of kinds sections 13-44 do not have, LLM and recommender training and serving at scale (2-D data x
# model tensor parallelism whose FFN sharding constraint names only the 'model' axis; param-tree regex rules that
# give an untied lm_head the embedding's spec, so the head is split over d_model and the logits are whole on
# every device; hand-written expert parallelism in shard_map whose dispatch all-gathers every device's tokens
# instead of an all_to_all; DIN-style target attention of a ranking service evaluated for every candidate of a
# request at once; a Mamba-2 model whose SSD chunk length is the whole sequence). The same conventions: the fixed
# twin changes exactly the first cause. See the README section of
# batch tpu34 for which pairs keep their dumps and what did not go as first written.


# 45.1 2-D (data x model) tensor parallelism whose FFN hidden constraint names only 'model' (global batch on every data replica)


def _tp2d_ffn_constraint_builder(mesh, layers, d_model, d_ff, batch, seq, data_axis, hidden_spec):
    """A decoder's FFN stack (pre-norm, GELU MLP, residual) trained with 2-D parallelism on a ('data', 'model')
    mesh built from the slice: the batch split over 'data', fc1 column-parallel and fc2 row-parallel over
    'model' (Megatron-style), written with jax.lax.with_sharding_constraint on the hidden activations
    (`h = wsc(h, NamedSharding(mesh, P(*hidden_spec)))`), layers under lax.scan, no rematerialization.
    hidden_spec: (None, None, 'model') (the first version, copied from a 1-D tensor-parallel codebase whose
    mesh had no 'data' axis: the hidden activations [B, S, d_ff] are constrained to the whole global batch on
    every 'data' replica) or ('data', None, 'model')."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    n = mesh.devices.size
    grid = Mesh(mesh.devices.reshape(data_axis, n // data_axis), ("data", "model"))
    bf, f32 = jnp.bfloat16, jnp.float32
    wsc = jax.lax.with_sharding_constraint
    act = NamedSharding(grid, P("data", None, None))
    hid = NamedSharding(grid, P(*hidden_spec))

    def rms_norm(x, g):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * g).astype(bf)

    def ffn_block(x, lw):
        x = wsc(x, act)
        h = wsc(rms_norm(x, lw["ffn_norm"]) @ lw["fc1"], hid)                              # [B, S, F]
        h = wsc(jax.nn.gelu(h), hid)
        return wsc(x + h @ lw["fc2"], act), None

    def train_step(params, tokens, targets):
        def loss_fn(params):
            x = params["tok_embeddings"][tokens]
            x, _ = jax.lax.scan(ffn_block, x, params["layers"])
            pred = rms_norm(x, params["final_norm"]).astype(f32) @ params["regression_head"]
            return jnp.mean((pred - targets) ** 2)

        return jax.value_and_grad(loss_fn)(params)

    L, D, F = layers, d_model, d_ff

    def g(shape, dt, *spec):
        return sds(shape, dt, grid, P(*spec))

    params = {"tok_embeddings": g((32000, D), bf, None, "model"),
              "final_norm": g((D,), f32), "regression_head": g((D, 8), f32, None, None),
              "layers": {"ffn_norm": g((L, D), f32),
                         "fc1": g((L, D, F), bf, None, None, "model"),
                         "fc2": g((L, F, D), bf, None, "model", None)}}
    tokens = g((batch, seq), jnp.int32, "data", None)
    targets = g((batch, seq, 8), f32, "data", None, None)
    return train_step, (params, tokens, targets), {}


# 45.2 DIN-style target attention of a ranking service evaluated for every candidate of a request at once


def _din_all_candidates_builder(mesh, requests, candidates, history, emb_dim, att_hidden, chunk):
    """Serving-time ranking with a Deep Interest Network (DIN): for each request the user's behaviour history
    [L, E] is attended by each candidate item through DIN's activation unit, an MLP over
    concat(h, c, h - c, h * c) (`din_attention_unit`), then a scoring MLP. Requests are sharded over the
    devices. chunk=None (the first version: the activation unit evaluated for every (candidate, history item)
    pair of a request at once, [R, C, L, 4E] -> [R, C, L, att_hidden] in f32); chunk=k: the candidates scored
    k at a time with jax.lax.map."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def score_candidates(params, hist, cand):                        # hist [R, L, E], cand [R, c, E]
        h = hist[:, None, :, :]
        c = cand[:, :, None, :]
        h, c = jnp.broadcast_arrays(h, c)
        unit_in = jnp.concatenate([h, c, h - c, h * c], -1).astype(f32)             # [R, c, L, 4E]
        a = jax.nn.sigmoid(unit_in @ params["att_w1"] + params["att_b1"])            # [R, c, L, A]
        w = (a @ params["att_w2"])[..., 0]                                            # [R, c, L]
        interest = jnp.einsum("rcl,rle->rce", w, hist.astype(f32))
        z = jnp.concatenate([interest, cand.astype(f32)], -1)
        return (jax.nn.relu(z @ params["mlp_w1"]) @ params["mlp_w2"])[..., 0]           # [R, c]

    def rank_candidates(params, history_emb, candidate_emb):
        if chunk is None:
            return score_candidates(params, history_emb, candidate_emb)
        R, C, E = candidate_emb.shape
        blocks = candidate_emb.reshape(R, C // chunk, chunk, E).transpose(1, 0, 2, 3)
        out = jax.lax.map(lambda cb: score_candidates(params, history_emb, cb), blocks)
        return out.transpose(1, 0, 2).reshape(R, C)

    E, A = emb_dim, att_hidden
    params = {"att_w1": sds((4 * E, A), f32, mesh, P()), "att_b1": sds((A,), f32, mesh, P()),
              "att_w2": sds((A, 1), f32, mesh, P()), "mlp_w1": sds((2 * E, 200), f32, mesh, P()),
              "mlp_w2": sds((200, 1), f32, mesh, P())}
    history_emb = sds((requests, history, E), bf, mesh, P("d"))
    candidate_emb = sds((requests, candidates, E), bf, mesh, P("d"))
    return rank_candidates, (params, history_emb, candidate_emb), {"out_shardings": NamedSharding(mesh, P("d"))}


# 45.3 regex partition rules that give the untied lm_head the embedding's spec: the head sharded over d_model, not the vocabulary


def _lm_head_wrong_axis_builder(mesh, layers, d_model, d_ff, vocab, batch, seq, lm_head_spec):
    """Megatron-style tensor parallelism over the slice's one 'model' axis for a Llama-style decoder's last
    stage (gated-MLP blocks under lax.scan; attention left out to keep the compile short), the untied output
    layer and a cross-entropy loss on f32 logits; the batch replicated (pure tensor parallelism). The
    shardings come from a param-tree regex rules table in the usual style (first match wins):
    ('embed_tokens/embedding', P('model', None)) (vocabulary-parallel), ('(gate|up)_proj', column),
    ('down_proj', row), ('lm_head/kernel', lm_head_spec), ('.*', P()).
    lm_head_spec: ('model', None) (the first version: the rule written "like the embedding", but the untied
    head is [d_model, vocab], so dim 0 is d_model: every device computes partial logits over the whole
    vocabulary, summed, [B, S, V] f32 on every device) or (None, 'model') (vocabulary-parallel)."""
    import re
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    mesh = Mesh(mesh.devices.reshape(mesh.devices.size), ("model",))
    bf, f32 = jnp.bfloat16, jnp.float32

    partition_rules = [
        (r"embed_tokens/embedding", P("model", None)),
        (r"layers/(gate|up)_proj/kernel", P(None, None, "model")),
        (r"layers/down_proj/kernel", P(None, "model", None)),
        (r"lm_head/kernel", P(*lm_head_spec)),
        (r".*", P()),
    ]

    def spec_for(path):
        for pattern, spec in partition_rules:
            if re.search(pattern, path):
                return spec
        return P()

    def rms_norm(x, g):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * g).astype(bf)

    def mlp_block(x, lw):
        h = rms_norm(x, lw["post_attention_layernorm"]["scale"])
        h = jax.nn.silu(h @ lw["gate_proj"]["kernel"]) * (h @ lw["up_proj"]["kernel"])
        return x + h @ lw["down_proj"]["kernel"], None

    def train_step(params, input_ids, labels):
        def loss_fn(params):
            x = params["embed_tokens"]["embedding"][input_ids]
            x, _ = jax.lax.scan(mlp_block, x, params["layers"])
            x = rms_norm(x, params["norm"]["scale"])
            logits = (x @ params["lm_head"]["kernel"]).astype(f32)                         # [B, S, V]
            logp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

        return jax.value_and_grad(loss_fn)(params)

    L, D, F, V = layers, d_model, d_ff, vocab
    shapes = {"embed_tokens/embedding": ((V, D), bf),
              "layers/post_attention_layernorm/scale": ((L, D), f32),
              "layers/gate_proj/kernel": ((L, D, F), bf),
              "layers/up_proj/kernel": ((L, D, F), bf),
              "layers/down_proj/kernel": ((L, F, D), bf),
              "norm/scale": ((D,), f32),
              "lm_head/kernel": ((D, V), bf)}
    params = {}
    for path, (shape, dt) in shapes.items():
        node = params
        keys = path.split("/")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = sds(shape, dt, mesh, spec_for(path))
    input_ids = sds((batch, seq), jnp.int32, mesh, P())
    labels = sds((batch, seq), jnp.int32, mesh, P())
    return train_step, (params, input_ids, labels), {}


# 45.4 a Mamba-2 (SSD) language model trained with the SSD chunk length set to the whole sequence


def _mamba2_ssd_chunk_builder(mesh, layers, d_model, heads, head_dim, d_state, vocab, batch, seq, chunk_size):
    """A Mamba-2 language model's mixer stack trained with the reference "ssd_minimal_discrete" algorithm of
    the Mamba-2 paper/repo (intra-chunk output through L = exp(segsum(A)) [b, h, c, l, l], chunk states,
    the inter-chunk recurrence, state -> output), B and C shared over the heads (ngroups=1), bf16 weights,
    the SSD in f32, the loss a cross-entropy over a small vocabulary, batch sharded over the devices.
    chunk_size: seq (the first version: the config's chunk_size set to the sequence length "to skip the
    inter-chunk pass", so the decay matrix L and the masked C^T B products are [b, h, seq, seq] f32, like
    full attention scores) or 256 (the paper's chunk length)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    H, Pd, N = heads, head_dim, d_state

    def segsum(x):                                                              # [..., T] -> [..., T, T]
        T = x.shape[-1]
        cs = jnp.cumsum(x, -1)
        s = cs[..., :, None] - cs[..., None, :]
        return jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)

    def ssd(X, A, Bm, Cm, block_len):
        b, l = X.shape[:2]
        c = l // block_len
        X = X.reshape(b, c, block_len, H, Pd)
        A = A.reshape(b, c, block_len, H).transpose(0, 3, 1, 2)                  # [b, h, c, l]
        Bm = Bm.reshape(b, c, block_len, N)
        Cm = Cm.reshape(b, c, block_len, N)
        A_cumsum = jnp.cumsum(A, -1)
        L = jnp.exp(segsum(A))                                                   # [b, h, c, l, l]
        Y_diag = jnp.einsum("bcln,bcsn,bhcls,bcshp->bclhp", Cm, Bm, L, X)
        decay_states = jnp.exp(A_cumsum[..., -1:] - A_cumsum)
        states = jnp.einsum("bcln,bhcl,bclhp->bchpn", Bm, decay_states, X)
        states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], 1)
        decay_chunk = jnp.exp(segsum(jnp.pad(A_cumsum[..., -1], ((0, 0), (0, 0), (1, 0)))))
        states = jnp.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
        Y_off = jnp.einsum("bcln,bchpn,bhcl->bclhp", Cm, states, jnp.exp(A_cumsum))
        return (Y_diag + Y_off).reshape(b, l, H * Pd)

    def mixer(x, lw):
        xn = x.astype(f32)
        xn = (xn * jax.lax.rsqrt((xn * xn).mean(-1, keepdims=True) + 1e-6) * lw["norm"]).astype(bf)
        X = (xn @ lw["x_proj"]).astype(f32)
        z = xn @ lw["z_proj"]
        dt = jax.nn.softplus((xn @ lw["dt_proj"]).astype(f32) + lw["dt_bias"])      # [b, l, h]
        A = -jnp.exp(lw["A_log"]) * dt
        Bm = (xn @ lw["B_proj"]).astype(f32)
        Cm = (xn @ lw["C_proj"]).astype(f32)
        y = ssd(X * dt.repeat(Pd, -1), A, Bm, Cm, chunk_size)
        y = (y * jax.nn.silu(z.astype(f32))).astype(bf)
        return x + y @ lw["out_proj"], None

    def train_step(params, input_ids, labels):
        def loss_fn(params):
            x = params["embedding"][input_ids]
            x, _ = jax.lax.scan(mixer, x, params["layers"])
            logp = jax.nn.log_softmax((x @ params["lm_head"]).astype(f32), -1)
            return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

        return jax.value_and_grad(loss_fn)(params)

    L_, D, E = layers, d_model, heads * head_dim

    def r(shape, dt):
        return sds(shape, dt, mesh, P())

    params = {"embedding": r((vocab, D), bf), "lm_head": r((D, vocab), bf),
              "layers": {"norm": r((L_, D), f32), "x_proj": r((L_, D, E), bf), "z_proj": r((L_, D, E), bf),
                         "dt_proj": r((L_, D, H), bf), "dt_bias": r((L_, H), f32), "A_log": r((L_, H), f32),
                         "B_proj": r((L_, D, N), bf), "C_proj": r((L_, D, N), bf),
                         "out_proj": r((L_, E, D), bf)}}
    n = mesh.devices.size * batch
    input_ids = sds((n, seq), jnp.int32, mesh, P("d"))
    labels = sds((n, seq), jnp.int32, mesh, P("d"))
    return train_step, (params, input_ids, labels), {}


# 45.5 expert parallelism in shard_map whose token dispatch all-gathers every device's tokens instead of an all_to_all


def _moe_ep_allgather_builder(mesh, layers, d_model, d_ff, experts, tokens, capacity_factor, dispatch):
    """A top-1 MoE FFN stack trained with expert parallelism written by hand in jax.shard_map over one
    'expert' axis (the slice's devices): tokens are batch-sharded over 'expert', each device holds
    experts/n experts (wi/wo P(None, 'expert')), the router replicated, GShard-style einsum dispatch and
    combine with a capacity per expert, layers under lax.scan. dispatch='all_gather' (the first version:
    `jax.lax.all_gather(x, 'expert', tiled=True)` brings every device's tokens to every device, the router
    and the dispatch/combine masks run over all n*T tokens for the local experts, and the partial outputs are
    `psum_scatter`ed back: the [n*T, E/n, n*C] masks and the gathered tokens are n times the local ones);
    'all_to_all': the usual dispatch, local [T, E, C] masks and two `jax.lax.all_to_all`s."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    n = mesh.devices.size
    grid = Mesh(mesh.devices.reshape(n), ("expert",))
    bf, f32 = jnp.bfloat16, jnp.float32
    E, El = experts, experts // n
    cap = int(capacity_factor * tokens / E)                  # per expert, per source device

    def masks(x, router, n_cap, first_expert, n_experts):
        probs = jax.nn.softmax(x.astype(f32) @ router, -1)                                 # [t, E]
        expert_index = jnp.argmax(probs, -1)
        gate = jnp.max(probs, -1)
        onehot = jax.nn.one_hot(expert_index - first_expert, n_experts, dtype=f32)         # [t, e]
        position = (jnp.cumsum(onehot, 0) - 1.0) * onehot
        keep = onehot * (position < n_cap)
        dispatch_mask = keep[:, :, None] * jax.nn.one_hot(position.sum(-1).astype(jnp.int32), n_cap,
                                                          dtype=f32)[:, None, :]          # [t, e, c]
        return dispatch_mask.astype(bf), (dispatch_mask * gate[:, None, None]).astype(bf)

    def moe_layer(x, lw):                                                                   # x [T, D] local
        if dispatch == "all_gather":
            x_all = jax.lax.all_gather(x, "expert", tiled=True)                               # [nT, D]
            first = jax.lax.axis_index("expert") * El
            d_mask, c_mask = masks(x_all, lw["router"], n * cap, first, El)                 # [nT, El, nC]
            expert_in = jnp.einsum("tec,td->ecd", d_mask, x_all)
        else:
            d_mask, c_mask = masks(x, lw["router"], cap, 0, E)                              # [T, E, C]
            expert_in = jnp.einsum("tec,td->ecd", d_mask, x)
            expert_in = jax.lax.all_to_all(expert_in, "expert", 0, 1, tiled=True)          # [El, nC, D]
        h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", expert_in, lw["wi"]))
        expert_out = jnp.einsum("ecf,efd->ecd", h, lw["wo"])
        if dispatch == "all_gather":
            y_all = jnp.einsum("tec,ecd->td", c_mask, expert_out, preferred_element_type=f32)
            y = jax.lax.psum_scatter(y_all, "expert", tiled=True).astype(bf)
        else:
            expert_out = jax.lax.all_to_all(expert_out, "expert", 1, 0, tiled=True)         # [E, C, D]
            y = jnp.einsum("tec,ecd->td", c_mask, expert_out)
        return x + y, None

    def local_loss(moe, x, target):
        x, _ = jax.lax.scan(moe_layer, x, moe)
        return jax.lax.pmean(jnp.mean((x.astype(f32) - target) ** 2), "expert")

    sharded_loss = jax.shard_map(local_loss, mesh=grid, in_specs=(
        {"router": P(), "wi": P(None, "expert"), "wo": P(None, "expert")}, P("expert"), P("expert")),
        out_specs=P(), check_vma=False)

    def moe_train_step(moe, hidden_states, target):
        return jax.value_and_grad(sharded_loss)(moe, hidden_states, target)

    L, D, F = layers, d_model, d_ff
    moe = {"router": sds((L, D, E), f32, grid, P()),
           "wi": sds((L, E, D, F), bf, grid, P(None, "expert")),
           "wo": sds((L, E, F, D), bf, grid, P(None, "expert"))}
    hidden_states = sds((n * tokens, D), bf, grid, P("expert"))
    target = sds((n * tokens, D), f32, grid, P("expert"))
    return moe_train_step, (moe, hidden_states, target), {}


pair(
    "tp2d_ffn_constraint_model_only", "v4", "v4:2x2x1",
    "A decoder FFN stack (8 layers, D=4096, d_ff=16384, bf16, no remat) trained on v4 (8 TensorCores) with 2-D "
    "parallelism on a ('data', 'model') = (4, 2) mesh, whose with_sharding_constraint on the FFN hidden "
    "activations says P(None, None, 'model'): the [B, S, d_ff] activations of the whole global batch on every "
    "'data' replica, saved for the backward pass of every layer, beyond 15.25G.",
    "Fixed variant of tp2d_ffn_constraint_model_only_v4: the hidden constraint P('data', None, 'model'); fits.",
    dict(category="aggregate", causes=["replicated_tensor", "no_remat"]),
    _tp2d_ffn_constraint_builder, dict(layers=8, d_model=4096, d_ff=16384, batch=16, seq=2048, data_axis=4,
                                       hidden_spec=(None, None, "model")),
    dict(layers=8, d_model=4096, d_ff=16384, batch=16, seq=2048, data_axis=4, hidden_spec=("data", None, "model")),
    dump=False,
)

pair(
    "din_target_attention_all_candidates", "v6e", "v6e:2x2",
    "A DIN ranking service on v6e scoring 1000 candidates per request against a 512-item behaviour history, "
    "80 requests per device: DIN's activation unit evaluated for every (candidate, history item) pair at once, "
    "its inputs broadcast to bf16[80,1000,512,64] (9.8 GiB each) per device, beyond 31.25G.",
    "Fixed variant of din_target_attention_all_candidates_v6e: the candidates scored 100 at a time "
    "(jax.lax.map); fits.",
    dict(category="aggregate", causes=["large_activation", "batch_too_large"]),
    _din_all_candidates_builder, dict(requests=320, candidates=1000, history=512, emb_dim=64, att_hidden=80,
                                      chunk=None),
    dict(requests=320, candidates=1000, history=512, emb_dim=64, att_hidden=80, chunk=100),
    dump=True,
)

pair(
    "lm_head_rule_shards_d_model", "v5e", "v5e:2x2",
    "Tensor parallelism over v5e's 4 chips for a Llama-style decoder (4 gated-MLP blocks, D=4096, vocab 128256, "
    "batch 12 x 2048 replicated) whose regex partition rule gives the untied lm_head/kernel [d_model, vocab] the "
    "embedding's P('model', None): the head is split over d_model, every device sums partial logits over the "
    "whole vocabulary, f32[12,2048,128256] (11.7 GiB) on every device, beyond 15.75G.",
    "Fixed variant of lm_head_rule_shards_d_model_v5e: the rule ('lm_head/kernel', P(None, 'model')), the "
    "head vocabulary-parallel; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "large_activation"]),
    _lm_head_wrong_axis_builder, dict(layers=4, d_model=4096, d_ff=14336, vocab=128256, batch=12, seq=2048,
                                      lm_head_spec=("model", None)),
    dict(layers=4, d_model=4096, d_ff=14336, vocab=128256, batch=12, seq=2048, lm_head_spec=(None, "model")),
    dump=False,
)

pair(
    "mamba2_ssd_chunk_is_sequence", "v6e", "v6e:2x2",
    "A Mamba-2 language model (2 SSD mixers, 32 heads of 64, d_state 128) trained on v6e with 8192-token "
    "sequences, 1 per device, whose SSD chunk_size is set to the sequence length: the decay matrix "
    "exp(segsum(A)) and the masked C^T B products are f32[1,32,1,8192,8192] (8 GiB) per layer, beyond 31.25G.",
    "Fixed variant of mamba2_ssd_chunk_is_sequence_v6e: chunk_size 256 (the paper's), the inter-chunk "
    "recurrence over 32 chunk states; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _mamba2_ssd_chunk_builder, dict(layers=2, d_model=1024, heads=32, head_dim=64, d_state=128, vocab=32000,
                                    batch=1, seq=8192, chunk_size=8192),
    dict(layers=2, d_model=1024, heads=32, head_dim=64, d_state=128, vocab=32000, batch=1, seq=8192,
         chunk_size=256),
    dump=False,
)

pair(
    "moe_expert_parallel_allgather_dispatch", "v4", "v4:2x2x1",
    "A top-1 MoE stack (4 layers, 64 experts, D=2048, d_ff=8192) trained on v4 (8 TensorCores) with "
    "hand-written expert parallelism in jax.shard_map whose dispatch all-gathers every device's 6144 tokens "
    "(jax.lax.all_gather(x, 'expert', tiled=True)) and builds the dispatch/combine masks over all 49152 tokens "
    "for the 8 local experts, [49152, 8, 960] per layer, beyond 15.25G.",
    "Fixed variant of moe_expert_parallel_allgather_dispatch_v4: the GShard dispatch, local [6144, 64, 120] "
    "masks and two jax.lax.all_to_all; fits.",
    dict(category="aggregate", causes=["replicated_tensor", "large_activation"]),
    _moe_ep_allgather_builder, dict(layers=4, d_model=2048, d_ff=8192, experts=64, tokens=6144,
                                    capacity_factor=1.25, dispatch="all_gather"),
    dict(layers=4, d_model=2048, d_ff=8192, experts=64, tokens=6144, capacity_factor=1.25, dispatch="all_to_all"),
    dump=False,
)

# ---- 46. more broken/fixed pairs (batch tpu35): other models, other names ---------------------
#
# Programs of kinds sections 13-44 do not have, from science, vision and graphs (a parallel-beam tomography
# reconstruction in shard_map whose sinogram is all-gathered by in_specs=P(); a graph-partitioned GNN in
# shard_map that all-gathers every node's features in each layer instead of exchanging halos; a video
# object-segmentation memory bank that stores every past frame; cryo-EM projection matching that projects
# the volume for every orientation at once; an SR3-style super-resolution U-Net with self-attention at the
# full output resolution). The same conventions: the fixed twin changes exactly the first cause. See the README section of
# batch tpu35 for which pairs keep their dumps and what did not go as first written.


# 46.1 tomography filtered back-projection in shard_map whose sinogram is all-gathered by in_specs=P()


def _tomo_fbp_gathered_builder(mesh, angles, det_rows, det_cols, sino_in_spec):
    """Filtered back-projection of a parallel-beam synchrotron micro-CT scan, written in jax.shard_map.
    The sinogram [angles, det_rows, det_cols] f32 arrives sharded over detector rows (P(None, 'd', None));
    each device reconstructs the slab of volume slices its rows image (parallel beam: slice z sees only
    detector row z), ramp-filtering along the detector columns with an rfft, then a fori_loop over the
    angles (linear interpolation of each filtered projection along t = x cos + y sin).
    sino_in_spec=() (the first version: in_specs=P() "because every slab needs every angle", so the whole
    sinogram is all-gathered onto every device and ramp-filtered there before the slab is cut out);
    (None, 'd', None): in_specs=P(None, 'd', None), each device filters only its own rows."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    n_dev = mesh.devices.size
    rows_local = det_rows // n_dev
    N = det_cols

    def ramp_filter(sino):
        freqs = jnp.fft.rfftfreq(2 * det_cols).astype(f32)
        padded = jnp.pad(sino, ((0, 0), (0, 0), (0, det_cols)))
        filtered = jnp.fft.irfft(jnp.fft.rfft(padded, axis=-1) * (2 * jnp.abs(freqs)), axis=-1)
        return filtered[..., :det_cols].astype(f32)

    def backproject_slab(sinogram, theta):
        filtered = ramp_filter(sinogram)
        if filtered.shape[1] != rows_local:                                            # the whole sinogram
            filtered = jax.lax.dynamic_slice_in_dim(filtered, jax.lax.axis_index("d") * rows_local, rows_local, 1)
        xs = jnp.arange(N, dtype=f32) - N / 2
        X, Y = jnp.meshgrid(xs, xs, indexing="ij")

        def add_angle(a, vol):
            t = X * jnp.cos(theta[a]) + Y * jnp.sin(theta[a]) + N / 2
            i0 = jnp.clip(jnp.floor(t).astype(jnp.int32), 0, N - 2)
            w = (t - i0)[None]
            proj = filtered[a]                                                           # [rows_local, N]
            return vol + (1 - w) * proj[:, i0] + w * proj[:, i0 + 1]

        vol = jax.lax.fori_loop(0, angles, add_angle, jnp.zeros((rows_local, N, N), f32))
        return vol * (jnp.pi / angles)

    fbp = jax.shard_map(backproject_slab, mesh=mesh, in_specs=(P(*sino_in_spec), P()),
                        out_specs=P("d", None, None), check_vma=False)

    def reconstruct_volume(sinogram, theta):
        return fbp(sinogram, theta)

    sinogram = sds((angles, det_rows, det_cols), f32, mesh, P(None, "d", None))
    theta = sds((angles,), f32, mesh, P())
    return reconstruct_volume, (sinogram, theta), {}


# 46.2 a graph-partitioned GNN in shard_map that all-gathers every node's features in each layer instead of a halo


def _gnn_halo_builder(mesh, nodes, dim, layers, edges, halo, exchange):
    """Full-graph training of a message-passing GNN (a mesh-based physics simulator / road-network model with
    millions of nodes) whose graph is partitioned over the devices (METIS-style: each device owns nodes/n
    nodes and the edges that end in them), written in jax.shard_map. Each layer projects the sender
    features and scatter-adds the messages into the local receivers, with psum of the gradients.
    exchange='all_gather' (the first version: `jax.lax.all_gather(h, 'd', tiled=True)` of the whole node
    feature matrix in every layer, the sender ids global, so each device holds, and keeps for the backward
    pass, all nodes' features per layer); 'halo': only the `halo` boundary nodes each partition exports are
    all-gathered (`h[halo_export]`), the sender ids index [local nodes; every partition's halo], as
    DistDGL/PyG partitioned training exchanges halos."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    n_dev = mesh.devices.size
    local = nodes // n_dev

    def gnn_loss(params, h, senders, receivers, halo_export, targets):
        for l in range(layers):
            lw = params[f"message_passing_{l}"]
            if exchange == "all_gather":
                h_src = jax.lax.all_gather(h, "d", axis=0, tiled=True)                    # [nodes, dim]
            else:
                h_src = jnp.concatenate([h, jax.lax.all_gather(h[halo_export], "d", axis=0, tiled=True)])
            m = jax.nn.silu(h_src @ lw["w_msg"])
            agg = jax.ops.segment_sum(m[senders], receivers, num_segments=local)
            h = h + jax.nn.silu(agg @ lw["w_update"] + h @ lw["w_self"])
        return jnp.mean((h @ params["decoder"] - targets) ** 2)

    def per_partition(params, h, senders, receivers, halo_export, targets):
        loss, grads = jax.value_and_grad(gnn_loss)(params, h, senders, receivers, halo_export, targets)
        return jax.lax.pmean(loss, "d"), jax.lax.pmean(grads, "d")

    step = jax.shard_map(per_partition, mesh=mesh,
                         in_specs=(P(), P("d"), P("d"), P("d"), P("d"), P("d")), out_specs=(P(), P()),
                         check_vma=False)

    def partitioned_gnn_train_step(params, node_features, senders, receivers, halo_export, targets):
        return step(params, node_features, senders, receivers, halo_export, targets)

    rep = P()
    params = {"decoder": sds((dim, 3), f32, mesh, rep)}
    for l in range(layers):
        params[f"message_passing_{l}"] = {k: sds((dim, dim), f32, mesh, rep) for k in ("w_msg", "w_update", "w_self")}
    i32 = jnp.int32
    node_features = sds((nodes, dim), f32, mesh, P("d"))
    senders = sds((edges * n_dev,), i32, mesh, P("d"))
    receivers = sds((edges * n_dev,), i32, mesh, P("d"))
    halo_export = sds((halo * n_dev,), i32, mesh, P("d"))
    targets = sds((nodes, 3), f32, mesh, P("d"))
    return partitioned_gnn_train_step, (params, node_features, senders, receivers, halo_export, targets), {}


# 46.3 a video object-segmentation memory bank that stores every past frame's keys and values


def _vos_memory_bank_builder(mesh, frames, height, width, key_dim, value_dim, videos, mem_every):
    """STM/XMem-style semi-supervised video object segmentation at inference: a lax.scan over the frames of
    each clip, the query frame's keys (stride-16 features, [H*W, key_dim] bf16) read out against a memory
    bank preallocated for the clip ([slots, H*W, key_dim] and [slots, H*W, value_dim] bf16, unwritten slots
    masked), the affinity softmaxed over every memory position, and the frame's key/value written into the
    bank every `mem_every` frames. mem_every=1 (the first version: every past frame is kept, slots = frames,
    the affinity [videos, H*W, frames*H*W] f32 per step); 5 (STM's default memory interval)."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    HW = height * width
    slots = -(-frames // mem_every)

    def segment_clip(params, frame_features, first_mask):
        B = frame_features.shape[0]
        k0 = frame_features[:, 0] @ params["key_proj"]
        v0 = (frame_features[:, 0] * first_mask[..., None]) @ params["value_proj"]
        mem_k = jnp.zeros((B, slots, HW, key_dim), bf).at[:, 0].set(k0)
        mem_v = jnp.zeros((B, slots, HW, value_dim), bf).at[:, 0].set(v0)

        def step(carry, t):
            mem_k, mem_v = carry
            feats = jax.lax.dynamic_index_in_dim(frame_features, t, 1, keepdims=False)     # [B, HW, C]
            qk = feats @ params["key_proj"]
            aff = jnp.einsum("bqc,bsmc->bqsm", qk, mem_k, preferred_element_type=f32) * key_dim ** -0.5
            written = (jnp.arange(slots) * mem_every < t)[None, None, :, None]
            aff = jnp.where(written, aff, -1e9).reshape(B, HW, slots * HW)
            p = jax.nn.softmax(aff, -1).astype(bf)
            readout = jnp.einsum("bqn,bnc->bqc", p, mem_v.reshape(B, slots * HW, value_dim))
            mask_logits = (jnp.concatenate([readout, feats], -1) @ params["decoder"])[..., 0]
            v_new = (feats * jax.nn.sigmoid(mask_logits)[..., None].astype(bf)) @ params["value_proj"]
            slot = t // mem_every
            do_write = (t % mem_every) == 0
            mem_k = jnp.where(do_write, jax.lax.dynamic_update_index_in_dim(mem_k, qk, slot, 1), mem_k)
            mem_v = jnp.where(do_write, jax.lax.dynamic_update_index_in_dim(mem_v, v_new, slot, 1), mem_v)
            return (mem_k, mem_v), mask_logits.astype(f32)

        _, masks = jax.lax.scan(step, (mem_k, mem_v), jnp.arange(1, frames))
        return jnp.swapaxes(masks, 0, 1)

    C = 1024
    rep = P()
    params = {"key_proj": sds((C, key_dim), bf, mesh, rep), "value_proj": sds((C, value_dim), bf, mesh, rep),
              "decoder": sds((value_dim + C, 1), bf, mesh, rep)}
    n = mesh.devices.size * videos
    frame_features = sds((n, frames, HW, C), bf, mesh, P("d"))
    first_mask = sds((n, HW), bf, mesh, P("d"))
    return segment_clip, (params, frame_features, first_mask), {"out_shardings": NamedSharding(mesh, P("d"))}


# 46.4 cryo-EM projection matching that projects the volume for every candidate orientation at once


def _cryoem_projection_builder(mesh, box, orientations, particles, chunk):
    """The expectation step of cryo-EM refinement by projection matching: the current 3-D reconstruction's
    Fourier transform (a [box, box, box] complex64 volume, replicated) is sliced (Fourier-slice theorem,
    nearest-neighbour lookup) at every candidate orientation, CTF-weighted, and cross-correlated with the
    particle images' Fourier transforms (sharded over the devices) to score [particles, orientations].
    chunk=0 (the first version: all projections [orientations, box, box//2+1] complex64 made at once);
    chunk>0: jax.lax.map over blocks of `chunk` orientations, each block projected and scored in turn, as
    RELION/cryoSPARC iterate orientation batches."""
    jax, jnp, NamedSharding, P = _jax()
    f32, c64 = jnp.float32, jnp.complex64
    D, Dh = box, box // 2 + 1
    ky = (jnp.fft.fftfreq(D) * D).astype(f32)
    kx = jnp.arange(Dh, dtype=f32)

    def project(vol_ft, rot):                                                          # rot [3, 3]
        coords = rot[:, 0, None, None] * kx[None, None, :] + rot[:, 1, None, None] * ky[None, :, None]
        idx = jnp.round(coords).astype(jnp.int32) % D                                     # [3, D, Dh]
        return vol_ft[idx[0], idx[1], idx[2]]                                            # [D, Dh] complex

    def score_orientations(volume_ft, rotations, particle_ft, ctf):
        if chunk:
            def score_block(rs):
                pr = jax.vmap(lambda r: project(volume_ft, r))(rs)
                return jnp.real(jnp.einsum("pxy,oxy->po", jnp.conj(particle_ft) * ctf, pr))
            blocks = jax.lax.map(score_block, rotations.reshape(-1, chunk, 3, 3))        # [O/c, P, c]
            return jnp.moveaxis(blocks, 0, 1).reshape(particle_ft.shape[0], -1)
        projs = jax.vmap(lambda r: project(volume_ft, r))(rotations)                     # [O, D, Dh]
        return jnp.real(jnp.einsum("pxy,oxy->po", jnp.conj(particle_ft) * ctf, projs))

    def projection_matching_estep(volume_ft, rotations, particle_ft, ctf):
        scores = score_orientations(volume_ft, rotations, particle_ft, ctf)
        return jax.nn.log_softmax(scores, -1).max(-1), jnp.argmax(scores, -1)

    volume_ft = sds((D, D, D), c64, mesh, P())
    rotations = sds((orientations, 3, 3), f32, mesh, P())
    n = mesh.devices.size * particles
    particle_ft = sds((n, D, Dh), c64, mesh, P("d"))
    ctf = sds((n, D, Dh), f32, mesh, P("d"))
    return projection_matching_estep, (volume_ft, rotations, particle_ft, ctf), {}


# 46.5 an SR3-style super-resolution diffusion U-Net with self-attention at the full output resolution


def _sr3_fullres_attention_builder(mesh, size, images, channels, attn_res):
    """A training step of an SR3-style super-resolution diffusion model (64 -> 256: the bicubic-upsampled
    low-resolution image concatenated with the noisy target, a conv U-Net over 256, 128, 64, 32 and 16,
    bf16 activations, weights replicated, images sharded over the devices, epsilon-prediction loss).
    Self-attention (one head over every pixel of a level) is applied at the levels in `attn_res`.
    attn_res=(256, 16) (the first version: the config lists the output resolution among the attention
    resolutions, so one block attends over all 65536 pixels, scores [B, 65536, 65536]); (16,): SR3's
    attention at the 16x16 level only."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    levels = [size >> i for i in range(len(channels))]

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def res_block(x, lw):
        h = conv(jax.nn.silu(x), lw["conv_0"])
        h = conv(jax.nn.silu(h), lw["conv_1"])
        return x + h

    def self_attention(x, lw):
        B, H, W, C = x.shape
        t = x.reshape(B, H * W, C)
        q, k, v = t @ lw["to_q"], t @ lw["to_k"], t @ lw["to_v"]
        s = jnp.einsum("bqc,bkc->bqk", q, k, preferred_element_type=f32) * C ** -0.5
        o = jnp.einsum("bqk,bkc->bqc", jax.nn.softmax(s, -1).astype(bf), v)
        return x + (o @ lw["proj_out"]).reshape(x.shape)

    def unet(params, x):
        h = conv(x, params["stem"])
        skips = []
        for i, r in enumerate(levels):
            h = res_block(h, params[f"down_{i}"])
            if r in attn_res:
                h = self_attention(h, params[f"down_attn_{i}"])
            skips.append(h)
            if i + 1 < len(levels):
                B, H, W, C = h.shape
                h = h.reshape(B, H // 2, 2, W // 2, 2, C).mean((2, 4)) @ params[f"down_proj_{i}"]
        for i in reversed(range(len(levels))):
            h = res_block(h + skips[i], params[f"up_{i}"])
            if levels[i] in attn_res:
                h = self_attention(h, params[f"up_attn_{i}"])
            if i > 0:
                h = jnp.repeat(jnp.repeat(h, 2, 1), 2, 2) @ params[f"up_proj_{i}"]
        return conv(jax.nn.silu(h), params["head"])

    def sr3_train_step(params, lowres_upsampled, noisy_target, noise):
        def loss_fn(params):
            x = jnp.concatenate([lowres_upsampled, noisy_target], -1).astype(bf)
            eps = unet(params, x).astype(f32)
            return jnp.mean((eps - noise) ** 2)

        return jax.value_and_grad(loss_fn)(params)

    rep = P()
    params = {"stem": sds((3, 3, 6, channels[0]), bf, mesh, rep), "head": sds((3, 3, channels[0], 3), bf, mesh, rep)}
    for i, c in enumerate(channels):
        for side in ("down", "up"):
            params[f"{side}_{i}"] = {"conv_0": sds((3, 3, c, c), bf, mesh, rep), "conv_1": sds((3, 3, c, c), bf, mesh, rep)}
            if levels[i] in attn_res:
                params[f"{side}_attn_{i}"] = {k: sds((c, c), bf, mesh, rep) for k in ("to_q", "to_k", "to_v", "proj_out")}
        if i + 1 < len(channels):
            params[f"down_proj_{i}"] = sds((c, channels[i + 1]), bf, mesh, rep)
            params[f"up_proj_{i + 1}"] = sds((channels[i + 1], c), bf, mesh, rep)
    n = mesh.devices.size * images
    img = lambda: sds((n, size, size, 3), f32, mesh, P("d"))
    return sr3_train_step, (params, img(), img(), img()), {}


pair(
    "tomo_fbp_sinogram_gathered", "v5e", "v5e:2x2",
    "Filtered back-projection of a parallel-beam micro-CT scan on v5e in jax.shard_map: the row-sharded "
    "sinogram (900 angles x 1024 detector rows x 1024 columns, f32) is passed with in_specs=P(), so it is "
    "all-gathered onto every device and ramp-filtered whole (the rfft of the zero-padded projections) before "
    "each device cuts out its slab's rows, beyond 15.75G.",
    "Fixed variant of tomo_fbp_sinogram_gathered_v5e: in_specs=P(None, 'd', None), each device filters and "
    "back-projects only its own detector rows; fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _tomo_fbp_gathered_builder, dict(angles=900, det_rows=1024, det_cols=1024, sino_in_spec=()),
    dict(angles=900, det_rows=1024, det_cols=1024, sino_in_spec=(None, "d", None)),
    dump=True,
)

pair(
    "gnn_partitioned_full_allgather", "v4", "v4:2x2x1",
    "Full-graph training on v4 (8 TensorCores) of a 4-layer message-passing GNN over a 4M-node mesh graph "
    "partitioned over the cores in jax.shard_map, that all-gathers the whole node feature matrix in every "
    "layer (f32[4194304,256], 4 GiB) and keeps it for the backward pass of the sender projection, beyond "
    "15.25G.",
    "Fixed variant of gnn_partitioned_full_allgather_v4: only each partition's 65536 exported halo nodes are "
    "all-gathered, the sender ids index [local nodes; halos]; fits.",
    dict(category="aggregate", causes=["replicated_tensor"]),
    _gnn_halo_builder, dict(nodes=4194304, dim=256, layers=4, edges=1048576, halo=65536, exchange="all_gather"),
    dict(nodes=4194304, dim=256, layers=4, edges=1048576, halo=65536, exchange="halo"),
    dump=False,
)

pair(
    "vos_memory_bank_every_frame", "v6e", "v6e:2x2",
    "STM-style video object segmentation on v6e (120-frame 480p clips, stride-16 keys: 1620 tokens per frame, "
    "16 clips per device) whose memory bank stores every past frame: the readout affinity "
    "f32[16,1620,194400] per step, beyond 31.25G.",
    "Fixed variant of vos_memory_bank_every_frame_v6e: a frame written into the memory every 5 frames "
    "(STM's memory interval), 24 slots; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _vos_memory_bank_builder, dict(frames=120, height=30, width=54, key_dim=64, value_dim=512, videos=16,
                                   mem_every=1),
    dict(frames=120, height=30, width=54, key_dim=64, value_dim=512, videos=16, mem_every=5),
    dump=False,
)

pair(
    "cryoem_all_orientation_projections", "v5p", "v5p:2x2x1",
    "Cryo-EM projection matching on v5p (a 256^3 complex64 reconstruction, 196608 candidate orientations, 256 "
    "particles per device) whose E-step slices the volume for every orientation at once: the projections "
    "complex64[196608,256,129] (48 GiB) and their CTF-weighted products, beyond 95.74G.",
    "Fixed variant of cryoem_all_orientation_projections_v5p: jax.lax.map over blocks of 2048 orientations, "
    "each block projected and scored in turn; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _cryoem_projection_builder, dict(box=256, orientations=196608, particles=256, chunk=0),
    dict(box=256, orientations=196608, particles=256, chunk=2048),
    dump=False,
)

pair(
    "sr3_unet_fullres_attention", "v5e", "v5e:2x2",
    "An SR3-style 64 -> 256 super-resolution diffusion U-Net trained on v5e (2 images per device) whose "
    "attention resolutions include the output resolution: one self-attention block over all 65536 pixels of "
    "the 256x256 level, scores f32[2,65536,65536] (32 GiB), beyond 15.75G.",
    "Fixed variant of sr3_unet_fullres_attention_v5e: self-attention at the 16x16 level only, as SR3's "
    "config has it; fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _sr3_fullres_attention_builder, dict(size=256, images=2, channels=(64, 128, 128, 256, 256), attn_res=(256, 16)),
    dict(size=256, images=2, channels=(64, 128, 128, 256, 256), attn_res=(16,)),
    dump=False,
)

# ---- 47. more broken/fixed pairs (batch tpu36): other models, other names ---------------------
#
# Programs of kinds sections 13-46 do not have, three about placement the way training codebases write it
# (a Levanter/haliax-style named-axis mapping whose `axis_resources` leave the 'vocab' axis unmapped; Adam
# moments whose partition specs are looked up by shape in a table built from the per-layer params tree before
# the layers were stacked for the scan; a tied LM head in jax.shard_map that all-gathers the vocabulary-sharded
# embedding table) and the rest activations / program structure (a mixture-of-depths block computed for every
# token and masked instead of gathering the routed tokens; RETRO's chunked cross-attention written as one
# cross-attention over every chunk's neighbours; ESM-2 contact prediction whose layer scan emits every layer's
# attention maps in f32 for the contact head). The same conventions: the fixed twin changes exactly the
# first cause. See the README section of batch tpu36 for which pairs keep their dumps.


def _rms_norm36(x, g):
    import jax
    import jax.numpy as jnp
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * g).astype(jnp.bfloat16)


# 47.1 haliax-style named-axis mapping: axis_resources map 'mlp' and 'heads' to 'model' but leave 'vocab' unmapped


def _haliax_vocab_unmapped_builder(mesh, layers, vocab, embed, mlp, heads, head_size, batch, seq, axis_resources):
    """A Gemma-style decoder trained with tensor parallelism over the slice, written the Levanter/haliax way:
    every parameter and activation carries named axes (('vocab', 'embed'), ('layers', 'embed', 'heads',
    'head_size'), ('batch', 'position', 'mlp'), ...) and one `axis_resources` dict maps axis names to mesh
    axes; an axis the dict does not name is replicated (haliax's rule). Parameters f32 (bf16 compute), Adam
    moments shaped and placed like the parameters, params and state donated, layers under lax.scan.
    axis_resources={'mlp': 'model', 'heads': 'model'} (the first version: the tensor-parallel mapping written
    for the blocks, 'vocab' never mapped, so the 256000-row token embedding and the untied lm_head, their
    gradients, both Adam moments and the logits are whole on every device); the same with 'vocab': 'model'."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    grid = Mesh(mesh.devices.reshape(-1), ("model",))
    f32, bf = jnp.float32, jnp.bfloat16

    def spec(axes):
        return P(*(axis_resources.get(a) for a in axes))

    def shard(x, *axes):                                   # hax.shard(x, axis_resources)
        return jax.lax.with_sharding_constraint(x, NamedSharding(grid, spec(axes)))

    def decoder_layer(x, lw):
        h = _rms_norm36(x, lw["attn_norm"])
        q = shard(jnp.einsum("bse,ehd->bshd", h, lw["q_proj"].astype(bf)), "batch", "position", "heads", "head_size")
        k = shard(jnp.einsum("bse,ehd->bshd", h, lw["k_proj"].astype(bf)), "batch", "position", "heads", "head_size")
        v = shard(jnp.einsum("bse,ehd->bshd", h, lw["v_proj"].astype(bf)), "batch", "position", "heads", "head_size")
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * head_size ** -0.5
        causal = jnp.tril(jnp.ones((seq, seq), bool))
        p = jax.nn.softmax(jnp.where(causal, s, -1e9), -1).astype(bf)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v)
        x = shard(x + jnp.einsum("bshd,hde->bse", o, lw["o_proj"].astype(bf)), "batch", "position", "embed")
        h = _rms_norm36(x, lw["mlp_norm"])
        g = shard(h @ lw["gate_proj"].astype(bf), "batch", "position", "mlp")
        u = shard(h @ lw["up_proj"].astype(bf), "batch", "position", "mlp")
        x = shard(x + (jax.nn.gelu(g) * u) @ lw["down_proj"].astype(bf), "batch", "position", "embed")
        return x, None

    def train_step(params, opt_state, tokens, targets):
        def loss_fn(params):
            x = shard(params["token_embeddings"][tokens].astype(bf), "batch", "position", "embed")
            x, _ = jax.lax.scan(jax.checkpoint(decoder_layer), x, params["layers"])
            x = _rms_norm36(x, params["final_norm"])
            logits = shard(jnp.einsum("bse,ev->bsv", x, params["lm_head"].astype(bf), preferred_element_type=f32),
                           "batch", "position", "vocab")
            logp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    L, E, M, H, D = layers, embed, mlp, heads, head_size
    named = {"token_embeddings": ((vocab, E), ("vocab", "embed")),
             "lm_head": ((E, vocab), ("embed", "vocab")),
             "final_norm": ((E,), ("embed",)),
             "layers": {"attn_norm": ((L, E), ("layers", "embed")),
                        "q_proj": ((L, E, H, D), ("layers", "embed", "heads", "head_size")),
                        "k_proj": ((L, E, H, D), ("layers", "embed", "heads", "head_size")),
                        "v_proj": ((L, E, H, D), ("layers", "embed", "heads", "head_size")),
                        "o_proj": ((L, H, D, E), ("layers", "heads", "head_size", "embed")),
                        "mlp_norm": ((L, E), ("layers", "embed")),
                        "gate_proj": ((L, E, M), ("layers", "embed", "mlp")),
                        "up_proj": ((L, E, M), ("layers", "embed", "mlp")),
                        "down_proj": ((L, M, E), ("layers", "mlp", "embed"))}}
    is_leaf = lambda t: isinstance(t, tuple) and len(t) == 2 and isinstance(t[1], tuple)
    mk = lambda t: sds(t[0], f32, grid, spec(t[1]))
    params = jax.tree_util.tree_map(mk, named, is_leaf=is_leaf)
    opt_state = {"count": sds((), jnp.int32, grid, P()),
                 "mu": jax.tree_util.tree_map(mk, named, is_leaf=is_leaf),
                 "nu": jax.tree_util.tree_map(mk, named, is_leaf=is_leaf)}
    tokens = sds((batch, seq), jnp.int32, grid, P())
    targets = sds((batch, seq), jnp.int32, grid, P())
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(grid, P())),
          "donate_argnums": (0, 1)}
    return train_step, (params, opt_state, tokens, targets), kw


# 47.2 Adam-moment partition specs looked up by shape in a table built from the unstacked per-layer params tree


def _opt_specs_by_shape_builder(mesh, layers, d_model, d_ff, vocab, batch, seq, specs_from):
    """FSDP training of a decoder (f32 master weights sharded over 'fsdp' on their input dimension, bf16
    compute, layers under lax.scan with jax.checkpoint, params and Adam state donated). The launcher derives
    the optimizer state's shardings the way some trainers do: a table {shape: PartitionSpec} built from the
    params' specs, every moment looked up by its shape, anything not found replicated ("counts and scalars").
    specs_from='per_layer' (the first version: the table was built from the model's per-layer params tree
    before the layers were stacked into [layers, ...] arrays for the scan; the stacked moments' shapes are not
    in it, so both moments of every layer weight fall back to P() and are whole on every device);
    'stacked': the table built from the params tree that is actually trained."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    grid = Mesh(mesh.devices.reshape(-1), ("fsdp",))
    f32, bf = jnp.float32, jnp.bfloat16
    L, D, F, V = layers, d_model, d_ff, vocab
    per_layer = {"wq": ((D, D), P("fsdp", None)), "wk": ((D, D), P("fsdp", None)), "wv": ((D, D), P("fsdp", None)),
                 "wo": ((D, D), P("fsdp", None)), "w_gate": ((D, F), P("fsdp", None)),
                 "w_up": ((D, F), P("fsdp", None)), "w_down": ((F, D), P("fsdp", None)),
                 "attn_norm": ((D,), P()), "mlp_norm": ((D,), P())}
    top = {"embed_tokens": ((V, D), P("fsdp", None)), "final_norm": ((D,), P()), "lm_head": ((D, V), P("fsdp", None))}
    stacked = {k: ((L,) + s, P(None, *sp)) for k, (s, sp) in per_layer.items()}
    params_def = dict(top, layers=stacked)
    table_src = dict(top, **per_layer) if specs_from == "per_layer" else dict(top, **stacked)
    spec_by_shape = {s: sp for s, sp in table_src.values()}
    is_leaf = lambda t: isinstance(t, tuple) and len(t) == 2 and isinstance(t[1], P)
    params = jax.tree_util.tree_map(lambda t: sds(t[0], f32, grid, t[1]), params_def, is_leaf=is_leaf)
    moment = lambda t: sds(t[0], f32, grid, spec_by_shape.get(t[0], P()))
    opt_state = {"count": sds((), jnp.int32, grid, P()),
                 "mu": jax.tree_util.tree_map(moment, params_def, is_leaf=is_leaf),
                 "nu": jax.tree_util.tree_map(moment, params_def, is_leaf=is_leaf)}

    def layer(x, lw):
        w = {k: v.astype(bf) for k, v in lw.items()}
        h = _rms_norm36(x, lw["attn_norm"])
        B, S, _ = x.shape
        q, k, v = [(h @ w[n]).reshape(B, S, D // 128, 128) for n in ("wq", "wk", "wv")]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * 128 ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(B, S, D)
        x = x + o @ w["wo"]
        h = _rms_norm36(x, lw["mlp_norm"])
        return x + (jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"], None

    def fsdp_train_step(params, opt_state, input_ids, labels):
        def loss_fn(params):
            x = params["embed_tokens"][input_ids].astype(bf)
            x, _ = jax.lax.scan(jax.checkpoint(layer), x, params["layers"])
            logits = _rms_norm36(x, params["final_norm"]) @ params["lm_head"].astype(bf)
            logp = jax.nn.log_softmax(logits.astype(f32), -1)
            return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    input_ids = sds((batch, seq), jnp.int32, grid, P("fsdp"))
    labels = sds((batch, seq), jnp.int32, grid, P("fsdp"))
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(grid, P())),
          "donate_argnums": (0, 1)}
    return fsdp_train_step, (params, opt_state, input_ids, labels), kw


# 47.3 a tied LM head in jax.shard_map that all-gathers the vocabulary-sharded embedding table


def _tied_head_gathered_builder(mesh, vocab, d_model, batch, seq, head):
    """The tied output layer and loss of a Gemma-style model under hand-written tensor parallelism in
    jax.shard_map: the input embedding table [vocab, d_model] is vocabulary-parallel (P('model', None)), the
    final hidden states [B, S, d_model] are replicated over 'model' (after the last row-parallel psum), and the
    head reuses the embedding (logits = x @ E^T, soft-capped as Gemma does), cross-entropy, value_and_grad.
    head='all_gather' (the first version: `E = jax.lax.all_gather(embedding, 'model', tiled=True)`, "the head
    needs the whole vocabulary", so every device computes full-vocabulary f32 logits [B, S, vocab] and keeps
    them for the backward pass); 'vocab_parallel': each device computes the logits of its own vocabulary
    rows, the log-sum-exp and the target's logit combined with pmax/psum (Megatron's vocab-parallel
    cross-entropy)."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    grid = Mesh(mesh.devices.reshape(-1), ("model",))
    f32, bf = jnp.float32, jnp.bfloat16
    n = grid.devices.size
    v_local = vocab // n

    def tied_lm_loss(embedding, final_norm, hidden, targets):
        x = _rms_norm36(hidden, final_norm)
        if head == "all_gather":
            table = jax.lax.all_gather(embedding, "model", axis=0, tiled=True)             # [vocab, D]
            logits = jnp.einsum("bsd,vd->bsv", x, table.astype(bf), preferred_element_type=f32)
            logits = 30.0 * jnp.tanh(logits / 30.0)
            logp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))
        logits = jnp.einsum("bsd,vd->bsv", x, embedding.astype(bf), preferred_element_type=f32)
        logits = 30.0 * jnp.tanh(logits / 30.0)                                             # [B, S, vocab/n]
        m = jax.lax.pmax(jax.lax.stop_gradient(logits.max(-1)), "model")
        lse = jnp.log(jax.lax.psum(jnp.exp(logits - m[..., None]).sum(-1), "model")) + m
        lo = jax.lax.axis_index("model") * v_local
        local_t = targets - lo
        mine = (local_t >= 0) & (local_t < v_local)
        t_logit = jnp.take_along_axis(logits, jnp.clip(local_t, 0, v_local - 1)[..., None], -1)[..., 0]
        t_logit = jax.lax.psum(jnp.where(mine, t_logit, 0.0), "model")
        return jnp.mean(lse - t_logit)

    def per_device(embedding, final_norm, hidden, targets):
        loss, grads = jax.value_and_grad(tied_lm_loss, argnums=(0, 1, 2))(embedding, final_norm, hidden, targets)
        return loss, grads

    step = jax.shard_map(per_device, mesh=grid, in_specs=(P("model", None), P(), P(), P()),
                         out_specs=(P(), (P("model", None), P(), P())), check_vma=False)

    def tied_head_loss_and_grads(embedding, final_norm, hidden, targets):
        return step(embedding, final_norm, hidden, targets)

    embedding = sds((vocab, d_model), f32, grid, P("model", None))
    final_norm = sds((d_model,), f32, grid, P())
    hidden = sds((batch, seq, d_model), bf, grid, P())
    targets = sds((batch, seq), jnp.int32, grid, P())
    return tied_head_loss_and_grads, (embedding, final_norm, hidden, targets), {}


# 47.4 a mixture-of-depths block computed for every token and masked, instead of on the routed tokens


def _mod_dense_masked_builder(mesh, layers, d_model, heads, d_ff, batch, seq, capacity, routing):
    """Mixture-of-depths (Raposo et al. 2024) training: in every block a linear router scores the tokens,
    the top `capacity` fraction (12.5%) go through attention + MLP, the others skip it on the residual, the
    block output scaled by the router weight. Layers under lax.scan, no rematerialization, bf16, batch
    sharded over the devices. routing='mask' (the first version, the "simple" implementation: the block is
    applied to every token and its output multiplied by the top-k mask, so attention is computed over the
    whole sequence and its [B, H, S, S] scores kept for the backward pass); 'gather': the routed tokens
    gathered with take_along_axis (in sequence order), the block run on [B, k, D], the outputs scattered back."""
    jax, jnp, NamedSharding, P = _jax()
    f32, bf = jnp.float32, jnp.bfloat16
    k_tok = int(seq * capacity)
    hd = d_model // heads

    def block(x, lw):
        B, S, D = x.shape
        h = _rms_norm36(x, lw["norm_1"])
        q, k, v = [(h @ lw[n]).reshape(B, S, heads, hd) for n in ("wq", "wk", "wv")]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(B, S, D)
        x = x + o @ lw["wo"]
        h = _rms_norm36(x, lw["norm_2"])
        return x + jax.nn.gelu(h @ lw["w_in"]) @ lw["w_out"]

    def mod_layer(x, lw):
        r = (x @ lw["router"])[..., 0].astype(f32)                                         # [B, S]
        top_w, top_i = jax.lax.top_k(r, k_tok)
        if routing == "mask":
            thresh = top_w[:, -1:]
            routed = (r >= thresh)
            y = block(x, lw)
            return x + jnp.where(routed[..., None], (y - x) * r[..., None].astype(bf), 0).astype(bf), None
        idx = jnp.sort(top_i, -1)
        xs = jnp.take_along_axis(x, idx[..., None], 1)                                    # [B, k, D]
        w = jnp.take_along_axis(r, idx, -1)
        y = block(xs, lw)
        upd = ((y - xs) * w[..., None].astype(bf)).astype(bf)
        return jax.vmap(lambda xb, ib, ub: xb.at[ib].add(ub))(x, idx, upd), None

    def mod_train_step(params, input_ids, labels):
        def loss_fn(params):
            x = params["embed"][input_ids]
            x, _ = jax.lax.scan(mod_layer, x, params["blocks"])
            logits = (_rms_norm36(x, params["final_norm"]) @ params["unembed"]).astype(f32)
            logp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

        return jax.value_and_grad(loss_fn)(params)

    L, D, F = layers, d_model, d_ff
    rep = P()
    blocks = {n: sds((L, D, D), bf, mesh, rep) for n in ("wq", "wk", "wv", "wo")}
    blocks.update(router=sds((L, D, 1), bf, mesh, rep), norm_1=sds((L, D), f32, mesh, rep),
                  norm_2=sds((L, D), f32, mesh, rep), w_in=sds((L, D, F), bf, mesh, rep),
                  w_out=sds((L, F, D), bf, mesh, rep))
    params = {"embed": sds((32000, D), bf, mesh, rep), "unembed": sds((D, 32000), bf, mesh, rep),
              "final_norm": sds((D,), f32, mesh, rep), "blocks": blocks}
    n = mesh.devices.size * batch
    input_ids = sds((n, seq), jnp.int32, mesh, P("d"))
    labels = sds((n, seq), jnp.int32, mesh, P("d"))
    return mod_train_step, (params, input_ids, labels), {}


# 47.5 RETRO chunked cross-attention written as one cross-attention over every chunk's neighbours


def _retro_cca_builder(mesh, layers, d_model, heads, batch, seq, chunk, neighbours, neighbour_len, cca):
    """The decoder side of a RETRO-style retrieval-enhanced LM (training): the sequence is cut into chunks of
    `chunk` tokens, each chunk has `neighbours` retrieved passages of `neighbour_len` tokens (already encoded,
    [B, C, K, R, D] bf16, sharded over the batch), and every decoder layer adds a chunked cross-attention.
    Layers under lax.scan, no rematerialization. cca='flat' (the first version: the neighbours of all chunks
    flattened into one memory [B, C*K*R, D] and every token attends over all of it, a block-causal chunk mask
    keeping only its own chunk's neighbours: scores [B, H, S, C*K*R]); 'chunked': the tokens reshaped to
    [B, C, chunk, D] and each chunk attends only over its own K*R neighbour tokens, as the paper's CCA does
    (scores [B, C, H, chunk, K*R], the same result)."""
    jax, jnp, NamedSharding, P = _jax()
    f32, bf = jnp.float32, jnp.bfloat16
    C = seq // chunk
    KR = neighbours * neighbour_len
    hd = d_model // heads

    def self_attn(x, lw):
        B, S, D = x.shape
        h = _rms_norm36(x, lw["sa_norm"])
        q, k, v = [(h @ lw[n]).reshape(B, S, heads, hd) for n in ("sa_q", "sa_k", "sa_v")]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(B, S, D)
        return x + o @ lw["sa_o"]

    def chunked_cross_attn(x, nbr, lw):
        B, S, D = x.shape
        h = _rms_norm36(x, lw["cca_norm"])
        mem = nbr.reshape(B, C * KR, D)
        q = (h @ lw["cca_q"]).reshape(B, S, heads, hd)
        k = (mem @ lw["cca_k"]).reshape(B, C * KR, heads, hd)
        v = (mem @ lw["cca_v"]).reshape(B, C * KR, heads, hd)
        if cca == "flat":
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5     # [B,H,S,C*KR]
            own = (jnp.arange(S)[:, None] // chunk) == (jnp.arange(C * KR)[None, :] // KR)
            p = jax.nn.softmax(jnp.where(own, s, -1e9), -1).astype(bf)
            o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, S, D)
        else:
            qc = q.reshape(B, C, chunk, heads, hd)
            kc, vc = k.reshape(B, C, KR, heads, hd), v.reshape(B, C, KR, heads, hd)
            s = jnp.einsum("bcqhd,bckhd->bchqk", qc, kc, preferred_element_type=f32) * hd ** -0.5
            p = jax.nn.softmax(s, -1).astype(bf)
            o = jnp.einsum("bchqk,bckhd->bcqhd", p, vc).reshape(B, S, D)
        return x + o @ lw["cca_o"]

    def retro_train_step(params, input_ids, neighbour_states, labels):
        def loss_fn(params):
            x = params["embed"][input_ids]

            def layer(x, lw):
                x = self_attn(x, lw)
                x = chunked_cross_attn(x, neighbour_states, lw)
                h = _rms_norm36(x, lw["ffw_norm"])
                return x + jax.nn.gelu(h @ lw["ffw_in"]) @ lw["ffw_out"], None

            x, _ = jax.lax.scan(layer, x, params["decoder"])
            logits = (_rms_norm36(x, params["final_norm"]) @ params["unembed"]).astype(f32)
            logp = jax.nn.log_softmax(logits, -1)
            return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

        return jax.value_and_grad(loss_fn)(params)

    L, D = layers, d_model
    rep = P()
    dec = {n: sds((L, D, D), bf, mesh, rep) for n in ("sa_q", "sa_k", "sa_v", "sa_o", "cca_q", "cca_k", "cca_v", "cca_o")}
    dec.update({n: sds((L, D), f32, mesh, rep) for n in ("sa_norm", "cca_norm", "ffw_norm")})
    dec.update(ffw_in=sds((L, D, 4 * D), bf, mesh, rep), ffw_out=sds((L, 4 * D, D), bf, mesh, rep))
    params = {"embed": sds((32000, D), bf, mesh, rep), "unembed": sds((D, 32000), bf, mesh, rep),
              "final_norm": sds((D,), f32, mesh, rep), "decoder": dec}
    n = mesh.devices.size * batch
    input_ids = sds((n, seq), jnp.int32, mesh, P("d"))
    labels = sds((n, seq), jnp.int32, mesh, P("d"))
    neighbour_states = sds((n, C, neighbours, neighbour_len, D), bf, mesh, P("d"))
    return retro_train_step, (params, input_ids, neighbour_states, labels), {}


pair(
    "haliax_axis_mapping_vocab_unmapped", "v5e", "v5e:2x2",
    "A Gemma-style decoder (vocab 256000, embed 3072, mlp 24576, 2 layers) trained on v5e with tensor "
    "parallelism written the haliax way: the named-axis mapping axis_resources={'mlp': 'model', 'heads': "
    "'model'} leaves 'vocab' unmapped, so the token embedding and the untied lm_head (f32[256000,3072] each) "
    "and their Adam moments are whole on every device, beyond 15.75G.",
    "Fixed variant of haliax_axis_mapping_vocab_unmapped_v5e: axis_resources also maps 'vocab': 'model'; fits.",
    dict(category="arguments", causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _haliax_vocab_unmapped_builder, dict(layers=2, vocab=256000, embed=3072, mlp=24576, heads=16, head_size=256,
                                         batch=4, seq=512, axis_resources={"mlp": "model", "heads": "model"}),
    dict(layers=2, vocab=256000, embed=3072, mlp=24576, heads=16, head_size=256, batch=4, seq=512,
         axis_resources={"mlp": "model", "heads": "model", "vocab": "model"}),
    dump=False,
)

pair(
    "adam_specs_by_shape_before_stacking", "v5p", "v5p:2x2x1",
    "FSDP training on v5p of a 26-layer decoder (D=6144, d_ff=16384, f32 master weights sharded over 'fsdp') "
    "whose Adam moments take their PartitionSpecs from a {shape: spec} table built from the per-layer params "
    "tree before the layers were stacked for lax.scan: no stacked shape is in the table, so both moments of "
    "every layer weight fall back to P() (2 x 47 GB whole on every device), beyond 95.74G.",
    "Fixed variant of adam_specs_by_shape_before_stacking_v5p: the table built from the stacked params tree "
    "that is trained, the moments sharded like the weights; fits.",
    dict(category="arguments", causes=["optimizer_state_unsharded"]),
    _opt_specs_by_shape_builder, dict(layers=26, d_model=6144, d_ff=16384, vocab=32000, batch=8, seq=1024,
                                      specs_from="per_layer"),
    dict(layers=26, d_model=6144, d_ff=16384, vocab=32000, batch=8, seq=1024, specs_from="stacked"),
    dump=False,
)

pair(
    "tied_lm_head_embedding_allgathered", "v6e", "v6e:2x2",
    "The tied LM head and loss of a Gemma-style model (vocab 262144, d_model 2560, 8 x 2048 tokens) under "
    "tensor parallelism in jax.shard_map on v6e: the vocabulary-parallel embedding is all-gathered "
    "(jax.lax.all_gather(embedding, 'model', tiled=True)) to compute the tied logits, so every device holds "
    "the whole table and full-vocabulary f32 logits [8,2048,262144] (16 GiB), beyond 31.25G.",
    "Fixed variant of tied_lm_head_embedding_allgathered_v6e: each device computes the logits of its own "
    "65536 vocabulary rows, the log-sum-exp and the target logit combined with pmax/psum (vocab-parallel "
    "cross-entropy); fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "large_activation"]),
    _tied_head_gathered_builder, dict(vocab=262144, d_model=2560, batch=8, seq=2048, head="all_gather"),
    dict(vocab=262144, d_model=2560, batch=8, seq=2048, head="vocab_parallel"),
    dump=True,
)

pair(
    "mixture_of_depths_dense_masked", "v4", "v4:2x2x1",
    "Mixture-of-depths training on v4 (8 TensorCores, 16384-token sequences, 1 per core, 4 blocks, D=2048, "
    "8 heads, capacity 12.5%) whose routed block is computed for every token and masked by the router's top-k: "
    "attention over all 16384 tokens, scores f32[1,8,16384,16384] (8 GiB) per block, beyond 15.25G.",
    "Fixed variant of mixture_of_depths_dense_masked_v4: the 2048 routed tokens gathered (take_along_axis), "
    "the block run on them, the outputs scattered back; fits.",
    dict(category="single_large_allocation", causes=["large_activation", "no_remat"]),
    _mod_dense_masked_builder, dict(layers=4, d_model=2048, heads=8, d_ff=8192, batch=1, seq=16384,
                                    capacity=0.125, routing="mask"),
    dict(layers=4, d_model=2048, heads=8, d_ff=8192, batch=1, seq=16384, capacity=0.125, routing="gather"),
    dump=False,
)

pair(
    "retro_cca_flat_neighbour_memory", "v5e", "v5e:2x2",
    "A RETRO-style retrieval-enhanced decoder (8 layers, D=1024, 16 heads, 2048 tokens in 32 chunks of 64, 2 "
    "neighbours of 128 tokens per chunk, 2 sequences per device) trained on v5e whose chunked cross-attention "
    "attends over all 8192 neighbour tokens of the sequence under a block-causal chunk mask: scores "
    "f32[2,16,2048,8192] per layer kept for the backward pass, beyond 15.75G.",
    "Fixed variant of retro_cca_flat_neighbour_memory_v5e: each chunk's 64 tokens attend only over their own "
    "256 neighbour tokens (scores [2,32,16,64,256]); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "no_remat"]),
    _retro_cca_builder, dict(layers=8, d_model=1024, heads=16, batch=2, seq=2048, chunk=64, neighbours=2,
                             neighbour_len=128, cca="flat"),
    dict(layers=8, d_model=1024, heads=16, batch=2, seq=2048, chunk=64, neighbours=2, neighbour_len=128,
         cca="chunked"),
    dump=False,
)


# 47.6 ESM-2 contact prediction: every layer's attention maps stacked in f32 for the logistic-regression head


def _esm_contact_maps_builder(mesh, layers, d_model, heads, seqs, length, maps_dtype):
    """Contact-map prediction with an ESM-2-style protein language model (inference, bf16 weights
    replicated, sequences sharded over the devices): a lax.scan over the transformer layers that also emits
    each layer's attention probabilities, stacked into [layers, B, heads, N, N], then ESM's contact head
    (symmetrize, average product correction, a logistic regression over the layers x heads maps, sigmoid).
    maps_dtype='float32' (the first version: the softmax is taken in f32 and the maps are emitted as they
    come, so the stack, its symmetrized copy and the corrected maps are f32); 'bfloat16': the maps cast to
    bf16 before they leave the layer (the softmax itself and the regression's accumulation still in f32)."""
    jax, jnp, NamedSharding, P = _jax()
    f32, bf = jnp.float32, jnp.bfloat16
    hd = d_model // heads
    out_dt = jnp.dtype(maps_dtype)

    def layer(x, lw):
        B, N, D = x.shape
        h = _rms_norm36(x, lw["attn_layer_norm"])
        q, k, v = [(h @ lw[n]).reshape(B, N, heads, hd) for n in ("q_proj", "k_proj", "v_proj")]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        attn = jax.nn.softmax(s, -1)                                                       # f32 [B, H, N, N]
        o = jnp.einsum("bhqk,bkhd->bqhd", attn.astype(bf), v).reshape(B, N, D)
        x = x + o @ lw["out_proj"]
        h = _rms_norm36(x, lw["final_layer_norm"])
        x = x + jax.nn.gelu(h @ lw["fc1"]) @ lw["fc2"]
        return x, attn.astype(out_dt)

    def predict_contacts(params, tokens):
        x = params["embed_tokens"][tokens]
        _, attentions = jax.lax.scan(layer, x, params["layers"])                           # [L, B, H, N, N]
        sym = attentions + jnp.swapaxes(attentions, -1, -2)
        a1 = sym.sum(-1, keepdims=True)
        a2 = sym.sum(-2, keepdims=True)
        a12 = sym.sum((-1, -2), keepdims=True)
        normalized = sym - (a1 * a2 / a12).astype(out_dt)                                  # APC
        logits = jnp.einsum("lbhij,lh->bij", normalized, params["contact_head"]["regression"].astype(out_dt),
                            preferred_element_type=f32) + params["contact_head"]["bias"]
        return jax.nn.sigmoid(logits)

    L, D = layers, d_model
    rep = P()
    lay = {n: sds((L, D, D), bf, mesh, rep) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    lay.update(attn_layer_norm=sds((L, D), f32, mesh, rep), final_layer_norm=sds((L, D), f32, mesh, rep),
               fc1=sds((L, D, 4 * D), bf, mesh, rep), fc2=sds((L, 4 * D, D), bf, mesh, rep))
    params = {"embed_tokens": sds((33, D), bf, mesh, rep), "layers": lay,
              "contact_head": {"regression": sds((L, heads), f32, mesh, rep), "bias": sds((), f32, mesh, rep)}}
    tokens = sds((mesh.devices.size * seqs, length), jnp.int32, mesh, P("d"))
    return predict_contacts, (params, tokens), {"out_shardings": NamedSharding(mesh, P("d"))}


pair(
    "esm_contact_attention_maps_f32", "v5e", "v5e:2x2",
    "ESM-2 (650M: 33 layers, 20 heads, D=1280) contact-map prediction on v5e for 1024-residue proteins, 4 per "
    "device, whose layer scan emits every layer's attention probabilities in f32 for the contact head: the "
    "stack f32[33,4,20,1024,1024] (10.3 GiB) and its symmetrized copy, beyond 15.75G.",
    "Fixed variant of esm_contact_attention_maps_f32_v5e: the maps cast to bf16 before they leave the layer "
    "(the softmax and the contact head's regression still accumulate in f32); fits.",
    dict(category="single_large_allocation", causes=["f32_precision", "large_activation"]),
    _esm_contact_maps_builder, dict(layers=33, d_model=1280, heads=20, seqs=4, length=1024, maps_dtype="float32"),
    dict(layers=33, d_model=1280, heads=20, seqs=4, length=1024, maps_dtype="bfloat16"),
    dump=True,
)

# ---- 48. more broken/fixed pairs (batch tpu37): other models, other names ---------------------
#
# Programs of kinds sections 13-46 do not have, from model-based RL, neural fields, differentiable rendering,
# implicit surfaces, exploration in RL and robot learning (an MBPO-style ensemble of dynamics models vmapped
# over stacked members whose stacked params and Adam moments are given in_shardings P(); a Plenoxels-style
# dense radiance grid passed replicated to the jitted train step; a 3-D Gaussian splatting renderer that
# composites every Gaussian at every pixel; a neural SDF evaluated on the whole marching-cubes query grid at
# once; an NGU-style episodic memory of every actor given in_shardings P() while the actors are sharded; a
# Diffusion Policy trained on every diffusion timestep of every action chunk). The same conventions: the fixed
# twin changes exactly the first cause. See the README section of batch tpu37 for which pairs keep their dumps
# and what did not go as first written.


# 48.1 an MBPO-style dynamics-model ensemble vmapped over stacked members whose params are given in_shardings P()


def _mbpo_ensemble_builder(mesh, members, obs_dim, act_dim, hidden, depth, batch, member_spec):
    """Model-based RL (MBPO / PETS): an ensemble of `members` probabilistic dynamics models, each an MLP
    (obs + action -> hidden x depth -> mean and log-variance of the next-state delta), params stacked on a
    leading member axis and trained together with jax.vmap(member_nll) and Adam; every member gets its own
    bootstrap batch [members, batch, ...] placed over the member axis. The jit's in_shardings/out_shardings
    for the stacked params and the Adam moments come from `member_spec`:
    member_spec=() (the first version: `ensemble_sharding = NamedSharding(mesh, P())`, written when the
    ensemble was 5 small members, so the stacked params and both moments are replicated on every device);
    ('d',): P('d') over the member axis, each device holds and trains its own members (as the data is)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    spec = P(*member_spec)
    d_in = obs_dim + act_dim

    def member_nll(p, obs, act, next_obs):
        h = jnp.concatenate([obs, act], -1)
        h = jax.nn.swish(h @ p["input_layer"]["kernel"])
        for i in range(depth):
            h = jax.nn.swish(h @ p[f"hidden_{i}"]["kernel"])
        out = h @ p["output_layer"]["kernel"]
        mean, log_var = out[..., :obs_dim], jnp.clip(out[..., obs_dim:], -10.0, 0.5)
        delta = next_obs - obs
        return jnp.mean((mean - delta) ** 2 * jnp.exp(-log_var) + log_var)

    def ensemble_train_step(ens_params, opt_state, obs, act, next_obs):
        def loss_fn(ens_params):
            return jnp.sum(jax.vmap(member_nll)(ens_params, obs, act, next_obs))

        loss, grads = jax.value_and_grad(loss_fn)(ens_params)
        ens_params, opt_state = adam_update(ens_params, grads, opt_state)
        return ens_params, opt_state, loss

    def stack(shape):
        return sds((members,) + shape, f32, mesh, spec)

    def tree():
        t = {"input_layer": {"kernel": stack((d_in, hidden))},
             "output_layer": {"kernel": stack((hidden, 2 * obs_dim))}}
        for i in range(depth):
            t[f"hidden_{i}"] = {"kernel": stack((hidden, hidden))}
        return t

    ens_params = tree()
    opt_state = {"count": sds((), jnp.int32, mesh, P()), "mu": tree(), "nu": tree()}
    data = lambda d: sds((members, batch, d), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(ens_params), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return ensemble_train_step, (ens_params, opt_state, data(obs_dim), data(act_dim), data(obs_dim)), kw


# 48.2 a Plenoxels-style dense radiance grid (and its Adam moments) passed to the jitted step replicated


def _plenoxel_grid_builder(mesh, res, channels, rays, samples, grid_spec):
    """Training of a Plenoxels / DVGO-style dense radiance field: the grid `density_sh` f32[channels, res,
    res, res] (1 density + 27 spherical-harmonic coefficients per voxel, channels-first as the PyTorch
    original stores it) is sampled trilinearly at `samples` points along each ray (8 corner look-ups into the
    flattened grid), alpha-composited, and fitted to the pixel colours with an L2 loss and Adam; the rays are
    sharded over the devices, the grid and its moments donated.
    grid_spec=() (the first version: `pjit(train_step, in_shardings=(P(), P(), P('d'), P('d')))` "because
    every ray may touch any voxel", so the grid and both moments are replicated on every device);
    (None, 'd'): the grid and its moments sharded over its x axis, the look-ups masked per shard."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    n_vox = res ** 3
    gspec = P(*grid_spec)

    def render_rays(density_sh, origins, dirs):
        flat = density_sh.reshape(channels, n_vox)
        t = jnp.linspace(0.05, 1.0, samples, dtype=f32)
        pts = origins[:, None, :] + t[None, :, None] * dirs[:, None, :]             # [R, S, 3] in [0, 1)
        g = jnp.clip(pts, 0.0, 1.0 - 1e-6) * (res - 1)
        i0 = jnp.floor(g).astype(jnp.int32)
        frac = g - i0
        feats = 0.0
        for corner in range(8):
            off = jnp.array([(corner >> 2) & 1, (corner >> 1) & 1, corner & 1], jnp.int32)
            ijk = i0 + off
            w = jnp.prod(jnp.where(off == 1, frac, 1.0 - frac), -1)                   # [R, S]
            idx = (ijk[..., 0] * res + ijk[..., 1]) * res + ijk[..., 2]
            feats = feats + w[None] * jnp.take(flat, idx, axis=1)                     # [C, R, S]
        sigma = jax.nn.relu(feats[0])
        rgb = jax.nn.sigmoid(jnp.stack([jnp.sum(feats[1 + 9 * k:10 + 9 * k], 0) for k in range(3)], -1))
        alpha = 1.0 - jnp.exp(-sigma / samples)
        trans = jnp.cumprod(jnp.concatenate([jnp.ones_like(alpha[:, :1]), 1.0 - alpha[:, :-1] + 1e-10], -1), -1)
        return jnp.sum((alpha * trans)[..., None] * rgb, 1)                              # [R, 3]

    def plenoxel_train_step(density_sh, opt_state, ray_bundle, target_rgb):
        def loss_fn(density_sh):
            return jnp.mean((render_rays(density_sh, ray_bundle[:, 0], ray_bundle[:, 1]) - target_rgb) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(density_sh)
        density_sh, opt_state = adam_update(density_sh, grads, opt_state, lr=1e-1)
        return density_sh, opt_state, loss

    grid = lambda: sds((channels, res, res, res), f32, mesh, gspec)
    density_sh = grid()
    opt_state = {"count": sds((), jnp.int32, mesh, P()), "mu": grid(), "nu": grid()}
    ray_bundle = sds((rays, 2, 3), f32, mesh, P("d"))
    target_rgb = sds((rays, 3), f32, mesh, P("d"))
    kw = {"out_shardings": (_shardings(density_sh), _shardings(opt_state), NamedSharding(mesh, P())),
          "donate_argnums": (0, 1)}
    return plenoxel_train_step, (density_sh, opt_state, ray_bundle, target_rgb), kw


# 48.3 a 3-D Gaussian splatting renderer that alpha-composites every Gaussian at every pixel (no tiles)


def _gsplat_dense_builder(mesh, gaussians, views, height, width, pixel_chunk):
    """Fitting a 3-D Gaussian splatting scene: `gaussians` Gaussians (means, log-scales, rotation quaternions,
    opacity logits, RGB), replicated; `views` camera views per device (sharded), projected with a pinhole
    camera to 2-D means and inverse covariances, sorted by depth once per view, then composited front to
    back per pixel (alpha = opacity * exp(-0.5 d^T Sigma^-1 d), transmittance = the exclusive cumulative product of 1 - alpha, as
    exp(cumsum(log1p(-alpha)))); L1 loss
    against the ground-truth image, gradients for every Gaussian parameter.
    pixel_chunk=None (the first version, a "readable" JAX rasterizer: every Gaussian evaluated at every pixel
    of the view at once, alpha and transmittance [H*W, G] kept for the backward pass); an int: the pixels
    rendered `pixel_chunk` at a time with jax.lax.map over a jax.checkpoint'ed chunk renderer."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    focal = 0.8 * width

    def project(g, cam):
        R, tvec = cam[:, :3], cam[:, 3]
        xyz = g["means"] @ R.T + tvec                                                    # [G, 3]
        z = jnp.maximum(xyz[:, 2], 0.1)
        uv = focal * xyz[:, :2] / z[:, None] + jnp.array([width / 2, height / 2], f32)
        q = g["quats"] / jnp.linalg.norm(g["quats"], axis=-1, keepdims=True)
        w, x, y, zq = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
        rot = jnp.stack([1 - 2 * (y * y + zq * zq), 2 * (x * y - w * zq), 2 * (x * y + w * zq),
                         1 - 2 * (x * x + zq * zq)], -1).reshape(-1, 2, 2)
        s = jnp.exp(g["log_scales"][:, :2]) * focal / z[:, None]
        cov = jnp.einsum("gij,gj,gkj->gik", rot, s * s, rot) + 0.3 * jnp.eye(2, dtype=f32)
        det = cov[:, 0, 0] * cov[:, 1, 1] - cov[:, 0, 1] ** 2
        conic = jnp.stack([cov[:, 1, 1], -cov[:, 0, 1], cov[:, 0, 0]], -1) / det[:, None]
        order = jnp.argsort(z)
        return uv[order], conic[order], jax.nn.sigmoid(g["opacity_logits"][order]), jax.nn.sigmoid(g["colors"][order])

    def composite(pix, uv, conic, opacity, color):
        d = pix[:, None, :] - uv[None]                                                   # [P, G, 2]
        power = -0.5 * (conic[None, :, 0] * d[..., 0] ** 2 + 2 * conic[None, :, 1] * d[..., 0] * d[..., 1]
                        + conic[None, :, 2] * d[..., 1] ** 2)
        alpha = jnp.minimum(0.99, opacity[None] * jnp.exp(power))                          # [P, G]
        log_keep = jnp.log1p(-alpha)
        trans = jnp.exp(jnp.cumsum(log_keep, -1) - log_keep)                               # exclusive cumprod
        return (alpha * trans) @ color                                                  # [P, 3]

    ys, xs = jnp.meshgrid(jnp.arange(height, dtype=f32), jnp.arange(width, dtype=f32), indexing="ij")
    pixels = jnp.stack([xs.ravel(), ys.ravel()], -1) + 0.5

    def render_view(g, cam):
        uv, conic, opacity, color = project(g, cam)
        if pixel_chunk is None:
            return composite(pixels, uv, conic, opacity, color)
        chunk_fn = jax.checkpoint(lambda pix: composite(pix, uv, conic, opacity, color))
        out = jax.lax.map(chunk_fn, pixels.reshape(-1, pixel_chunk, 2))
        return out.reshape(-1, 3)

    def splat_train_step(gaussian_params, cameras, gt_images):
        def loss_fn(g):
            rendered = jax.vmap(lambda cam: render_view(g, cam))(cameras)
            return jnp.mean(jnp.abs(rendered - gt_images.reshape(rendered.shape)))

        loss, grads = jax.value_and_grad(loss_fn)(gaussian_params)
        return loss, grads

    rep = P()
    gaussian_params = {"means": sds((gaussians, 3), f32, mesh, rep), "log_scales": sds((gaussians, 3), f32, mesh, rep),
                       "quats": sds((gaussians, 4), f32, mesh, rep), "opacity_logits": sds((gaussians,), f32, mesh, rep),
                       "colors": sds((gaussians, 3), f32, mesh, rep)}
    n = mesh.devices.size * views
    cameras = sds((n, 3, 4), f32, mesh, P("d"))
    gt_images = sds((n, height, width, 3), f32, mesh, P("d"))
    return splat_train_step, (gaussian_params, cameras, gt_images), {}


# 48.4 a neural SDF evaluated on the whole marching-cubes query grid at once


def _sdf_grid_query_builder(mesh, res, width, depth, freqs, chunk):
    """Mesh extraction from a trained neural signed-distance field (NeuS / IGR-style: Fourier-feature
    positional encoding with `freqs` octaves, a softplus MLP of `depth` x `width`, bf16 weights,
    replicated): the SDF is queried at every vertex of a res^3 grid, the values returned for marching cubes on
    the host. The grid's points are built in the jitted function, its z slabs sharded over the devices
    (with_sharding_constraint) and queried per slab in jax.shard_map.
    chunk=None (the first version: `sdf_fn(grid_points)` on all res^3 points at once, every hidden
    activation [points, width] materialised); an int: jax.lax.map over blocks of `chunk` points."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32

    def encode(x):
        scales = (2.0 ** jnp.arange(freqs, dtype=f32)) * jnp.pi
        xb = x[..., None, :] * scales[:, None]
        return jnp.concatenate([x, jnp.sin(xb).reshape(*x.shape[:-1], -1), jnp.cos(xb).reshape(*x.shape[:-1], -1)], -1)

    def sdf_fn(params, x):
        h = encode(x).astype(bf)
        for i in range(depth):
            h = jax.nn.softplus((h @ params[f"layer_{i}"]["kernel"]).astype(f32) * 100.0).astype(bf) / 100.0
        return (h @ params["sdf_head"]["kernel"]).astype(f32)[..., 0]

    def extract_sdf_grid(params, bbox_min, bbox_max):
        lin = jnp.linspace(0.0, 1.0, res, dtype=f32)
        zz, yy, xx = jnp.meshgrid(lin, lin, lin, indexing="ij")
        pts = jnp.stack([xx, yy, zz], -1) * (bbox_max - bbox_min) + bbox_min            # [res, res, res, 3]
        pts = jax.lax.with_sharding_constraint(pts, NamedSharding(mesh, P("d")))

        def slab(p):                                                                    # one chip's z slab
            if chunk is None:
                return sdf_fn(params, p)
            return jax.lax.map(lambda c: sdf_fn(params, c), p.reshape(-1, chunk, 3)).reshape(p.shape[:-1])

        return jax.shard_map(slab, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False)(pts)

    d_in = 3 + 6 * freqs
    params = {f"layer_{i}": {"kernel": sds((d_in if i == 0 else width, width), bf, mesh, P())} for i in range(depth)}
    params["sdf_head"] = {"kernel": sds((width, 1), bf, mesh, P())}
    box = lambda: sds((3,), f32, mesh, P())
    return extract_sdf_grid, (params, box(), box()), {}


# 48.5 an NGU-style episodic memory of every actor given in_shardings P() (replicated) while the actors are sharded


def _ngu_episodic_memory_builder(mesh, actors, slots, emb_dim, k, memory_spec):
    """Never Give Up / Agent57-style intrinsic reward in an on-device (Anakin / Sebulba-style) actor step: each
    of `actors` parallel environments keeps an episodic memory of `slots` controllable-state embeddings
    (f32 [actors, slots, emb_dim], a ring buffer written at `write_ptr`); the step embeds the new
    observations, takes the k-nearest-neighbour kernel of each against its own actor's memory for the
    episodic novelty bonus, and writes the embedding into the memory (donated). The actors' observations
    are sharded over the devices.
    memory_spec=() (the first version: `episodic_memory` in in_shardings as P() "because it is bookkeeping,
    not a model", so every device holds every actor's memory); ('d',): P('d') over the actor axis, like the
    observations, each device holds its own actors' memories."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    mspec = P(*memory_spec)

    def episodic_novelty_step(embed_params, episodic_memory, write_ptr, observations):
        emb = jnp.tanh(observations @ embed_params["embedding_net"]["kernel"])             # [A, E]
        d2 = jnp.sum((episodic_memory - emb[:, None, :]) ** 2, -1)                          # [A, slots]
        knn_d2 = -jax.lax.top_k(-d2, k)[0]                                                  # [A, k]
        knn_d2 = knn_d2 / (jnp.mean(knn_d2, -1, keepdims=True) + 1e-8)
        kernel = 1e-3 / (knn_d2 + 1e-3)
        intrinsic_reward = 1.0 / (jnp.sqrt(jnp.sum(kernel, -1)) + 1e-3)
        onehot = jax.nn.one_hot(write_ptr % slots, slots, dtype=f32)[:, :, None]          # [A, slots, 1]
        episodic_memory = episodic_memory * (1.0 - onehot) + onehot * emb[:, None, :]
        return episodic_memory, write_ptr + 1, intrinsic_reward

    obs_dim = 512
    embed_params = {"embedding_net": {"kernel": sds((obs_dim, emb_dim), f32, mesh, P())}}
    episodic_memory = sds((actors, slots, emb_dim), f32, mesh, mspec)
    write_ptr = sds((actors,), jnp.int32, mesh, P("d"))
    observations = sds((actors, obs_dim), f32, mesh, P("d"))
    kw = {"out_shardings": (NamedSharding(mesh, mspec), NamedSharding(mesh, P("d")), NamedSharding(mesh, P("d"))),
          "donate_argnums": (1, 2)}
    return episodic_novelty_step, (embed_params, episodic_memory, write_ptr, observations), kw


# 48.6 a Diffusion Policy trained on every diffusion timestep of every action chunk (timesteps = arange(T))


def _diffusion_policy_all_timesteps_builder(mesh, batch, horizon, action_dim, obs_dim, channels, train_timesteps,
                                            all_timesteps):
    """Training of a Diffusion Policy (Chi et al.) for a robot arm: a 1-D temporal conv U-Net (kernel 5, channels
    `channels`, FiLM-conditioned on the observation features and the timestep embedding, bf16) predicts the
    noise added to an action chunk [horizon, action_dim] under a DDPM schedule of `train_timesteps` steps;
    batch sharded over the devices, weights replicated.
    all_timesteps=True (the first version: `timesteps = jnp.arange(num_train_timesteps)` broadcast against the
    batch "so every noise level is seen every step": each chunk is noised at all 100 levels and the U-Net runs
    on batch x 100 chunks, its activations kept for the backward pass); False: one timestep per chunk drawn
    with jax.random.randint, as the reference implementation does."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    betas = jnp.linspace(1e-4, 2e-2, train_timesteps, dtype=f32)
    alphas_cumprod = jnp.cumprod(1.0 - betas)

    def conv1d(x, w):
        return jax.lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))

    def cond_res_block(x, cond, p):
        h = jax.nn.mish(conv1d(x, p["conv_0"]))
        scale, shift = jnp.split(cond @ p["film"], 2, -1)
        h = h * (1 + scale[:, None, :]) + shift[:, None, :]
        h = jax.nn.mish(conv1d(h, p["conv_1"]))
        return h + (conv1d(x, p["residual"]) if "residual" in p else x)

    def temb(t, dim=128):
        freqs = jnp.exp(-jnp.log(10000.0) * jnp.arange(dim // 2, dtype=f32) / (dim // 2))
        a = t.astype(f32)[:, None] * freqs
        return jnp.concatenate([jnp.sin(a), jnp.cos(a)], -1)

    def unet(params, x, t, obs):
        cond = jnp.concatenate([jax.nn.mish(temb(t) @ params["time_mlp"]), obs], -1).astype(bf)
        h = x.astype(bf)
        skips = []
        for i in range(len(channels)):
            h = cond_res_block(h, cond, params[f"down_{i}"])
            skips.append(h)
            if i + 1 < len(channels):
                B, W, C = h.shape
                h = h.reshape(B, W // 2, 2, C).mean(2)
        for i in reversed(range(len(channels) - 1)):
            h = jnp.repeat(h, 2, 1)
            h = cond_res_block(jnp.concatenate([h, skips[i]], -1), cond, params[f"up_{i}"])
        return conv1d(h, params["final_conv"]).astype(f32)

    def policy_train_step(params, actions, obs_features, rng):
        def loss_fn(params):
            k_t, k_n = jax.random.split(rng)
            B = actions.shape[0]
            if all_timesteps:
                t = jnp.tile(jnp.arange(train_timesteps), B)
                a0, obs = jnp.repeat(actions, train_timesteps, 0), jnp.repeat(obs_features, train_timesteps, 0)
            else:
                t = jax.random.randint(k_t, (B,), 0, train_timesteps)
                a0, obs = actions, obs_features
            noise = jax.random.normal(k_n, a0.shape, f32)
            ac = alphas_cumprod[t][:, None, None]
            noisy = jnp.sqrt(ac) * a0 + jnp.sqrt(1 - ac) * noise
            return jnp.mean((unet(params, noisy, t, obs) - noise) ** 2)

        return jax.value_and_grad(loss_fn)(params)

    rep = P()
    cdim = 128 + obs_dim
    params = {"time_mlp": sds((128, 128), f32, mesh, rep), "final_conv": sds((5, channels[0], action_dim), bf, mesh, rep)}
    prev = action_dim
    for i, c in enumerate(channels):
        params[f"down_{i}"] = {"conv_0": sds((5, prev, c), bf, mesh, rep), "conv_1": sds((5, c, c), bf, mesh, rep),
                               "film": sds((cdim, 2 * c), bf, mesh, rep), "residual": sds((1, prev, c), bf, mesh, rep)}
        prev = c
    for i in range(len(channels) - 1):
        cin, c = channels[i + 1] + channels[i], channels[i]
        params[f"up_{i}"] = {"conv_0": sds((5, cin, c), bf, mesh, rep), "conv_1": sds((5, c, c), bf, mesh, rep),
                             "film": sds((cdim, 2 * c), bf, mesh, rep), "residual": sds((1, cin, c), bf, mesh, rep)}
    n = mesh.devices.size * batch
    actions = sds((n, horizon, action_dim), f32, mesh, P("d"))
    obs_features = sds((n, obs_dim), f32, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, P())
    return policy_train_step, (params, actions, obs_features, rng), {}


pair(
    "mbpo_ensemble_members_replicated", "v5e", "v5e:2x2",
    "An MBPO-style ensemble of 8 probabilistic dynamics models (obs 376 + act 17 -> 4 x 8192 swish -> mean and "
    "log-variance) trained on v5e with jax.vmap over the stacked members and Adam, whose stacked params and "
    "moments are given in_shardings/out_shardings NamedSharding(mesh, P()): f32[8,8192,8192] kernels and both "
    "moments replicated on every device, beyond 15.75G.",
    "Fixed variant of mbpo_ensemble_members_replicated_v5e: the stacked params and moments P('d') over the "
    "member axis, as the bootstrap batches are; fits.",
    dict(category="arguments", causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _mbpo_ensemble_builder, dict(members=8, obs_dim=376, act_dim=17, hidden=8192, depth=3, batch=256, member_spec=()),
    dict(members=8, obs_dim=376, act_dim=17, hidden=8192, depth=3, batch=256, member_spec=("d",)),
    dump=False,
)

pair(
    "plenoxel_grid_replicated", "v6e", "v6e:2x2",
    "Plenoxels-style dense radiance-field training on v6e: the grid density_sh f32[28,512,512,512] (15 GiB) "
    "and its Adam moments are passed with in_shardings P() (replicated: \"every ray may touch any voxel\"), "
    "4096 rays of 128 samples per device, beyond 31.25G.",
    "Fixed variant of plenoxel_grid_replicated_v6e: the grid and its moments sharded over the grid's x axis "
    "(P(None, 'd')), the look-ups masked per shard; fits.",
    dict(category="arguments", causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _plenoxel_grid_builder, dict(res=512, channels=28, rays=16384, samples=128, grid_spec=()),
    dict(res=512, channels=28, rays=16384, samples=128, grid_spec=(None, "d")),
    dump=False,
)

pair(
    "gsplat_dense_every_pixel", "v4", "v4:2x2x1",
    "Fitting a 3-D Gaussian splatting scene (65536 Gaussians) on v4 (8 TensorCores), one 128x128 view per "
    "core, with a pure-JAX rasterizer that evaluates every Gaussian at every pixel: the offsets "
    "f32[16384,65536,2] (8 GiB), alpha and transmittance f32[16384,65536] (4 GiB each) for the backward pass, "
    "beyond 15.25G.",
    "Fixed variant of gsplat_dense_every_pixel_v4: the pixels rendered 1024 at a time (jax.lax.map over a "
    "jax.checkpoint'ed chunk renderer); fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _gsplat_dense_builder, dict(gaussians=65536, views=1, height=128, width=128, pixel_chunk=None),
    dict(gaussians=65536, views=1, height=128, width=128, pixel_chunk=1024),
    dump=False,
)

pair(
    "neural_sdf_marching_cubes_grid", "v5e", "v5e:2x2",
    "Mesh extraction from a NeuS-style neural SDF (6 x 512 softplus MLP, 6 Fourier octaves, bf16) on v5e: the "
    "SDF queried at all 512^3 vertices of the marching-cubes grid at once (z slabs sharded over the 4 chips), "
    "hidden activations [33554432, 512] per device, beyond 15.75G.",
    "Fixed variant of neural_sdf_marching_cubes_grid_v5e: each chip's slab queried 65536 points at a time "
    "(jax.lax.map in jax.shard_map); fits.",
    dict(category="single_large_allocation", causes=["large_activation"]),
    _sdf_grid_query_builder, dict(res=512, width=512, depth=6, freqs=6, chunk=None),
    dict(res=512, width=512, depth=6, freqs=6, chunk=65536),
    dump=True,
)


pair(
    "ngu_episodic_memory_replicated", "v6e", "v6e:2x2",
    "An on-device NGU-style actor step on v6e (512 actors sharded over the chips) whose episodic memories "
    "f32[512,131072,128] (32 GiB) are given in_shardings P() (\"bookkeeping, not a model\"): every chip holds "
    "every actor's memory, beyond 31.25G.",
    "Fixed variant of ngu_episodic_memory_replicated_v6e: the memories P('d') over the actor axis, like the "
    "observations; fits.",
    dict(category="arguments", causes=["replicated_tensor"]),
    _ngu_episodic_memory_builder, dict(actors=512, slots=131072, emb_dim=128, k=10, memory_spec=()),
    dict(actors=512, slots=131072, emb_dim=128, k=10, memory_spec=("d",)),
    dump=False,
)

pair(
    "diffusion_policy_every_timestep", "v5p", "v5p:2x2x1",
    "Diffusion Policy training on v5p (a 1-D conv U-Net over 16-step action chunks, channels 256/512/1024, bf16, "
    "8192 chunks per chip) whose timesteps are jnp.arange(100) broadcast against the batch: every chunk noised at "
    "all 100 levels, the U-Net run on 819200 chunks per chip with its activations kept for the backward pass, "
    "beyond 95.74G.",
    "Fixed variant of diffusion_policy_every_timestep_v5p: one timestep per chunk drawn with "
    "jax.random.randint, as the reference implementation does; fits.",
    dict(category="aggregate", causes=["batch_too_large", "large_activation"]),
    _diffusion_policy_all_timesteps_builder, dict(batch=8192, horizon=16, action_dim=10, obs_dim=512,
                                                  channels=(256, 512, 1024), train_timesteps=100, all_timesteps=True),
    dict(batch=8192, horizon=16, action_dim=10, obs_dim=512, channels=(256, 512, 1024), train_timesteps=100,
         all_timesteps=False),
    dump=False,
)

# ---- 49. more broken/fixed pairs (batch tpu38): other models, other names ---------------------
#
# Programs of kinds sections 13-48 do not have, mostly placement written the way training codebases write it
# (a knowledge-graph embedding trainer on a multi-host v5e-16 whose mesh is built from jax.local_devices(); a
# DCN / Wide & Deep ranking model in jax's explicit-sharding mode whose embedding gather is given
# out_sharding=P() to silence the ShardingTypeError; a FuXi-style weather transformer whose partition helper
# shards only 2-D params, so the layer-stacked 3-D kernels and their Adam moments stay replicated; a long-context
# DNA LM meant as DeepSpeed-Ulysses sequence parallelism in shard_map that all-gathers the sequence at entry
# instead of an all_to_all per layer), and a reward model trained on every (chosen, rejected) pair of K
# responses by running it on each pair; and the HBM budget capped per jit by compiler_options carried over from a
# serving config. The same conventions: the fixed twin changes exactly the first cause.
# See the README section of batch tpu38 for which pairs keep their dumps and what did not go as first written.


# 49.1 a multi-host knowledge-graph embedding trainer whose mesh is built from jax.local_devices() (one host's chips)


def _kge_local_devices_mesh_builder(mesh, entities, relations, dim, triples, negatives, local_mesh):
    """Knowledge-graph embedding training (TransE with PyTorch-BigGraph-style chunked negative sampling: every
    chunk of positive triples shares `negatives` corrupted tail entities) on a multi-host v5e-16 slice (4 hosts
    of 4 chips): f32 entity and relation tables, row-wise sharded over the mesh axis 'entity_shard', trained with
    Adagrad (elementwise accumulators, as PBG's dense variant), tables and accumulators donated; the triples are
    sharded over the same axis.
    local_mesh=True (the first version, ported from the single-host v5e-4 script: `mesh =
    Mesh(np.array(jax.local_devices()), ('entity_shard',))`, so every host builds a mesh over its own 4 chips
    and each holds a quarter of the tables, i.e. the tables are split 4 ways instead of 16 and every host keeps a
    whole copy); False: `Mesh(np.array(jax.devices()), ('entity_shard',))`, the tables over all 16 chips."""
    jax, jnp, NamedSharding, P = _jax()
    import numpy as np
    from jax.sharding import Mesh
    f32 = jnp.float32
    if local_mesh:
        devs = [d for d in mesh.devices.flat if d.process_index == 0]                  # jax.local_devices() on host 0
    else:
        devs = list(mesh.devices.flat)                                                  # jax.devices()
    kg_mesh = Mesh(np.array(devs), ("entity_shard",))
    rows = NamedSharding(kg_mesh, P("entity_shard", None))

    def transe_adagrad_step(tables, adagrad_state, heads, rels, tails, neg_tails):
        def loss_fn(tables):
            h = tables["entity_embeddings"][heads]                                     # [B, D]
            r = tables["relation_embeddings"][rels]
            t = tables["entity_embeddings"][tails]
            n = tables["entity_embeddings"][neg_tails]                                 # [chunks, K, D]
            hr = (h + r).reshape(n.shape[0], -1, dim)                                 # [chunks, B/chunks, D]
            pos = -jnp.sum(jnp.abs(hr - t.reshape(hr.shape)), -1)
            neg = -jnp.sum(jnp.abs(hr[:, :, None, :] - n[:, None, :, :]), -1)          # [chunks, B/c, K]
            return jnp.mean(jax.nn.relu(1.0 - pos[..., None] + neg))

        loss, grads = jax.value_and_grad(loss_fn)(tables)
        adagrad_state = _tm(lambda a, g: a + g * g, adagrad_state, grads)
        tables = _tm(lambda p, g, a: p - 0.1 * g / (jnp.sqrt(a) + 1e-10), tables, grads, adagrad_state)
        return tables, adagrad_state, loss

    def tabs():
        return {"entity_embeddings": jax.ShapeDtypeStruct((entities, dim), f32, sharding=rows),
                "relation_embeddings": jax.ShapeDtypeStruct((relations, dim), f32, sharding=rows)}

    tables, adagrad_state = tabs(), tabs()
    ids = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=NamedSharding(kg_mesh, P("entity_shard")))
    chunks = len(devs) * 4
    args = (tables, adagrad_state, ids((triples,)), ids((triples,)), ids((triples,)), ids((chunks, negatives)))
    kw = {"out_shardings": (_shardings(tables), _shardings(adagrad_state), NamedSharding(kg_mesh, P())),
          "donate_argnums": (0, 1)}
    return transe_adagrad_step, args, kw


# 49.2 explicit-sharding mode: the embedding gather given out_sharding=P() to silence the ShardingTypeError


def _explicit_gather_out_sharding_builder(mesh, vocab, fields, dim, batch, deep, gather_spec):
    """A Wide & Deep / DCN-style CTR ranking model written for jax's explicit-sharding mode (`jax.make_mesh(...,
    axis_types=(AxisType.Explicit,))`): the hashed sparse features of `fields` categorical fields are looked up
    in one f32 table [vocab, dim] sharded by rows, concatenated (an Avazu-style all-categorical model), passed
    through a cross layer and a bf16 deep tower (weights replicated), logistic loss (the labels resharded to
    the logits' sharding, as explicit mode asks), SGD; the batch is sharded over 'data'. In explicit mode
    `table[ids]` raises `ShardingTypeError: Use .at[...].get(out_sharding=) ...` because both operands are sharded
    over 'data'.
    gather_spec=() (the first version: `table.at[ids].get(out_sharding=P())` "to make the error go away": the
    gathered features are replicated, and explicit mode carries that sharding on, so every chip runs the cross
    layer and the deep tower on the whole global batch); ('data',): out_sharding=P('data'), the features
    sharded like the ids, every chip runs its own quarter of the batch."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import AxisType, Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    xm = Mesh(mesh.devices, ("data",), axis_types=(AxisType.Explicit,))
    gspec = NamedSharding(xm, P(*gather_spec))
    rep = NamedSharding(xm, P())

    def ctr_train_step(params, sparse_ids, clicks):
        def loss_fn(params):
            emb = params["sparse_embedding"].at[sparse_ids].get(out_sharding=gspec)     # [B, F, D]
            x0 = emb.reshape(emb.shape[0], fields * dim).astype(bf)
            x = x0 * (x0 @ params["cross_0"]["kernel"]) + x0                            # DCN-v2 cross layer
            h = x
            for i in range(len(deep)):
                h = jax.nn.relu(h @ params[f"deep_{i}"]["kernel"])
            logit = (h @ params["logit"]["kernel"]).astype(f32)[:, 0]
            y = jax.sharding.reshard(clicks, jax.typeof(logit).sharding)
            return jnp.mean(jax.nn.softplus(logit) - y * logit)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: (p - 1e-3 * g).astype(p.dtype), params, grads), loss

    d_in = fields * dim
    params = {"sparse_embedding": jax.ShapeDtypeStruct((vocab, dim), f32, sharding=NamedSharding(xm, P("data", None))),
              "cross_0": {"kernel": jax.ShapeDtypeStruct((d_in, d_in), bf, sharding=rep)}}
    prev = d_in
    for i, w in enumerate(deep):
        params[f"deep_{i}"] = {"kernel": jax.ShapeDtypeStruct((prev, w), bf, sharding=rep)}
        prev = w
    params["logit"] = {"kernel": jax.ShapeDtypeStruct((prev, 1), bf, sharding=rep)}
    bs = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(xm, P("data", *([None] * (len(shape) - 1)))))
    args = (params, bs((batch, fields), jnp.int32), bs((batch,), f32))
    kw = {"out_shardings": (_shardings(params), rep), "donate_argnums": (0,)}
    return ctr_train_step, args, kw


# 49.3 a partition helper that shards only 2-D params: the layer-stacked 3-D kernels and their Adam moments replicated


def _weather_rank_rule_builder(mesh, layers, d_model, ffn, tokens, batch, three_d_rule):
    """A FuXi / Pangu-style medium-range weather transformer trunk (the 0.25-degree fields patch-embedded into
    `tokens` tokens of `d_model`, `layers` pre-LN blocks stacked on a leading layer axis and run with
    jax.lax.scan under jax.checkpoint, bf16 compute, f32 master weights), trained with Adam on an 'fsdp' mesh,
    params and moments donated. The shardings come from the project's helper

        def fsdp_spec(p): return P('fsdp', None) if p.ndim == 2 else P()     # "biases and scales replicated"

    written for the unstacked model, where every kernel is 2-D.
    three_d_rule=False (the first version: after the blocks were stacked for the scan every block kernel is 3-D
    [layers, in, out], so the helper returns P() for all of them and for both of their Adam moments; only
    the patch embedding and the output head (2-D) are sharded); True: the helper also maps 3-D params to
    P(None, 'fsdp', None) (the layer axis kept whole, the input features sharded)."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    fm = Mesh(mesh.devices, ("fsdp",))
    channels = 70 * 4 * 4                                                              # 70 variables, 4x4 patches

    def fsdp_spec(shape):
        if len(shape) == 2:
            return P("fsdp", None)
        if len(shape) == 3 and three_d_rule:
            return P(None, "fsdp", None)
        return P()

    def leaf(shape):
        return jax.ShapeDtypeStruct(shape, f32, sharding=NamedSharding(fm, fsdp_spec(shape)))

    def ln(x, g):
        x32 = x.astype(f32)
        return ((x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-6) * g).astype(bf)

    def fuxi_train_step(params, opt_state, era5_patches, targets):
        def loss_fn(params):
            x = (era5_patches.astype(bf) @ params["cube_embed"]["kernel"].astype(bf))  # [B, T, D]

            @jax.checkpoint
            def block(h, w):
                a = ln(h, w["attn_norm"]["scale"])
                b_, t_, _ = a.shape
                qkv = (a @ w["attention"]["qkv"]["kernel"].astype(bf)).reshape(b_, t_, 3, 16, -1)
                s = jnp.einsum("bqhd,bkhd->bhqk", qkv[:, :, 0], qkv[:, :, 1]).astype(f32) / 16.0
                o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), qkv[:, :, 2]).reshape(b_, t_, -1)
                h = h + o @ w["attention"]["out"]["kernel"].astype(bf)
                m = ln(h, w["mlp_norm"]["scale"])
                return h + jax.nn.gelu(m @ w["mlp"]["fc1"]["kernel"].astype(bf)) @ w["mlp"]["fc2"]["kernel"].astype(bf), None

            h, _ = jax.lax.scan(block, x, params["swin_blocks"])
            pred = (h @ params["head"]["kernel"].astype(bf)).astype(f32)
            return jnp.mean((pred - targets) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state = adam_update(params, grads, opt_state)
        return params, opt_state, loss

    L, D, F = layers, d_model, ffn

    def tree():
        return {"cube_embed": {"kernel": leaf((channels, D))}, "head": {"kernel": leaf((D, channels))},
                "swin_blocks": {"attn_norm": {"scale": leaf((L, D))}, "mlp_norm": {"scale": leaf((L, D))},
                                "attention": {"qkv": {"kernel": leaf((L, D, 3 * D))}, "out": {"kernel": leaf((L, D, D))}},
                                "mlp": {"fc1": {"kernel": leaf((L, D, F))}, "fc2": {"kernel": leaf((L, F, D))}}}}

    params = tree()
    opt_state = {"count": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(fm, P())), "mu": tree(), "nu": tree()}
    data = lambda: jax.ShapeDtypeStruct((batch, tokens, channels), f32, sharding=NamedSharding(fm, P("fsdp")))
    kw = {"out_shardings": (_shardings(params), _shardings(opt_state), NamedSharding(fm, P())),
          "donate_argnums": (0, 1)}
    return fuxi_train_step, (params, opt_state, data(), data()), kw


# 49.4 a reward model trained on every (chosen, rejected) pair of K responses by running it on each pair


def _rm_all_pairs_builder(mesh, prompts, k_resp, seq, d_model, heads, depth, encode_pairs):
    """An LLM reward model (a scanned pre-LN decoder, bf16, jax.checkpoint per block, the reward read at the last
    token) trained with the InstructGPT loss over all K*(K-1)/2 ranked pairs of K responses per prompt; prompts
    sharded over the devices, weights replicated, SGD, donated.
    encode_pairs=True (the first version, from a pairwise-dataset collator: for every pair (i, j) the two token
    sequences are gathered into chosen_ids / rejected_ids [prompts * K*(K-1)/2, seq] and the model is run on both,
    so each response is encoded K-1 times); False: every response encoded once [prompts * K, seq], the K rewards
    gathered into the pairs (as the InstructGPT paper does "to avoid overfitting and for efficiency")."""
    jax, jnp, NamedSharding, P = _jax()
    import itertools
    bf, f32 = jnp.bfloat16, jnp.float32
    D, H = d_model, heads
    hd = D // H
    pairs = list(itertools.combinations(range(k_resp), 2))
    pi = jnp.array([p[0] for p in pairs], jnp.int32)
    pj = jnp.array([p[1] for p in pairs], jnp.int32)

    def rms(x, g):
        x32 = x.astype(f32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * g).astype(bf)

    @jax.checkpoint
    def decoder_block(h, w):
        b, s, _ = h.shape
        a = rms(h, w["input_layernorm"])
        q = (a @ w["q_proj"]).reshape(b, s, H, hd)
        k = (a @ w["k_proj"]).reshape(b, s, H, hd)
        v = (a @ w["v_proj"]).reshape(b, s, H, hd)
        sc = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * hd ** -0.5
        sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e30)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, -1).astype(bf), v).reshape(b, s, D)
        h = h + o @ w["o_proj"]
        m = rms(h, w["post_attention_layernorm"])
        return h + (jax.nn.silu(m @ w["gate_proj"]) * (m @ w["up_proj"])) @ w["down_proj"], None

    def rewards(rm, ids):
        h = jnp.take(rm["embed_tokens"], ids, axis=0)
        h, _ = jax.lax.scan(decoder_block, h, rm["layers"])
        return (rms(h[:, -1], rm["norm"]) @ rm["score_head"]).astype(f32)[:, 0]

    def reward_model_step(rm, response_ids):                                          # [B, K, S], best first
        def loss_fn(rm):
            B = response_ids.shape[0]
            if encode_pairs:
                chosen_ids = response_ids[:, pi].reshape(-1, seq)                         # [B*P, S]
                rejected_ids = response_ids[:, pj].reshape(-1, seq)
                margin = rewards(rm, chosen_ids) - rewards(rm, rejected_ids)
            else:
                r = rewards(rm, response_ids.reshape(-1, seq)).reshape(B, k_resp)
                margin = (r[:, pi] - r[:, pj]).reshape(-1)
            return -jnp.mean(jax.nn.log_sigmoid(margin))

        loss, g = jax.value_and_grad(loss_fn)(rm)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), rm, g), loss

    L, F = depth, 4 * d_model
    lay = lambda *s: sds((L,) + s, bf, mesh, P())
    rm = {"embed_tokens": sds((32000, D), bf, mesh, P()), "norm": sds((D,), bf, mesh, P()),
          "score_head": sds((D, 1), bf, mesh, P()),
          "layers": {"input_layernorm": lay(D), "post_attention_layernorm": lay(D), "q_proj": lay(D, D),
                     "k_proj": lay(D, D), "v_proj": lay(D, D), "o_proj": lay(D, D), "gate_proj": lay(D, F),
                     "up_proj": lay(D, F), "down_proj": lay(F, D)}}
    n = mesh.devices.size * prompts
    response_ids = sds((n, k_resp, seq), jnp.int32, mesh, P("d"))
    return reward_model_step, (rm, response_ids), {"donate_argnums": (0,)}


# 49.5 DeepSpeed-Ulysses sequence parallelism in shard_map that all-gathers the sequence at entry instead of all_to_all per layer


def _ulysses_allgather_builder(mesh, layers, d_model, heads, seq, batch, head_scatter):
    """Prefill (scoring) of a long-context DNA language model (bidirectional encoder blocks over single-nucleotide
    tokens, bf16, blocks stacked and run with jax.lax.scan) with DeepSpeed-Ulysses sequence parallelism written in
    jax.shard_map: the sequence is sharded over the mesh axis 'sp', every device projects Q/K/V for its own
    sequence slice, and an all_to_all should trade the sequence shards for head shards (each device attends with
    heads/n heads over the whole sequence), a second all_to_all trading them back.
    head_scatter=False (the first version, written before jax.lax.all_to_all's split/concat axes were understood:
    the token ids are jax.lax.all_gather'ed over 'sp' at entry "so that attention sees the whole sequence", every
    device runs every layer on the whole sequence with ALL heads and keeps its own slice of the output, so the
    [B, heads, S, S] scores are on every device); True: each layer's Q/K/V go through
    jax.lax.all_to_all(split_axis=heads, concat_axis=sequence), the attention output back."""
    jax, jnp, NamedSharding, P = _jax()
    from jax.sharding import Mesh
    bf, f32 = jnp.bfloat16, jnp.float32
    sp = Mesh(mesh.devices, ("sp",))
    n = sp.devices.size
    hd = d_model // heads

    def attend(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) * hd ** -0.5
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v)

    def ulysses_layer(h, w):                                                          # h: [B, S/n, D]
        b, s_loc, _ = h.shape
        x32 = h.astype(f32)
        a = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf)
        q, k, v = [(a @ w[m]).reshape(b, s_loc, heads, hd) for m in ("wq", "wk", "wv")]
        if head_scatter:
            q, k, v = [jax.lax.all_to_all(t, "sp", 2, 1, tiled=True) for t in (q, k, v)]    # [B, S, H/n, hd]
            o = jax.lax.all_to_all(attend(q, k, v), "sp", 1, 2, tiled=True)                 # [B, S/n, H, hd]
        else:
            o = attend(q, k, v)                                                         # the whole sequence
        h = h + o.reshape(b, s_loc, d_model) @ w["wo"]
        return h + jax.nn.gelu(h @ w["w_in"]) @ w["w_out"], None

    def dna_lm_prefill(params, token_ids):
        def body(ids, params):
            s_loc = ids.shape[1]
            if not head_scatter:
                ids = jax.lax.all_gather(ids, "sp", axis=1, tiled=True)                  # [B, S]
            h = jnp.take(params["nucleotide_embed"], ids, axis=0)
            h, _ = jax.lax.scan(ulysses_layer, h, params["encoder_layers"])
            if not head_scatter:
                h = jax.lax.dynamic_slice_in_dim(h, jax.lax.axis_index("sp") * s_loc, s_loc, 1)   # own slice
            return h.astype(f32)

        return jax.shard_map(body, mesh=sp, in_specs=(P(None, "sp"), P()), out_specs=P(None, "sp"),
                             check_vma=False)(token_ids, params)

    L, D = layers, d_model
    lay = lambda *s: jax.ShapeDtypeStruct((L,) + s, bf, sharding=NamedSharding(sp, P()))
    params = {"nucleotide_embed": jax.ShapeDtypeStruct((16, D), bf, sharding=NamedSharding(sp, P())),
              "encoder_layers": {"wq": lay(D, D), "wk": lay(D, D), "wv": lay(D, D), "wo": lay(D, D),
                                 "w_in": lay(D, 4 * D), "w_out": lay(4 * D, D)}}
    token_ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(sp, P(None, "sp")))
    return dna_lm_prefill, (params, token_ids), {}


pair(
    "kge_mesh_from_local_devices", "v5e", "v5e:4x4",
    "TransE knowledge-graph embedding training (67M entities x 128, f32, Adagrad, PyTorch-BigGraph-style chunked "
    "negatives) on a 4-host v5e-16 slice whose mesh is built from jax.local_devices(): the tables and accumulators "
    "(64 GiB) split over one host's 4 chips instead of 16, 16 GiB of arguments per chip, beyond 15.75G.",
    "Fixed variant of kge_mesh_from_local_devices_v5e: the mesh built from jax.devices(), the tables over all 16 "
    "chips; fits.",
    dict(category="arguments", causes=["arguments_exceed", "replicated_tensor"]),
    _kge_local_devices_mesh_builder, dict(entities=1 << 26, relations=4096, dim=128, triples=65536, negatives=1000,
                                          local_mesh=True),
    dict(entities=1 << 26, relations=4096, dim=128, triples=65536, negatives=1000, local_mesh=False),
    dump=True,
)

pair(
    "explicit_mode_gather_out_sharding_replicated", "v6e", "v6e:2x2",
    "A DCN / Wide & Deep CTR model in jax's explicit-sharding mode on v6e: the sparse-feature gather "
    "table.at[ids].get(out_sharding=P()) (written to silence the ShardingTypeError) replicates the gathered "
    "features, and the cross layer and deep tower run on the whole global batch on every chip, beyond 31.25G.",
    "Fixed variant of explicit_mode_gather_out_sharding_replicated_v6e: out_sharding=P('data'), the features "
    "sharded like the ids; fits.",
    dict(category="aggregate", causes=["replicated_tensor", "batch_too_large"]),
    _explicit_gather_out_sharding_builder, dict(vocab=1 << 24, fields=24, dim=128, batch=262144,
                                                deep=(16384, 16384, 16384, 8192), gather_spec=()),
    dict(vocab=1 << 24, fields=24, dim=128, batch=262144, deep=(16384, 16384, 16384, 8192), gather_spec=("data",)),
    dump=False,
)

pair(
    "weather_fsdp_rule_2d_only_stacked_replicated", "v5p", "v5p:2x2x1",
    "A FuXi-style weather transformer trunk (44 stacked blocks, d=4096, f32 master weights, Adam) on v5p whose "
    "partition helper `P('fsdp', None) if p.ndim == 2 else P()` was written before the blocks were stacked for "
    "lax.scan: every 3-D block kernel and both of its Adam moments replicated, beyond 95.74G.",
    "Fixed variant of weather_fsdp_rule_2d_only_stacked_replicated_v5p: the helper maps 3-D params to "
    "P(None, 'fsdp', None); fits.",
    dict(category="arguments", causes=["replicated_tensor", "optimizer_state_unsharded", "arguments_exceed"]),
    _weather_rank_rule_builder, dict(layers=44, d_model=4096, ffn=16384, tokens=2048, batch=4, three_d_rule=False),
    dict(layers=44, d_model=4096, ffn=16384, tokens=2048, batch=4, three_d_rule=True),
    dump=False,
)

pair(
    "reward_model_pairs_reencoded", "v5e", "v5e:2x2",
    "An LLM reward model (8 scanned decoder blocks, d=2048, bf16, remat per block) trained on all 28 ranked pairs "
    "of 8 responses per prompt on v5e by running the model on every pair's chosen and rejected sequence: 56 "
    "encodings of 1024 tokens per prompt instead of 8, beyond 15.75G.",
    "Fixed variant of reward_model_pairs_reencoded_v5e: every response encoded once, the rewards gathered into "
    "the pairs; fits.",
    dict(category="aggregate", causes=["batch_too_large", "large_activation"]),
    _rm_all_pairs_builder, dict(prompts=4, k_resp=8, seq=1024, d_model=2048, heads=16, depth=8, encode_pairs=True),
    dict(prompts=4, k_resp=8, seq=1024, d_model=2048, heads=16, depth=8, encode_pairs=False),
    dump=False,
)


pair(
    "ulysses_sp_allgather_all_heads", "v6e", "v6e:2x2",
    "Prefill of a long-context DNA language model (4 scanned encoder blocks, d=2048, 16 heads, bf16) over 4 "
    "sequences of 16384 nucleotides on v6e, meant as DeepSpeed-Ulysses sequence parallelism in jax.shard_map, whose "
    "token ids are all_gather'ed over the sequence at entry instead of an all_to_all per layer: every chip runs "
    "every layer on the whole sequence with all 16 heads, the probabilities bf16[4,16,16384,16384] (32 GiB) on "
    "every chip, beyond 31.25G.",
    "Fixed variant of ulysses_sp_allgather_all_heads_v6e: the sequence stays sharded, each layer's Q/K/V go through "
    "jax.lax.all_to_all(split_axis=heads, concat_axis=sequence) and back, each chip attends with 4 heads; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "large_activation"]),
    _ulysses_allgather_builder, dict(layers=4, d_model=2048, heads=16, seq=16384, batch=4, head_scatter=False),
    dict(layers=4, d_model=2048, heads=16, seq=16384, batch=4, head_scatter=True),
    dump=True,
)

# 49.6 the HBM budget capped per jit: compiler_options={'xla_tpu_max_hbm_size_mib': ...} from a co-located serving config

_ULYSSES_FIT = dict(layers=4, d_model=2048, heads=16, seq=16384, batch=4, head_scatter=True)

case(
    "jit_compiler_options_hbm_cap_v6e", "v6e:2x2",
    "The (fixed, Ulysses all_to_all) long-context DNA LM prefill of ulysses_sp_allgather_all_heads_fixed_v6e compiled "
    "with jax.jit(...).lower(...).compile(compiler_options={'xla_tpu_max_hbm_size_mib': 6144}), carried over from "
    "the serving config that shares each v6e chip with a second model: the compiler plans for 6 GiB instead of "
    "31.25G and the 8.19G program does not fit.",
    expect="oom", dump=False, compiler_options={"xla_tpu_max_hbm_size_mib": 6144},
    label=dict(category="single_large_allocation", causes=["preallocation", "large_activation"],
               fixed="jit_compiler_options_hbm_cap_fixed_v6e"),
)(lambda mesh: _ulysses_allgather_builder(mesh, **_ULYSSES_FIT))
case(
    "jit_compiler_options_hbm_cap_fixed_v6e", "v6e:2x2",
    "Fixed variant of jit_compiler_options_hbm_cap_v6e: the same program compiled without the "
    "xla_tpu_max_hbm_size_mib compiler option; fits.",
    expect="fit", dump=False, label={"twin_of": "jit_compiler_options_hbm_cap_v6e"},
)(lambda mesh: _ulysses_allgather_builder(mesh, **_ULYSSES_FIT))

# ---- 50. more broken/fixed pairs (batch tpu39): other models, other names ---------------------
#
# Programs of kinds sections 13-48 do not have, from weather forecasting, video tokenization, LLM serving,
# retrieval, speech synthesis and temporal graphs (a FourCastNet-style AFNO whose fields are split over
# longitude, the axis its 2-D FFTs run along, so the partitioner gathers every field around each FFT; a
# MAGVIT-v2 tokenizer whose lookup-free quantizer takes its entropy over all 2^18 codes at once instead of the
# factorized entropy; an int8 KV cache whose dequantization scales are f32 per element instead of per token and
# head; a cross-encoder reranker trained on every (query, passage) pair of the global in-batch matrix; a
# HiFi-GAN vocoder trained on whole utterances because the segment_size crop was dropped; a TGN whose GRU
# memory update runs over every node and is masked to the touched ones). The same conventions: the fixed twin
# changes exactly the first cause. See the README section of batch tpu39 for which pair keeps its dump and what
# did not go as first written.


# 50.1 FourCastNet (AFNO) with "spatial parallelism": the fields sharded over longitude, the FFT axis


def _afno_lon_sharded_builder(mesh, batch, lat, lon, n_vars, embed, n_blocks, depth, field_spec):
    """Training step of a FourCastNet-style AFNO weather model at the token grid (lat x lon after the patch
    embedding): every block is layer norm -> rfft2 over (lat, lon) -> the block-diagonal complex MLP of AFNO
    (n_blocks blocks, soft-shrink) on the kept modes -> irfft2 -> residual, then layer norm -> channel MLP ->
    residual; lax.scan over the stacked blocks with jax.checkpoint; MSE on the next state of the n_vars
    variables; weights replicated, SGD. The global batch of initial conditions is `batch`.
    field_spec=(None, None, 'd', None) (the first version, "spatial parallelism" copied from a
    domain-decomposed CFD code: the fields and the target split over longitude, the axis the 2-D FFT runs
    along, so the partitioner gathers the whole field around every rfft2/irfft2); ('d',): the fields split
    over the batch of initial conditions (plain data parallelism), the FFTs local."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    bs = embed // n_blocks
    fspec = P(*field_spec)

    def layer_norm(x, g):
        m = jnp.mean(x, -1, keepdims=True)
        v = jnp.mean((x - m) ** 2, -1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-6) * g

    def afno_filter(x, blk):
        B, H, W, C = x.shape
        xf = jnp.fft.rfft2(x, axes=(1, 2), norm="ortho").reshape(B, H, W // 2 + 1, n_blocks, bs)
        w1 = jax.lax.complex(blk["spectral_w1_real"], blk["spectral_w1_imag"])
        w2 = jax.lax.complex(blk["spectral_w2_real"], blk["spectral_w2_imag"])
        h = jnp.einsum("bhwkc,kcd->bhwkd", xf, w1)
        h = jax.lax.complex(jax.nn.relu(h.real), jax.nn.relu(h.imag))
        h = jnp.einsum("bhwkd,kdc->bhwkc", h, w2)
        h = jax.lax.complex(jnp.sign(h.real) * jax.nn.relu(jnp.abs(h.real) - 0.01),
                            jnp.sign(h.imag) * jax.nn.relu(jnp.abs(h.imag) - 0.01))           # soft-shrink
        return jnp.fft.irfft2(h.reshape(B, H, W // 2 + 1, C), s=(H, W), axes=(1, 2), norm="ortho")

    def afno_block(x, blk):
        x = x + afno_filter(layer_norm(x, blk["norm1"]), blk)
        h = jax.nn.gelu(layer_norm(x, blk["norm2"]) @ blk["mlp_fc1"])
        return x + h @ blk["mlp_fc2"], None

    def fourcastnet_train_step(params, era5_state, era5_next):
        def loss_fn(params):
            x = era5_state @ params["patch_embed"] + params["pos_embed"]
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, fspec))
            x, _ = jax.lax.scan(jax.checkpoint(afno_block), x, params["blocks"])
            pred = x @ params["head"]
            return jnp.mean((pred - era5_next) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-4 * g, params, grads), loss

    rep = P()
    L, E = depth, embed
    blocks = {"norm1": sds((L, E), f32, mesh, rep), "norm2": sds((L, E), f32, mesh, rep),
              "mlp_fc1": sds((L, E, 4 * E), f32, mesh, rep), "mlp_fc2": sds((L, 4 * E, E), f32, mesh, rep)}
    for n in ("spectral_w1_real", "spectral_w1_imag", "spectral_w2_real", "spectral_w2_imag"):
        blocks[n] = sds((L, n_blocks, bs, bs), f32, mesh, rep)
    params = {"patch_embed": sds((n_vars, E), f32, mesh, rep), "pos_embed": sds((lat, lon, E), f32, mesh, rep),
              "head": sds((E, n_vars), f32, mesh, rep), "blocks": blocks}
    era5_state = sds((batch, lat, lon, n_vars), f32, mesh, fspec)
    era5_next = sds((batch, lat, lon, n_vars), f32, mesh, fspec)
    return fourcastnet_train_step, (params, era5_state, era5_next), {"donate_argnums": (0,)}


# 50.2 a MAGVIT-v2 video tokenizer whose lookup-free quantizer takes the entropy over all 2^18 codes at once


def _magvit_lfq_entropy_builder(mesh, clips, frames, size, code_bits, hidden, entropy_groups):
    """Training step of a MAGVIT-v2-style video tokenizer with lookup-free quantization (LFQ): a tubelet
    encoder (4x8x8 tubelets -> 2-layer MLP, bf16) maps each token to `code_bits` dims quantized by sign; the
    LFQ entropy penalty (per-token entropy low, codebook-usage entropy high) needs each token's soft
    assignment to every code c in {-1, 1}^code_bits, softmax(2 z.c / tau). The decoder mirrors the encoder;
    L2 reconstruction + commitment + entropy terms; clips sharded over the devices, weights replicated.
    entropy_groups=1 (the first version: the assignment taken over all 2^code_bits codes at once, logits
    f32[tokens, 262144]); 2: the factorized entropy of MAGVIT-v2 / Open-MAGVIT2 (the bits split into 2 groups
    of 9, each group's 512 sub-codes scored separately, logits f32[tokens, 2, 512])."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    tt, tp = 4, 8
    d_tube = tt * tp * tp * 3
    gbits = code_bits // entropy_groups
    codebook = (((jnp.arange(2 ** gbits)[:, None] >> jnp.arange(gbits)[None, :]) & 1) * 2 - 1).astype(f32)  # [2^g, g]

    def lfq_entropy_loss(z, tau=0.1):
        zg = z.reshape(z.shape[0], entropy_groups, gbits)
        logits = 2.0 * jnp.einsum("ngb,kb->ngk", zg, codebook) / tau                    # [N, G, 2^g]
        probs = jax.nn.softmax(logits, -1)
        per_token = -jnp.mean(jnp.sum(probs * jax.nn.log_softmax(logits, -1), -1))
        avg = jnp.mean(probs, 0)
        codebook_usage = -jnp.sum(avg * jnp.log(avg + 1e-8))
        return per_token - codebook_usage

    def tubelets(video):
        B, T, H, W, C = video.shape
        v = video.reshape(B, T // tt, tt, H // tp, tp, W // tp, tp, C).transpose(0, 1, 3, 5, 2, 4, 6, 7)
        return v.reshape(-1, d_tube)

    def magvit2_tokenizer_step(params, video):
        def loss_fn(params):
            x = tubelets(video).astype(bf)
            h = jax.nn.gelu(x @ params["encoder"]["fc1"])
            z = (jax.nn.gelu(h @ params["encoder"]["fc2"]) @ params["encoder"]["to_code"]).astype(f32)
            q = z + jax.lax.stop_gradient(jnp.sign(z) - z)                                 # straight-through
            h = jax.nn.gelu(q.astype(bf) @ params["decoder"]["from_code"])
            recon = (jax.nn.gelu(h @ params["decoder"]["fc1"]) @ params["decoder"]["fc2"]).astype(f32)
            rec = jnp.mean((recon - x.astype(f32)) ** 2)
            commit = jnp.mean((z - jax.lax.stop_gradient(jnp.sign(z))) ** 2)
            return rec + 0.25 * commit + 0.1 * lfq_entropy_loss(z)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), params, grads), loss

    r = lambda *s: sds(s, bf, mesh, P())
    params = {"encoder": {"fc1": r(d_tube, hidden), "fc2": r(hidden, hidden), "to_code": r(hidden, code_bits)},
              "decoder": {"from_code": r(code_bits, hidden), "fc1": r(hidden, hidden), "fc2": r(hidden, d_tube)}}
    video = sds((mesh.devices.size * clips, frames, size, size, 3), f32, mesh, P("d"))
    return magvit2_tokenizer_step, (params, video), {"donate_argnums": (0,)}


# 50.3 an int8 KV cache whose dequantization scales were kept per element in f32, not per token and head


def _int8_kv_scales_builder(mesh, layers, batch, kv_heads, q_heads, max_len, head_dim, d_model, scale_per_element):
    """One decode step of a serving stack (a GQA decoder, bf16 weights replicated, the batch of sequences
    sharded over the chips) with an int8 KV cache `k_cache`/`v_cache` int8[layers, B, kv_heads, max_len,
    head_dim] and its dequantization scales: lax.scan over the layers, each quantizing the new token's key and
    value (absmax), writing them at `cache_index`, and attending over the dequantized cache; caches and scales
    donated and returned.
    scale_per_element=True (the first version: `k_scale = jnp.zeros_like(k_cache, dtype=jnp.float32)`, written
    when the quantizer was still a per-element prototype, so each int8 entry carries a 4-byte f32 scale);
    False: one f32 scale per token and head, f32[layers, B, kv_heads, max_len], as the quantizer computes it."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32, i8 = jnp.bfloat16, jnp.float32, jnp.int8
    group = q_heads // kv_heads

    def quantize(x):                                                                    # [B, KV, D]
        s = jnp.max(jnp.abs(x.astype(f32)), -1, keepdims=True) / 127.0 + 1e-8
        q = jnp.round(x.astype(f32) / s).astype(i8)
        return q, (jnp.broadcast_to(s, x.shape) if scale_per_element else s[..., 0])

    def dequant(q, s):
        return q.astype(bf) * (s if scale_per_element else s[..., None]).astype(bf)

    def layer(x, lw, pos):
        wq, wk, wv, wo, w_up, w_down, kc, vc, ks, vs = lw
        B = x.shape[0]
        h = x * jax.lax.rsqrt(jnp.mean(x.astype(f32) ** 2, -1, keepdims=True) + 1e-6).astype(bf)
        q = (h @ wq).reshape(B, kv_heads, group, head_dim)
        kq, ksc = quantize((h @ wk).reshape(B, kv_heads, head_dim))
        vq, vsc = quantize((h @ wv).reshape(B, kv_heads, head_dim))
        kc = jax.lax.dynamic_update_slice_in_dim(kc, kq[:, :, None], pos, 2)
        vc = jax.lax.dynamic_update_slice_in_dim(vc, vq[:, :, None], pos, 2)
        ks = jax.lax.dynamic_update_slice_in_dim(ks, ksc[:, :, None], pos, 2)
        vs = jax.lax.dynamic_update_slice_in_dim(vs, vsc[:, :, None], pos, 2)
        s = jnp.einsum("bkgd,bksd->bkgs", q, dequant(kc, ks), preferred_element_type=f32) * head_dim ** -0.5
        s = jnp.where(jnp.arange(max_len) <= pos, s, -1e30)
        o = jnp.einsum("bkgs,bksd->bkgd", jax.nn.softmax(s, -1).astype(bf), dequant(vc, vs)).reshape(B, -1)
        x = x + o @ wo
        x = x + jax.nn.silu(x @ w_up) @ w_down
        return x, (kc, vc, ks, vs)

    def serve_decode_step(params, kv_state, tokens, cache_index):
        x = params["embed"][tokens]
        ws = tuple(params["layers"][n] for n in ("wq", "wk", "wv", "wo", "w_up", "w_down"))
        cache = tuple(kv_state[n] for n in ("k_cache", "v_cache", "k_scale", "v_scale"))
        x, (kc, vc, ks, vs) = jax.lax.scan(lambda x, lw: layer(x, lw, cache_index), x, ws + cache)
        logits = (x @ params["embed"].T).astype(f32)
        return jnp.argmax(logits, -1), {"k_cache": kc, "v_cache": vc, "k_scale": ks, "v_scale": vs}

    rep, L, D = P(), layers, d_model
    hq = q_heads * head_dim
    hk = kv_heads * head_dim
    params = {"embed": sds((32000, D), bf, mesh, rep),
              "layers": {"wq": sds((L, D, hq), bf, mesh, rep), "wk": sds((L, D, hk), bf, mesh, rep),
                         "wv": sds((L, D, hk), bf, mesh, rep), "wo": sds((L, hq, D), bf, mesh, rep),
                         "w_up": sds((L, D, 4 * D), bf, mesh, rep), "w_down": sds((L, 4 * D, D), bf, mesh, rep)}}
    cspec = P(None, "d")
    cache = lambda: sds((L, batch, kv_heads, max_len, head_dim), i8, mesh, cspec)
    sshape = (L, batch, kv_heads, max_len) + ((head_dim,) if scale_per_element else ())
    kv_state = {"k_cache": cache(), "v_cache": cache(), "k_scale": sds(sshape, f32, mesh, cspec),
                "v_scale": sds(sshape, f32, mesh, cspec)}
    tokens = sds((batch,), jnp.int32, mesh, P("d"))
    cache_index = sds((), jnp.int32, mesh, P())
    kw = {"donate_argnums": (1,), "out_shardings": (NamedSharding(mesh, P("d")), _shardings(kv_state))}
    return serve_decode_step, (params, kv_state, tokens, cache_index), kw


# 50.4 a cross-encoder reranker trained on every (query, passage) pair of the in-batch matrix


def _cross_encoder_inbatch_builder(mesh, queries, cands, q_len, p_len, depth, d_model, heads, all_pairs):
    """Training step of a BERT-style cross-encoder reranker (bf16, `depth` post-LN layers under lax.scan with
    jax.checkpoint, weights replicated, queries sharded over the chips): each (query, passage) pair is
    encoded as one [CLS] q [SEP] p sequence, the [CLS] state scored by a linear head, and a softmax
    cross-entropy over each query's scores puts the positive first. Every query comes with `cands` passages
    (its positive and mined hard negatives).
    all_pairs=True (the first version, ported from the bi-encoder's in-batch-negatives loss: every query is
    paired with every passage of the global batch, queries x (queries * cands) sequences, because "more
    negatives are free"; they are not for a cross-encoder, which encodes each pair); False: each query with
    its own `cands` passages, as the listwise reranker loss is defined."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    hd = d_model // heads
    S = q_len + p_len

    def layer_norm(x, g):
        x32 = x.astype(f32)
        m = jnp.mean(x32, -1, keepdims=True)
        return ((x32 - m) * jax.lax.rsqrt(jnp.var(x32, -1, keepdims=True) + 1e-12) * g).astype(bf)

    def bert_layer(x, lw):
        N = x.shape[0]
        q, k, v = [(x @ lw[n]).reshape(N, S, heads, hd) for n in ("query", "key", "value")]
        s = jnp.einsum("nqhd,nkhd->nhqk", q, k, preferred_element_type=f32) * hd ** -0.5
        o = jnp.einsum("nhqk,nkhd->nqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(N, S, d_model)
        x = layer_norm(x + o @ lw["attn_output"], lw["ln_attn"])
        x = layer_norm(x + jax.nn.gelu(x @ lw["intermediate"]) @ lw["output"], lw["ln_ffn"])
        return x, None

    def rerank_train_step(reranker, query_ids, passage_ids):
        Bq = query_ids.shape[0]
        if all_pairs:
            pas = passage_ids.reshape(-1, p_len)                                         # [Bq*C, p]
            qi = jnp.repeat(query_ids, pas.shape[0], 0)
            pi = jnp.tile(pas, (Bq, 1))
            labels = jnp.arange(Bq) * cands                                             # own positive
        else:
            qi = jnp.repeat(query_ids, cands, 0)
            pi = passage_ids.reshape(-1, p_len)
            labels = jnp.zeros((Bq,), jnp.int32)
        pair_ids = jnp.concatenate([qi, pi], 1)                                         # [pairs, S]

        def loss_fn(reranker):
            x = reranker["word_embeddings"][pair_ids] + reranker["position_embeddings"]
            x, _ = jax.lax.scan(jax.checkpoint(bert_layer), x, reranker["layers"])
            scores = (x[:, 0] @ reranker["score_head"]).astype(f32).reshape(Bq, -1)
            logp = jax.nn.log_softmax(scores, -1)
            return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1))

        loss, g = jax.value_and_grad(loss_fn)(reranker)
        return _tm(lambda p, g: (p - 1e-5 * g).astype(p.dtype), reranker, g), loss

    L, D = depth, d_model
    r = lambda *s: sds(s, bf, mesh, P())
    reranker = {"word_embeddings": r(30522, D), "position_embeddings": r(S, D), "score_head": r(D, 1),
                "layers": {"query": r(L, D, D), "key": r(L, D, D), "value": r(L, D, D), "attn_output": r(L, D, D),
                           "intermediate": r(L, D, 4 * D), "output": r(L, 4 * D, D),
                           "ln_attn": sds((L, D), f32, mesh, P()), "ln_ffn": sds((L, D), f32, mesh, P())}}
    n = mesh.devices.size * queries
    query_ids = sds((n, q_len), jnp.int32, mesh, P("d"))
    passage_ids = sds((n, cands, p_len), jnp.int32, mesh, P("d"))
    return rerank_train_step, (reranker, query_ids, passage_ids), {"donate_argnums": (0,)}


# 50.5 a HiFi-GAN vocoder trained on whole utterances instead of random segments (segment_size)


def _hifigan_full_utterance_builder(mesh, batch, mel_frames, segment_frames, hop_rates, channels):
    """Generator step of a HiFi-GAN (V1-style) neural vocoder, f32 as the reference trains it: conv_pre (80 mel
    bins -> channels[0], kernel 7), then per upsampling stage a transposed conv (stride = the rate, kernel
    2 x rate) and a residual block of dilated convs (kernel 3, dilations 1, 3, 5, leaky ReLU), conv_post ->
    tanh waveform; an L1 loss against the real waveform (the mel and adversarial terms are left out of this
    reproduction); batch sharded over the chips, weights replicated.
    segment_frames=None (the first version: the data loader's `segment_size` crop was dropped when the
    dataset moved to pre-computed mels, so each utterance's whole mel (`mel_frames` frames, 10 s) is
    vocoded, every stage's activations kept for the backward pass); an int: a random crop of
    `segment_frames` mel frames (segment_size = 8192 samples) and the matching audio, as the recipe does."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    hop = 1
    for r in hop_rates:
        hop *= r
    dn = ("NWC", "WIO", "NWC")

    def conv(x, w, dil=1):
        return jax.lax.conv_general_dilated(x, w, (1,), "SAME", rhs_dilation=(dil,), dimension_numbers=dn)

    def generator(g, mel):
        x = conv(mel, g["conv_pre"])
        for i, r in enumerate(hop_rates):
            x = jax.nn.leaky_relu(x, 0.1)
            x = jax.lax.conv_transpose(x, g[f"ups_{i}"], (r,), "SAME", dimension_numbers=dn)
            for j, d in enumerate((1, 3, 5)):
                x = x + conv(jax.nn.leaky_relu(conv(jax.nn.leaky_relu(x, 0.1), g[f"resblock_{i}"][f"convs1_{j}"], d),
                                               0.1), g[f"resblock_{i}"][f"convs2_{j}"])
        return jnp.tanh(conv(jax.nn.leaky_relu(x, 0.1), g["conv_post"]))[..., 0]

    def vocoder_generator_step(gen_params, mels, audio, rng):
        if segment_frames is None:
            mel, wav = mels, audio
        else:
            start = jax.random.randint(rng, (), 0, mel_frames - segment_frames)
            mel = jax.lax.dynamic_slice_in_dim(mels, start, segment_frames, 1)
            wav = jax.lax.dynamic_slice_in_dim(audio, start * hop, segment_frames * hop, 1)

        def loss_fn(g):
            return jnp.mean(jnp.abs(generator(g, mel) - wav))

        loss, grads = jax.value_and_grad(loss_fn)(gen_params)
        return _tm(lambda p, g: p - 2e-4 * g, gen_params, grads), loss

    rep = P()
    g = {"conv_pre": sds((7, 80, channels[0]), f32, mesh, rep), "conv_post": sds((7, channels[-1], 1), f32, mesh, rep)}
    for i, r in enumerate(hop_rates):
        cin, c = channels[i], channels[i + 1]
        g[f"ups_{i}"] = sds((2 * r, cin, c), f32, mesh, rep)
        g[f"resblock_{i}"] = {f"convs{k}_{j}": sds((3, c, c), f32, mesh, rep) for k in (1, 2) for j in range(3)}
    n = mesh.devices.size * batch
    mels = sds((n, mel_frames, 80), f32, mesh, P("d"))
    audio = sds((n, mel_frames * hop), f32, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, P())
    return vocoder_generator_step, (g, mels, audio, rng), {"donate_argnums": (0,)}


# 50.6 a temporal graph network (TGN) whose GRU memory update runs over every node, masked to the touched ones


def _tgn_memory_all_nodes_builder(mesh, nodes, mem_dim, edge_dim, events, all_nodes):
    """Training step of a TGN (Rossi et al.) link predictor on an interaction stream (users x items): a node
    memory f32[nodes, mem_dim] (one array on every chip, as PyG's TGNMemory keeps it; donated) is updated from
    a batch of `events` interactions (src, dst, edge features; sharded): the message MLP of [memory[src],
    memory[dst], edge features] feeds a GRU cell, the updated memories of src and dst are scored against each other and
    against a random negative destination (BCE). Gradients reach the message MLP, the GRU and the link head.
    all_nodes=True (the first version, "to keep every shape static under jit": the messages scattered into a
    [nodes, msg] buffer, the GRU cell applied to the whole memory and the result kept where a node was touched,
    jnp.where(touched, gru(memory), memory), so the GRU's gates for every node are computed and kept for the
    backward pass); False: the GRU applied to the 2 x events touched rows only, written back with
    memory.at[ids].set (shapes are just as static)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32

    def gru_cell(p, x, h):
        gx, gh = x @ p["w_ih"], h @ p["w_hh"]
        r = jax.nn.sigmoid(gx[:, :mem_dim] + gh[:, :mem_dim])
        z = jax.nn.sigmoid(gx[:, mem_dim:2 * mem_dim] + gh[:, mem_dim:2 * mem_dim])
        n = jnp.tanh(gx[:, 2 * mem_dim:] + r * gh[:, 2 * mem_dim:])
        return (1 - z) * n + z * h

    def tgn_train_step(tgn, node_memory, src, dst, neg_dst, edge_feats):
        def loss_fn(tgn):
            m_src, m_dst = node_memory[src], node_memory[dst]
            msg_in = jnp.concatenate([m_src, m_dst, edge_feats], -1)
            msg = jax.nn.relu(msg_in @ tgn["message_mlp"]["kernel"])                       # [E, mem]
            ids = jnp.concatenate([src, dst])
            msgs = jnp.concatenate([msg, msg])
            if all_nodes:
                buf = jnp.zeros((nodes, mem_dim), f32).at[ids].set(msgs)
                touched = jnp.zeros((nodes,), bool).at[ids].set(True)
                new_memory = jnp.where(touched[:, None], gru_cell(tgn["memory_updater"], buf, node_memory),
                                       node_memory)
            else:
                upd = gru_cell(tgn["memory_updater"], msgs, node_memory[ids])
                new_memory = node_memory.at[ids].set(upd)
            h_src, h_dst, h_neg = new_memory[src], new_memory[dst], new_memory[neg_dst]
            link = lambda a, b: jnp.concatenate([a, b], -1) @ tgn["link_predictor"]["kernel"]
            pos, neg = link(h_src, h_dst), link(h_src, h_neg)
            loss = jnp.mean(jax.nn.softplus(-pos)) + jnp.mean(jax.nn.softplus(neg))
            return loss, jax.lax.stop_gradient(new_memory)

        (loss, new_memory), g = jax.value_and_grad(loss_fn, has_aux=True)(tgn)
        return _tm(lambda p, g: p - 1e-4 * g, tgn, g), new_memory, loss

    rep = P()
    tgn = {"message_mlp": {"kernel": sds((2 * mem_dim + edge_dim, mem_dim), f32, mesh, rep)},
           "memory_updater": {"w_ih": sds((mem_dim, 3 * mem_dim), f32, mesh, rep),
                              "w_hh": sds((mem_dim, 3 * mem_dim), f32, mesh, rep)},
           "link_predictor": {"kernel": sds((2 * mem_dim, 1), f32, mesh, rep)}}
    node_memory = sds((nodes, mem_dim), f32, mesh, P())
    ev = lambda: sds((events,), jnp.int32, mesh, P("d"))
    edge_feats = sds((events, edge_dim), f32, mesh, P("d"))
    kw = {"donate_argnums": (0, 1), "out_shardings": (_shardings(tgn), NamedSharding(mesh, P()),
                                                       NamedSharding(mesh, P()))}
    return tgn_train_step, (tgn, node_memory, ev(), ev(), ev(), edge_feats), kw


pair(
    "afno_fields_sharded_over_longitude", "v5e", "v5e:2x2",
    "FourCastNet-style AFNO training on v5e (8 blocks, embed 768, a 180x360 token grid, 20 ERA5 variables, a "
    "global batch of 8 initial conditions) whose fields are split over longitude for \"spatial parallelism\": "
    "longitude is an axis of the rfft2/irfft2 in every block, so the partitioner gathers the whole field "
    "around each FFT, beyond 15.75G.",
    "Fixed variant of afno_fields_sharded_over_longitude_v5e: the fields split over the batch of initial "
    "conditions (P('d')), the FFTs local; fits.",
    dict(category="aggregate", causes=["replicated_tensor", "batch_too_large"]),
    _afno_lon_sharded_builder, dict(batch=8, lat=180, lon=360, n_vars=20, embed=768, n_blocks=8, depth=8,
                                    field_spec=(None, None, "d", None)),
    dict(batch=8, lat=180, lon=360, n_vars=20, embed=768, n_blocks=8, depth=8, field_spec=("d",)),
    dump=False,
)

pair(
    "magvit2_lfq_entropy_full_codebook", "v4", "v4:2x2x1",
    "A MAGVIT-v2-style video tokenizer trained on v4 (8 TensorCores, 16 clips of 16x128x128 per core, 1024 "
    "tokens a clip) whose lookup-free quantizer (18 bits) takes its entropy penalty over all 2^18 codes at "
    "once: the code logits f32[16384,1,262144] per core (16 GiB), beyond 15.25G.",
    "Fixed variant of magvit2_lfq_entropy_full_codebook_v4: the factorized entropy of MAGVIT-v2 (two groups "
    "of 9 bits, 512 sub-codes each, logits f32[16384,2,512]); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision"]),
    _magvit_lfq_entropy_builder, dict(clips=16, frames=16, size=128, code_bits=18, hidden=1024, entropy_groups=1),
    dict(clips=16, frames=16, size=128, code_bits=18, hidden=1024, entropy_groups=2),
    dump=False,
)

pair(
    "int8_kv_cache_scales_per_element", "v6e", "v6e:2x2",
    "A decode step of a 32-layer GQA decoder served on v6e (64 sequences of up to 8192 tokens, 16 per chip) "
    "with an int8 KV cache whose dequantization scales were created with jnp.zeros_like(k_cache, "
    "dtype=jnp.float32): an f32 scale per int8 element, f32[32,64,8,8192,128] for keys and for values (4x the "
    "cache itself), beyond 31.25G.",
    "Fixed variant of int8_kv_cache_scales_per_element_v6e: one f32 scale per token and head, "
    "f32[32,64,8,8192]; fits.",
    dict(category="arguments", category_also=["single_large_allocation"], causes=["f32_precision", "arguments_exceed"]),
    _int8_kv_scales_builder, dict(layers=32, batch=64, kv_heads=8, q_heads=16, max_len=8192, head_dim=128,
                                  d_model=2048, scale_per_element=True),
    dict(layers=32, batch=64, kv_heads=8, q_heads=16, max_len=8192, head_dim=128, d_model=2048,
         scale_per_element=False),
    dump=True,
)

pair(
    "cross_encoder_inbatch_all_pairs", "v5p", "v5p:2x2x1",
    "A BERT-base cross-encoder reranker trained on v5p (16 queries per chip, 8 candidate passages each, 320-token "
    "pairs) with the bi-encoder's in-batch-negatives loss ported as is: every query paired with every passage of "
    "the global batch, 64 x 512 = 32768 pair sequences instead of 512, beyond 95.74G.",
    "Fixed variant of cross_encoder_inbatch_all_pairs_v5p: each query scored against its own 8 candidates (the "
    "listwise reranker loss); fits.",
    dict(category="aggregate", causes=["batch_too_large", "large_activation"]),
    _cross_encoder_inbatch_builder, dict(queries=16, cands=8, q_len=64, p_len=256, depth=12, d_model=768, heads=12,
                                         all_pairs=True),
    dict(queries=16, cands=8, q_len=64, p_len=256, depth=12, d_model=768, heads=12, all_pairs=False),
    dump=False,
)

pair(
    "hifigan_whole_utterance_no_segment", "v5e", "v5e:2x2",
    "HiFi-GAN (V1-style, f32) generator training on v5e, 16 audiobook utterances per chip, whose segment_size "
    "crop was dropped when the data moved to pre-computed mels: each 20 s utterance (1728 mel frames, 442368 "
    "samples) vocoded whole, every upsampling stage's activations (up to f32[16,442368,32]) kept for the "
    "backward pass, beyond 15.75G.",
    "Fixed variant of hifigan_whole_utterance_no_segment_v5e: a random crop of 32 mel frames (segment_size "
    "8192 samples) and the matching audio, as the recipe does; fits.",
    dict(category="aggregate", causes=["batch_too_large", "padding", "large_activation"]),
    _hifigan_full_utterance_builder, dict(batch=16, mel_frames=1728, segment_frames=None, hop_rates=(8, 8, 2, 2),
                                          channels=(512, 256, 128, 64, 32)),
    dict(batch=16, mel_frames=1728, segment_frames=32, hop_rates=(8, 8, 2, 2), channels=(512, 256, 128, 64, 32)),
    dump=False,
)

pair(
    "tgn_memory_gru_over_every_node", "v6e", "v6e:2x2",
    "A TGN link predictor trained on v6e over a 4M-node interaction graph (memory f32[4194304,256] on every "
    "chip) whose GRU memory update runs on every node and keeps the result where a node was touched "
    "(jnp.where(touched, gru(memory), memory), \"to keep shapes static\"): the GRU gates f32[4194304,768] "
    "kept for the backward pass, for 32768 events a step, beyond 31.25G.",
    "Fixed variant of tgn_memory_gru_over_every_node_v6e: the GRU applied to the 65536 touched rows only, "
    "written back with memory.at[ids].set; fits.",
    dict(category="aggregate", causes=["large_activation"]),
    _tgn_memory_all_nodes_builder, dict(nodes=4194304, mem_dim=256, edge_dim=172, events=32768, all_nodes=True),
    dict(nodes=4194304, mem_dim=256, edge_dim=172, events=32768, all_nodes=False),
    dump=False,
)


# ---- 51. more broken/fixed pairs (batch tpu40): other models, other names ---------------------
#
# Programs of kinds sections 13-50 do not have, from speech, recommendation, video, genomics and RL (a
# domain-adversarial ASR encoder whose gradient-reversal custom_vjp constrains the reversed cotangent with the
# domain head's replicated spec; a two-tower recommender whose in_shardings are a spec list written in the
# model's declaration order and unflattened onto the params tree, whose dict keys jax sorts, so the user table
# gets a dense layer's P(); a video classifier whose mixup partner is x[jax.random.permutation(B)] over the
# data-sharded global batch instead of timm's x.flip(0); an IMPALA learner whose time-major trajectories are
# placed with the batch-major P('d'), which splits time; a metagenomic read classifier whose bag of k-mers is a
# dense multi-hot count matrix over all 4^12 k-mers multiplied by the embedding table instead of a gather; a
# causal 3-D video VAE decoder that decodes all frames of a long video in one pass instead of temporal tiles).
# The same conventions: the fixed twin changes exactly the first cause. See the README section of batch tpu40.


# 51.1 domain-adversarial ASR: the gradient-reversal custom_vjp constrains the reversed cotangent to P()


def _dann_grad_reversal_builder(mesh, batch, frames, d_model, layers, n_domains, cot_spec):
    """Training step of a domain-adversarial (DANN) speech encoder: log-mel frames f32[B, T, 80] (sharded over
    the batch) -> input projection -> `layers` residual feed-forward blocks (bf16, lax.scan with
    jax.checkpoint) -> frame-level token classifier (cross-entropy on frame labels); the encoder output also
    goes, in f32, through a gradient-reversal layer (jax.custom_vjp: identity forward, -lambda * g backward) into
    a frame-level domain classifier (recording channel / accent), whose loss is added. Weights replicated, SGD.
    cot_spec=() (the first version: the backward rule ends with
    `jax.lax.with_sharding_constraint(g, NamedSharding(mesh, P()))`, the spec copied from the domain head's
    replicated weights, so the reversed cotangent f32[B, T, d_model] of the whole global batch is built on every
    chip); ('d',): the cotangent constrained like the activation it belongs to, P('d')."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    cot_sharding = NamedSharding(mesh, P(*cot_spec))

    @jax.custom_vjp
    def grad_reverse(x, lambda_):
        return x

    def grad_reverse_fwd(x, lambda_):
        return x, lambda_

    def grad_reverse_bwd(lambda_, g):
        g = jax.lax.with_sharding_constraint(-lambda_ * g, cot_sharding)
        return g, jnp.zeros_like(lambda_)

    grad_reverse.defvjp(grad_reverse_fwd, grad_reverse_bwd)

    def ffn_block(h, blk):
        y = jax.nn.gelu(h @ blk["ffn_in"])
        return h + y @ blk["ffn_out"], None

    def dann_asr_train_step(params, log_mel, frame_labels, domain_labels, grl_lambda):
        def loss_fn(params):
            h = (log_mel @ params["input_proj"]).astype(bf)
            h, _ = jax.lax.scan(jax.checkpoint(ffn_block), h, params["encoder"])
            tok = (h @ params["token_head"]).astype(f32)
            asr = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(tok, -1), frame_labels[..., None], -1))
            r = grad_reverse(h.astype(f32), grl_lambda)
            dom = jax.nn.relu(r @ params["domain_head"]["dense_0"]) @ params["domain_head"]["dense_1"]
            adv = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(dom, -1), domain_labels[..., None], -1))
            return asr + adv

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), params, grads), loss

    rep, D = P(), d_model
    params = {"input_proj": sds((80, D), f32, mesh, rep),
              "encoder": {"ffn_in": sds((layers, D, D), bf, mesh, rep), "ffn_out": sds((layers, D, D), bf, mesh, rep)},
              "token_head": sds((D, 512), bf, mesh, rep),
              "domain_head": {"dense_0": sds((D, 1024), f32, mesh, rep), "dense_1": sds((1024, n_domains), f32, mesh, rep)}}
    n = mesh.devices.size * batch
    log_mel = sds((n, frames, 80), f32, mesh, P("d"))
    frame_labels = sds((n, frames), jnp.int32, mesh, P("d"))
    domain_labels = sds((n, frames), jnp.int32, mesh, P("d"))
    grl_lambda = sds((), f32, mesh, rep)
    return dann_asr_train_step, (params, log_mel, frame_labels, domain_labels, grl_lambda), {"donate_argnums": (0,)}


# 51.2 a two-tower recommender whose spec list, written in declaration order, is unflattened onto sorted dict keys


def _two_tower_spec_list_builder(mesh, users, items, dim, batch, by_name):
    """Training step of a two-tower (YouTube-style) candidate generator: user id -> user_embedding row ->
    user_tower (3 dense layers), item id -> item_embedding row -> item_tower (1 dense layer), in-batch
    sampled-softmax over the global batch; Adagrad (the accumulators shaped like the params), params and
    accumulators donated, in_shardings = out_shardings.
    by_name=False (the first version: `PARAM_SPECS = [P('d', None), P(), P(), P(), P('d', None), P()]` listed in
    the order the model declares its params (user_embedding, user_tower/dense_0..2, item_embedding,
    item_tower/dense_0) and turned into shardings with
    `jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), ...)`; tree_structure sorts dict keys
    (item_embedding, item_tower, user_embedding, user_tower), so item_embedding still gets P('d', None) but
    user_embedding gets P() (replicated, and its Adagrad accumulator too) while user_tower/dense_1 gets
    P('d', None)); True: the specs derived from each param's path (`'embedding' in name -> P('d', None)`)."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    decl = [("user_embedding", (users, dim)), ("user_tower/dense_0", (dim, 1024)),
            ("user_tower/dense_1", (1024, 1024)), ("user_tower/dense_2", (1024, dim)),
            ("item_embedding", (items, dim)), ("item_tower/dense_0", (dim, dim))]
    PARAM_SPECS = [P("d", None), P(), P(), P(), P("d", None), P()]

    def nest(flat):
        out = {}
        for k, v in flat.items():
            parts = k.split("/")
            d = out
            for p_ in parts[:-1]:
                d = d.setdefault(p_, {})
            d[parts[-1]] = v
        return out

    shapes = nest({k: s for k, s in decl})
    treedef = jax.tree_util.tree_structure(shapes, is_leaf=lambda x: isinstance(x, tuple))
    if by_name:
        specs = nest({k: (P("d", None) if "embedding" in k else P()) for k, _ in decl})
    else:
        specs = jax.tree_util.tree_unflatten(treedef, PARAM_SPECS)       # specs in declaration order, keys sorted
    params = jax.tree_util.tree_map(lambda s, sp: sds(s, f32, mesh, sp), shapes, specs,
                                    is_leaf=lambda x: isinstance(x, tuple))
    adagrad_acc = jax.tree_util.tree_map(lambda a: sds(a.shape, f32, mesh, a.sharding.spec), params)

    def tower(x, layers):
        for i in range(len(layers)):
            x = x @ layers[f"dense_{i}"]
            if i < len(layers) - 1:
                x = jax.nn.relu(x)
        return x

    def two_tower_train_step(params, adagrad_acc, user_ids, item_ids):
        def loss_fn(params):
            u = tower(params["user_embedding"][user_ids], params["user_tower"])
            v = tower(params["item_embedding"][item_ids], params["item_tower"])
            logits = u @ v.T                                                    # [B, B] in-batch softmax
            return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, -1)))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        acc = _tm(lambda a, g: a + g * g, adagrad_acc, grads)
        new = _tm(lambda p, g, a: p - 0.05 * g * jax.lax.rsqrt(a + 1e-10), params, grads, acc)
        return new, acc, loss

    user_ids = sds((batch,), jnp.int32, mesh, P("d"))
    item_ids = sds((batch,), jnp.int32, mesh, P("d"))
    kw = {"donate_argnums": (0, 1), "out_shardings": (_shardings(params), _shardings(adagrad_acc),
                                                       NamedSharding(mesh, P()))}
    return two_tower_train_step, (params, adagrad_acc, user_ids, item_ids), kw


# 51.3 a video classifier whose mixup partner is x[jax.random.permutation(B)] over the data-sharded global batch


def _video_mixup_perm_builder(mesh, clips, frames, size, d_model, layers, partner):
    """Training step of a ViViT-style video classifier (tubelet embedding 4x32x32 -> `layers` pre-LN
    transformer blocks, bf16, lax.scan with jax.checkpoint -> mean pool -> 400 Kinetics classes) on normalized
    f32 clips [B, frames, size, size, 3] sharded over the batch, with mixup (lam ~ Beta(0.8, 0.8)) of clips and
    one-hot labels. Weights replicated, SGD.
    partner='permutation' (the first version, mixup as in the original paper:
    `perm = jax.random.permutation(rng, B); x_mix = lam * x + (1 - lam) * x[perm]`, a gather with global
    indices along the sharded batch axis, so the partitioner all-gathers the whole global batch of clips onto
    every chip); 'flip': the partner is `x[::-1]` (timm's Mixup uses x.flip(0)), a reversal the partitioner
    does with a collective permute of each chip's own clips."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    tt, tp = 4, 32
    d_tube = tt * tp * tp * 3
    heads = d_model // 64

    def ln(x, g):
        m = jnp.mean(x, -1, keepdims=True)
        v = jnp.mean((x - m) ** 2, -1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-6) * g

    def block(x, blk):
        B, N, D = x.shape
        h = ln(x, blk["ln1"]).astype(bf)
        q, k, v = jnp.split(h @ blk["qkv"], 3, -1)
        q, k, v = (t.reshape(B, N, heads, 64) for t in (q, k, v))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=f32) / 8.0
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(bf), v).reshape(B, N, D)
        x = x + (o @ blk["proj"]).astype(f32)
        h = ln(x, blk["ln2"]).astype(bf)
        return x + (jax.nn.gelu(h @ blk["mlp_fc1"]) @ blk["mlp_fc2"]).astype(f32), None

    def vivit_mixup_train_step(params, clips_, labels, rng):
        B, T, H, W, C = clips_.shape
        k1, k2 = jax.random.split(rng)
        lam = jax.random.beta(k1, 0.8, 0.8)
        y = jax.nn.one_hot(labels, 400)
        if partner == "permutation":
            perm = jax.random.permutation(k2, B)
            x_mix, y_mix = lam * clips_ + (1 - lam) * clips_[perm], lam * y + (1 - lam) * y[perm]
        else:
            x_mix, y_mix = lam * clips_ + (1 - lam) * clips_[::-1], lam * y + (1 - lam) * y[::-1]

        def loss_fn(params):
            t = x_mix.reshape(B, T // tt, tt, H // tp, tp, W // tp, tp, C).transpose(0, 1, 3, 5, 2, 4, 6, 7)
            x = t.reshape(B, -1, d_tube).astype(bf) @ params["tubelet_embed"]
            x = x.astype(f32) + params["pos_embed"]
            x, _ = jax.lax.scan(jax.checkpoint(block), x, params["blocks"])
            logits = jnp.mean(x, 1) @ params["head"]
            return -jnp.mean(jnp.sum(y_mix * jax.nn.log_softmax(logits, -1), -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: (p - 1e-4 * g).astype(p.dtype), params, grads), loss

    rep, L, D = P(), layers, d_model
    n_tok = (frames // tt) * (size // tp) ** 2
    params = {"tubelet_embed": sds((d_tube, D), bf, mesh, rep), "pos_embed": sds((n_tok, D), f32, mesh, rep),
              "head": sds((D, 400), f32, mesh, rep),
              "blocks": {"ln1": sds((L, D), f32, mesh, rep), "ln2": sds((L, D), f32, mesh, rep),
                         "qkv": sds((L, D, 3 * D), bf, mesh, rep), "proj": sds((L, D, D), bf, mesh, rep),
                         "mlp_fc1": sds((L, D, 4 * D), bf, mesh, rep), "mlp_fc2": sds((L, 4 * D, D), bf, mesh, rep)}}
    n = mesh.devices.size * clips
    clips_in = sds((n, frames, size, size, 3), f32, mesh, P("d"))
    labels = sds((n,), jnp.int32, mesh, P("d"))
    rng = sds((2,), jnp.uint32, mesh, rep)
    return vivit_mixup_train_step, (params, clips_in, labels, rng), {"donate_argnums": (0,)}


# 51.4 a metagenomic read classifier whose bag of k-mers is a dense multi-hot count matrix times the table


def _kmer_multihot_builder(mesh, reads, read_len, k, dim, taxa, dense_counts):
    """Training step of a DeepMicrobes/fastText-style metagenomic read classifier: each read of `read_len`
    bases is split into its read_len - k + 1 overlapping k-mers (ids in [0, 4^k)), the k-mer embeddings
    (f32[4^k, dim], replicated, donated) are averaged into the read's vector, an MLP predicts the taxon
    (softmax over `taxa`); reads sharded over the chips, SGD.
    dense_counts=True (the first version, the bag of k-mers written as in the scikit-learn prototype: a count
    matrix `jnp.zeros((B, 4**k)).at[rows, kmer_ids].add(1.0)` (f32[B, 16777216] for k = 12), divided by the
    number of k-mers and multiplied by the table); False: the embedding bag as a gather,
    `kmer_embedding[kmer_ids].mean(1)`."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    vocab = 4 ** k
    n_kmers = read_len - k + 1

    def read_classifier_step(params, kmer_ids, taxon):
        B = kmer_ids.shape[0]

        def loss_fn(params):
            if dense_counts:
                counts = jnp.zeros((B, vocab), f32).at[jnp.arange(B)[:, None], kmer_ids].add(1.0)
                x = (counts / n_kmers) @ params["kmer_embedding"]
            else:
                x = jnp.mean(params["kmer_embedding"][kmer_ids], 1)
            h = jax.nn.relu(x @ params["mlp"]["dense_0"])
            logits = h @ params["mlp"]["dense_1"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), taxon[:, None], -1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 1e-3 * g, params, grads), loss

    rep = P()
    params = {"kmer_embedding": sds((vocab, dim), f32, mesh, rep),
              "mlp": {"dense_0": sds((dim, 1024), f32, mesh, rep), "dense_1": sds((1024, taxa), f32, mesh, rep)}}
    n = mesh.devices.size * reads
    kmer_ids = sds((n, n_kmers), jnp.int32, mesh, P("d"))
    taxon = sds((n,), jnp.int32, mesh, P("d"))
    return read_classifier_step, (params, kmer_ids, taxon), {"donate_argnums": (0,)}



# 51.5 a causal 3-D video VAE decoder that decodes every latent frame of a long video in one pass


def _video_vae_decode_builder(mesh, videos, lat_frames, lat_h, lat_w, chunk):
    """Decode step of a causal 3-D-conv video VAE (CogVideoX / LTX-style decoder, bf16): the latents
    [B, lat_frames, lat_h, lat_w, 16] (one video per chip, sharded over the batch) go through conv_in (16 ->
    512), a residual block, three up stages (nearest x2 in space each, x2 in time in the first two; 3x3x3
    convs with causal padding in time, group-norm-free for brevity, SiLU; channels 512 -> 512 -> 256 -> 128, a
    residual block each) and conv_out to RGB, returned channels-first per frame [B, T, 3, H, W] in f32.
    chunk=None (the first version: the whole video decoded in one pass, every full-resolution activation
    bf16[B, 4 * lat_frames, 8 * lat_h, 8 * lat_w, 128] of every frame at once); an int: temporal tiling as
    diffusers' `enable_tiling()` / CogVideoX do it, lax.map over chunks of `chunk` latent frames, each decoded
    with the previous latent frame as causal context and the context's output frames dropped."""
    jax, jnp, NamedSharding, P = _jax()
    bf, f32 = jnp.bfloat16, jnp.float32
    dn = ("NDHWC", "DHWIO", "NDHWC")

    def conv3d(x, w):
        x = jnp.pad(x, ((0, 0), (2, 0), (1, 1), (1, 1), (0, 0)))                         # causal in time
        return jax.lax.conv_general_dilated(x, w, (1, 1, 1), "VALID", dimension_numbers=dn)

    def resblock(x, rb):
        h = conv3d(jax.nn.silu(x), rb["conv1"])
        return x + conv3d(jax.nn.silu(h), rb["conv2"])

    def upsample(x, t2):
        x = jnp.repeat(jnp.repeat(x, 2, 2), 2, 3)
        return jnp.repeat(x, 2, 1) if t2 else x

    def decode(dec, z):
        x = conv3d(z.astype(bf), dec["conv_in"])
        x = resblock(x, dec["mid"])
        for i, t2 in enumerate((True, True, False)):
            x = conv3d(upsample(x, t2), dec[f"up_{i}"]["conv"])
            x = resblock(x, dec[f"up_{i}"]["resblock"])
        rgb = conv3d(jax.nn.silu(x), dec["conv_out"]).astype(f32)
        return jnp.moveaxis(rgb, -1, 2)                                                  # [B, T, 3, H, W]

    def vae_decode_video(decoder, latents):
        if chunk is None:
            return decode(decoder, latents)
        B, T, h, w, c = latents.shape
        n = T // chunk
        ctx = jnp.concatenate([latents[:, :1], latents], 1)                            # first chunk: itself as context
        idx = jnp.arange(n) * chunk
        pieces = jax.lax.map(lambda s: decode(decoder, jax.lax.dynamic_slice_in_dim(ctx, s, chunk + 1, 1))[:, 4:],
                             idx)                                                        # [n, B, 4*chunk, 3, H, W]
        return jnp.moveaxis(pieces, 0, 1).reshape(B, n * 4 * chunk, *pieces.shape[3:])

    rep = P()
    w = lambda ci, co: sds((3, 3, 3, ci, co), bf, mesh, rep)
    rb = lambda c: {"conv1": w(c, c), "conv2": w(c, c)}
    decoder = {"conv_in": w(16, 512), "mid": rb(512),
               "up_0": {"conv": w(512, 512), "resblock": rb(512)}, "up_1": {"conv": w(512, 256), "resblock": rb(256)},
               "up_2": {"conv": w(256, 128), "resblock": rb(128)}, "conv_out": w(128, 3)}
    latents = sds((mesh.devices.size * videos, lat_frames, lat_h, lat_w, 16), f32, mesh, P("d"))
    return vae_decode_video, (decoder, latents), {}


# 51.6 an IMPALA learner whose time-major trajectories [T, B, ...] are sharded P('d'): over time, not the batch


def _impala_time_major_builder(mesh, unroll, batch, obs_dim, hidden, actions, traj_spec):
    """Learner step of an IMPALA-style actor-critic with an LSTM core (V-trace targets, policy-gradient +
    baseline + entropy losses), on time-major trajectories as the actors send them: obs f32[T, B, obs_dim],
    actions/rewards/discounts [T, B], the actors' behaviour logits f32[T, B, A] (the last step only bootstraps
    the value); MLP torso applied to every
    step, the LSTM (lax.scan over time) unrolled from a zero state, the V-trace recursion a reverse lax.scan;
    weights replicated, SGD, the global batch of trajectories `batch`.
    traj_spec=('d',) (the first version: the trajectories placed with NamedSharding(mesh, P('d')), the spec the
    batch-major supervised code uses, which on time-major arrays splits the time axis: the LSTM scan over time
    needs every step, so each chip gathers all T steps of the whole global batch and runs the core, the heads
    and the backward pass on it); (None, 'd'): the batch axis (axis 1) split, each chip runs its own
    trajectories."""
    jax, jnp, NamedSharding, P = _jax()
    f32 = jnp.float32
    tspec = P(*traj_spec)

    def lstm_step(p, carry, x):
        h, c = carry
        g = x @ p["w_ih"] + h @ p["w_hh"] + p["bias"]
        i, f, o, u = jnp.split(g, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    def vtrace(v_tm1, v_t, rewards, discounts, rhos, lam=1.0):
        c = jnp.minimum(1.0, rhos) * lam
        clipped_rho = jnp.minimum(1.0, rhos)
        deltas = clipped_rho * (rewards + discounts * v_t - v_tm1)

        def body(acc, xs):
            d, disc, c_ = xs
            acc = d + disc * c_ * acc
            return acc, acc

        _, vs_minus_v = jax.lax.scan(body, jnp.zeros_like(v_t[0]), (deltas, discounts, c), reverse=True)
        vs = vs_minus_v + v_tm1
        vs_t1 = jnp.concatenate([vs[1:], v_t[-1:]], 0)
        pg_adv = clipped_rho * (rewards + discounts * vs_t1 - v_tm1)
        return jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_adv)

    def impala_learner_step(params, traj):
        def loss_fn(params):
            x = jax.nn.relu(traj["obs"] @ params["torso"]["dense_0"])
            x = jax.nn.relu(x @ params["torso"]["dense_1"])                            # [T, B, H]
            B = x.shape[1]
            zero = (jnp.zeros((B, hidden), f32), jnp.zeros((B, hidden), f32))
            _, h = jax.lax.scan(lambda cr, xt: lstm_step(params["lstm"], cr, xt), zero, x)
            logits = h[:-1] @ params["policy_head"]
            values = (h @ params["value_head"])[..., 0]
            logp = jax.nn.log_softmax(logits, -1)
            blogp = jax.nn.log_softmax(traj["behaviour_logits"][:-1], -1)
            take = lambda lp: jnp.take_along_axis(lp, traj["actions"][:-1, :, None], -1)[..., 0]
            rhos = jnp.exp(take(logp) - take(blogp))
            vs, adv = vtrace(values[:-1], values[1:], traj["rewards"][:-1], traj["discounts"][:-1],
                             jax.lax.stop_gradient(rhos))
            pg = -jnp.mean(take(logp) * adv)
            baseline = 0.5 * jnp.mean((vs - values[:-1]) ** 2)
            entropy = jnp.mean(jnp.sum(jnp.exp(logp) * logp, -1))
            return pg + 0.5 * baseline + 0.01 * entropy

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return _tm(lambda p, g: p - 6e-4 * g, params, grads), loss

    rep, H = P(), hidden
    params = {"torso": {"dense_0": sds((obs_dim, H), f32, mesh, rep), "dense_1": sds((H, H), f32, mesh, rep)},
              "lstm": {"w_ih": sds((H, 4 * H), f32, mesh, rep), "w_hh": sds((H, 4 * H), f32, mesh, rep),
                       "bias": sds((4 * H,), f32, mesh, rep)},
              "policy_head": sds((H, actions), f32, mesh, rep), "value_head": sds((H, 1), f32, mesh, rep)}
    T, B = unroll, batch
    traj = {"obs": sds((T, B, obs_dim), f32, mesh, tspec),
            "actions": sds((T, B), jnp.int32, mesh, tspec), "rewards": sds((T, B), f32, mesh, tspec),
            "discounts": sds((T, B), f32, mesh, tspec), "behaviour_logits": sds((T, B, actions), f32, mesh, tspec)}
    return impala_learner_step, (params, traj), {"donate_argnums": (0,)}


pair(
    "dann_grad_reversal_cotangent_replicated", "v5e", "v5e:2x2",
    "A domain-adversarial (DANN) speech encoder trained on v5e (96 utterances of 4096 frames per chip, d_model "
    "2048) whose gradient-reversal custom_vjp ends its backward rule with "
    "jax.lax.with_sharding_constraint(-lambda_ * g, NamedSharding(mesh, P())), the spec copied from the domain "
    "head's replicated weights: the reversed cotangent f32[384,4096,2048] of the whole global batch is built on "
    "every chip, beyond 15.75G.",
    "Fixed variant of dann_grad_reversal_cotangent_replicated_v5e: the cotangent constrained like the activation "
    "it belongs to, P('d'); fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "f32_precision"]),
    _dann_grad_reversal_builder, dict(batch=96, frames=4096, d_model=2048, layers=2, n_domains=8, cot_spec=()),
    dict(batch=96, frames=4096, d_model=2048, layers=2, n_domains=8, cot_spec=("d",)),
    dump=False,
)

pair(
    "two_tower_spec_list_declaration_order", "v6e", "v6e:2x2",
    "A two-tower candidate generator trained with Adagrad on v6e (24M users, 4M items, dim 128) whose "
    "in_shardings are a spec list written in the model's declaration order and put on the params with "
    "tree_unflatten(tree_structure(params), PARAM_SPECS): jax sorts the dict keys, so user_embedding "
    "f32[25165824,128] and its Adagrad accumulator get a dense layer's P() (12 GiB each on every chip), beyond "
    "31.25G.",
    "Fixed variant of two_tower_spec_list_declaration_order_v6e: the specs derived from each param's path "
    "('embedding' in the name -> P('d', None)); fits.",
    dict(category="aggregate", causes=["replicated_tensor", "optimizer_state_unsharded"]),
    _two_tower_spec_list_builder, dict(users=25165824, items=4194304, dim=128, batch=16384, by_name=False),
    dict(users=25165824, items=4194304, dim=128, batch=16384, by_name=True),
    dump=True,
)

pair(
    "video_mixup_permutation_gathers_batch", "v4", "v4:2x2x1",
    "A ViViT-style video classifier trained on v4 (8 TensorCores, 64 normalized f32 clips of 32x256x256 per "
    "core) with mixup whose partner is clips[jax.random.permutation(rng, B)]: a gather with global indices "
    "along the data-sharded batch axis, so the whole global batch of clips f32[512,32,256,256,3] (12 GiB) is "
    "all-gathered onto every core, beyond 15.25G.",
    "Fixed variant of video_mixup_permutation_gathers_batch_v4: the mixup partner is clips[::-1] (timm's "
    "x.flip(0)), each core's clips exchanged by a collective permute; fits.",
    dict(category="single_large_allocation", causes=["replicated_tensor", "f32_precision"]),
    _video_mixup_perm_builder, dict(clips=64, frames=32, size=256, d_model=512, layers=4, partner="permutation"),
    dict(clips=64, frames=32, size=256, d_model=512, layers=4, partner="flip"),
    dump=False,
)

pair(
    "kmer_bag_dense_multihot_matmul", "v5p", "v5p:2x2x1",
    "A metagenomic read classifier (150-bp reads, k = 12, 139 k-mers a read, 2048 reads per chip) trained on "
    "v5p whose bag of k-mers is a dense count matrix jnp.zeros((B, 4**12)).at[rows, kmer_ids].add(1.0) "
    "(f32[2048,16777216] per chip, 128 GiB) multiplied by the k-mer embedding table, beyond 95.74G.",
    "Fixed variant of kmer_bag_dense_multihot_matmul_v5p: the embedding bag as a gather, "
    "kmer_embedding[kmer_ids].mean(1); fits.",
    dict(category="single_large_allocation", causes=["large_activation", "f32_precision"]),
    _kmer_multihot_builder, dict(reads=2048, read_len=150, k=12, dim=128, taxa=4096, dense_counts=True),
    dict(reads=2048, read_len=150, k=12, dim=128, taxa=4096, dense_counts=False),
    dump=True,
)


pair(
    "video_vae_decode_all_frames", "v5e", "v5e:2x2",
    "A causal 3-D-conv video VAE decoder (CogVideoX-style, bf16) run on v5e, one 120-frame 320x512 video per chip "
    "(latents [4,30,40,64,16]), that decodes every latent frame in one pass: the full-resolution activations "
    "bf16[1,120,320,512,128] (5 GiB each) of the last stage's convs and residual block live together, beyond "
    "15.75G.",
    "Fixed variant of video_vae_decode_all_frames_v5e: temporal tiling (lax.map over chunks of 5 latent frames, "
    "each with the previous latent frame as causal context, the context's output frames dropped); fits.",
    dict(category="single_large_allocation", category_also=["aggregate"], causes=["large_activation", "batch_too_large"]),
    _video_vae_decode_builder, dict(videos=1, lat_frames=30, lat_h=40, lat_w=64, chunk=None),
    dict(videos=1, lat_frames=30, lat_h=40, lat_w=64, chunk=5),
    dump=False,
)
# the tiled decode's compile logs ~170 lines of "Successful retry compilation of fusion..." warnings (47 KB in all):
# its stderr.log is trimmed (startup boilerplate, then the middle of the warnings) to stay under 40 KB
# (meta.json "stderr_trimmed" says so)
CASES["video_vae_decode_all_frames_fixed_v5e"]["stderr_limit"] = 40 * 1024


pair(
    "impala_time_major_sharded_over_time", "v5e", "v5e:2x2",
    "An IMPALA learner (MLP torso, LSTM core with 1024 units, V-trace) trained on v5e on time-major trajectories "
    "(unroll 80, a global batch of 8192, obs f32[80,8192,512]) placed with P('d'), the batch-major code's spec, "
    "which splits the time axis: the LSTM scan gathers every step of the whole global batch onto each chip and "
    "runs the core and its backward pass on all 8192 trajectories, beyond 15.75G.",
    "Fixed variant of impala_time_major_sharded_over_time_v5e: the trajectories split over the batch axis, "
    "P(None, 'd'); fits.",
    dict(category="aggregate", causes=["replicated_tensor", "batch_too_large"]),
    _impala_time_major_builder, dict(unroll=80, batch=8192, obs_dim=512, hidden=1024, actions=18,
                                     traj_spec=("d",)),
    dict(unroll=80, batch=8192, obs_dim=512, hidden=1024, actions=18, traj_spec=(None, "d")),
    dump=False,
)


# --------------------------------------------------------------------------------------------
# Worker (child process): build, lower, compile, record
# --------------------------------------------------------------------------------------------


def run_worker(name, outdir):
    spec = CASES[name]
    import importlib.metadata as md

    import numpy as np
    import jax
    from jax.experimental import topologies
    from jax.sharding import Mesh

    result = {
        "versions": {
            "python": sys.version.split()[0],
            "jax": jax.__version__,
            "jaxlib": md.version("jaxlib"),
            "libtpu": md.version("libtpu"),
        }
    }
    topo = topologies.get_topology_desc(topology_name=spec["topology"], platform="tpu")
    devices = topo.devices
    result["num_devices"] = len(devices)
    result["device_kind"] = devices[0].device_kind
    mesh = Mesh(np.array(devices).reshape(len(devices)), ("d",))
    fn, args, jit_kwargs = spec["builder"](mesh)
    result["function"] = fn.__name__
    result["jit_kwargs"] = {k: repr(v) for k, v in jit_kwargs.items()}
    result["inputs"] = [
        f"{a.dtype}[{','.join(map(str, a.shape))}] {a.sharding.spec}"
        for a in jax.tree_util.tree_leaves(args)
    ]
    result["compiler_options"] = spec["compiler_options"]
    t0 = time.time()
    try:
        lowered = jax.jit(fn, **jit_kwargs).trace(*args).lower(lowering_platforms=("tpu",))
        if spec["compiler_options"]:
            compiled = lowered.compile(spec["compiler_options"])
        else:
            compiled = lowered.compile()
        result["compiled"] = True
        ma = compiled.memory_analysis()
        if ma is not None:
            fields = [f for f in dir(ma) if f.endswith("_in_bytes")]
            result["memory_analysis"] = {f: int(getattr(ma, f)) for f in sorted(fields)}
    except Exception as e:  # noqa: BLE001 - we record whatever the user would see
        result["compiled"] = False
        result["exception_type"] = type(e).__module__ + "." + type(e).__qualname__
        with open(os.path.join(outdir, "exception.txt"), "w") as f:
            f.write(traceback.format_exc())
    result["compile_seconds"] = round(time.time() - t0, 2)
    with open(os.path.join(outdir, "result.json"), "w") as f:
        json.dump(result, f, indent=2)


# --------------------------------------------------------------------------------------------
# Parent: run cases, post-process
# --------------------------------------------------------------------------------------------

STDERR_LIMIT = 60 * 1024
DUMP_PATTERNS = (
    "before_optimizations.txt",
    "after_optimizations.txt",
    "-buffer-assignment.txt",
    "-live-range.txt",
    "-memory-usage-report.txt",
)

SIZE = r"[0-9.]+[BKMGT]"


def parse_figures(stderr, exc):
    """Headline figures exactly as printed (strings), from libtpu stderr and the exception text."""
    fig = {}
    text = stderr + "\n" + (exc or "")
    m = re.search(
        r"Ran out of memory in memory space (\w+)\. Used (" + SIZE + r") of (" + SIZE + r") \w+\. "
        r"Exceeded \w+ capacity by (" + SIZE + r")\.",
        text,
    )
    if m:
        fig["oom_memory_space"] = m.group(1)
        fig["used"] = m.group(2)
        fig["limit"] = m.group(3)
        fig["exceeded_by"] = m.group(4)
        fig["used_line"] = text[m.start(): m.end()]
    m = re.search(
        r"total memory required for HLO temporaries \((" + SIZE + r")\) exceeds available HBM \((" + SIZE + r")\)",
        text,
    )
    if m:
        fig["exception_required"] = m.group(1)
        fig["exception_available"] = m.group(2)
    m = re.search(r"Aborting compilation early[^\n]*?Requires (" + SIZE + r"), has (" + SIZE + r") available", text)
    if m:
        fig["early_abort_requires"] = m.group(1)
        fig["early_abort_available"] = m.group(2)
    m = re.search(r"XLA::TPU program HBM usage: (" + SIZE + r") / (" + SIZE + r")", text)
    if m:
        fig["program_hbm_usage"] = m.group(1)
        fig["program_hbm_limit"] = m.group(2)
    m = re.search(r"Total hbm usage >= (" + SIZE + r"):\n((?:[ \t]+\S.*\n)+)", stderr)
    if m:
        fig["total_hbm_usage"] = m.group(1)
        for line in m.group(2).splitlines():
            parts = line.split()
            if len(parts) >= 2:
                fig["total_hbm_" + parts[0]] = " ".join(parts[1:])
    m = re.search(r"Program hbm requirement (" + SIZE + r")", stderr)
    if m:
        fig["program_hbm_requirement"] = m.group(1)
    m = re.search(r"HLO temp\s+(" + SIZE + r") \(([^\n]*)\)", stderr)
    if m:
        fig["hlo_temp"] = m.group(1)
        fig["hlo_temp_detail"] = m.group(2)
    pads = re.findall(r"Extra memory due to padding: (" + SIZE + r") \(([0-9.]+)x expansion\)", text)
    if pads:
        fig["padding_entries"] = [{"extra": a, "expansion": b} for a, b in pads]
    m = re.search(r"Can't reduce memory use below ([0-9.]+[KMGT]?i?B)[^\n]*", text)
    if m:
        fig["remat_cant_reduce_below"] = m.group(1)
        fig["remat_line"] = m.group(0).strip()
    m = re.search(r"rematerialization limit[^\n]*", text)
    if m:
        fig["remat_limit_line"] = m.group(0).strip()
    m = re.search(
        r"Scoped allocation with size (" + SIZE + r") and limit (" + SIZE + r") exceeded scoped (\w+) limit by (" + SIZE + r")",
        text,
    )
    if m:
        fig["scoped_size"], fig["scoped_limit"], fig["scoped_space"], fig["scoped_exceeded_by"] = m.groups()
    m = re.search(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)[^\n]*", text)
    if m:
        fig["allocation_size_bytes"] = int(m.group(1))
        fig["allocation_memory_bytes"] = int(m.group(2))
        sp = re.search(r"space=(\w+)", m.group(0))
        if sp:
            fig["allocation_space"] = sp.group(1)
    m = re.search(r"TPU TensorCore Hbm usage: (" + SIZE + r"), SparseCore Hbm usage (" + SIZE + r")[^\n]*", text)
    if m:
        fig["sparsecore_line"] = m.group(0)
    m = re.search(r"Build label: (\S+)", stderr)
    if m:
        fig["libtpu_build_label"] = m.group(1)
    # the first line of the exception message as the user reads it
    if exc:
        for line in exc.splitlines():
            if re.match(r"^[\w.]+(Error|Exception): ", line):
                fig["exception_line"] = line
                break
    return fig


def trim_stderr(text, limit=None):
    """Keep the file < limit (default STDERR_LIMIT; a case may set a lower "stderr_limit"): first drop the startup boilerplate (before the compile
    starts), then, if still needed, elide lines far away from the OOM / usage report."""
    limit = limit or STDERR_LIMIT
    if len(text.encode()) <= limit:
        return text, None
    lines = text.splitlines(keepends=True)
    start = 0
    for i, l in enumerate(lines):
        if "running hlo passes" in l or "Initial HLO module" in l:
            start = i
            break
    notes = []
    if start:
        notes.append(f"[generate.py: trimmed {start} leading lines of libtpu startup output unrelated to the compile]\n")
        lines = lines[start:]
    if len("".join(lines).encode()) > limit:
        # keep the head of the compile and everything from the first report line on, elide middle
        key = None
        for i, l in enumerate(lines):
            if re.search(r"Ran out of memory|Aborting compilation early|RESOURCE_EXHAUSTED|"
                         r"XLA::TPU program HBM usage|would exceed memory|Can't reduce memory", l):
                key = i
                break
        if key is None:
            key = len(lines) - 1
        head = lines[:40]
        tail = lines[max(40, key - 40):]
        while len("".join(head + tail).encode()) > limit - 200 and len(tail) > 200:
            tail = tail[:-1]
        dropped_mid = max(0, key - 40 - 40)
        mid_note = f"[generate.py: elided {dropped_mid} lines]\n"
        cut_tail = len(lines) - (max(40, key - 40) + len(tail))
        lines = head + [mid_note] + tail
        if cut_tail > 0:
            lines.append(f"[generate.py: trimmed {cut_tail} trailing lines]\n")
        notes.append(mid_note)
    return "".join(notes[:1]) + "".join(lines), "".join(notes)


REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def relative_paths(text, python=None):
    """Fixtures name no machine: the checkout becomes repository-relative, a venv outside it
    `<venv>` (tests/corpus must not carry the absolute path of the checkout that made it)."""
    if python:
        prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
        if not prefix.startswith(REPO_ROOT + os.sep):
            text = text.replace(prefix + os.sep, "<venv>/")
    return text.replace(REPO_ROOT + os.sep, "").replace(REPO_ROOT, ".")


def pick_dump_files(dump_dir, fn_name):
    files = [os.path.basename(p) for p in glob.glob(os.path.join(dump_dir, "*"))]
    mod = f"jit_{fn_name}"
    by_module = {}
    for f in files:
        m = re.match(r"(module_\d+)\.(" + re.escape(mod) + r")\.", f)
        if m:
            by_module.setdefault(m.group(1), []).append(f)
    if not by_module:
        return []
    # the main module: the one with most files (the compiled one); tie -> highest number
    best = max(by_module, key=lambda k: (len(by_module[k]), k))
    return sorted(f for f in by_module[best] if f.endswith(DUMP_PATTERNS))


def run_case(name, python):
    spec = CASES[name]
    out = os.path.join(HERE, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    with tempfile.TemporaryDirectory(prefix=f"hbmdoc-{name}-") as tmp:
        dump_dir = os.path.join(tmp, "dump")
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        env = dict(os.environ)
        env.pop("LIBTPU_INIT_ARGS", None)  # only what the case sets
        env.update(
            TPU_STDERR_LOG_LEVEL="0",
            TPU_MIN_LOG_LEVEL="0",
            TPU_WORKER_HOSTNAMES="localhost",
            TPU_ACCELERATOR_TYPE=ACCELERATOR_TYPE[spec["topology"]],
            XLA_FLAGS=f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text",
        )
        env.update(spec["env"])
        t0 = time.time()
        proc = subprocess.run(
            [python, os.path.abspath(__file__), "--worker", name, work],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=1800,
        )
        elapsed = time.time() - t0
        stderr = proc.stderr.decode("utf-8", "replace")
        res_path = os.path.join(work, "result.json")
        if not os.path.exists(res_path):
            with open(os.path.join(out, "stderr.log"), "w") as f:
                f.write(stderr)
            raise RuntimeError(f"worker for {name} failed (rc={proc.returncode}); see {out}/stderr.log")
        with open(res_path) as f:
            res = json.load(f)
        exc = None
        if os.path.exists(os.path.join(work, "exception.txt")):
            with open(os.path.join(work, "exception.txt")) as f:
                exc = f.read()
            exc = relative_paths(exc, python)
            with open(os.path.join(out, "exception.txt"), "w") as f:
                f.write(exc)
        stderr = relative_paths(stderr, python)
        trimmed, note = trim_stderr(stderr, CASES[name].get("stderr_limit"))
        with open(os.path.join(out, "stderr.log"), "w") as f:
            f.write(trimmed)
        figures = parse_figures(stderr, exc)
        dump_files = []
        if spec["dump"]:
            dump_files = pick_dump_files(dump_dir, res["function"])
            if dump_files:
                os.makedirs(os.path.join(out, "dump"))
                for fn in dump_files:
                    with open(os.path.join(dump_dir, fn), encoding="utf-8", errors="replace") as f:
                        text = relative_paths(f.read(), python)
                    with open(os.path.join(out, "dump", fn), "w", encoding="utf-8") as f:
                        f.write(text)
        dump_bytes = sum(os.path.getsize(os.path.join(out, "dump", f)) for f in dump_files)

    shows = None
    if spec["expect"] == "fit":
        shows = bool(res["compiled"])
    elif spec["expect"] == "oom_suppressed":
        shows = bool(res["compiled"]) and "used" in figures
    else:
        shows = not res["compiled"]
    meta = {
        "case": name,
        "purpose": spec["purpose"],
        "expect": spec["expect"],
        "label": None,
        "shows_expected": shows,
        "topology": spec["topology"],
        "tpu_accelerator_type": ACCELERATOR_TYPE[spec["topology"]],
        "num_devices": res["num_devices"],
        "device_kind": res["device_kind"],
        "versions": res["versions"],
        "function": res["function"],
        "jit_kwargs": res["jit_kwargs"],
        "compiler_options": res["compiler_options"],
        "extra_env": spec["env"],
        "inputs": res["inputs"],
        "compiled": res["compiled"],
        "exception_type": res.get("exception_type"),
        "memory_analysis": res.get("memory_analysis"),
        "figures": figures,
        "stderr_trimmed": note,
        "dump_files": dump_files,
        "dump_bytes": dump_bytes,
        "worker_seconds": round(elapsed, 1),
        "regenerate": f".venv-tpu/bin/python tests/corpus/tpu/generate.py {name}",
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    # the label's basis is measured from meta.json files: this case's and its twin's
    twins = [n for n, c in CASES.items() if n == name or (c.get("label") or {}).get("fixed") == name
             or (CASES[name].get("label") or {}).get("fixed") == n or (c.get("label") or {}).get("twin_of") == name]
    relabel(twins)
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    return meta


def _gib(b):
    return "%.2f GiB" % (b / GiB)


def label_for(name):
    """The expected diagnosis for meta.json "label": from the case's label (or, for a case that
    fits, category "none"); the basis is measured from the fixed twin's meta.json when there is one."""
    spec = CASES[name]
    lab = dict(spec.get("label") or {})
    if spec["expect"] == "fit":
        lab.setdefault("category", "none")
        lab.setdefault("causes", [])
    if not lab:
        return None
    out = {"category": lab["category"], "category_also": list(lab.get("category_also", [])),
           "causes": list(lab.get("causes", []))}
    fixed = lab.get("fixed")
    if fixed:
        out["fixed"] = fixed
    basis = lab.get("basis")

    def load(n):
        mp = os.path.join(HERE, n, "meta.json")
        if os.path.exists(mp):
            with open(mp) as fh:
                return json.load(fh)
        return None

    me = load(name)
    if fixed:
        fm = load(fixed)
        if fm and fm.get("compiled") and fm.get("memory_analysis") and me:
            f = me.get("figures", {})
            if "used" in f:
                broken = f"used {f['used']} of {f['limit']} (figures)"
            elif "scoped_size" in f:
                broken = f"scoped {f['scoped_size']} of {f['scoped_limit']} (figures)"
            elif "allocation_size_bytes" in f:
                broken = f"allocation {f['allocation_size_bytes']} B of {f['allocation_memory_bytes']} B (figures)"
            else:
                broken = "no compile"
            ma = fm["memory_analysis"]
            measured = (f"measured: {fixed} compiles ({fm['topology']}), peak {_gib(ma['peak_memory_in_bytes'])} "
                        f"(args {_gib(ma['argument_size_in_bytes'])}) vs {broken} for {name} "
                        f"(from meta.json memory_analysis)")
            basis = measured + ("; " + basis if basis else "")
        elif not basis:
            basis = f"measured: {fixed} (not generated yet)"
    elif spec["expect"] == "fit" and me and me.get("memory_analysis"):
        ma = me["memory_analysis"]
        twin = lab.get("twin_of")
        basis = (f"measured: compiles, peak {_gib(ma['peak_memory_in_bytes'])} (from meta.json memory_analysis)"
                 + (f"; fixed twin of {twin}" if twin else ""))
    out["basis"] = basis or ""
    return out


def relabel(names):
    """Rewrite only the "label" field of existing meta.json files (placed after "expect")."""
    changed = 0
    for n in names:
        mp = os.path.join(HERE, n, "meta.json")
        if not os.path.exists(mp):
            continue
        with open(mp) as fh:
            meta = json.load(fh)
        lab = label_for(n)
        if meta.get("label") == lab:
            continue
        new = {}
        for k, v in meta.items():
            if k == "label":
                continue
            new[k] = v
            if k == "expect":
                new["label"] = lab
        if "label" not in new:
            new["label"] = lab
        with open(mp, "w") as fh:
            json.dump(new, fh, indent=2)
            fh.write("\n")
        changed += 1
    return changed


def headline(meta):
    f = meta["figures"]
    if "used_line" in f:
        return f["used_line"]
    if "early_abort_requires" in f:
        return f"Aborting compilation early: requires {f['early_abort_requires']}, has {f['early_abort_available']}"
    if "scoped_size" in f:
        return f"scoped {f['scoped_space']} {f['scoped_size']} > limit {f['scoped_limit']} (by {f['scoped_exceeded_by']})"
    if "allocation_size_bytes" in f:
        return f"Allocation (size={f['allocation_size_bytes']}) would exceed memory (size={f['allocation_memory_bytes']})"
    if "program_hbm_usage" in f:
        return f"XLA::TPU program HBM usage: {f['program_hbm_usage']} / {f['program_hbm_limit']}"
    if "exception_line" in f:
        return f["exception_line"][:200]
    return ""


def table_row(m):
    f = m["figures"]
    ma = m.get("memory_analysis") or {}
    fig = ""
    if "used" in f:
        fig = f"used {f['used']} / limit {f['limit']} / exceeded {f['exceeded_by']}"
    elif "scoped_size" in f:
        fig = f"scoped {f['scoped_size']} / limit {f['scoped_limit']}"
    elif "allocation_size_bytes" in f:
        fig = f"alloc {f['allocation_size_bytes']} B / {f['allocation_space']} {f['allocation_memory_bytes']} B"
    if ma:
        fig += ("; " if fig else "") + "peak %.2f GiB (args %.2f, out %.2f, temp %.2f, alias %.2f)" % tuple(
            ma[k] / GiB for k in ("peak_memory_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                                  "temp_size_in_bytes", "alias_size_in_bytes"))
    exc = f.get("exception_line", "")
    if len(exc) > 160:
        exc = exc[:157] + "..."
    exc = exc.replace("|", "\\|")
    return (f"| `{m['case']}` | {m['topology']} | {'yes' if m['compiled'] else 'no'} | "
            f"{'yes' if m['shows_expected'] else '**NO**'} | `{headline(m)}` | {fig} | {('`' + exc + '`') if exc else ''} |")


def update_readme_table():
    """Rewrite the table between the markers in README.md from every <case>/meta.json."""
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return
    metas = []
    for n in CASES:
        mp = os.path.join(HERE, n, "meta.json")
        if os.path.exists(mp):
            with open(mp) as fh:
                metas.append(json.load(fh))
    lines = ["| case | topology | compiled | as meant | headline (stderr) | figures | exception |",
             "|---|---|---|---|---|---|---|"] + [table_row(m) for m in metas]
    with open(path) as fh:
        text = fh.read()
    begin, end = "<!-- BEGIN TABLE (generate.py) -->", "<!-- END TABLE -->"
    if begin in text and end in text:
        i, j = text.index(begin) + len(begin), text.index(end)
        text = text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:]
        with open(path, "w") as fh:
            fh.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--table", action="store_true", help="only rebuild the README table")
    ap.add_argument("--relabel", action="store_true",
                    help="only rewrite the \"label\" field of existing meta.json files (all cases, or those named)")
    ap.add_argument("--worker", nargs=2, metavar=("CASE", "OUTDIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        run_worker(*a.worker)
        return
    if a.table:
        update_readme_table()
        return
    if a.relabel:
        print(f"relabelled {relabel(a.cases or list(CASES))} meta.json file(s)")
        return
    if a.list:
        for n, s in CASES.items():
            print(f"{n:24s} {s['topology']:10s} {s['expect']:4s} {s['purpose']}")
        return
    names = a.cases or list(CASES)
    for n in names:
        if n not in CASES:
            sys.exit(f"unknown case {n!r}; try --list")
    rows = []
    t_all = time.time()
    for n in names:
        print(f"== {n} ...", flush=True)
        meta = run_case(n, sys.executable)
        ok = "ok" if meta["shows_expected"] else "NOT AS EXPECTED"
        print(f"   compiled={meta['compiled']} {ok} ({meta['worker_seconds']}s) {headline(meta)}", flush=True)
        rows.append(meta)
    total = time.time() - t_all
    print(f"total {total:.0f}s for {len(names)} cases")
    update_readme_table()

if __name__ == "__main__":
    main()
