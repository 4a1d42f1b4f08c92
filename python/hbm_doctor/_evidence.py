"""Evidence captured inside the failing process: what held the memory (docs/evidence.md).

At an out-of-memory failure, :func:`capture` reads what only the process knows: JAX's live arrays
grouped by shape, dtype and sharding, the Python objects that hold them (through the garbage
collector's referrers, within a time bound), every local device's allocator statistics, the
compiled executables still alive, PyTorch/XLA's memory and metrics, and the in-process sampler's
last snapshots. :func:`write` puts it in a JSON file for ``hbm-doctor explain --evidence``.

Neither JAX nor torch_xla is imported here: a framework is read only when the program already
imported it (``sys.modules``). Nothing leaves the machine; every step is wrapped so that a
failure to read one part is recorded in ``errors`` and never hides the original exception.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import sys
import tempfile
import time
import types
from collections import deque
from typing import Any, Dict, Iterable, List, Optional, Tuple

from hbm_doctor._size import format_size

__all__ = ["capture", "write", "capture_to_file", "evidence_path", "summary_lines", "read_summary", "ATTR"]

SCHEMA_VERSION = 1
ATTR = "__hbm_doctor_evidence__"  # set on the exception: the path of its evidence file
ENV_DIR = "HBM_DOCTOR_EVIDENCE_DIR"  # where the files go (default: the temporary directory)
ENV_OFF = "HBM_DOCTOR_EVIDENCE"  # "0" turns capture off
HOLDER_BUDGET_S = 1.0  # the whole holder search
EXECUTABLE_BUDGET_S = 0.5  # memory analysis of cached executables
MAX_GROUPS = 200  # live_arrays groups written (largest first)
MAX_HOLDERS = 20
_LEVELS = 5  # array -> container -> container -> object (-> its __dict__), then a variable's name
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def enabled() -> bool:
    return os.environ.get(ENV_OFF, "1").strip().lower() not in ("0", "false", "no", "off")


# ---- JAX --------------------------------------------------------------------------------------

_SHORT = {"bool": "pred", "bfloat16": "bf16"}


def _short_dtype(name: str) -> str:
    if name in _SHORT:
        return _SHORT[name]
    for long, short in (("uint", "u"), ("int", "s"), ("float", "f"), ("complex", "c")):
        if name.startswith(long):
            return short + name[len(long) :]
    return name


def _sharding_text(s: Any) -> str:
    name = type(s).__name__
    try:
        if name == "SingleDeviceSharding":
            return f"SingleDeviceSharding({next(iter(s.device_set)).id})"
        if name == "NamedSharding":
            axes = ",".join(f"{k}={v}" for k, v in s.mesh.shape.items())
            return f"NamedSharding(mesh({axes}), {s.spec})"
    except Exception:
        pass
    text = repr(s)
    return text if len(text) <= 200 else text[:197] + "..."


def _int(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


_DEVICE_KEYS = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "largest_free_block_bytes", "num_allocs")


def _jax_devices(jax: Any) -> List[Dict[str, Any]]:
    out = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats() or {}
        except Exception:
            stats = {}
        entry: Dict[str, Any] = {"id": str(d.id), "kind": getattr(d, "device_kind", None),
                                 "platform": getattr(d, "platform", None)}
        for k in _DEVICE_KEYS:
            entry[k] = _int(stats.get(k))
        entry["memory_stats"] = {k: _int(v) for k, v in stats.items() if _int(v) is not None} or None
        out.append(entry)
    return out


class _Group:
    __slots__ = ("shape", "dtype", "sharding", "count", "bytes_per_device", "devices", "arrays")

    def __init__(self, shape: str, dtype: str, sharding: str, bytes_per_device: int, devices: int) -> None:
        self.shape, self.dtype, self.sharding = shape, dtype, sharding
        self.bytes_per_device, self.devices = bytes_per_device, devices
        self.count = 0
        self.arrays: List[Any] = []

    @property
    def array_bytes(self) -> int:
        return self.bytes_per_device * self.devices

    @property
    def total_bytes(self) -> int:
        return self.array_bytes * self.count

    def to_json(self) -> Dict[str, Any]:
        return {"shape": self.shape, "dtype": self.dtype, "sharding": self.sharding, "count": self.count,
                "bytes_per_device": self.bytes_per_device, "devices": self.devices,
                "total_bytes": self.total_bytes}


def _group_arrays(arrays: Iterable[Any]) -> List[_Group]:
    groups: Dict[Tuple[Any, Any, Any], _Group] = {}
    for a in arrays:
        try:
            key = (a.shape, a.dtype, a.sharding)
            g = groups.get(key)
            if g is None:
                shape, dtype, sharding = key
                per = 1
                for n in sharding.shard_shape(shape):
                    per *= int(n)
                g = groups[key] = _Group(
                    f"{_short_dtype(dtype.name)}[{','.join(str(int(n)) for n in shape)}]",
                    dtype.name,
                    _sharding_text(sharding),
                    per * dtype.itemsize,
                    len(sharding.device_set),
                )
            g.count += 1
            g.arrays.append(a)
        except Exception:  # a deleted or donated array
            continue
    return sorted(groups.values(), key=lambda g: (-g.total_bytes, -g.count))


def _jax_executables(jax: Any, deadline: float) -> List[Dict[str, Any]]:
    clients: Dict[int, Any] = {}
    for d in jax.local_devices():
        c = getattr(d, "client", None)
        if c is not None:
            clients[id(c)] = c
    by_name: Dict[str, List[Any]] = {}
    for c in clients.values():
        for e in c.live_executables():  # newest first
            try:
                name = e.hlo_modules()[0].name
            except Exception:
                name = "?"
            by_name.setdefault(name, []).append(e)
    jitted = _jitted_globals()
    out = []
    for name, execs in sorted(by_name.items(), key=lambda kv: -len(kv[1])):
        entry: Dict[str, Any] = {"name": name, "count": len(execs)}
        if name in jitted:
            entry["jit_cache_size"], entry["held_by"] = jitted[name]
        # get_compiled_memory_stats() can cost 100 ms on a large CPU program: the newest of each
        # name, while the budget lasts.
        if time.perf_counter() < deadline:
            try:
                m = execs[0].get_compiled_memory_stats()
                entry.update(
                    argument_bytes=_int(m.argument_size_in_bytes),
                    output_bytes=_int(m.output_size_in_bytes),
                    alias_bytes=_int(m.alias_size_in_bytes),
                    temp_bytes=_int(m.temp_size_in_bytes),
                    generated_code_bytes=_int(m.generated_code_size_in_bytes),
                )
            except Exception:
                pass
        out.append(entry)
    return out[:100]


def _jitted_globals() -> Dict[str, Tuple[int, Dict[str, str]]]:
    """``jit_NAME`` -> (``_cache_size()``, the global holding it) for the jitted functions that
    module globals hold (jit has no registry of its functions; locals and attributes are missed)."""
    out: Dict[str, Tuple[int, Dict[str, str]]] = {}
    for m in list(sys.modules.values()):
        try:
            items = list(vars(m).items())
        except Exception:
            continue
        for k, v in items:
            if type(v).__name__ != "PjitFunction":
                continue
            try:
                name = "jit_" + getattr(v, "__name__", k)
                size = int(v._cache_size())
            except Exception:
                continue
            if name not in out or size > out[name][0]:
                out[name] = (size, {"name": k, "scope": "global", "where": _module_where(m)})
    return out


# ---- who holds the arrays ---------------------------------------------------------------------

_CONTAINERS = (list, tuple, dict, set, frozenset, deque)
# Referrers that are not holders: frames (their locals are read by name), modules, classes,
# functions and closure cells.
_SKIP = (types.FrameType, types.ModuleType, type, types.FunctionType, types.CellType, types.MethodType)


_NOT_HOLDERS = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, str, bytes, int, float,
                type(None))


def _frames(exc: Optional[BaseException]) -> List[types.FrameType]:
    """Frames to read locals from, nearest to the failure first, without this package's own."""
    seen: Dict[int, types.FrameType] = {}
    ordered: List[types.FrameType] = []

    def add(f: Optional[types.FrameType]) -> None:
        while f is not None and id(f) not in seen:
            seen[id(f)] = f
            ordered.append(f)
            f = f.f_back

    tb_frames = []
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        tb_frames.append(tb.tb_frame)
        tb = tb.tb_next
    for f in reversed(tb_frames):  # innermost first; add() walks on to the callers
        if id(f) not in seen:
            seen[id(f)] = f
            ordered.append(f)
    if tb_frames:
        add(tb_frames[0].f_back)
    try:
        for f in sys._current_frames().values():
            add(f)
    except Exception:
        pass
    return [f for f in ordered if not f.f_code.co_filename.startswith(_PKG_DIR) and f.f_code.co_name != "<module>"]


def _module_where(mod: types.ModuleType) -> str:
    name = getattr(mod, "__name__", "?")
    if name == "__main__":
        f = getattr(mod, "__file__", None)
        return os.path.basename(f) if f else "__main__"
    return name


class _Namer:
    """Names objects by the variables that hold them: frame locals first, then module globals."""

    def __init__(self, frames: List[types.FrameType]) -> None:
        self.frames = frames
        self.modules = [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
        self.module_dicts = {id(vars(m)): m for m in self.modules if hasattr(m, "__dict__")}
        self._globals: Optional[Dict[int, Tuple[str, str, str]]] = None

    def names(self, wanted: Dict[int, Any]) -> Dict[int, Tuple[str, str, str]]:
        """id -> (name, scope, where) for the objects in ``wanted`` that a variable holds."""
        found: Dict[int, Tuple[str, str, str]] = {}
        for f in self.frames:
            try:
                items = list(f.f_locals.items())
            except Exception:
                continue
            where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}"
            for k, v in items:
                if id(v) in wanted and id(v) not in found:
                    found[id(v)] = (k, "local", where)
        if self._globals is None:  # one pass over every module's globals, then lookups
            self._globals = {}
            for m in self.modules:
                try:
                    items = list(vars(m).items())
                except Exception:
                    continue
                where = _module_where(m)
                for k, v in items:
                    if not isinstance(v, _NOT_HOLDERS) and not k.startswith("__"):
                        self._globals.setdefault(id(v), (k, "global", where))
        for i in wanted:
            if i not in found and i in self._globals:
                found[i] = self._globals[i]
        return found


def _attr_name(obj: Any, child: Any) -> Optional[str]:
    try:
        for k, v in vars(obj).items():
            if v is child:
                return k
    except TypeError:
        pass
    for cls in type(obj).__mro__:
        for k in getattr(cls, "__slots__", ()) or ():
            if isinstance(k, str) and getattr(obj, k, None) is child:
                return k
    return None


def _count_reachable(holder: Any, owner: Dict[int, int], deadline: float) -> Dict[int, int]:
    """Arrays of the selected groups reachable from ``holder`` within two container hops."""
    counts: Dict[int, int] = {}
    seen = set()
    stack = [(holder, 0)]
    steps = 0
    while stack:
        obj, depth = stack.pop()
        g = owner.get(id(obj))
        if g is not None:
            if id(obj) not in seen:
                seen.add(id(obj))
                counts[g] = counts.get(g, 0) + 1
            continue
        if depth > 2 or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            children: Iterable[Any] = obj.values()
        elif isinstance(obj, _CONTAINERS):
            children = obj
        elif depth == 0 or hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"):
            children = [v for v in gc.get_referents(obj) if not isinstance(v, type)]
        else:
            continue
        for c in children:
            stack.append((c, depth + 1))
            steps += 1
            if steps & 0xFFF == 0 and time.perf_counter() > deadline:
                return counts
    return counts


def _holders(groups: List[_Group], frames: List[types.FrameType], budget: float) -> Tuple[List[Dict[str, Any]], bool]:
    """The named objects holding the largest groups and the groups of many small arrays."""
    start = time.perf_counter()
    deadline = start + budget
    by_bytes = groups[:5]
    by_count = sorted((g for g in groups if g.count >= 100), key=lambda g: -g.count)[:3]
    selected: List[_Group] = []
    for g in by_bytes + by_count:
        if all(g is not s for s in selected):
            selected.append(g)
    owner: Dict[int, int] = {}
    samples: List[Any] = []
    for i, g in enumerate(selected):
        for a in g.arrays:
            owner[id(a)] = i
        n = len(g.arrays)
        step = max(1, n // 8)
        samples.extend(g.arrays[::step][:8])
    namer = _Namer(frames)
    ours = {id(samples), id(owner), id(groups), id(selected), id(frames)} | {id(g.arrays) for g in groups}

    # id of the object counted from -> (that object, name, scope, where)
    named: Dict[int, Tuple[Any, str, str, str]] = {}
    # Level by level, from the sampled arrays up to their referrers' referrers. An object that
    # holds the level below in an attribute carries the path (`.params`) and the object the
    # attribute points to, so that `state.opt` counts what `opt` holds, not all of `state`.
    level: Dict[int, Any] = {id(a): a for a in samples}
    suffix: Dict[int, str] = {}
    target: Dict[int, Any] = {}
    dict_key: Dict[int, Tuple[str, Any]] = {}
    dict_owner: Dict[int, Any] = {}  # id(obj.__dict__) -> obj, for the objects met on the way
    complete = True
    last_pass = 0.0
    for depth in range(_LEVELS):
        ours.add(id(level))
        for oid, (name, scope, where) in namer.names(level).items():
            t = target.get(oid, level[oid])
            named.setdefault(id(t), (t, name + suffix.get(oid, ""), scope, where))
        todo = [v for k, v in level.items() if id(target.get(k, v)) not in named]
        if not todo or depth == _LEVELS - 1:
            break
        if time.perf_counter() + last_pass > deadline:
            complete = False
            break
        targets = tuple(todo[:64])
        ours.add(id(todo))
        t0 = time.perf_counter()
        refs = gc.get_referrers(*targets)
        last_pass = time.perf_counter() - t0
        ours.add(id(refs))
        target_ids = {id(t) for t in targets}
        nxt: Dict[int, Any] = {}
        for r in refs:
            if id(r) in ours or r is targets or id(r) in target_ids or id(r) in namer.module_dicts:
                continue  # ours; a cycle; globals (the namer names them)
            if isinstance(r, _SKIP):
                continue
            if isinstance(r, dict):
                # Remember under which key: if this dict is an object's __dict__, the object
                # comes next and names the attribute.
                for k, v in r.items():
                    if id(v) in target_ids and isinstance(k, str):
                        dict_key[id(r)] = (k, v)
                        break
                owner_obj = dict_owner.get(id(r))
                if owner_obj is not None and id(r) in dict_key:  # seen already: skip a pass
                    attr, child = dict_key[id(r)]
                    suffix[id(owner_obj)] = f".{attr}{suffix.get(id(child), '')}"
                    target[id(owner_obj)] = target.get(id(child), child)
                    r = owner_obj
            elif not isinstance(r, _CONTAINERS):
                # An object holding the level below in an attribute: `obj.attr`.
                d = getattr(r, "__dict__", None)
                if isinstance(d, dict):
                    dict_owner[id(d)] = r
                for t in targets:
                    if d is t and id(t) in dict_key:
                        attr, child = dict_key[id(t)]
                    else:
                        attr, child = _attr_name(r, t), t
                    if attr is not None:
                        suffix[id(r)] = f".{attr}{suffix.get(id(child), '')}"
                        target[id(r)] = target.get(id(child), child)
                        break
                else:
                    continue
            nxt[id(r)] = r
            if len(nxt) >= 256:
                break
        level = nxt
        if time.perf_counter() > deadline:
            complete = False
            break

    out: List[Dict[str, Any]] = []
    for oid, (obj, name, scope, where) in named.items():
        if time.perf_counter() > deadline:
            complete = False
            break
        counts = _count_reachable(obj, owner, deadline)
        if not counts:
            continue
        n = sum(counts.values())
        nbytes = sum(selected[g].array_bytes * c for g, c in counts.items())
        top = max(counts, key=lambda g: selected[g].array_bytes * counts[g])
        kind = "array" if id(obj) in owner else type(obj).__name__
        out.append({"name": name, "kind": kind, "scope": scope, "where": where, "arrays": n, "bytes": nbytes,
                    "example": selected[top].shape})
    out.sort(key=lambda h: (-h["bytes"], -h["arrays"], h["name"]))
    return out[:MAX_HOLDERS], complete


# ---- PyTorch/XLA ------------------------------------------------------------------------------

_XLA_COUNTERS = ("CompileTime", "UncachedCompile", "CachedCompile", "TransferToDevice", "TransferFromDevice",
                 "CreateDataHandles", "DestroyDataHandles", "ExecuteTime")


def _torch_xla(errors: List[str]) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    part: Dict[str, Any] = {"memory_info": None, "metrics": {}}
    devices: List[Dict[str, Any]] = []
    try:
        xm = sys.modules.get("torch_xla.core.xla_model")
        if xm is None:
            import torch_xla.core.xla_model as xm  # noqa: PLC0415 (torch_xla is already imported)
        device = xm.xla_device()
        info = dict(xm.get_memory_info(device))
        if "bytes_used" in info:
            used, limit, peak = _int(info.get("bytes_used")), _int(info.get("bytes_limit")), _int(info.get("peak_bytes_used"))
        else:  # older torch_xla: kb_free / kb_total
            total = _int(info.get("kb_total"))
            free = _int(info.get("kb_free"))
            limit = total * 1024 if total is not None else None
            used = (total - free) * 1024 if total is not None and free is not None else None
            peak = None
        part["memory_info"] = {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": peak}
        try:
            ordinal = xm.get_ordinal()
        except Exception:
            ordinal = 0
        try:
            hw = str(xm.xla_device_hw(device))
        except Exception:
            hw = None
        devices.append({"id": str(ordinal), "kind": hw, "platform": (hw or "").lower() or None, "bytes_in_use": used,
                        "peak_bytes_in_use": peak, "bytes_limit": limit, "largest_free_block_bytes": None,
                        "num_allocs": None})
    except Exception as e:
        errors.append(f"torch_xla memory_info: {type(e).__name__}: {e}")
    try:
        met = sys.modules.get("torch_xla.debug.metrics")
        if met is None:
            import torch_xla.debug.metrics as met  # noqa: PLC0415
        counters = set(met.counter_names())
        metrics = set(met.metric_names())
        for name in _XLA_COUNTERS:
            if name in counters:
                part["metrics"][name] = _int(met.counter_value(name))
            elif name in metrics or name + "Time" in metrics:
                data = met.metric_data(name if name in metrics else name + "Time")
                part["metrics"][name] = _int(data[0]) if data else None  # number of samples
    except Exception as e:
        errors.append(f"torch_xla metrics: {type(e).__name__}: {e}")
    return part, devices


# ---- the document -----------------------------------------------------------------------------


def _exception(exc: BaseException) -> Dict[str, Any]:
    import traceback  # noqa: PLC0415

    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    text = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    message = str(exc)
    return {"type": name, "message": message[:20000], "traceback": text[-50000:]}


def _series() -> List[Dict[str, Any]]:
    sampler = sys.modules.get("hbm_doctor.sampler")
    return sampler.recent_series() if sampler is not None else []


def capture(exc: Optional[BaseException] = None, step: Optional[int] = None) -> Dict[str, Any]:
    """The evidence document (docs/evidence.md) of this process, now. Never raises."""
    t0 = time.perf_counter()
    errors: List[str] = []
    doc: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "hbm_doctor_evidence",
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pid": os.getpid(),
        "framework": None,
        "step": step,
        "exception": _exception(exc) if exc is not None else None,
        "devices": [],
        "live_arrays": [],
        "holders": [],
        "executables": [],
    }
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "live_arrays"):
        doc["framework"] = "jax"
        try:
            doc["devices"] = _jax_devices(jax)
        except Exception as e:
            errors.append(f"devices: {type(e).__name__}: {e}")
        groups: List[_Group] = []
        try:
            groups = _group_arrays(jax.live_arrays())
            doc["live_arrays"] = [g.to_json() for g in groups[:MAX_GROUPS]]
            if len(groups) > MAX_GROUPS:
                doc["live_arrays_omitted"] = {"groups": len(groups) - MAX_GROUPS,
                                              "count": sum(g.count for g in groups[MAX_GROUPS:]),
                                              "total_bytes": sum(g.total_bytes for g in groups[MAX_GROUPS:])}
        except Exception as e:
            errors.append(f"live_arrays: {type(e).__name__}: {e}")
        if groups:
            try:
                h0 = time.perf_counter()
                doc["holders"], complete = _holders(groups, _frames(exc), HOLDER_BUDGET_S)
                doc["holders_search"] = {"seconds": round(time.perf_counter() - h0, 4), "complete": complete}
            except Exception as e:
                errors.append(f"holders: {type(e).__name__}: {e}")
        del groups
        try:
            doc["executables"] = _jax_executables(jax, time.perf_counter() + EXECUTABLE_BUDGET_S)
        except Exception as e:
            errors.append(f"executables: {type(e).__name__}: {e}")
    if "torch_xla" in sys.modules:
        doc["framework"] = doc["framework"] or "torch_xla"
        doc["torch_xla"], devices = _torch_xla(errors)
        if not doc["devices"]:
            doc["devices"] = devices
    try:
        doc["series"] = _series()
    except Exception as e:
        errors.append(f"series: {type(e).__name__}: {e}")
    doc["capture_seconds"] = round(time.perf_counter() - t0, 4)
    if errors:
        doc["errors"] = errors
    return doc


def write(doc: Dict[str, Any], directory: Optional[str] = None) -> str:
    """Writes ``doc`` to ``hbm-doctor-evidence-PID.json`` (``-PID-N`` after the first) in
    ``directory`` (default ``$HBM_DOCTOR_EVIDENCE_DIR`` or the temporary directory)."""
    directory = directory or os.environ.get(ENV_DIR) or tempfile.gettempdir()
    os.makedirs(directory, exist_ok=True)
    pid = os.getpid()
    path = os.path.join(directory, f"hbm-doctor-evidence-{pid}.json")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(directory, f"hbm-doctor-evidence-{pid}-{n}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
    return path


def evidence_path(exc: Optional[BaseException]) -> Optional[str]:
    """The evidence file recorded on ``exc`` or an exception it chains to."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        p = getattr(exc, ATTR, None)
        if isinstance(p, str) and os.path.isfile(p):
            return p
        exc = exc.__cause__ or exc.__context__
    return None


def capture_to_file(exc: BaseException, step: Optional[int] = None, stream: Any = None) -> Optional[str]:
    """Captures the evidence of ``exc`` once (its path is kept on the exception), writes it and
    prints the path on one line of ``stream`` (stderr). Returns the path; never raises."""
    existing = evidence_path(exc)
    if existing is not None or not enabled():
        return existing
    if "jax" not in sys.modules and "torch_xla" not in sys.modules:
        return None  # no framework in this process: nothing to read that the traceback lacks
    try:
        path = write(capture(exc, step))
    except Exception as e:
        try:
            (stream or sys.stderr).write(f"hbm-doctor: could not capture evidence: {type(e).__name__}: {e}\n")
        except Exception:
            pass
        return None
    try:
        setattr(exc, ATTR, path)
    except Exception:  # an exception type with __slots__: nothing to keep it on
        pass
    try:
        (stream or sys.stderr).write(f"hbm-doctor: evidence of what held the memory: {path}\n")
        (stream or sys.stderr).flush()
    except Exception:
        pass
    return path


# ---- a short summary, for when the binary cannot read the evidence itself ---------------------


def summary_lines(doc: Dict[str, Any], limit: int = 3) -> List[str]:
    """Plain lines: the largest holders, recompiled executables and the allocator's figures."""
    lines: List[str] = []
    for h in (doc.get("holders") or [])[:limit]:
        where = f" in {h['where']}" if h.get("where") else ""
        what = "array" if h["arrays"] == 1 else "arrays"
        lines.append(f"{h['arrays']:,} {h.get('example') or ''} {what} ({format_size(h['bytes'])}) held by the "
                     f"{h.get('scope', '')} {h.get('kind', 'object')} `{h['name']}`{where}")
    for e in doc.get("executables") or []:
        if e.get("count", 0) > 1:
            lines.append(f"{e['count']} compiled versions of {e['name']} are cached")
    for d in doc.get("devices") or []:
        use, lim, free = d.get("bytes_in_use"), d.get("bytes_limit"), d.get("largest_free_block_bytes")
        if use is not None and lim is not None:
            s = f"device {d.get('id')}: {format_size(use)} in use of {format_size(lim)}"
            if free is not None:
                s += f", largest free block {format_size(free)}"
            lines.append(s)
    arrays = doc.get("live_arrays") or []
    if arrays:
        total = sum(a.get("total_bytes") or 0 for a in arrays)
        count = sum(a.get("count") or 0 for a in arrays)
        lines.append(f"{count:,} live arrays, {format_size(total)} over all devices")
    return lines


def read_summary(path: str) -> List[str]:
    """:func:`summary_lines` of an evidence file; empty when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return summary_lines(json.load(f))
    except Exception:
        return []
