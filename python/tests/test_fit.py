"""fit / max_batch on small real programs, compiled deviceless by the real TPU compiler.

Every figure fit reports is checked against what the compiler itself says: the bare
``compiled.memory_analysis()`` of the same program compiled here without hbm-doctor, or the
compiler's own RESOURCE_EXHAUSTED message.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.tpu

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

import hbm_doctor  # noqa: E402
import programs as pr  # noqa: E402
from hbm_doctor.jax import GENERATIONS, TargetError, fit, max_batch, target  # noqa: E402
from hbm_doctor import format_size  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

GiB = 1 << 30


def bare_compile(fn, args, specs, topology="v5e:2x2", **jit_kwargs):
    """The compile fit wraps, done by hand: returns (memory_analysis, None) or (None, exception)."""
    topo = topologies.get_topology_desc(topology_name=topology, platform="tpu")
    mesh = Mesh(np.array(topo.devices).reshape(-1), ("data",))

    def sds(a, spec):
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec)), a
        )

    abstract = [sds(a, s) for a, s in zip(args, specs)]
    lowered = jax.jit(fn, **jit_kwargs).trace(*abstract).lower(lowering_platforms=("tpu",))
    try:
        return lowered.compile().memory_analysis(), None
    except Exception as e:  # JaxRuntimeError RESOURCE_EXHAUSTED
        return None, e


def required_from_message(exc):
    """(required, available) in bytes from the compiler's own message, and the unit for rounding."""
    m = re.search(
        r"required for HLO temporaries \(([0-9.]+)([KMGT])\) exceeds available HBM \(([0-9.]+)([KMGT])\)", str(exc)
    )
    assert m, str(exc)
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return float(m.group(1)) * unit[m.group(2)], float(m.group(3)) * unit[m.group(4)], unit[m.group(2)]


def test_targets():
    t = target("v5e-8")
    assert (t.topology, len(t.devices), t.usable_bytes) == ("v5e:2x4", 8, 16_909_336_576)
    # v4 is megacore, as on the TPU VM: one device per chip, 30.75G each (v4-8 = 4 chips).
    v4 = target("v4-8")
    assert (v4.topology, v4.chips, len(v4.devices), v4.usable_bytes) == ("v4:2x2x1", 4, 4, 33_017_561_088)
    assert (target("v5p-8").topology, len(target("v5p-8").devices)) == ("v5p:2x2x1", 4)
    assert len(target("v6e-1").devices) == 1 and target("v6e:4x4").chips == 16
    for spelling in ("v5e8", "v5e_8", "V5E-8", "tpu-v5e-8", "v5litepod-8", "v5e 8"):
        assert (target(spelling).topology, len(target(spelling).devices)) == ("v5e:2x4", 8), spelling
    for bad in ("v9-8", "v5e-3", "v5p-3", "h100", "v5e:3x3", "v5e:axb"):
        with pytest.raises(TargetError) as e:
            target(bad)
        assert "\n" not in str(e.value) and ("use" in str(e.value) or "type" in str(e.value)), str(e.value)


# What users' messages show on each generation (`of 30.75G hbm` on v4...): JAX devices per chip,
# device_kind and the compiler's available HBM per device, rounded as it prints it.
USERS_SEE = {
    "v2": (2, "TPU v2", "7.48G"),
    "v3": (2, "TPU v3", "15.48G"),
    "v4": (1, "TPU v4", "30.75G"),
    "v5e": (1, "TPU v5 lite", "15.75G"),
    "v5p": (1, "TPU v5", "95.74G"),
    "v6e": (1, "TPU v6 lite", "31.25G"),
    "v7": (2, "TPU7x", "94.75G"),
}


@pytest.mark.parametrize("gen", sorted(USERS_SEE))
def test_every_generation_fits_and_fails_where_the_compiler_does(gen):
    """A known program on each generation's 4-chip slice: y = 2x + 1 needs 8 MiB per row per
    device (argument + output, nothing else). Rows 8 MiB under the limit fit, with exactly that
    peak; rows over it do not, and the compiler's available HBM is what users' messages show."""
    per_chip, kind, shown = USERS_SEE[gen]
    g = GENERATIONS[gen]
    name = f"{gen}-8" if g.counts_cores else f"{gen}-4"
    t = target(name)
    assert (t.chips, len(t.devices), t.devices[0].device_kind, g.devices_per_chip) == (4, 4 * per_chip, kind, per_chip)
    assert format_size(t.usable_bytes) == shown and g.usable_bytes_per_device == t.usable_bytes
    n = len(t.devices)
    rows = g.usable_bytes_per_device // (2 * pr.ROW) - 1
    ok = fit(pr.affine, *pr.affine_args(rows, n), target=name, in_specs=pr.AFFINE_SPECS)
    assert ok.fits and ok.peak_bytes == 2 * rows * pr.ROW and ok.devices == n and ok.limit_bytes == t.usable_bytes
    over = fit(pr.affine, *pr.affine_args(rows + 64, n), target=name, in_specs=pr.AFFINE_SPECS)
    assert not over.fits
    _, available, unit = required_from_message(over.error)
    assert abs(available - g.usable_bytes_per_device) <= 0.006 * unit
    assert f"of {shown} usable" in str(over) and f"{shown} is available" in str(over.diagnosis)


def test_replicated_array_fits_v4_megacore():
    """The issue's case: a replicated 10 GiB array and its output fit one v4 chip (30.75G), which a
    per-TensorCore model (15.25G) refused."""
    x = jax.ShapeDtypeStruct((10 * GiB // 4,), jnp.float32)
    r = fit(lambda a: a + 1, x, target="v4-8", in_specs=P())
    assert r.fits and r.devices == 4 and r.peak_bytes == 20 * GiB and r.limit_bytes == 33_017_561_088


def test_fits():
    args = pr.mlp_args(16384, width=2048, layers=2)
    r = fit(pr.mlp_train_step, *args, target="v5e-4", in_specs=pr.MLP_SPECS)
    ma, err = bare_compile(pr.mlp_train_step, args, pr.MLP_SPECS)
    assert err is None and r.fits and bool(r)
    assert r.peak_bytes == ma.peak_memory_in_bytes  # the compiler's own figure, exactly
    assert r.memory_analysis["argument_size_in_bytes"] == ma.argument_size_in_bytes
    assert r.memory_analysis["temp_size_in_bytes"] == ma.temp_size_in_bytes
    assert r.headroom_bytes == 16_909_336_576 - ma.peak_memory_in_bytes > 0
    assert r.hbm_per_chip_bytes == 16 * GiB and r.devices == 4 and r.diagnosis is None
    # The dump's analysis agrees with memory_analysis (buffer-assignment total vs peak).
    assert abs(r.hbm_total_bytes - ma.peak_memory_in_bytes) <= 0.01 * ma.peak_memory_in_bytes
    assert "fits" in str(r) and "peak per device" in str(r)
    json.dumps(r.to_json())


def test_does_not_fit():
    args = pr.mlp_args(98304, layers=16)
    r = fit(pr.mlp_train_step, *args, target="v5e-4", in_specs=pr.MLP_SPECS)
    ma, err = bare_compile(pr.mlp_train_step, args, pr.MLP_SPECS)
    assert ma is None and "RESOURCE_EXHAUSTED" in str(err)
    assert not r.fits and r.error.startswith("RESOURCE_EXHAUSTED")
    required, available, unit = required_from_message(err)
    # The peak is the compiler's requirement (exact bytes from its buffer assignment) and agrees
    # with the rounded figure of its message.
    assert abs(r.peak_bytes - required) <= 0.006 * unit
    assert r.headroom_bytes < 0
    d = r.diagnosis
    assert d and d.category == "aggregate"
    # The diagnosis has the exact figures (the message's, in bytes): one story with fit's.
    assert d.used_bytes == r.peak_bytes and d.limit_bytes == r.limit_bytes == 16_909_336_576
    assert abs(d.used_bytes - required) <= 0.006 * unit and abs(d.limit_bytes - available) <= 0.006 * unit
    # explain() on the exception object the bare compile raised reads the same figures (rounded).
    d2 = hbm_doctor.explain(err)
    assert abs(d2.used_bytes - d.used_bytes) <= 0.006 * unit
    # Without the dump's buffers the exception alone is `unknown` (labelling.md).
    assert d2.category == "unknown"
    assert "DOES NOT FIT" in str(r) and "over by" in str(r)
    assert "<table" in r._repr_html_() or "<div" in r._repr_html_()


def test_max_batch_known_by_construction():
    # affine on v5e-4: argument + output = 8 MiB per row per device, no temporaries, so the
    # largest batch is 4 * floor(usable / 8 MiB) = 4 * 2015 = 8060.
    assert pr.AFFINE_MAX_ROWS == 2015
    b = max_batch(pr.affine, *pr.affine_args(1000), target="v5e-4", in_specs=pr.AFFINE_SPECS)
    assert b.multiple_of == 4
    assert b.max_batch == 4 * pr.AFFINE_MAX_ROWS == 8060
    assert b.first_failing == 8064
    assert b.fit.fits and b.fit.peak_bytes == 2 * pr.AFFINE_MAX_ROWS * pr.ROW
    ma, _ = bare_compile(pr.affine, pr.affine_args(pr.AFFINE_MAX_ROWS), [pr.AFFINE_SPECS])
    assert ma.peak_memory_in_bytes == b.fit.peak_bytes
    _, err = bare_compile(pr.affine, pr.affine_args(pr.AFFINE_MAX_ROWS + 1), [pr.AFFINE_SPECS])
    assert err is not None
    # Builder form: any dimension.
    b2 = max_batch(
        lambda n: (pr.affine, pr.affine_args(n // 4), {"in_specs": pr.AFFINE_SPECS}),
        target="v5e-4",
        low=4000,
        multiple_of=4,
    )
    assert b2.max_batch == 8060


def fixes_by_name(r):
    return {f.name: f for f in r.fixes}


def test_only_donation_fixes():
    args = pr.sgd_bf16_args()
    r = fit(pr.sgd_bf16, *args, target="v5e-4", in_specs=pr.SGD_SPECS, try_fixes=True)
    assert not r.fits
    fx = fixes_by_name(r)
    assert fx["donate"].fits
    # FSDP (the weights sharded 4 ways) fits too; nothing else does.
    others = [f for f in r.fixes if f.name not in ("donate", "fsdp") and f.applied]
    assert others and not any(f.fits for f in others), [(f.name, f.fits) for f in others]
    assert not fx["bf16_params"].applied  # already bf16
    assert not fx["zero1"].applied and "no optimizer state" in fx["zero1"].reason
    # The donated program, compiled by hand, has exactly the peak fit measured.
    ma, err = bare_compile(pr.sgd_bf16, args, pr.SGD_SPECS, donate_argnums=(0,))
    assert err is None and fx["donate"].peak_bytes == ma.peak_memory_in_bytes
    assert fx["donate"].savings_bytes == r.peak_bytes - ma.peak_memory_in_bytes > 0
    donation = next(c for c in r.diagnosis.causes if c.cause == "no_donation")
    assert (donation.fix, donation.measured_fits) == ("donate", True)
    assert r.diagnosis.causes[0].measured_fits  # a cause whose fix fits comes first
    assert "donate_argnums=(0,)" in fx["donate"].code


def test_only_remat_fixes():
    args = pr.scanned_mlp_args(131072, 1024, 4)
    r = fit(pr.scanned_mlp, *args, target="v5e-4", in_specs=pr.SCAN_SPECS, try_fixes=True)
    assert not r.fits
    fx = fixes_by_name(r)
    # The policy with the least recompute fits first, so the family stops there.
    remat = [f for f in r.fixes if f.name.startswith("remat:")]
    assert [f.name for f in remat] == ["remat:dots_with_no_batch_dims_saveable"] and remat[0].fits
    others = [f for f in r.fixes if not f.name.startswith("remat:") and f.applied]
    assert not any(f.fits for f in others), [(f.name, f.fits) for f in others]
    assert not fx["microbatch:2"].applied  # one sequence per device: nothing to split
    top = r.diagnosis.causes[0]
    assert top.cause == "no_remat" and top.measured_fits and top.fix == "remat:dots_with_no_batch_dims_saveable"
    # What the fix compiled is the program with jax.checkpoint written by hand.
    pol = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def by_hand(params, x):
        def block(h, p):
            w1, w2 = p
            return h + jax.nn.gelu(h @ w1) @ w2, None

        def loss(ps):
            h, _ = jax.lax.scan(jax.checkpoint(block, policy=pol), x, ps)
            return jnp.mean(h.astype(jnp.float32) ** 2)

        return jax.value_and_grad(jax.checkpoint(loss, policy=pol))(params)

    ma, err = bare_compile(by_hand, args, pr.SCAN_SPECS)
    assert err is None and fx["remat:dots_with_no_batch_dims_saveable"].peak_bytes == ma.peak_memory_in_bytes


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def step(x):
        return x * 2 + 1

    def make(batch=8000):
        return step, (jax.ShapeDtypeStruct((batch, 8, 131072), jnp.float32),), {"in_specs": P("data")}

    if __name__ == "__main__":
        raise SystemExit("the script's main must not run")
""")


def test_fit_command(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    exe = hbm_doctor.find_hbm_doctor_bin()
    env = dict(os.environ, HBM_DOCTOR_PYTHON=sys.executable, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    ok = subprocess.run(
        [exe, "fit", f"{script}:make", "--target", "v5e-4", "--format", "json"], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["fits"] and doc["peak_bytes"] == 2 * 2000 * pr.ROW and doc["target"] == "v5e-4"
    over = subprocess.run(
        [
            sys.executable,
            "-m",
            "hbm_doctor",
            "fit",
            f"{script}:step",
            "--target",
            "v5e-4",
            "--arg",
            "f32[8064,8,131072]@data",
            "--try-fixes",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert over.returncode == 1, over.stderr
    assert "DOES NOT FIT" in over.stdout and "donate" in over.stdout
    bad = subprocess.run([exe, "fit", f"{script}:nope"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "no attribute 'nope'" in bad.stderr


def test_uncaught_compile_oom_with_excepthook(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
        import sys
        sys.path.insert(0, %r)
        import hbm_doctor, programs as pr
        from jax.experimental import topologies
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding
        hbm_doctor.install_excepthook()
        topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
        mesh = Mesh(np.array(topo.devices), ("data",))
        (x,) = pr.affine_args(2100)
        x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, pr.AFFINE_SPECS))
        jax.jit(pr.affine).trace(x).lower(lowering_platforms=("tpu",)).compile()
    """
            % os.path.dirname(os.path.abspath(__file__))
        )
    )
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 1
    assert "JaxRuntimeError" in p.stderr and "RESOURCE_EXHAUSTED" in p.stderr
    diag = p.stderr.split("hbm-doctor:", 1)[1]
    assert "16.41G" in diag and "15.75G" in diag  # 2100 rows x 8 MiB, as the compiler says


def test_jitted_function_keeps_its_own_donation():
    rows = pr.AFFINE_MAX_ROWS + 1  # does not fit undonated; fits when x is donated
    plain = fit(pr.affine, *pr.affine_args(rows), target="v5e-4", in_specs=pr.AFFINE_SPECS)
    donated = fit(jax.jit(pr.affine, donate_argnums=0), *pr.affine_args(rows), target="v5e-4", in_specs=pr.AFFINE_SPECS)
    assert not plain.fits and donated.fits
    assert donated.memory_analysis["alias_size_in_bytes"] == rows * pr.ROW


def test_optimizer_state_sharding_fixes_replicated_adam(capsys):
    """Pure data parallelism, f32 parameters and Adam moments replicated: the arguments alone are
    the limit. Sharding the moments over the data axis (ZeRO-1) fits; its peak is the program
    sharded by hand. Micro-batching costs the gradient accumulator (the parameters' size), not the
    moments: the measured program computes what optax.MultiSteps computes."""
    args = pr.adam_dp_args()
    r = fit(pr.adam_dp, *args, target="v5e-4", in_specs=pr.ADAM_SPECS, try_fixes=True, donate_argnums=(0, 1), progress=True)
    assert not r.fits
    fx = fixes_by_name(r)
    z = fx["zero1"]
    assert z.fits and z.cause == "optimizer_state_unsharded"
    assert "fsdp" not in fx  # the family stops at the first fix that fits
    # ZeRO-1 by hand: the moments sharded on dim 0 over the 4 devices, in and out.
    topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
    mesh = Mesh(np.array(topo.devices).reshape(-1), ("data",))
    rep, shard = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    ws, state, x = args

    def sds(tree, sh):
        return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), tree)

    out_sh = ([rep] * len(ws), {"mu": [shard] * len(ws), "nu": [shard] * len(ws)})
    lowered = (
        jax.jit(pr.adam_dp, donate_argnums=(0, 1), out_shardings=out_sh)
        .trace(sds(ws, rep), sds(state, shard), sds(x, shard))
        .lower(lowering_platforms=("tpu",))
    )
    ma = lowered.compile().memory_analysis()
    assert z.peak_bytes == ma.peak_memory_in_bytes < r.limit_bytes
    assert z.savings_bytes == r.peak_bytes - ma.peak_memory_in_bytes > 0
    params = len(ws) * 8192 * 8192 * 4  # f32 parameters per device (replicated)
    mb = fx["microbatch:2"]
    assert mb.applied and not mb.fits and 0 < -mb.savings_bytes <= params * 1.05, mb
    cause = next(c for c in r.diagnosis.causes if c.cause == "optimizer_state_unsharded")
    assert cause.fix == "zero1" and cause.measured_fits
    err = capsys.readouterr().err
    assert "zero1: compiling" in err and "zero1: fits" in err


def test_one_story_headline_and_figures_agree():
    """fit's verdict, the diagnosis headline and its figures block say the same bytes, and the
    causes are analyze's on the same dump."""
    args = pr.adam_dp_args()
    r = fit(pr.adam_dp, *args, target="v5e-4", in_specs=pr.ADAM_SPECS, donate_argnums=(0, 1))
    over = format_size(r.peak_bytes - r.limit_bytes)
    text = str(r)
    assert f"over by {over}" in text
    d = r.diagnosis
    assert f"({over} over," in d.summary and f"exceeded by {over}" in str(d)
    assert d.exceeded_bytes == r.peak_bytes - r.limit_bytes
    assert [c["cause"] for c in r.analysis["diagnosis"]["causes"]] == [c.cause for c in d.causes]
    assert d.category == r.analysis["diagnosis"]["category"]
    assert d.raw["diagnosis"]["engine"] == "analyze"


NO_JAX = """
import sys
sys.modules["jax"] = None
from hbm_doctor.jax import fit
try:
    fit(lambda x: x, None, target="v5e-4")
except ModuleNotFoundError as e:
    print("ERR", e)
"""

NO_LIBTPU = NO_JAX.replace('sys.modules["jax"] = None', 'sys.modules["libtpu"] = None')


@pytest.mark.parametrize("script,expect", [(NO_JAX, "pip install 'jax[tpu]'"), (NO_LIBTPU, "without libtpu")])
def test_missing_jax_or_libtpu_says_what_to_install(script, expect):
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ERR")]
    assert len(lines) == 1 and expect in lines[0] and "pip install" in lines[0], p.stdout + p.stderr


def test_fit_command_bad_target_one_line(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, HBM_DOCTOR_PYTHON=sys.executable, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    exe = hbm_doctor.find_hbm_doctor_bin()
    p = subprocess.run(
        [exe, "fit", f"{script}:step", "--target", "v5e:3x3", "--arg", "f32[64,8,131072]@data"],
        capture_output=True,
        text=True,
        env=env,
    )
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("hbm-doctor: error:")]
    assert p.returncode == 2 and len(errors) == 1 and "v5e:2x4" in errors[0], p.stderr
    assert "Traceback" not in p.stderr and "JaxRuntimeError" not in p.stderr
