"""Does it fit? Compile a JAX program for a TPU topology on any machine, before you pay for one.

:func:`fit` compiles ``fn`` ahead of time with the real TPU compiler (the ``libtpu`` wheel of
``jax[tpu]``) for a topology such as ``v5e-8``, deviceless: the arguments are abstract
(``jax.ShapeDtypeStruct``), nothing is allocated, no TPU is needed. The compiler writes its dump
into a temporary directory; ``hbm-doctor analyze`` reads it (peak per device, what is live at the
peak, where it comes from), and when the compiler says ``RESOURCE_EXHAUSTED``, ``hbm-doctor
explain`` diagnoses its message joined with the dump. With ``try_fixes=True`` every fix that can
be applied automatically is compiled too, and the compiler's own figures say which ones fit.

Example::

    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    from hbm_doctor.jax import fit, max_batch

    def train_step(params, batch): ...
    params = jax.ShapeDtypeStruct((8192, 8192), jnp.float32)
    batch = jax.ShapeDtypeStruct((65536, 8192), jnp.float32)
    r = fit(train_step, params, batch, target="v5e-8", in_specs=(P(), P("data")), try_fixes=True)
    print(r)                       # fits or not, peak per device vs HBM, headroom, fixes measured
    r.fits, r.peak_bytes, r.headroom_bytes

    b = max_batch(train_step, params, batch, target="v5e-8", in_specs=(P(), P("data")))
    b.max_batch                    # the largest leading dim of `batch` that compiles

TPU compiler flags go in ``compiler_options`` (or ``LIBTPU_INIT_ARGS``), never ``XLA_FLAGS``:
libtpu aborts on unknown ``XLA_FLAGS``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from hbm_doctor._diagnosis import Cause, Diagnosis, exception_text, explain, run_binary
from hbm_doctor._size import format_size

__all__ = [
    "FitResult",
    "FixResult",
    "BatchSearch",
    "Generation",
    "GENERATIONS",
    "MissingDependency",
    "TargetError",
    "chip_table",
    "Program",
    "Target",
    "fit",
    "max_batch",
    "target",
]

GiB = 1 << 30

# ---------------------------------------------------------------------------------------------
# Dependencies: one line that says what to install
# ---------------------------------------------------------------------------------------------


class MissingDependency(ModuleNotFoundError):
    """jax or libtpu (the TPU compiler) is not installed: the message says what to install."""


def _require_jax_tpu() -> None:
    """Raises :class:`MissingDependency` with one line when jax or libtpu is missing."""
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415

    try:
        import jax  # noqa: PLC0415
    except ImportError:
        raise MissingDependency(
            f"hbm_doctor.jax needs jax with the TPU compiler: `{sys.executable} -m pip install 'jax[tpu]'` "
            "(about 1 GiB; no TPU needed)"
        ) from None
    try:
        found = importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingDependency(
            f"jax {jax.__version__} is installed without libtpu, the TPU compiler fit runs: "
            f"`{sys.executable} -m pip install 'jax[tpu]=={jax.__version__}'` (no TPU needed)"
        )


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

# The chip facts (usable HBM per device as the compiler counts it, physical HBM per device) are
# the Rust table's (crates/hbm_doctor_units/src/chips.rs, printed by `hbm-doctor chips
# --format json`), so explain, analyze and fit agree. This copy is used only when the binary
# cannot be run; test_package.py checks it equals the binary's.
_BUILTIN_CHIPS: Dict[str, Tuple[int, int]] = {
    # name: (physical bytes per device, usable bytes per device)
    "v2": (8 * GiB, 8_031_043_584),
    "v4-core": (16 * GiB, 16_373_514_240),
    "v3": (16 * GiB, 16_621_830_144),
    "v5e": (16 * GiB, 16_909_336_576),
    "v4": (32 * GiB, 33_017_561_088),
    "v6e": (32 * GiB, 33_550_237_696),
    "v5p": (95 * GiB, 102_803_439_616),
    "v7": (96 * GiB, 101_732_843_520),  # per device; a 7x chip shows two
}


@functools.lru_cache(maxsize=1)
def chip_table() -> Dict[str, Tuple[int, int]]:
    """``{name: (physical_bytes, usable_bytes)}`` per device, from ``hbm-doctor chips --format json``
    (the built-in copy if the binary cannot run)."""
    try:
        proc = run_binary(["chips", "--format", "json"], ok_codes=(0,), timeout=30)
        return {t["name"]: (int(t["physical_bytes"]), int(t["usable_bytes"])) for t in json.loads(proc.stdout)["tpus"]}
    except Exception:  # no binary, or an old one without `chips`
        return dict(_BUILTIN_CHIPS)


@dataclass(frozen=True)
class Generation:
    """A TPU generation as ``fit`` compiles for it.

    ``hbm_per_chip_bytes`` is the vendor's HBM per chip; ``usable_bytes_per_device`` is what the
    compiler lets one JAX device use (the chip table's ``chip`` entry). ``devices_per_chip``: JAX
    devices per chip as users see them on the TPU VM (v4 and v5p are megacore, one device per
    chip; v2, v3 and v7 show each TensorCore as a device). ``counts_cores``: ``v4-8`` names 8
    TensorCores (4 chips), ``v5e-8`` 8 chips.
    """

    name: str
    kind: str  # jax's device_kind
    hbm_per_chip_bytes: int
    usable_bytes_per_device: int
    devices_per_chip: int
    counts_cores: bool
    dims: int
    accelerator_type: str  # TPU_ACCELERATOR_TYPE pattern
    topology_prefix: str = ""  # what get_topology_desc calls it (tpu7x for v7)
    chip_config: Optional[str] = None  # get_topology_desc(chip_config_name=...): megacore for v4
    chip: str = ""  # the chip table's entry

    @property
    def topology_name(self) -> str:
        return self.topology_prefix or self.name


# name, device_kind, devices per chip, counts TensorCores, topology dims, TPU_ACCELERATOR_TYPE,
# topology prefix, chip config, chip-table entry
_GEN_FACTS = [
    ("v2", "TPU v2", 2, True, 2, "v2-{n}", "v2", None, "v2"),
    ("v3", "TPU v3", 2, True, 2, "v3-{n}", "v3", None, "v3"),
    ("v4", "TPU v4", 1, True, 3, "v4-{n}", "v4", "megacore", "v4"),
    ("v5e", "TPU v5 lite", 1, False, 2, "v5litepod-{n}", "v5e", None, "v5e"),
    ("v5p", "TPU v5", 1, True, 3, "v5p-{n}", "v5p", None, "v5p"),
    ("v6e", "TPU v6 lite", 1, False, 2, "v6e-{n}", "v6e", None, "v6e"),
    ("v7", "TPU7x", 2, True, 3, "tpu7x-{n}", "tpu7x", None, "v7"),
]


def _generations(table: Dict[str, Tuple[int, int]]) -> Dict[str, Generation]:
    out = {}
    for name, kind, per_chip, cores, dims, acc, prefix, cfg, chip in _GEN_FACTS:
        physical, usable = table.get(chip) or _BUILTIN_CHIPS[chip]
        out[name] = Generation(name, kind, physical * per_chip, usable, per_chip, cores, dims, acc, prefix, cfg, chip)
    return out


GENERATIONS: Dict[str, Generation] = _generations(chip_table())
_ALIASES = {
    "v5litepod": "v5e",
    "v5lite": "v5e",
    "v5lp": "v5e",
    "trillium": "v6e",
    "v6litepod": "v6e",
    "v6lite": "v6e",
    "v7x": "v7",
    "7x": "v7",
    "tpu7x": "v7",
    "ironwood": "v7",
}
_TOPO_2D = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TOPO_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}


class TargetError(ValueError):
    """A target that does not name a TPU slice or topology; the message says what to type."""


@dataclass
class Target:
    """A resolved target: generation, topology compiled for, and its abstract devices."""

    name: str
    generation: Generation
    topology: str
    chips: int
    devices: list

    @property
    def usable_bytes(self) -> int:
        """HBM the compiler lets a program use on one device."""
        return self.generation.usable_bytes_per_device

    def mesh(self, axes: Union[None, Dict[str, int], Sequence[str]] = None):
        """A ``jax.sharding.Mesh`` over this target's devices.

        ``axes``: ``None`` (one axis ``"data"`` over all devices), a dict ``{"data": 4,
        "model": -1}`` (-1: the rest), or a sequence of names (all devices on the first).
        """
        import numpy as np  # noqa: PLC0415
        from jax.sharding import Mesh  # noqa: PLC0415

        n = len(self.devices)
        if axes is None:
            axes = {"data": n}
        elif not isinstance(axes, dict):
            names = list(axes)
            axes = {names[0]: n, **{a: 1 for a in names[1:]}}
        sizes = dict(axes)
        free = [a for a, s in sizes.items() if s == -1]
        known = math.prod(s for s in sizes.values() if s != -1)
        if len(free) > 1:
            raise ValueError(f"mesh {axes}: at most one axis may be -1")
        if free:
            if n % known:
                raise ValueError(f"mesh {axes}: {n} devices are not divisible by {known}")
            sizes[free[0]] = n // known
        if math.prod(sizes.values()) != n:
            raise ValueError(f"mesh {axes} has {math.prod(sizes.values())} devices but {self.name} has {n}")
        return Mesh(np.array(self.devices).reshape(tuple(sizes.values())), tuple(sizes))


_TOPO_CACHE: Dict[Tuple[str, Optional[str]], Any] = {}


def _set_tpu_env(gen: Generation, chips: int) -> None:
    # Silences libtpu's probing of the (absent) TPU host; harmless on a real TPU VM, where the
    # variables are already set.
    os.environ.setdefault(
        "TPU_ACCELERATOR_TYPE", gen.accelerator_type.format(n=max(chips, 4) * (2 if gen.counts_cores else 1))
    )
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # Deviceless compiles do not open the TPU: do not fail on libtpu's one-process lockfile when
    # another process (a training job, a notebook kernel) has libtpu loaded.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _slice_names(gen: Generation) -> str:
    table = _TOPO_3D if gen.dims == 3 else _TOPO_2D
    unit = 2 if gen.counts_cores else 1
    return ", ".join(f"{gen.name}-{c * unit}" for c in [1, 2, *table])


_TARGET_RE = re.compile(r"(?:tpu[-_ ]?)?(v?\d+[a-z]*|trillium|ironwood)(?:(?:[-_ ]?)(\d+)|:(.+))?")


def parse_target(name: str) -> Tuple[Generation, Optional[int], Optional[str]]:
    """``"v5e8"`` -> (v5e, 8, None); ``"v5e:2x4"`` -> (v5e, None, "2x4"); raises TargetError."""
    raw = re.sub(r"\s+", " ", str(name).strip().lower())
    m = _TARGET_RE.fullmatch(raw)
    usage = "type a slice such as v5e-8, v6e-4, v5p-8, v4-8, v3-8, v7-8, or a topology such as v5e:2x4"
    if not m:
        raise TargetError(f"unknown target {name!r}: {usage}")
    token = m.group(1)
    gen_name = _ALIASES.get(token, token)
    if not gen_name.startswith("v") and f"v{gen_name}" in GENERATIONS:
        gen_name = f"v{gen_name}"
    gen = GENERATIONS.get(gen_name)
    if gen is None:
        raise TargetError(f"unknown TPU generation {token!r} in {name!r}: use one of {', '.join(GENERATIONS)} ({usage})")
    count = int(m.group(2)) if m.group(2) else None
    topo = m.group(3).strip() if m.group(3) else None
    if topo is not None and not re.fullmatch(r"\d+(x\d+){1,2}", topo):
        example = (_TOPO_3D if gen.dims == 3 else _TOPO_2D)[8]
        raise TargetError(f"{name!r}: use a topology such as {gen.name}:{example} ({gen.name}:AxB or AxBxC)")
    return gen, count, topo


def _topology_desc(gen: Generation, topo_name: str, name: str):
    key = (topo_name, gen.chip_config)
    if key not in _TOPO_CACHE:
        from jax.experimental import topologies  # noqa: PLC0415

        kw = {"chip_config_name": gen.chip_config} if gen.chip_config else {}
        try:
            _TOPO_CACHE[key] = topologies.get_topology_desc(topology_name=topo_name, platform="tpu", **kw)
        except Exception as e:  # jax.errors.JaxRuntimeError: the compiler has no such topology
            first = (str(e).strip().splitlines() or [""])[0][:160]
            table = _TOPO_3D if gen.dims == 3 else _TOPO_2D
            raise TargetError(
                f"{name!r}: the TPU compiler has no {gen.name} topology {topo_name.split(':', 1)[1]} ({first}); "
                f"use one of {', '.join(f'{gen.name}:{t}' for t in table.values())} or {_slice_names(gen)}"
            ) from None
    return _TOPO_CACHE[key]


def target(name: str) -> Target:
    """Resolves ``"v5e-8"``, ``"v6e-4"``, ``"v5p-8"``, ``"v4-8"``, ``"v3-8"``, ``"v7-8"``, ``"v5e"``
    or ``"v5e:2x4"``.

    ``v5e-N``/``v6e-N`` count chips; ``v2-N``/``v3-N``/``v4-N``/``v5p-N``/``v7-N`` count
    TensorCores (N/2 chips), as Cloud TPU names them. A bare generation is one chip. Devices are
    what JAX shows on the TPU VM: one per chip on v4 (megacore), v5e, v5p and v6e; one per
    TensorCore on v2, v3 and v7. One- and two-chip targets compile on the smallest topology with
    a mesh over the devices of 1 or 2 of its chips. ``v5e8``, ``v5e_8``, ``V5E-8``,
    ``tpu-v5e-8`` and ``v5litepod-8`` are the same target.

    Raises:
        TargetError: (a ValueError) with what to type instead.

    Example:
        >>> t = target("v5e-8")      # doctest: +SKIP
        >>> t.topology, len(t.devices), t.usable_bytes
        ('v5e:2x4', 8, 16909336576)
    """
    gen, n, rest = parse_target(name)
    prefix = gen.topology_name
    if rest is not None:
        topo_name = f"{prefix}:{rest}"
        chips = math.prod(int(x) for x in rest.split("x"))
        take = None
    else:
        unit = 2 if gen.counts_cores else 1
        n = n if n is not None else unit
        chips = n // unit
        if chips < 1 or n % unit:
            raise TargetError(f"{name!r}: {gen.name}-N counts TensorCores (2 per chip), N must be even: use {_slice_names(gen)}")
        table = _TOPO_3D if gen.dims == 3 else _TOPO_2D
        if chips in (1, 2):
            topo_name, take = f"{prefix}:{table[4]}", chips * gen.devices_per_chip
        elif chips in table:
            topo_name, take = f"{prefix}:{table[chips]}", None
        else:
            raise TargetError(
                f"{name!r}: no {gen.name} slice with {chips} chips; use one of {_slice_names(gen)}"
                f", or a topology such as {gen.name}:{table[8]}"
            )
    _require_jax_tpu()
    _set_tpu_env(gen, chips)
    devices = list(_topology_desc(gen, topo_name, name).devices)
    if take is not None:
        devices = devices[:take]
    return Target(name=name, generation=gen, topology=topo_name, chips=chips, devices=devices)


# ---------------------------------------------------------------------------------------------
# Programs and abstract arguments
# ---------------------------------------------------------------------------------------------


@dataclass
class Program:
    """What a builder returns for ``max_batch`` and ``hbm-doctor fit``: a function and its abstract args.

    Example::

        def make(batch):
            return Program(train_step, (params, jax.ShapeDtypeStruct((batch, 1024), jnp.float32)),
                           in_specs=(P(), P("data")), jit_kwargs={"donate_argnums": (0,)})
    """

    fn: Callable
    args: tuple
    in_specs: Any = None
    jit_kwargs: Dict[str, Any] = field(default_factory=dict)
    mesh: Any = None
    batch_argnums: Optional[Sequence[int]] = None

    @classmethod
    def coerce(cls, obj: Any) -> "Program":
        """Accepts a Program, ``(fn, args)``, ``(fn, args, jit_kwargs)`` or a dict of the fields."""
        if isinstance(obj, Program):
            return obj
        if isinstance(obj, dict):
            return cls(**obj)
        if isinstance(obj, (tuple, list)) and obj and callable(obj[0]):
            fn, rest = obj[0], list(obj[1:])
            args = tuple(rest[0]) if rest else ()
            kw = dict(rest[1]) if len(rest) > 1 else {}
            in_specs = kw.pop("in_specs", None)
            mesh = kw.pop("mesh", None)
            batch_argnums = kw.pop("batch_argnums", None)
            return cls(fn, args, in_specs=in_specs, jit_kwargs=kw, mesh=mesh, batch_argnums=batch_argnums)
        raise TypeError(f"expected a Program, (fn, args) or (fn, args, jit_kwargs), got {type(obj).__name__}")


def _P():
    from jax.sharding import PartitionSpec  # noqa: PLC0415

    return PartitionSpec


def _is_array_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _own_spec(leaf: Any):
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

    s = getattr(leaf, "sharding", None)
    if isinstance(s, NamedSharding):
        return s.spec
    if isinstance(s, PartitionSpec):
        return s
    return PartitionSpec()


def _sds(leaf: Any, spec: Any, mesh: Any, dtype: Any = None):
    import jax  # noqa: PLC0415
    from jax.sharding import NamedSharding  # noqa: PLC0415

    if not _is_array_like(leaf):
        return leaf
    spec = _own_spec(leaf) if spec is None else spec
    return jax.ShapeDtypeStruct(
        tuple(leaf.shape),
        dtype or leaf.dtype,
        sharding=NamedSharding(mesh, spec),
        weak_type=bool(getattr(leaf, "weak_type", False)),
    )


_UNSET = object()


def _abstract_args(args: Sequence[Any], in_specs: Any, mesh: Any, static: Sequence[int]) -> list:
    """Every array leaf becomes a ShapeDtypeStruct sharded over ``mesh``.

    ``in_specs`` is a prefix tree of ``PartitionSpec`` (like ``shard_map``'s): one spec for
    everything, or one entry per positional argument (a spec, ``None`` for the leaf's own
    sharding, or a tree of specs). Leaves without a spec keep the ``PartitionSpec`` of their own
    ``NamedSharding``, else are replicated.
    """
    import jax  # noqa: PLC0415

    P = _P()
    n = len(args)
    if in_specs is None:
        per_arg = [_UNSET] * n
    elif isinstance(in_specs, P):
        per_arg = [in_specs] * n
    elif isinstance(in_specs, (tuple, list)) and len(in_specs) == n:
        per_arg = list(in_specs)
    else:
        raise ValueError(f"in_specs must be a PartitionSpec or a sequence of {n} entries (one per argument)")
    is_leaf = lambda x: x is None or isinstance(x, P)  # noqa: E731
    out = []
    for i, (arg, prefix) in enumerate(zip(args, per_arg)):
        if i in static:
            out.append(arg)
        elif prefix is _UNSET or prefix is None:
            out.append(jax.tree_util.tree_map(lambda leaf: _sds(leaf, None, mesh), arg))
        else:
            out.append(
                jax.tree_util.tree_map(
                    lambda spec, sub: jax.tree_util.tree_map(lambda leaf: _sds(leaf, spec, mesh), sub),
                    prefix,
                    arg,
                    is_leaf=is_leaf,
                )
            )
    return out


def _static_argnums(jit_kwargs: Dict[str, Any]) -> Tuple[int, ...]:
    s = jit_kwargs.get("static_argnums")
    if s is None:
        return ()
    return (s,) if isinstance(s, int) else tuple(s)


def _default_batch_argnums(n_args: int, static: Sequence[int]) -> Tuple[int, ...]:
    # The `step(state, batch)` convention: the last positional, non-static argument.
    for i in reversed(range(n_args)):
        if i not in static:
            return (i,)
    return ()


def _resolve_mesh(tgt: Target, mesh: Any):
    from jax.sharding import Mesh  # noqa: PLC0415

    if mesh is None or isinstance(mesh, (dict, list, tuple)):
        return tgt.mesh(mesh)
    if isinstance(mesh, Mesh):
        if set(mesh.devices.flat) <= set(tgt.devices):
            return mesh
        return tgt.mesh(dict(mesh.shape))  # the same axes over the target's devices
    if callable(mesh):
        return mesh(tgt.devices)
    raise TypeError("mesh must be None, a dict {axis: size}, a sequence of axis names, a Mesh or a callable(devices)")


@contextlib.contextmanager
def _mesh_context(mesh) -> Iterator[None]:
    import jax  # noqa: PLC0415

    # Lets `with_sharding_constraint(x, P("data"))` inside the function resolve axis names.
    if hasattr(jax, "set_mesh"):
        with jax.set_mesh(mesh):
            yield
    elif hasattr(jax.sharding, "use_mesh"):
        with jax.sharding.use_mesh(mesh):
            yield
    else:
        with mesh:
            yield


def _nbytes(leaf) -> int:
    import numpy as np  # noqa: PLC0415

    return int(math.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize


def _shards(mesh, spec, dim: int) -> int:
    if spec is None or dim >= len(spec) or spec[dim] is None:
        return 1
    axes = spec[dim] if isinstance(spec[dim], tuple) else (spec[dim],)
    return math.prod(mesh.shape[a] for a in axes)


# ---------------------------------------------------------------------------------------------
# One compile
# ---------------------------------------------------------------------------------------------


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "would exceed memory" in text


@dataclass
class _Compiled:
    fits: bool
    memory_analysis: Optional[Dict[str, int]]
    exception: Optional[BaseException]
    compile_seconds: float
    trace_seconds: float


def _memory_analysis_dict(compiled) -> Optional[Dict[str, int]]:
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    return {k: int(getattr(ma, k)) for k in dir(ma) if k.endswith("_in_bytes") and not k.startswith("_")}


def _is_jitted(fn) -> bool:
    return callable(getattr(fn, "trace", None)) and callable(getattr(fn, "lower", None))


def _unjitted(fn):
    """The Python function under ``jax.jit`` (fixes re-jit it with their own arguments)."""
    return getattr(fn, "__wrapped__", fn) if _is_jitted(fn) else fn


_TRACE_LOCK = threading.RLock()


def _compile(
    fn: Callable,
    abstract: Sequence[Any],
    mesh,
    jit_kwargs: Dict[str, Any],
    compiler_options: Dict[str, Any],
    dump_dir: Optional[str],
    patch: Optional[Callable[[], Any]] = None,
) -> _Compiled:
    import jax  # noqa: PLC0415

    # A fresh function object per compile: jax caches traces by function, and a fix (e.g. remat)
    # changes what tracing produces without changing `fn`.
    @functools.wraps(fn)
    def program(*a, **k):
        return fn(*a, **k)

    t0 = time.perf_counter()
    # Tracing patches jax's modules (the remat fix) and sets the mesh: one trace at a time. The
    # compile itself runs outside the lock, so fixes compile side by side (the compiler releases
    # the GIL).
    with _TRACE_LOCK, _mesh_context(mesh), patch() if patch else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donat.*")
        if not jit_kwargs and patch is None and _is_jitted(fn):
            traced = fn.trace(*abstract)  # already jitted: keep its donate_argnums, shardings...
        else:
            traced = jax.jit(program, **jit_kwargs).trace(*abstract)
        lowered = traced.lower(lowering_platforms=("tpu",))
    t1 = time.perf_counter()
    opts = dict(compiler_options)
    if dump_dir is not None:
        opts.update(xla_dump_to=dump_dir, xla_dump_hlo_as_text=True)
    try:
        compiled = lowered.compile(compiler_options=opts) if opts else lowered.compile()
    except Exception as e:  # jax.errors.JaxRuntimeError
        if not _is_oom(e):
            raise
        return _Compiled(False, None, e, time.perf_counter() - t1, t1 - t0)
    return _Compiled(True, _memory_analysis_dict(compiled), None, time.perf_counter() - t1, t1 - t0)


def _analyze(dump_dir: str, budget: int) -> Optional[Dict[str, Any]]:
    if not os.path.isdir(dump_dir) or not os.listdir(dump_dir):
        return None
    proc = run_binary(
        ["analyze", dump_dir, "--format", "json", "--budget", str(budget), "--top", "10"], ok_codes=(0, 1)
    )
    return json.loads(proc.stdout)


def _hbm_space(analysis: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if not analysis:
        return None
    best = None
    for m in analysis.get("modules", []):
        for s in m.get("memory_spaces", []):
            if s.get("space") == "hbm" and (best is None or s["total_bytes"] > best["total_bytes"]):
                best = s
    return best


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class FixResult:
    """One automatic fix, compiled: does the program fit with it, and at what peak.

    Attributes:
        name: ``donate``, ``remat:nothing_saveable``, ``remat:dots_with_no_batch_dims_saveable``,
            ``bf16_params``, ``microbatch:K``, ``compiler_remat``.
        cause: the contract cause it addresses (``no_donation``, ``no_remat``...).
        applied: false when the fix does not apply to this program (``reason`` says why).
        fits: the compiler accepted the program with the fix.
        peak_bytes: peak per device with the fix, measured by the compiler.
        savings_bytes: the program's peak minus ``peak_bytes``.
        code: how to apply the fix in your code.
    """

    name: str
    cause: str
    description: str
    code: str
    applied: bool = True
    fits: Optional[bool] = None
    peak_bytes: Optional[int] = None
    savings_bytes: Optional[int] = None
    reason: Optional[str] = None
    error: Optional[str] = None
    compile_seconds: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FitResult:
    """What :func:`fit` found. ``bool(result)`` is ``result.fits``.

    Attributes:
        fits: the TPU compiler accepted the program for the target (no ``RESOURCE_EXHAUSTED``).
        target, topology, device_kind, chips, devices: what it was compiled for.
        peak_bytes: peak HBM per device. When it fits: ``compiled.memory_analysis()
            .peak_memory_in_bytes``; when it does not: what the compiler required (the ``Used X``
            of its OOM, read exactly from the dump's buffer assignment).
        limit_bytes: HBM the compiler lets one device use (e.g. 15.75 GiB on v5e).
        hbm_per_chip_bytes: the vendor's HBM per chip (v5e 16 GiB, v6e 32, v5p 95, v4 32).
        headroom_bytes: ``limit_bytes - peak_bytes`` (negative: over by that much).
        memory_analysis: every ``*_in_bytes`` field of ``compiled.memory_analysis()`` (fits only).
        analysis: ``hbm-doctor analyze --format json`` of the compiler's dump.
        diagnosis: ``hbm-doctor explain`` of the compiler's error joined with the dump (when it
            does not fit); with ``try_fixes`` its causes are ranked by measured savings.
        error: the compiler's message when it does not fit.
        fixes: the fixes tried (``try_fixes=True``).
    """

    fits: bool
    target: str
    topology: str
    device_kind: str
    chips: int
    devices: int
    peak_bytes: Optional[int]
    limit_bytes: int
    hbm_per_chip_bytes: int
    memory_analysis: Optional[Dict[str, int]] = None
    analysis: Optional[Dict[str, Any]] = None
    diagnosis: Optional[Diagnosis] = None
    error: Optional[str] = None
    fixes: List[FixResult] = field(default_factory=list)
    function: str = ""
    compile_seconds: float = 0.0
    trace_seconds: float = 0.0
    analyze_seconds: float = 0.0
    fixes_seconds: float = 0.0
    dump_dir: Optional[str] = None

    def __bool__(self) -> bool:
        return self.fits

    @property
    def headroom_bytes(self) -> Optional[int]:
        """Usable HBM per device minus the peak; negative when the program does not fit."""
        return None if self.peak_bytes is None else self.limit_bytes - self.peak_bytes

    @property
    def hbm_total_bytes(self) -> Optional[int]:
        """What the compiler reserves in HBM per device (buffer assignment total), from the dump."""
        s = _hbm_space(self.analysis)
        return s["total_bytes"] if s else None

    def fixes_that_fit(self) -> List[FixResult]:
        """The fixes with which the program fits, largest measured savings first."""
        return sorted((f for f in self.fixes if f.fits), key=lambda f: -(f.savings_bytes or 0))

    def to_json(self) -> Dict[str, Any]:
        """A JSON-ready dict (``schema_version`` 1; the ``hbm-doctor fit --format json`` document)."""
        return {
            "schema_version": 1,
            "function": self.function,
            "target": self.target,
            "topology": self.topology,
            "device_kind": self.device_kind,
            "chips": self.chips,
            "devices": self.devices,
            "fits": self.fits,
            "peak_bytes": self.peak_bytes,
            "limit_bytes": self.limit_bytes,
            "headroom_bytes": self.headroom_bytes,
            "hbm_per_chip_bytes": self.hbm_per_chip_bytes,
            "hbm_total_bytes": self.hbm_total_bytes,
            "memory_analysis": self.memory_analysis,
            "error": self.error,
            "fixes": [f.to_json() for f in self.fixes],
            "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
            "analysis": self.analysis,
            "seconds": {
                "trace": round(self.trace_seconds, 3),
                "compile": round(self.compile_seconds, 3),
                "analyze": round(self.analyze_seconds, 3),
                "fixes": round(self.fixes_seconds, 3),
            },
        }

    def _verdict(self) -> str:
        where = f"{self.target} ({self.topology}, {self.devices} devices, {self.device_kind})"
        name = f"{self.function} on " if self.function else ""
        return f"{name}{where}: {'fits' if self.fits else 'DOES NOT FIT'}"

    def _figures(self) -> str:
        if self.peak_bytes is None:
            return f"peak per device unknown; {format_size(self.limit_bytes)} usable"
        pct = 100.0 * self.peak_bytes / self.limit_bytes
        head = self.headroom_bytes or 0
        tail = f"headroom {format_size(head)}" if head >= 0 else f"over by {format_size(-head)}"
        return (
            f"peak per device {format_size(self.peak_bytes)} of {format_size(self.limit_bytes)} usable "
            f"({pct:.0f}%; {format_size(self.hbm_per_chip_bytes)} HBM per chip): {tail}"
        )

    def _fix_rows(self) -> List[Tuple[str, str, str, str, str]]:
        rows = []
        for f in self.fixes:
            if not f.applied:
                rows.append((f.name, "n/a", "", "", f.reason or ""))
            elif f.error:
                rows.append((f.name, "error", "", "", f.error.splitlines()[0][:100]))
            else:
                sav = (
                    ""
                    if f.savings_bytes is None
                    else ("saves " if f.savings_bytes >= 0 else "costs ") + format_size(abs(f.savings_bytes))
                )
                rows.append(
                    (
                        f.name,
                        "fits" if f.fits else "no",
                        format_size(f.peak_bytes) if f.peak_bytes is not None else "?",
                        sav,
                        f.code,
                    )
                )
        return rows

    def __str__(self) -> str:
        lines = [("✓ " if self.fits else "✗ ") + self._verdict(), "  " + self._figures()]
        if self.error:
            lines.append("  compiler: " + self.error.splitlines()[0][:240])
        s = _hbm_space(self.analysis)
        if s and s.get("buffers_at_peak"):
            lines.append("  largest buffers live at the peak:")
            for b in s["buffers_at_peak"][:5]:
                where = b.get("source") or b.get("op_name") or b.get("name") or ""
                lines.append(
                    f"    {format_size(b['size_bytes']):>9}  {b.get('kind', ''):9} {b.get('shape') or '':28} {where}"
                )
        if self.fixes:
            lines.append("  fixes, compiled and measured by the TPU compiler:")
            for name, ok, peak, sav, code in self._fix_rows():
                lines.append(f"    {name:38} {ok:5} {peak:>9}  {sav:15} {code}".rstrip())
        if self.diagnosis:
            lines.append("")
            lines.append(str(self.diagnosis))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html  # noqa: PLC0415

        esc = html.escape
        color = "#1a7f37" if self.fits else "#b00020"
        parts = [
            '<div style="font-family:system-ui,sans-serif;line-height:1.35;max-width:60em">',
            f'<div style="font-weight:600;color:{color}">{"&#x2713;" if self.fits else "&#x2717;"} {esc(self._verdict())}</div>',
        ]
        if self.peak_bytes is not None:
            pct = min(100.0, 100.0 * self.peak_bytes / self.limit_bytes)
            parts.append(
                f'<div style="background:#eee;width:30em;height:.8em;border-radius:3px;margin:.3em 0">'
                f'<div style="background:{color};width:{pct:.1f}%;height:100%;border-radius:3px"></div></div>'
            )
        parts.append(f"<div>{esc(self._figures())}</div>")
        if self.error:
            parts.append(f"<div><code>{esc(self.error.splitlines()[0][:300])}</code></div>")
        if self.fixes:
            parts.append(
                '<table style="margin:.4em 0"><tr><th>fix</th><th>fits</th><th>peak</th><th>savings</th><th>how</th></tr>'
            )
            for row in self._fix_rows():
                parts.append(
                    "<tr>"
                    + "".join(
                        f"<td><code>{esc(c)}</code></td>" if i == 4 else f"<td>{esc(c)}</td>" for i, c in enumerate(row)
                    )
                    + "</tr>"
                )
            parts.append("</table>")
        if self.diagnosis:
            parts.append(self.diagnosis._repr_html_())
        parts.append("</div>")
        return "".join(parts)


@dataclass
class BatchSearch:
    """What :func:`max_batch` found.

    Attributes:
        max_batch: the largest size that compiles for the target (``None``: not even ``low``).
        fit: the full :class:`FitResult` at ``max_batch``.
        first_failing: the smallest size tried that does not fit (``None`` if none failed).
        trials: ``(size, fits, peak_bytes)`` of every compile, in order.
    """

    max_batch: Optional[int]
    fit: Optional[FitResult]
    first_failing: Optional[int]
    multiple_of: int
    trials: List[Tuple[int, bool, Optional[int]]]
    seconds: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema_version": 1,
            "max_batch": self.max_batch,
            "first_failing": self.first_failing,
            "multiple_of": self.multiple_of,
            "trials": [{"batch": b, "fits": f, "peak_bytes": p} for b, f, p in self.trials],
            "fit": self.fit.to_json() if self.fit else None,
            "seconds": round(self.seconds, 3),
        }

    def __str__(self) -> str:
        if self.max_batch is None:
            head = "✗ no batch size fits"
        else:
            head = f"✓ max batch {self.max_batch}"
            if self.first_failing is not None:
                head += f" (next multiple of {self.multiple_of}, {self.max_batch + self.multiple_of}, does not fit)"
        lines = [head, f"  {len(self.trials)} compiles in {self.seconds:.1f}s:"]
        for b, f, p in self.trials:
            lines.append(f"    {b:>10}  {'fits' if f else 'no':4}  {format_size(p) if p is not None else '?':>9}")
        if self.fit is not None:
            lines.append(str(self.fit))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Fixes
# ---------------------------------------------------------------------------------------------

# Least recompute first: the first that fits is the one to use.
_REMAT_POLICIES = ("dots_with_no_batch_dims_saveable", "nothing_saveable")
_COMPILER_REMAT = {"xla_tpu_rematerialization_algo": "PEAK_PRIORITY", "xla_tpu_pre_fusion_remat": True}


@contextlib.contextmanager
def _remat_patch(policy_name: str, counter: List[int]) -> Iterator[None]:
    """While tracing: every function given to jax.grad/value_and_grad/vjp and every lax.scan body
    is wrapped in ``jax.checkpoint(policy=...)``."""
    import jax  # noqa: PLC0415
    import jax.lax  # noqa: PLC0415

    policy = getattr(jax.checkpoint_policies, policy_name)
    orig = {"grad": jax.grad, "value_and_grad": jax.value_and_grad, "vjp": jax.vjp, "scan": jax.lax.scan}

    def ck(f):
        counter[0] += 1
        return jax.checkpoint(f, policy=policy)

    def grad(fun, *a, **k):
        return orig["grad"](ck(fun), *a, **k)

    def value_and_grad(fun, *a, **k):
        return orig["value_and_grad"](ck(fun), *a, **k)

    def vjp(fun, *primals, **k):
        return orig["vjp"](ck(fun), *primals, **k)

    def scan(f, *a, **k):
        return orig["scan"](ck(f), *a, **k)

    jax.grad, jax.value_and_grad, jax.vjp, jax.lax.scan = grad, value_and_grad, vjp, scan
    try:
        yield
    finally:
        jax.grad, jax.value_and_grad, jax.vjp, jax.lax.scan = (
            orig["grad"],
            orig["value_and_grad"],
            orig["vjp"],
            orig["scan"],
        )


def _donatable(fn, abstract, mesh, jit_kwargs, static) -> Tuple[int, ...]:
    import jax  # noqa: PLC0415

    already = jit_kwargs.get("donate_argnums") or ()
    already = (already,) if isinstance(already, int) else tuple(already)
    with _mesh_context(mesh):
        out = jax.eval_shape(jax.jit(fn, **{k: v for k, v in jit_kwargs.items() if k != "donate_argnums"}), *abstract)
    outs = {(tuple(o.shape), str(o.dtype)) for o in jax.tree_util.tree_leaves(out) if _is_array_like(o)}
    donate = []
    for i, arg in enumerate(abstract):
        if i in static or i in already:
            continue
        leaves = [x for x in jax.tree_util.tree_leaves(arg) if _is_array_like(x)]
        if any((tuple(x.shape), str(x.dtype)) in outs and _nbytes(x) >= (1 << 20) for x in leaves):
            donate.append(i)
    return tuple(donate)


def _to_bf16(abstract, param_argnums, mesh):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    changed = [0]

    def cast(x):
        if _is_array_like(x) and str(x.dtype) in ("float32", "float64"):
            changed[0] += 1
            return _sds(x, _own_spec(x), mesh, dtype=jnp.bfloat16)
        return x

    out = [jax.tree_util.tree_map(cast, a) if i in param_argnums else a for i, a in enumerate(abstract)]
    return out, changed[0]


# Optimizer state: which leaves of the non-batch arguments are parameters, which the optimizer's
# state. By name first (optax's ScaleByAdamState `mu`/`nu`, `momentum`, `trace`, a TrainState's
# `opt_state`...), then by position: a later argument whose leaves all have the shapes of the first
# non-batch argument's (the `step(params, opt_state, batch)` convention with unnamed moments).
_OPT_NAMES = frozenset(
    {
        "opt_state",
        "optimizer_state",
        "optim_state",
        "inner_state",
        "mu",
        "nu",
        "mu_hat",
        "nu_hat",
        "momentum",
        "trace",
        "exp_avg",
        "exp_avg_sq",
        "moment1",
        "moment2",
        "velocity",
        "sum_of_squares",
        "accumulator",
    }
)


def _path_names(path) -> List[str]:
    out = []
    for k in path:
        for attr in ("key", "name"):
            v = getattr(k, attr, None)
            if isinstance(v, str):
                out.append(v.lower())
    return out


def _is_float(x) -> bool:
    import jax.numpy as jnp  # noqa: PLC0415

    return _is_array_like(x) and bool(jnp.issubdtype(x.dtype, jnp.floating))  # bfloat16 too


def _state_roles(abstract, static, batch_argnums) -> Dict[Tuple[int, str], str]:
    """``{(argnum, keystr(path)): "param" | "opt"}`` for the float leaves of the non-batch arguments."""
    import jax  # noqa: PLC0415

    roles: Dict[Tuple[int, str], str] = {}
    first: Optional[set] = None
    for i, arg in enumerate(abstract):
        if i in static or i in batch_argnums:
            continue
        leaves = [(p, x) for p, x in jax.tree_util.tree_leaves_with_path(arg) if _is_float(x)]
        sigs = {(tuple(x.shape), str(x.dtype)) for _, x in leaves}
        positional = first is not None and bool(sigs) and sigs <= first
        for p, x in leaves:
            opt = positional or any(n in _OPT_NAMES for n in _path_names(p))
            roles[(i, jax.tree_util.keystr(p))] = "opt" if opt else "param"
        if first is None and sigs:
            first = sigs
    return roles


def _data_axes(mesh, abstract, batch_argnums) -> Tuple[str, ...]:
    """The mesh axes the batch's leading dim is split over (data parallelism); else the largest axis."""
    import jax  # noqa: PLC0415

    for i in batch_argnums:
        for x in jax.tree_util.tree_leaves(abstract[i]):
            if _is_array_like(x) and len(x.shape) > 0:
                spec = _own_spec(x)
                if len(spec) > 0 and spec[0] is not None:
                    return tuple(spec[0]) if isinstance(spec[0], tuple) else (spec[0],)
    return (max(mesh.shape, key=lambda a: mesh.shape[a]),)


def _shard_spec(x, mesh, axes: Tuple[str, ...]):
    """``x``'s spec with its largest dim that divides split over ``axes`` (None: none divides, or
    the leaf already uses those axes, or it is under 1 MiB)."""
    P = _P()
    d = math.prod(mesh.shape[a] for a in axes)
    spec = list(_own_spec(x))
    used = {a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,))}
    if d <= 1 or used & set(axes) or _nbytes(x) < (1 << 20):
        return None
    spec += [None] * (len(x.shape) - len(spec))
    dims = [j for j in range(len(x.shape)) if spec[j] is None and x.shape[j] % d == 0]
    if not dims:
        return None
    j = max(dims, key=lambda j: (x.shape[j], -j))
    spec[j] = axes if len(axes) > 1 else axes[0]
    while spec and spec[-1] is None:
        spec.pop()
    return P(*spec)


def _restate(fn, abstract, mesh, static, batch_argnums, choose):
    """``fn`` with some non-batch leaves re-placed: ``choose(role, leaf) -> (spec, memory_kind) | None``.

    Returns ``(program, new_abstract, changed_bytes, out_shardings)``. Inside the program, leaves placed in host
    memory are moved to the device before ``fn`` runs; outputs that are the new value of a changed
    leaf (same path in the output tuple as in the arguments, else the only input of that shape and
    dtype) are constrained to its placement, as a training loop that keeps the state so needs.
    """
    import jax  # noqa: PLC0415
    from jax.sharding import NamedSharding  # noqa: PLC0415

    roles = _state_roles(abstract, static, batch_argnums)
    placed: Dict[str, Tuple[Any, Optional[str]]] = {}  # "[i]path" -> (spec, memory_kind)
    by_sig: Dict[Tuple, set] = {}
    changed = [0]
    new_abstract = list(abstract)
    for i, arg in enumerate(abstract):
        if i in static or i in batch_argnums:
            continue

        def one(p, x, i=i):
            role = roles.get((i, jax.tree_util.keystr(p)))
            if role is None:
                return x
            got = choose(role, x)
            spec, kind = got if got is not None else (_own_spec(x), None)
            key = f"[{i}]{jax.tree_util.keystr(p)}"
            placed[key] = (spec, kind)
            by_sig.setdefault((tuple(x.shape), str(x.dtype)), set()).add((spec, kind))
            if got is None:
                return x
            changed[0] += _nbytes(x)
            sh = NamedSharding(mesh, spec, memory_kind=kind) if kind else NamedSharding(mesh, spec)
            return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=sh, weak_type=bool(getattr(x, "weak_type", False)))

        new_abstract[i] = jax.tree_util.tree_map_with_path(one, arg)
    if not changed[0]:
        return None, None, 0, None

    def to_device(p, x, i):
        spec, kind = placed.get(f"[{i}]{jax.tree_util.keystr(p)}", (None, None))
        if kind is None or not _is_array_like(x):
            return x
        return jax.device_put(x, NamedSharding(mesh, spec, memory_kind="device"))

    def program(*args):
        args = [
            a if i in static or i in batch_argnums else jax.tree_util.tree_map_with_path(lambda p, x, i=i: to_device(p, x, i), a)
            for i, a in enumerate(args)
        ]
        return fn(*args)

    # The new state keeps its placement: out_shardings, as a training loop that keeps the state so
    # passes them (None: the compiler chooses, for outputs that are not the new state).
    with _mesh_context(mesh):
        out = jax.eval_shape(program, *new_abstract)
    seq = isinstance(out, (tuple, list))

    def out_sharding(p, o):
        if not _is_array_like(o):
            return None
        key = jax.tree_util.keystr(p) if seq else "[0]" + jax.tree_util.keystr(p)
        got = placed.get(key)
        if got is None:
            cands = by_sig.get((tuple(o.shape), str(o.dtype)), set())
            got = next(iter(cands)) if len(cands) == 1 else None
        if got is None:
            return None
        spec, kind = got
        return NamedSharding(mesh, spec, memory_kind=kind) if kind else NamedSharding(mesh, spec)

    out_shardings = jax.tree_util.tree_map_with_path(out_sharding, out)
    program.__name__ = getattr(fn, "__name__", "program")
    return program, new_abstract, changed[0], out_shardings


def _microbatched(fn, k: int, batch_argnums: Sequence[int], abstract, mesh, static=(), donate=()):
    """One call of gradient accumulation over ``k`` micro-batches, as ``optax.MultiSteps`` runs
    it: ``fn`` on 1/k of the batch arguments' leading dim (each keeps its sharding), plus an
    accumulator the size of the parameters (the non-batch float leaves that are not optimizer
    state) carried from call to call, donated when the state is. The program computes what the
    micro-batched training loop computes on each call; nothing is averaged as if it were a gradient.

    Returns ``((program, args, donate_argnums), None)`` or ``(None, reason)``.
    """
    import jax  # noqa: PLC0415

    leaves = [
        x
        for i in batch_argnums
        for x in jax.tree_util.tree_leaves(abstract[i])
        if _is_array_like(x) and len(x.shape) > 0
    ]
    if not leaves:
        return None, "no batch argument with a leading dimension"
    B = leaves[0].shape[0]
    for x in leaves:
        if x.shape[0] == B:
            sh = _shards(mesh, _own_spec(x), 0)
            if B % k or (B // k) % sh:
                return (
                    None,
                    f"batch {B} does not split into {k} micro-batches of a multiple of {sh} (the shards of its dim 0)",
                )
    n = B // k

    def chunk_sds(x):
        if _is_array_like(x) and len(x.shape) > 0 and x.shape[0] == B:
            return _sds(jax.ShapeDtypeStruct((n, *x.shape[1:]), x.dtype), _own_spec(x), mesh)
        return x

    args = [jax.tree_util.tree_map(chunk_sds, a) if i in batch_argnums else a for i, a in enumerate(abstract)]
    roles = _state_roles(abstract, static, batch_argnums)
    acc = [
        x
        for i, a in enumerate(abstract)
        if i not in static and i not in batch_argnums
        for p, x in jax.tree_util.tree_leaves_with_path(a)
        if roles.get((i, jax.tree_util.keystr(p))) == "param"
    ]

    def program(*a):
        *user, grads_acc = a
        out = fn(*user)
        return out, [g * 0.5 for g in grads_acc]  # acc <- acc + grads, as cheap as it gets

    program.__name__ = getattr(fn, "__name__", "program")
    state_donated = any(i in donate for i in range(len(abstract)) if i not in batch_argnums and i not in static)
    new_donate = tuple(sorted(set(donate) | ({len(abstract)} if state_donated else set())))
    return (program, [*args, acc], new_donate), None


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------


def _peak_of_failure(comp: _Compiled, analysis, diag: Optional[Diagnosis]) -> Optional[int]:
    s = _hbm_space(analysis)
    if s is not None:
        return int(s["total_bytes"])
    if diag is not None and diag.used_bytes is not None:
        return diag.used_bytes
    return None


def _measure(
    fn, abstract, mesh, jit_kwargs, compiler_options, limit, patch=None, analyze=True
) -> Tuple[_Compiled, Optional[int], Optional[dict], Optional[Diagnosis], Optional[str], float]:
    """Compiles once; returns (compiled, peak, analysis, diagnosis, dump_dir, analyze_seconds)."""
    tmp = tempfile.mkdtemp(prefix="hbm-doctor-fit-") if analyze else None
    try:
        comp = _compile(fn, abstract, mesh, jit_kwargs, compiler_options, tmp, patch)
        t = time.perf_counter()
        diag = None
        if not comp.fits:
            # explain reads the compiler's message (its figures, the event); the causes come from
            # analyze of the dump (_one_story). They run side by side.
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(explain, exception_text(comp.exception))
                analysis = _analyze(tmp, limit) if analyze else None
                diag = pending.result()
            peak = _peak_of_failure(comp, analysis, diag)
        else:
            analysis = _analyze(tmp, limit) if analyze else None
            peak = comp.memory_analysis.get("peak_memory_in_bytes") if comp.memory_analysis else None
        return comp, peak, analysis, diag, tmp, time.perf_counter() - t
    except BaseException:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _one_story(diag: Diagnosis, analysis: Optional[dict], peak: Optional[int], limit: int, where: str) -> Diagnosis:
    """fit's diagnosis: the event of the compiler's message (explain) with the category, ranked
    causes, ledger and what-ifs of ``hbm-doctor analyze`` on the same dump (the engine every
    command uses), and one set of figures: the exact peak of the buffer assignment against the
    limit, in the headline and in the figures alike."""
    if not analysis or peak is None:
        return diag
    ad = analysis.get("diagnosis") or {}
    doc = json.loads(json.dumps(diag.raw)) if diag.raw else {"schema_version": 1, "events": []}
    main = (doc.get("diagnosis") or {}).get("event")
    events = doc.get("events") or []
    if main is not None and main < len(events):
        # The message rounds to 0.01G; the dump's buffer assignment has the same figure in bytes.
        events[main].update(used_bytes=peak, limit_bytes=limit, exceeded_bytes=max(0, peak - limit))
    over = peak - limit
    verdict = f"{format_size(over)} over" if over > 0 else f"{format_size(-over)} to spare"
    summary = (
        f"Out of HBM at compile time on {where}: needs {format_size(peak)} per device but "
        f"{format_size(limit)} is available ({verdict}, {100.0 * peak / limit:.0f}% of the limit)."
    )
    d = dict(doc.get("diagnosis") or {})
    d.update(
        category=ad.get("category", d.get("category")),
        causes=ad.get("causes", []),
        summary=summary,
        ledger=ad.get("ledger", d.get("ledger", [])),
        engine="analyze",
    )
    if ad.get("what_if"):
        d["what_if"] = ad["what_if"]
    doc["diagnosis"] = d
    return Diagnosis.from_json(doc)


def _rank_by_measured(diag: Diagnosis, fixes: List[FixResult]) -> None:
    best: Dict[str, FixResult] = {}
    for f in fixes:
        if not f.applied or f.error or f.savings_bytes is None:
            continue
        cur = best.get(f.cause)
        if cur is None or (bool(f.fits), f.savings_bytes) > (bool(cur.fits), cur.savings_bytes):
            best[f.cause] = f
    present = set()
    for c in diag.causes:
        f = best.get(c.cause)
        if f is not None:
            c.measured_savings_bytes, c.measured_fits, c.fix = f.savings_bytes, f.fits, f.name
            present.add(c.cause)
    for cause, f in best.items():
        if cause in present:
            continue
        diag.causes.append(
            Cause(
                cause=cause,
                savings_bytes=None,
                evidence=f"measured: with {f.name} the compiler needs {format_size(f.peak_bytes or 0)} per device",
                actions=[f.description],
                snippets=[{"framework": "jax", "code": f.code}],
                measured_savings_bytes=f.savings_bytes,
                measured_fits=f.fits,
                fix=f.name,
            )
        )
    order = {id(c): i for i, c in enumerate(diag.causes)}

    def key(c: Cause):
        m = c.measured_savings_bytes
        if m is not None and m > 0:
            return (0 if c.measured_fits else 1, -m, order[id(c)])
        if m is None:
            return (2, 0, order[id(c)])
        return (3, -m, order[id(c)])

    diag.causes.sort(key=key)


def fit(
    fn: Callable,
    *args: Any,
    target: str = "v5e-8",
    mesh: Any = None,
    in_specs: Any = None,
    batch_argnums: Optional[Sequence[int]] = None,
    try_fixes: bool = False,
    compiler_options: Optional[Dict[str, Any]] = None,
    keep_dump: Optional[Union[str, os.PathLike]] = None,
    progress: Optional[bool] = None,
    **jit_kwargs: Any,
) -> FitResult:
    """Compiles ``fn(*args)`` for a TPU target, deviceless, and says whether it fits.

    Args:
        fn: the step function. A ``jax.jit`` object is compiled as it is (its own
            ``donate_argnums``, shardings...) when no ``jit_kwargs`` are given; fixes re-jit the
            function under it.
        *args: abstract arguments: pytrees of ``jax.ShapeDtypeStruct`` (or arrays: only their
            shapes and dtypes are used). A leaf's own ``NamedSharding`` spec is kept.
        target: ``"v5e-8"``, ``"v6e-4"``, ``"v5p-8"``, ``"v4-8"``, ``"v5e"`` (one chip) or a
            topology ``"v5e:2x4"`` (see :func:`target`).
        mesh: ``None`` (one axis ``"data"`` over all devices), ``{"data": 4, "model": 2}``, a
            ``Mesh`` (re-created over the target's devices with the same axes), or
            ``callable(devices) -> Mesh``. Active while tracing, so ``P("data")`` constraints work.
        in_specs: ``PartitionSpec`` for every argument, or one entry per argument (a spec or a
            tree of specs); default: each leaf's own spec, else replicated.
        batch_argnums: the arguments holding the batch (micro-batching, ``max_batch``; the other
            arguments are the parameters for ``bf16_params``). Default: the last argument.
        try_fixes: also compile with each automatic fix and measure it (see :class:`FixResult`).
        compiler_options: passed to the TPU compiler (``{"xla_tpu_...": ...}``; never put TPU
            flags in ``XLA_FLAGS``).
        keep_dump: copy the compiler's dump of the program there (it is deleted otherwise).
        progress: one line on stderr per fix compiled (which fix, the time so far); default: when
            stderr is a terminal.
        **jit_kwargs: passed to ``jax.jit`` (``donate_argnums``, ``static_argnums``, ...).

    Returns:
        A :class:`FitResult`; ``bool(result)`` is whether it fits.

    Raises:
        Any error of tracing or compiling that is not an out-of-memory error (a bug in ``fn``, a
        sharding that does not divide...), as jax raises it.

    Example:
        >>> r = fit(step, params, batch, target="v6e-8", in_specs=(P(), P("data")))  # doctest: +SKIP
        >>> print(r.fits, r.peak_bytes, r.headroom_bytes)                              # doctest: +SKIP
    """
    _require_jax_tpu()
    tgt = globals()["target"](target) if isinstance(target, str) else target
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return _fit_on(
        tgt, fn, args, mesh, in_specs, batch_argnums, try_fixes, compiler_options, keep_dump, jit_kwargs, progress=progress
    )


def _fit_on(
    tgt,
    fn,
    args,
    mesh,
    in_specs,
    batch_argnums,
    try_fixes,
    compiler_options,
    keep_dump,
    jit_kwargs,
    analyze=True,
    progress=False,
) -> FitResult:
    jit_kwargs = dict(jit_kwargs)
    user_opts = dict(jit_kwargs.pop("compiler_options", None) or {})
    user_opts.update(compiler_options or {})
    for k in user_opts:
        if not k.startswith("xla_"):
            raise ValueError(
                f"compiler option {k!r}: options are XLA/TPU flag names without dashes, e.g. xla_tpu_rematerialization_algo"
            )
    m = _resolve_mesh(tgt, mesh)
    static = _static_argnums(jit_kwargs)
    abstract = _abstract_args(args, in_specs, m, static)
    limit = tgt.usable_bytes
    comp, peak, analysis, diag, dump, a_secs = _measure(fn, abstract, m, jit_kwargs, user_opts, limit, analyze=analyze)
    if diag is not None:
        diag = _one_story(diag, analysis, peak, limit, f"{tgt.name} ({tgt.generation.kind})")
    try:
        if keep_dump is not None and dump:
            shutil.copytree(dump, os.fspath(keep_dump), dirs_exist_ok=True)
    finally:
        if dump:
            shutil.rmtree(dump, ignore_errors=True)
    res = FitResult(
        fits=comp.fits,
        target=tgt.name,
        topology=tgt.topology,
        device_kind=tgt.generation.kind,
        chips=tgt.chips,
        devices=len(m.devices.flat),
        peak_bytes=peak,
        limit_bytes=limit,
        hbm_per_chip_bytes=tgt.generation.hbm_per_chip_bytes,
        memory_analysis=comp.memory_analysis,
        analysis=analysis,
        diagnosis=diag,
        error=None if comp.fits else str(comp.exception).strip(),
        function=getattr(fn, "__name__", type(fn).__name__),
        compile_seconds=comp.compile_seconds,
        trace_seconds=comp.trace_seconds,
        analyze_seconds=a_secs,
        dump_dir=os.fspath(keep_dump) if keep_dump is not None else None,
    )
    if try_fixes:
        t = time.perf_counter()
        batch = tuple(batch_argnums) if batch_argnums is not None else _default_batch_argnums(len(args), static)
        res.fixes = _try_fixes(
            _unjitted(fn), abstract, m, jit_kwargs, user_opts, limit, peak, static, batch, res.fits, progress=progress
        )
        res.fixes_seconds = time.perf_counter() - t
        if res.diagnosis is not None:
            _rank_by_measured(res.diagnosis, res.fixes)
    return res


class _Progress:
    """One line per fix on stderr when it starts and when it ends, with the time so far."""

    def __init__(self, enabled: bool, total: int = 0):
        self.enabled, self.t0, self.lock = enabled, time.perf_counter(), threading.Lock()

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            sys.stderr.write(f"hbm-doctor fit: [{time.perf_counter() - self.t0:5.1f}s] {text}\n")
            sys.stderr.flush()


def _fit_jobs() -> int:
    """Fix families compiled at a time: ``$HBM_DOCTOR_FIT_JOBS``, else one per 4 cores the process
    may use (the TPU compiler runs several threads per compile: on 2 cores, two compiles side by
    side took 1.5x longer than one after the other)."""
    env = os.environ.get("HBM_DOCTOR_FIT_JOBS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 4)


def _hbm_peak(comp: _Compiled) -> Optional[int]:
    """The HBM peak of a program that fits: ``memory_analysis()`` counts ``pinned_host`` buffers in
    its peak too, so host arguments, outputs and temporaries are taken off."""
    ma = comp.memory_analysis or {}
    peak = ma.get("peak_memory_in_bytes")
    if peak is None:
        return None
    host = sum(ma.get(k, 0) for k in ("host_argument_size_in_bytes", "host_output_size_in_bytes", "host_temp_size_in_bytes"))
    return peak - host + ma.get("host_alias_size_in_bytes", 0) if host else peak


def _try_fixes(
    fn, abstract, mesh, jit_kwargs, opts, limit, base_peak, static, batch_argnums, base_fits, progress=False
) -> List[FixResult]:
    """Every automatic fix, compiled and measured. Fixes come in families tried one after the other
    until one fits (micro-batches 2, 4, 8, 16; remat policies from the least recompute; ZeRO-1
    then FSDP); families compile side by side, as many as there are cores."""
    name = getattr(fn, "__name__", "step")
    prev = jit_kwargs.get("donate_argnums") or ()
    prev = (prev,) if isinstance(prev, int) else tuple(prev)
    prog = _Progress(progress)

    def run(fix: FixResult, f=fn, a=abstract, kw=jit_kwargs, o=opts, patch=None) -> FixResult:
        prog.say(f"{fix.name}: compiling")
        t = time.perf_counter()
        try:
            comp, peak, _, _, dump, _ = _measure(f, a, mesh, kw, o, limit, patch=patch, analyze=False)
            if comp.fits:
                peak = _hbm_peak(comp)
            fix.fits, fix.peak_bytes, fix.compile_seconds = comp.fits, peak, comp.compile_seconds
            if not comp.fits and peak is None:
                fix.error = str(comp.exception).strip()
            if peak is not None and base_peak is not None:
                fix.savings_bytes = base_peak - peak
        except Exception as e:  # the transformed program did not trace or compile
            fix.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        verdict = "error" if fix.error else ("fits" if fix.fits else "does not fit")
        peak_s = f", {format_size(fix.peak_bytes)}" if fix.peak_bytes is not None else ""
        prog.say(f"{fix.name}: {verdict}{peak_s} ({time.perf_counter() - t:.1f}s)")
        return fix

    def not_applied(fix: FixResult, why: str) -> FixResult:
        fix.applied, fix.reason = False, why
        return fix

    # Each family is a list of steps; a step returns its FixResult and whether to go on.
    def donate_family() -> List[FixResult]:
        fix = FixResult(
            "donate", "no_donation", "donate the arguments whose buffers an output can reuse", f"jax.jit({name}, donate_argnums=...)"
        )
        try:
            with _TRACE_LOCK:
                donate = _donatable(fn, abstract, mesh, jit_kwargs, static)
        except Exception as e:
            return [not_applied(fix, f"outputs could not be computed: {e}")]
        if not donate:
            return [not_applied(fix, "no argument has a same-shaped output of 1 MiB or more (or it is already donated)")]
        fix.description = f"donate arguments {donate} whose buffers an output can reuse"
        fix.code = f"jax.jit({name}, donate_argnums={donate})"
        return [run(fix, kw={**jit_kwargs, "donate_argnums": tuple(sorted(set(prev) | set(donate)))})]

    def remat_family() -> List[FixResult]:
        out = []
        for pol in _REMAT_POLICIES:
            counter = [0]
            fix = FixResult(
                f"remat:{pol}",
                "no_remat",
                f"jax.checkpoint with policy {pol} on the functions given to jax.grad/value_and_grad/vjp and on lax.scan bodies",
                f"jax.checkpoint(layer, policy=jax.checkpoint_policies.{pol})  # each layer / the scanned block",
            )
            run(fix, patch=functools.partial(_remat_patch, pol, counter))
            if counter[0] == 0 and not fix.error:
                fix.fits = fix.peak_bytes = fix.savings_bytes = None
                out.append(not_applied(fix, "no jax.grad/value_and_grad/vjp or lax.scan call while tracing"))
                break
            out.append(fix)
            if fix.fits or base_fits:
                break
        return out

    def bf16_family() -> List[FixResult]:
        params = tuple(i for i in range(len(abstract)) if i not in static and i not in batch_argnums)
        cast, changed = _to_bf16(abstract, params, mesh)
        fix = FixResult(
            "bf16_params",
            "f32_precision",
            "parameters (the non-batch arguments) in bfloat16",
            "params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)  # f32 master copy in the optimizer if needed",
        )
        return [run(fix, a=cast)] if changed else [not_applied(fix, "no float32 parameter")]

    def microbatch_family() -> List[FixResult]:
        out = []
        for k in (2, 4, 8, 16):
            fix = FixResult(
                f"microbatch:{k}",
                "batch_too_large",
                f"{k} micro-batches per step with gradient accumulation: each call takes 1/{k} of the batch "
                "and carries a gradient accumulator the size of the parameters",
                f"optax.MultiSteps(opt, every_k_schedule={k}) with 1/{k} of the batch per call",
            )
            try:
                with _TRACE_LOCK:
                    built, why = _microbatched(fn, k, batch_argnums, abstract, mesh, static, prev)
            except Exception as e:
                built, why = None, f"{type(e).__name__}: {e}"
            if built is None:
                out.append(not_applied(fix, why))
                break
            f, a, donate = built
            out.append(run(fix, f=f, a=a, kw={**jit_kwargs, "donate_argnums": donate} if donate else jit_kwargs))
            if fix.fits or base_fits or fix.error or (fix.savings_bytes is not None and fix.savings_bytes <= 0):
                break  # fits, or more micro-batches will not help
        return out

    axes = _data_axes(mesh, abstract, batch_argnums)
    axis_s = "+".join(axes)
    d = math.prod(mesh.shape[a] for a in axes)

    def shard_family() -> List[FixResult]:
        out = []
        for fname, roles_, what, code in (
            (
                "zero1",
                ("opt",),
                f"the optimizer state (Adam moments...) sharded over the data axis {axis_s!r} ({d} ways), "
                "parameters replicated (ZeRO-1)",
                f"opt_state = jax.device_put(opt_state, NamedSharding(mesh, P({axis_s!r})))  # on its largest dim that divides, and the same out_shardings",
            ),
            (
                "fsdp",
                ("opt", "param"),
                f"parameters and optimizer state sharded over the data axis {axis_s!r} ({d} ways), "
                "gathered layer by layer by the compiler (FSDP / ZeRO-3)",
                f"params, opt_state = jax.device_put((params, opt_state), NamedSharding(mesh, P({axis_s!r})))  # largest dim that divides; same out_shardings",
            ),
        ):
            fix = FixResult(fname, "optimizer_state_unsharded" if fname == "zero1" else "replicated_tensor", what, code)
            with _TRACE_LOCK:
                f, a, nbytes, out_sh = _restate(
                    fn,
                    abstract,
                    mesh,
                    static,
                    batch_argnums,
                    lambda role, x, r=roles_: (s, None) if role in r and (s := _shard_spec(x, mesh, axes)) is not None else None,
                )
            if f is None:
                why = (
                    f"one device on the data axis {axis_s!r}: nothing to shard over"
                    if d <= 1
                    else ("no optimizer state found (by name: mu, nu, opt_state...; or an argument shaped like the parameters)"
                          if fname == "zero1" else "no parameter or state leaf of 1 MiB or more with a dim divisible by " + str(d))
                )
                out.append(not_applied(fix, why))
                continue
            fix.description += f"; {format_size(nbytes)} of arguments sharded"
            out.append(run(fix, f=f, a=a, kw={**jit_kwargs, "out_shardings": out_sh}))
            if fix.fits or base_fits:
                break
        return out

    def offload_family() -> List[FixResult]:
        fix = FixResult(
            "offload_opt_state",
            "optimizer_state_unsharded",
            "the optimizer state kept in host memory (pinned_host) between steps, brought to the device for the update",
            "opt_state = jax.device_put(opt_state, NamedSharding(mesh, P(), memory_kind='pinned_host'))  # and the same out_shardings",
        )
        with _TRACE_LOCK:
            f, a, nbytes, out_sh = _restate(
                fn, abstract, mesh, static, batch_argnums, lambda role, x: (_own_spec(x), "pinned_host") if role == "opt" else None
            )
        if f is None:
            return [not_applied(fix, "no optimizer state found (by name: mu, nu, opt_state...; or an argument shaped like the parameters)")]
        fix.description += f"; {format_size(nbytes)} offloaded"
        return [run(fix, f=f, a=a, kw={**jit_kwargs, "out_shardings": out_sh})]

    def compiler_remat_family() -> List[FixResult]:
        flags = " ".join(f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in _COMPILER_REMAT.items())
        fix = FixResult(
            "compiler_remat",
            "no_remat",
            "the TPU compiler's peak-priority rematerialization and pre-fusion remat (compile time for memory; last resort)",
            f"LIBTPU_INIT_ARGS='{flags}' (or compiler_options; never XLA_FLAGS)",
        )
        return [run(fix, o={**opts, **_COMPILER_REMAT})]

    families = [
        donate_family,
        remat_family,
        bf16_family,
        microbatch_family,
        shard_family,
        offload_family,
        compiler_remat_family,
    ]
    jobs = min(_fit_jobs(), len(families))
    prog.say(f"trying {len(families)} families of fixes, {jobs} at a time")
    if jobs <= 1:
        results = [fam() for fam in families]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            results = [fut.result() for fut in [pool.submit(fam) for fam in families]]
    return [f for fam in results for f in fam]


# ---------------------------------------------------------------------------------------------
# max_batch
# ---------------------------------------------------------------------------------------------


def _resize(args, batch_argnums, axis, old, new):
    import jax  # noqa: PLC0415

    def f(x):
        if _is_array_like(x) and len(x.shape) > axis and x.shape[axis] == old:
            shape = list(x.shape)
            shape[axis] = new
            return jax.ShapeDtypeStruct(
                tuple(shape),
                x.dtype,
                sharding=getattr(x, "sharding", None),
                weak_type=bool(getattr(x, "weak_type", False)),
            )
        return x

    return tuple(jax.tree_util.tree_map(f, a) if i in batch_argnums else a for i, a in enumerate(args))


def max_batch(
    fn: Callable,
    *args: Any,
    target: str = "v5e-8",
    mesh: Any = None,
    in_specs: Any = None,
    batch_argnums: Optional[Sequence[int]] = None,
    axis: int = 0,
    multiple_of: Optional[int] = None,
    low: int = 1,
    high: Optional[int] = None,
    compiler_options: Optional[Dict[str, Any]] = None,
    **jit_kwargs: Any,
) -> BatchSearch:
    """The largest batch (or any other dimension) for which ``fn`` fits the target.

    Two forms:

    * ``max_batch(fn, *abstract_args, ...)``: dimension ``axis`` of every leaf of the batch
      arguments (``batch_argnums``, default the last argument) that has the same size as the first
      such leaf is resized.
    * ``max_batch(build, ...)`` with no args: ``build(n)`` returns a :class:`Program` (or
      ``(fn, args)`` / ``(fn, args, jit_kwargs)``) for size ``n``, so any dimension can be searched
      (sequence length, number of layers...).

    The search doubles from the current size (or ``multiple_of``) until a compile fails, then
    bisects; each step is one deviceless compile. Sizes are multiples of ``multiple_of`` (default:
    how many shards the dimension is split into, so that every size divides; for builders,
    the number of devices).

    Returns:
        A :class:`BatchSearch` with ``max_batch``, the full :class:`FitResult` at that size and
        every trial.

    Example:
        >>> b = max_batch(step, params, batch, target="v5e-8", in_specs=(P(), P("data")))  # doctest: +SKIP
        >>> b.max_batch                                                                        # doctest: +SKIP
        8064
    """
    t_start = time.perf_counter()
    _require_jax_tpu()
    tgt = globals()["target"](target) if isinstance(target, str) else target
    user_opts = dict(compiler_options or {})

    if args:
        static = _static_argnums(jit_kwargs)
        batch = tuple(batch_argnums) if batch_argnums is not None else _default_batch_argnums(len(args), static)
        m = _resolve_mesh(tgt, mesh)
        abstract = _abstract_args(args, in_specs, m, static)
        import jax  # noqa: PLC0415

        leaves = [
            x
            for i in batch
            for x in jax.tree_util.tree_leaves(abstract[i])
            if _is_array_like(x) and len(x.shape) > axis
        ]
        if not leaves:
            raise ValueError(f"no leaf of the batch arguments {batch} has a dimension {axis}")
        start = leaves[0].shape[axis]
        if multiple_of is None:
            multiple_of = 1
            for x in leaves:
                if x.shape[axis] == start:
                    s = _shards(m, _own_spec(x), axis)
                    multiple_of = multiple_of * s // math.gcd(multiple_of, s)

        def program_for(n):
            return fn, _resize(abstract, batch, axis, start, n), m, None, dict(jit_kwargs)

    else:
        start = None
        # A builder usually shards the batch over every device.
        multiple_of = multiple_of or len(_resolve_mesh(tgt, mesh).devices.flat)

        def program_for(n):
            p = Program.coerce(fn(n))
            kw = {**jit_kwargs, **p.jit_kwargs}
            pm = _resolve_mesh(tgt, p.mesh if p.mesh is not None else mesh)
            st = _static_argnums(kw)
            spec = p.in_specs if p.in_specs is not None else in_specs
            return p.fn, _abstract_args(p.args, spec, pm, st), pm, None, kw

    trials: List[Tuple[int, bool, Optional[int]]] = []
    cache: Dict[int, bool] = {}

    def fits(n: int) -> bool:
        if n in cache:
            return cache[n]
        f, a, pm, _, kw = program_for(n)
        comp = _compile(f, a, pm, kw, user_opts, None)
        if comp.fits:
            peak = comp.memory_analysis.get("peak_memory_in_bytes") if comp.memory_analysis else None
        else:
            d = explain(str(comp.exception))
            peak = d.used_bytes
        trials.append((n, comp.fits, peak))
        cache[n] = comp.fits
        return comp.fits

    q = multiple_of
    lo_units = max(1, -(-low // q))  # ceil(low / q)
    cur = max(lo_units, (start or q) // q)
    if high is not None:
        cur = min(cur, high // q)
    good: Optional[int] = None
    bad: Optional[int] = None
    if fits(cur * q):
        good = cur
        while True:
            nxt = cur * 2
            if high is not None and nxt * q > high:
                nxt = high // q
                if nxt <= cur:
                    break
            if nxt > (1 << 40):
                break
            if fits(nxt * q):
                good = cur = nxt
                if high is not None and nxt * q >= high:
                    break
            else:
                bad = nxt
                break
    else:
        bad = cur
        while cur > lo_units:
            cur = max(lo_units, cur // 2)
            if fits(cur * q):
                good = cur
                break
            bad = cur
    if good is not None and bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid * q):
                good = mid
            else:
                bad = mid
    best = good * q if good is not None else None
    full = None
    if best is not None:
        f, a, pm, _, kw = program_for(best)
        full = _fit_on(tgt, f, a, pm, None, batch_argnums, False, user_opts, None, kw)
    return BatchSearch(
        max_batch=best,
        fit=full,
        first_failing=bad * q if bad is not None else None,
        multiple_of=q,
        trials=trials,
        seconds=time.perf_counter() - t_start,
    )
