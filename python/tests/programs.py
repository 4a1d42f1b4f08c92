"""Small real programs for the fit tests, with the memory they need known by construction.

Figures are per device, for jax 0.10.2 / libtpu 0.0.42.1 (the compiler decides the exact peak;
the tests compare against what it reports, not against these comments).
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

MiB = 1 << 20
GiB = 1 << 30
V5E_USABLE = 16_909_336_576  # what libtpu lets one v5e device use (15.75G)
ROW = 8 * 131072 * 4  # bytes of one f32[8,131072] row: 4 MiB, tile-aligned, no padding


def affine(x):
    """y = 2x + 1 on f32[B, 8, 131072]: argument + output = 8 MiB per row, nothing else."""
    return x * 2 + 1


def affine_args(rows_per_device, devices=4):
    return (jax.ShapeDtypeStruct((rows_per_device * devices, 8, 131072), jnp.float32),)


AFFINE_SPECS = P("data")
# Largest per-device rows that fit: (args + output) = 2 * ROW per row.
AFFINE_MAX_ROWS = V5E_USABLE // (2 * ROW)  # 2015 (2015.75: the 0.75 row of slack covers nothing else)


def sgd_bf16(params, x):
    """SGD step on 3 bf16[40960,40960] weights (3.13G each) and a small batch.

    Without donation the old and new weights coexist (2 x 9.4G); donating the weights lets the
    new ones reuse them. Activations are tiny (remat and micro-batching cannot help) and the
    weights are already bf16.
    """

    def loss(ps):
        h = x
        for w in ps:
            h = jnp.tanh(h @ w)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    g = jax.grad(loss)(params)
    return [w - jnp.asarray(0.01, w.dtype) * gw for w, gw in zip(params, g)]


def sgd_bf16_args():
    params = [jax.ShapeDtypeStruct((40960, 40960), jnp.bfloat16) for _ in range(3)]
    x = jax.ShapeDtypeStruct((4 * 256, 40960), jnp.bfloat16)
    return params, x


SGD_SPECS = (P(), P("data"))


def scanned_mlp(params, x):
    """16 residual MLP blocks (bf16, D=2048, 4x expansion) under lax.scan on one long sequence per
    device: x bf16[4, 32768, 2048] sharded over the 4 batch rows. The backward pass keeps every
    block's [32768, 8192] activation (16 x 512M plus more): only rematerialization fits it; the
    batch (1 per device) cannot be split.
    """

    def block(h, p):
        w1, w2 = p
        u = jax.nn.gelu(h @ w1)
        return h + u @ w2, None

    def loss(ps):
        h, _ = jax.lax.scan(block, x, ps)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    return jax.value_and_grad(loss)(params)


def scanned_mlp_args(seq=32768, d=2048, layers=16):
    params = (
        jax.ShapeDtypeStruct((layers, d, 4 * d), jnp.bfloat16),
        jax.ShapeDtypeStruct((layers, 4 * d, d), jnp.bfloat16),
    )
    x = jax.ShapeDtypeStruct((4, seq, d), jnp.bfloat16)
    return params, x


SCAN_SPECS = (P(), P("data"))


def mlp_train_step(ws, x):
    """Plain tanh MLP forward+backward, weights replicated, batch sharded (like fits_v5e)."""

    def loss(ws):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h * h)

    return jax.value_and_grad(loss)(ws)


def mlp_args(batch_per_device, width=4096, layers=4, devices=4):
    ws = [jax.ShapeDtypeStruct((width, width), jnp.float32) for _ in range(layers)]
    x = jax.ShapeDtypeStruct((batch_per_device * devices, width), jnp.float32)
    return ws, x


MLP_SPECS = (P(), P("data"))


def adam_dp(params, opt_state, x):
    """Pure data parallelism with Adam: f32 parameters and both moments replicated on every device
    (the arguments alone are 3x the parameters), the batch sharded. Sharding the moments over the
    data axis (ZeRO-1), or parameters and moments (FSDP), is what makes it fit.
    """

    def loss(ps):
        h = x
        for w in ps:
            h = jnp.tanh(h @ w)
        return jnp.mean(h * h)

    g = jax.grad(loss)(params)
    mu = [0.9 * m + 0.1 * gi for m, gi in zip(opt_state["mu"], g)]
    nu = [0.999 * v + 0.001 * gi * gi for v, gi in zip(opt_state["nu"], g)]
    new = [w - 1e-3 * m / (jnp.sqrt(v) + 1e-8) for w, m, v in zip(params, mu, nu)]
    return new, {"mu": mu, "nu": nu}


def adam_dp_args(layers=21, width=8192, batch_per_device=256, devices=4):
    """21 f32 [8192, 8192] weights: 5.25G of parameters, 15.75G with the two moments (v5e: 15.75G)."""
    ws = [jax.ShapeDtypeStruct((width, width), jnp.float32) for _ in range(layers)]
    state = {"mu": list(ws), "nu": list(ws)}
    x = jax.ShapeDtypeStruct((batch_per_device * devices, width), jnp.float32)
    return ws, state, x


ADAM_SPECS = (P(), P(), P("data"))
