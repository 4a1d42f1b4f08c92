"""Evidence captured in the process at an OOM (docs/evidence.md): watch(), the hooks, the holders.

The JAX programs run in subprocesses on CPU (``JAX_PLATFORMS=cpu``), so that their live arrays
are theirs alone; the OOM is a RuntimeError with the runtime's message.
"""

import json
import os
import stat
import subprocess
import sys
import textwrap
import types

import pytest

import hbm_doctor
from hbm_doctor import _diagnosis, _evidence, sampler

OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes."

needs_jax = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode != 0,
    reason="jax not installed",
)


def run_program(tmp_path, code: str, timeout: float = 240):
    prog = tmp_path / "train.py"
    prog.write_text(textwrap.dedent(code))
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(hbm_doctor.__file__)))  # this hbm_doctor
    path = os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, JAX_PLATFORMS="cpu", HBM_DOCTOR_EVIDENCE_DIR=str(tmp_path / "ev"), PYTHONPATH=path)
    p = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, timeout=timeout, env=env,
                       cwd=tmp_path)
    files = sorted((tmp_path / "ev").glob("hbm-doctor-evidence-*.json")) if (tmp_path / "ev").exists() else []
    docs = [json.loads(f.read_text()) for f in files]
    return p, files, docs


def first_causes(evidence_file):
    """The binary's diagnosis of the evidence alone: its causes, best first."""
    from hbm_doctor._find_bin import find_hbm_doctor_bin

    p = subprocess.run([find_hbm_doctor_bin(), "explain", "--evidence", str(evidence_file), "--format", "json"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 1), p.stderr
    report = json.loads(p.stdout)
    assert report["events"], p.stdout
    return [c["cause"] for c in report["diagnosis"]["causes"]], report["diagnosis"]


def holder(doc, name):
    found = [h for h in doc["holders"] if h["name"] == name]
    assert found, doc["holders"]
    return found[0]


@needs_jax
def test_list_across_steps_is_named_with_its_count(tmp_path):
    p, files, docs = run_program(tmp_path, f"""
        import jax, jax.numpy as jnp, hbm_doctor

        @jax.jit
        def step(x):
            return (x * x).sum()

        def train():
            x = jnp.ones((64,))
            losses = []
            w = hbm_doctor.watch()
            with w:
                for i in w.steps(range(3000)):
                    losses.append(step(x + i))   # keeps every step's loss on the device
                raise RuntimeError({OOM!r})

        train()
    """)
    assert p.returncode == 1, p.stderr
    assert len(files) == 1, p.stderr
    doc = docs[0]
    assert doc["schema_version"] == 1 and doc["kind"] == "hbm_doctor_evidence" and doc["framework"] == "jax"
    assert doc["step"] == 2999
    h = holder(doc, "losses")
    assert (h["kind"], h["scope"], h["where"], h["arrays"], h["example"]) == ("list", "local", "train.py:train", 3000, "f32[]")
    assert h["bytes"] == 3000 * 4
    group = [g for g in doc["live_arrays"] if g["shape"] == "f32[]"][0]
    assert group["count"] >= 3000 and group["bytes_per_device"] == 4 and group["devices"] == 1
    # The path on one line of stderr, then the diagnosis (no excepthook: watch() prints it).
    assert f"hbm-doctor: evidence of what held the memory: {files[0]}" in p.stderr.splitlines()
    assert "in this process:" in p.stderr or "losses" in p.stderr
    # The plan puts the leak first, naming the list that holds it.
    causes, diagnosis = first_causes(files[0])
    assert causes[0] == "memory_leak", diagnosis
    assert "losses" in diagnosis["causes"][0]["evidence"], diagnosis


@needs_jax
def test_new_executable_per_shape_is_counted(tmp_path):
    p, files, docs = run_program(tmp_path, f"""
        import jax, jax.numpy as jnp, hbm_doctor

        @jax.jit
        def train_step(x):
            return jnp.tanh(x) * 2

        @hbm_doctor.watch(diagnose=False)
        def train():
            outs = [train_step(jnp.ones((n, 8))) for n in range(1, 6)]   # a new shape each step
            raise RuntimeError({OOM!r})

        train()
    """)
    assert p.returncode == 1 and len(files) == 1, p.stderr
    ex = {e["name"]: e for e in docs[0]["executables"]}
    assert ex["jit_train_step"]["count"] == 5, ex
    assert ex["jit_train_step"]["jit_cache_size"] == 5  # the function's own cache, found as a global
    assert ex["jit_train_step"]["held_by"] == {"name": "train_step", "scope": "global", "where": "train.py"}
    assert_documented(docs[0])
    assert ex["jit_train_step"]["output_bytes"] is not None
    assert "hbm-doctor:" in p.stderr and "plan:" not in p.stderr  # diagnose=False: the path only
    causes, diagnosis = first_causes(files[0])
    assert causes[0] == "recompilation", diagnosis


@needs_jax
def test_large_global_array_is_named(tmp_path):
    p, files, docs = run_program(tmp_path, f"""
        import jax.numpy as jnp, hbm_doctor
        hbm_doctor.install_excepthook()

        embeddings = jnp.zeros((2048, 1024))   # 8 MiB, forgotten in a global
        small = [jnp.ones(3) for _ in range(5)]
        raise RuntimeError({OOM!r})
    """)
    assert p.returncode == 1 and len(files) == 1, p.stderr
    doc = docs[0]
    top = doc["holders"][0]
    assert (top["name"], top["kind"], top["scope"], top["where"]) == ("embeddings", "array", "global", "train.py")
    assert top["bytes"] == 2048 * 1024 * 4 and top["example"] == "f32[2048,1024]"
    assert doc["live_arrays"][0]["shape"] == "f32[2048,1024]"
    # The excepthook: traceback first, then the path, then the diagnosis.
    err = p.stderr
    assert err.index("Traceback") < err.index("hbm-doctor: evidence") < err.index("hbm-doctor: Out of")
    assert doc["exception"]["type"] == "RuntimeError" and doc["exception"]["message"] == OOM
    assert "train.py" in doc["exception"]["traceback"]
    d = doc["devices"][0]
    assert d["id"] == "0" and d["platform"] == "cpu" and "bytes_in_use" in d  # CPU: no allocator stats
    assert doc["holders_search"]["complete"] is True
    assert_documented(doc)


def assert_documented(doc):
    """Every field written is in docs/evidence.md's example (the format reference)."""
    import re

    from conftest import REPO

    text = (REPO / "docs" / "evidence.md").read_text()
    ref = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))
    assert set(doc) <= set(ref), set(doc) - set(ref)
    for part in ("devices", "live_arrays", "holders", "executables"):
        for row in doc[part]:
            assert set(row) <= set(ref[part][0]), (part, set(row) - set(ref[part][0]))


@needs_jax
def test_watch_and_excepthook_write_one_file_and_one_diagnosis(tmp_path):
    p, files, docs = run_program(tmp_path, f"""
        import jax.numpy as jnp, jaxlib, hbm_doctor
        hbm_doctor.install_excepthook()
        state = {{"step": 41}}

        class XlaRuntimeError(RuntimeError):   # the runtime's type, as jaxlib names it
            pass

        @hbm_doctor.watch(step=lambda: state["step"])
        def train():
            params = {{"w": jnp.ones((256, 256))}}
            raise XlaRuntimeError({OOM!r})

        train()
    """)
    assert p.returncode == 1 and len(files) == 1, p.stderr
    doc = docs[0]
    assert doc["step"] == 41 and doc["exception"]["type"] == "__main__.XlaRuntimeError"
    assert p.stderr.count("hbm-doctor: evidence of what held the memory") == 1
    assert p.stderr.count("hbm-doctor: Out of") == 1  # the hook prints it, under the traceback
    assert p.stderr.index("Traceback") < p.stderr.index("hbm-doctor: Out of")
    assert holder(doc, "params")["kind"] == "dict"


@needs_jax
def test_other_errors_are_not_captured(tmp_path):
    p, files, _ = run_program(tmp_path, """
        import jax.numpy as jnp, hbm_doctor
        hbm_doctor.install_excepthook()
        with hbm_doctor.watch():
            x = jnp.ones(3)
            raise ValueError("shape mismatch")
    """)
    assert p.returncode == 1 and "ValueError: shape mismatch" in p.stderr
    assert files == [] and "hbm-doctor" not in p.stderr


@needs_jax
def test_holder_search_is_bounded_on_100k_small_arrays(tmp_path):
    p, files, docs = run_program(tmp_path, f"""
        import time, jax, numpy as np, hbm_doctor
        metrics = jax.device_put(list(np.arange(100_000, dtype=np.float32)))   # 100k f32[] arrays
        t = time.perf_counter()
        try:
            with hbm_doctor.watch(diagnose=False):
                raise RuntimeError({OOM!r})
        except RuntimeError:
            print("watch", time.perf_counter() - t)
    """)
    assert p.returncode == 0 and len(files) == 1, p.stderr
    doc = docs[0]
    assert doc["holders_search"]["seconds"] <= 1.5, doc["holders_search"]  # 1 s budget, one pass over
    h = holder(doc, "metrics")
    assert h["arrays"] == 100_000 and h["kind"] == "list" and h["scope"] == "global"
    assert float(p.stdout.split()[-1]) < 5.0


def test_holder_search_stops_at_its_budget():
    class Arr:  # the attributes _group_arrays reads
        pass

    group = _evidence._Group("f32[]", "float32", "SingleDeviceSharding(0)", 4, 1)
    group.arrays = held = [Arr() for _ in range(1000)]
    group.count = len(held)
    out, complete = _evidence._holders([group], [], budget=0.0)
    assert complete is False and isinstance(out, list)


def test_import_imports_no_framework():
    code = (
        "import sys, hbm_doctor\n"
        "w = hbm_doctor.watch()\n"
        "try:\n"
        "    with w:\n"
        f"        raise RuntimeError({OOM!r})\n"
        "except RuntimeError:\n"
        "    pass\n"
        "print(sorted(m for m in ('jax', 'torch', 'torch_xla', 'jaxlib') if m in sys.modules), w.evidence_path)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "None"], out  # and no file without a framework


# ---- PyTorch/XLA, faked (torch_xla is not installed here) --------------------------------------


@pytest.fixture
def fake_torch_xla(monkeypatch):
    xm = types.ModuleType("torch_xla.core.xla_model")
    xm.xla_device = lambda: "xla:0"
    xm.get_memory_info = lambda device: {"bytes_used": 15 << 30, "bytes_limit": 16 << 30, "peak_bytes_used": 16 << 30}
    xm.get_ordinal = lambda: 0
    xm.xla_device_hw = lambda device: "TPU"
    met = types.ModuleType("torch_xla.debug.metrics")
    counters = {"UncachedCompile": 7, "CachedCompile": 90, "CreateDataHandles": 1200, "DestroyDataHandles": 400}
    metrics = {"CompileTime": (7, 1e9, []), "TransferToDeviceTime": (33, 1e6, [])}
    met.counter_names = lambda: list(counters)
    met.metric_names = lambda: list(metrics)
    met.counter_value = counters.get
    met.metric_data = metrics.get
    monkeypatch.delitem(sys.modules, "jax", raising=False)  # this process's JAX, if any, is not read
    root = types.ModuleType("torch_xla")
    for name, mod in [("torch_xla", root), ("torch_xla.core", types.ModuleType("torch_xla.core")),
                      ("torch_xla.core.xla_model", xm), ("torch_xla.debug", types.ModuleType("torch_xla.debug")),
                      ("torch_xla.debug.metrics", met)]:
        monkeypatch.setitem(sys.modules, name, mod)
    return xm


def test_torch_xla_memory_and_metrics(fake_torch_xla):
    doc = _evidence.capture(RuntimeError(OOM))
    tx = doc["torch_xla"]
    assert tx["memory_info"] == {"bytes_used": 15 << 30, "bytes_limit": 16 << 30, "peak_bytes_used": 16 << 30}
    assert tx["metrics"]["UncachedCompile"] == 7 and tx["metrics"]["CompileTime"] == 7
    assert tx["metrics"]["TransferToDevice"] == 33 and tx["metrics"]["CreateDataHandles"] == 1200
    assert tx["metrics"]["DestroyDataHandles"] == 400
    assert doc["framework"] == "torch_xla" and doc["live_arrays"] == [] and doc["holders"] == []
    assert doc["devices"] == [{"id": "0", "kind": "TPU", "platform": "tpu", "bytes_in_use": 15 << 30,
                               "peak_bytes_in_use": 16 << 30, "bytes_limit": 16 << 30,
                               "largest_free_block_bytes": None, "num_allocs": None}]
    assert doc["exception"]["message"] == OOM and "errors" not in doc


def test_torch_xla_older_memory_info(fake_torch_xla):
    fake_torch_xla.get_memory_info = lambda device: {"kb_free": 1024, "kb_total": 16 * 1024 * 1024}
    errors = []
    part, devices = _evidence._torch_xla(errors)
    assert part["memory_info"]["bytes_limit"] == 16 << 30
    assert part["memory_info"]["bytes_used"] == (16 << 30) - (1 << 20)
    assert devices[0]["bytes_limit"] == 16 << 30 and errors == []


def test_torch_xla_failures_are_recorded_not_raised(fake_torch_xla):
    def boom(device):
        raise RuntimeError("no device")

    fake_torch_xla.get_memory_info = boom
    errors = []
    part, devices = _evidence._torch_xla(errors)
    assert part["memory_info"] is None and devices == [] and "no device" in errors[0]


# ---- the sampler's series ---------------------------------------------------------------------


class FakeDevice:
    id = 3
    platform = "tpu"
    device_kind = "TPU v5 lite"

    def __init__(self):
        self.used = 0

    def memory_stats(self):
        self.used += 1 << 20
        return {"bytes_in_use": self.used, "bytes_limit": 16 << 30, "peak_bytes_in_use": self.used}


def test_sampler_keeps_the_last_snapshots_in_memory(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    dev = FakeDevice()
    s = sampler.Sampler(str(tmp_path / "s.jsonl"), devices=[dev], keep=5)
    for step in range(8):
        s.sample(step)
    assert [r["step"] for r in s.recent] == [3, 4, 5, 6, 7]
    assert s.recent[-1] == {**s.recent[-1], "device": "3", "bytes_in_use": 8 << 20, "bytes_limit": 16 << 30}
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 8  # the file still gets every line
    mem = sampler.Sampler(devices=[FakeDevice()], write=False, keep=2)
    mem.sample(1)
    assert mem._fd is None and len(mem.recent) == 1  # no file
    series = _evidence.capture()["series"]  # every live sampler's, oldest first
    assert [r["step"] for r in series if r["device"] == "3"] == [3, 4, 5, 6, 7, 1]
    assert [r["step"] for r in sampler.recent_series(limit=2)] == [7, 1]


# ---- explain() and the binary's --evidence ----------------------------------------------------


def fake_binary(tmp_path, body: str) -> str:
    exe = tmp_path / "hbm-doctor"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


DOC = json.dumps({"schema_version": 1, "events": [{"line": 1}], "diagnosis": {"event": 0, "category": "runtime_allocation", "causes": []}})


def evidence_file(tmp_path):
    path = tmp_path / "ev.json"
    path.write_text(json.dumps({"schema_version": 1, "kind": "hbm_doctor_evidence", "holders": [
        {"name": "losses", "kind": "list", "scope": "local", "where": "train.py:train", "arrays": 12000,
         "bytes": 48000, "example": "f32[]"}], "executables": [{"name": "jit_step", "count": 9}]}))
    return str(path)


def test_explain_passes_the_evidence(tmp_path, monkeypatch):
    log = tmp_path / "args"
    monkeypatch.setenv("HBM_DOCTOR_BIN", fake_binary(tmp_path, f"echo \"$@\" > {log}\ncat >/dev/null\necho '{DOC}'\nexit 1\n"))
    monkeypatch.setattr(_diagnosis, "EVIDENCE_FLAG", None)
    ev = evidence_file(tmp_path)
    e = RuntimeError(OOM)
    setattr(e, _evidence.ATTR, ev)  # as watch() leaves it
    d = hbm_doctor.explain(e)
    assert f"--evidence {ev}" in log.read_text()
    assert d.evidence_path == ev and d.evidence_read is True
    assert "in this process" not in str(d) and f"evidence: {ev}" in str(d)


def test_explain_falls_back_when_the_binary_has_no_evidence_flag(tmp_path, monkeypatch):
    body = (
        'for a in "$@"; do [ "$a" = --evidence ] && { echo "error: unexpected argument \'--evidence\' found" >&2; exit 2; }; done\n'
        f"cat >/dev/null\necho '{DOC}'\nexit 1\n"
    )
    monkeypatch.setenv("HBM_DOCTOR_BIN", fake_binary(tmp_path, body))
    monkeypatch.setattr(_diagnosis, "EVIDENCE_FLAG", None)
    ev = evidence_file(tmp_path)
    d = hbm_doctor.explain(OOM, evidence=ev)
    assert d and d.evidence_read is False and _diagnosis.EVIDENCE_FLAG is False
    text = str(d)
    assert "12,000 f32[] arrays (46.9K) held by the local list `losses` in train.py:train" in text
    assert "9 compiled versions of jit_step are cached" in text
    # Other usage errors still raise.
    monkeypatch.setenv("HBM_DOCTOR_BIN", fake_binary(tmp_path, "echo 'error: bad input' >&2\nexit 2\n"))
    monkeypatch.setattr(_diagnosis, "EVIDENCE_FLAG", None)
    with pytest.raises(hbm_doctor.HbmDoctorError):
        hbm_doctor.explain(OOM, evidence=ev)


def test_ipython_extension_captures(tmp_path, monkeypatch, capsys, fake_torch_xla):
    monkeypatch.setenv("HBM_DOCTOR_EVIDENCE_DIR", str(tmp_path))
    from test_hook import FakeShell

    shell = FakeShell()
    hbm_doctor.load_ipython_extension(shell)
    try:
        raise RuntimeError(OOM)
    except RuntimeError as e:
        shell.handler(shell, type(e), e, e.__traceback__)
        path = _evidence.evidence_path(e)
    assert path is not None and path.startswith(str(tmp_path))
    doc = json.loads(open(path).read())
    assert doc["exception"]["message"] == OOM and doc["torch_xla"]["memory_info"]["bytes_used"] == 15 << 30
    assert f"evidence of what held the memory: {path}" in capsys.readouterr().err
