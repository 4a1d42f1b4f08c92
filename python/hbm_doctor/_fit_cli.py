"""The Python side of ``hbm-doctor fit SCRIPT:FUNCTION`` (the Rust subcommand runs this).

Run it directly too: ``python -m hbm_doctor._fit_cli train.py:make_step --target v5p-8``.
Exit codes: 0 fits, 1 does not fit, 2 error (a one-line message on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
from typing import Any, Dict, Optional, Sequence

_DTYPES = {
    "f32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "f16": "float16",
    "float16": "float16",
    "f64": "float64",
    "float64": "float64",
    "s32": "int32",
    "i32": "int32",
    "int32": "int32",
    "s64": "int64",
    "i64": "int64",
    "int64": "int64",
    "s8": "int8",
    "i8": "int8",
    "int8": "int8",
    "u8": "uint8",
    "uint8": "uint8",
    "u32": "uint32",
    "uint32": "uint32",
    "pred": "bool",
    "bool": "bool",
}


class UsageError(Exception):
    """Bad command line or program: exit 2 with the message."""


def parse_arg_spec(text: str):
    """``f32[8192,1024]@data`` -> (ShapeDtypeStruct, PartitionSpec)."""
    import jax  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    m = re.fullmatch(r"\s*(\w+)\[([0-9,\s]*)\](?:@(.*))?\s*", text)
    if not m or m.group(1).lower() not in _DTYPES:
        raise UsageError(
            f"--arg {text!r}: write DTYPE[DIMS] with an optional @SPEC, e.g. f32[8192,1024]@data or bf16[4,2048,512]@data,_,model"
        )
    dims = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
    spec = P()
    if m.group(3):
        axes = [
            None if a in ("_", "", "None", "none") else (tuple(a.split("+")) if "+" in a else a)
            for a in m.group(3).split(",")
        ]
        if len(axes) > len(dims):
            raise UsageError(f"--arg {text!r}: the spec has more entries than the shape has dims")
        spec = P(*axes)
    return jax.ShapeDtypeStruct(dims, _DTYPES[m.group(1).lower()]), spec


def parse_mesh(text: Optional[str]) -> Optional[Dict[str, int]]:
    if not text:
        return None
    out: Dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name or not size.lstrip("-").isdigit():
            raise UsageError(f"--mesh {text!r}: write AXIS=N,... e.g. data=8 or data=4,model=-1")
        out[name.strip()] = int(size)
    return out


def parse_ints(text: Optional[str]) -> Optional[tuple]:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{text!r}: expected comma-separated argument numbers, e.g. 0,1") from None


def parse_option(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("xla_"):
        raise UsageError(
            f"--compiler-option {text!r}: write xla_..._flag=VALUE (no dashes), e.g. xla_tpu_rematerialization_algo=PEAK_PRIORITY"
        )
    low = value.lower()
    if low in ("true", "false"):
        return key, low == "true"
    if re.fullmatch(r"-?\d+", value):
        return key, int(value)
    return key, value


def load_target(ref: str):
    """``path/to/script.py:name`` or ``package.module:name`` -> the object."""
    path, sep, name = ref.rpartition(":")
    if not sep or not name or not path:
        raise UsageError(f"{ref!r}: write SCRIPT.py:FUNCTION or package.module:FUNCTION")
    if path.endswith(".py") or os.path.sep in path:
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file")
        script_dir = os.path.dirname(os.path.abspath(path))
        sys.path.insert(0, script_dir)
        spec = importlib.util.spec_from_file_location("hbm_doctor_fit_target", os.path.abspath(path))
        module = importlib.util.module_from_spec(spec)
        sys.modules["hbm_doctor_fit_target"] = module
        spec.loader.exec_module(module)  # not __main__: `if __name__ == "__main__"` blocks do not run
    else:
        module = importlib.import_module(path)
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{ref!r}: {path} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="hbm-doctor fit", description="Does a JAX program fit a TPU topology? (docs/fit.md)"
    )
    ap.add_argument("program", help="SCRIPT.py:FUNCTION or package.module:FUNCTION")
    ap.add_argument("--target", "-t", default="v5e-8")
    ap.add_argument("--arg", dest="args", action="append", default=[], metavar="SHAPE[@SPEC]")
    ap.add_argument("--mesh")
    ap.add_argument("--try-fixes", action="store_true")
    ap.add_argument("--max-batch", action="store_true")
    ap.add_argument("--batch-argnums")
    ap.add_argument("--donate-argnums")
    ap.add_argument("--compiler-option", dest="compiler_options", action="append", default=[])
    ap.add_argument("--keep-dump")
    ap.add_argument("--format", "-f", choices=("human", "json"), default="human")
    ap.add_argument("--color", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        return _run(a)
    except UsageError as e:
        sys.stderr.write(f"hbm-doctor: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        return 2
    except Exception as e:  # a bug in the user's program, or a compile error that is not an OOM
        if type(e).__name__ in ("TargetError", "MissingDependency"):  # already one line that says what to do
            sys.stderr.write(f"hbm-doctor: error: {e}\n")
            return 2
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        sys.stderr.write(f"hbm-doctor: error: {type(e).__name__}: {first}\n")
        if os.environ.get("HBM_DOCTOR_DEBUG"):
            raise
        sys.stderr.write("hbm-doctor: (set HBM_DOCTOR_DEBUG=1 for the traceback)\n")
        return 2


def _run(a) -> int:
    from hbm_doctor import jax as hj  # noqa: PLC0415

    try:
        hj._require_jax_tpu()
        hj.parse_target(a.target)  # a typo is reported before the script is imported
    except (hj.MissingDependency, hj.TargetError) as e:
        hint = ", or pass --python" if isinstance(e, hj.MissingDependency) else ""
        raise UsageError(f"{e}{hint}") from None

    obj = load_target(a.program)
    jit_kwargs: Dict[str, Any] = {}
    donate = parse_ints(a.donate_argnums)
    if donate:
        jit_kwargs["donate_argnums"] = donate
    opts = dict(parse_option(o) for o in a.compiler_options)
    mesh = parse_mesh(a.mesh)
    batch = parse_ints(a.batch_argnums)

    if a.args:
        if not callable(obj):
            raise UsageError(f"{a.program} is not callable")
        parsed = [parse_arg_spec(s) for s in a.args]
        fn, args, specs = obj, tuple(p[0] for p in parsed), tuple(p[1] for p in parsed)
        builder = None
    else:
        builder = obj
        fn = args = specs = None

    if a.max_batch:
        if builder is not None:
            res = hj.max_batch(builder, target=a.target, mesh=mesh, compiler_options=opts, **jit_kwargs)
        else:
            res = hj.max_batch(
                fn,
                *args,
                target=a.target,
                mesh=mesh,
                in_specs=specs,
                batch_argnums=batch,
                compiler_options=opts,
                **jit_kwargs,
            )
        _print(res, a.format)
        return 0 if res.max_batch is not None else 1

    if builder is not None:
        try:
            prog = hj.Program.coerce(
                builder() if callable(builder) and not isinstance(builder, hj.Program) else builder
            )
        except TypeError as e:
            raise UsageError(
                f"{a.program}: without --arg it must be a builder returning (fn, args), (fn, args, jit_kwargs) or hbm_doctor.jax.Program ({e}); or pass --arg for each argument"
            ) from None
        fn, args, specs = prog.fn, prog.args, prog.in_specs
        jit_kwargs = {**prog.jit_kwargs, **jit_kwargs}
        mesh = prog.mesh if prog.mesh is not None and mesh is None else mesh
        batch = batch if batch is not None else prog.batch_argnums
    res = hj.fit(
        fn,
        *args,
        target=a.target,
        mesh=mesh,
        in_specs=specs,
        batch_argnums=batch,
        try_fixes=a.try_fixes,
        compiler_options=opts,
        keep_dump=a.keep_dump,
        progress=a.try_fixes and os.environ.get("HBM_DOCTOR_PROGRESS", "1") != "0",
        **jit_kwargs,
    )
    _print(res, a.format)
    return 0 if res.fits else 1


def _print(res, fmt: str) -> None:
    if fmt == "json":
        json.dump(res.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(str(res) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
