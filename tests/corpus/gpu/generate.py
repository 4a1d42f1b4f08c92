#!/usr/bin/env python3
"""Real GPU out-of-memory failures, each with a fixed twin run the same way (tests/corpus/gpu).

Every case is a small program that really runs on one NVIDIA GPU (PyTorch, JAX, CuPy or Numba, as
the machine's Python has them) until it fails; its `-fixed` twin applies the one change the label
names and runs to the end, so the fix is measured, not assumed. Sizes are fractions of the GPU's
total memory, so the same script fails the same way on an 80 GB H100 and a 141 GB H200.

    python3 tests/corpus/gpu/generate.py --out DIR                 # every case (about 4 min on an H100)
    python3 tests/corpus/gpu/generate.py --out DIR torch_leak      # some cases
    python3 tests/corpus/gpu/generate.py --list                    # names and purposes
    python3 tests/corpus/gpu/generate.py --relabel                 # only rewrite the labels' basis here
    HBM_DOCTOR=path/to/hbm-doctor python3 tests/corpus/gpu/generate.py --out DIR
        # also records the leak cases with `hbm-doctor record` (NVML) and runs `top --once`

Each case runs in its own child process (`generate.py --worker CASE`), so the GPU starts empty.
Written per case under DIR/CASE/: `stderr.log` (the child's stdout and stderr together, verbatim,
less the one result line the child prints for this script), `meta.json` (purpose, label, the
fixed twin's measured peak, versions, the GPU). Nothing here is needed to run the tests: the
outputs are committed (tests/corpus/gpu/README.md says how they were made).
"""

import json
import os
import signal
import subprocess
import sys
import time

GiB = 1 << 30
MiB = 1 << 20
RESULT = "HBM_DOCTOR_GENERATE_RESULT "
HERE = os.path.abspath(__file__)
# the checkout's root, stripped from what is written so the fixtures carry no machine path
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE)))) + os.sep
KEEP_DUMP = ("after_optimizations.txt", "after_optimizations-buffer-assignment.txt",
             "after_optimizations-live-range.txt", "after_optimizations-memory-usage-report.txt")


def result(**kw):
    print(RESULT + json.dumps(kw), flush=True)


# --------------------------------------------------------------------------------------------
# PyTorch programs


def torch_total():
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def torch_mlp(width, layers):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*mods).cuda()


def torch_train_step(model, opt, x, y):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def torch_batch(fixed, share=1.5):
    """An MLP trained on a batch whose saved activations need `share` of the GPU."""
    import torch

    width, layers = 8192, 8
    model = torch_mlp(width, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    per_row = layers * 2 * width * 4  # each layer saves its Linear input and its GELU input
    batch_size = int(torch_total() * share / per_row) // 1024 * 1024
    if fixed:
        batch_size //= 4
    print(f"model: {layers} x Linear({width}, {width}), AdamW; batch_size={batch_size}", flush=True)
    x = torch.randn(batch_size, width, device="cuda")
    y = torch.randn(batch_size, width, device="cuda")
    loss = torch_train_step(model, opt, x, y)
    print(f"step 0 loss {loss.item():.4f}", flush=True)
    result(
        peak_bytes=torch.cuda.max_memory_allocated(),
        reserved_peak_bytes=torch.cuda.max_memory_reserved(),
        batch_size=batch_size,
    )


def torch_leak(fixed):
    """A training loop that keeps every step's logits for metrics: the graph-free tensors pile up."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    vocab, hidden = 32768, 1024
    model = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, vocab)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # about 1/300 of the GPU kept per step: the OOM comes after a few hundred good steps
    batch = max(256, int(torch_total() / 300 / (vocab * 4)) // 64 * 64)
    print(f"batch {batch}, vocab {vocab}: logits {batch * vocab * 4 / MiB:.0f} MiB per step", flush=True)
    all_logits = []
    steps = 400 if fixed else 100000
    for step in range(steps):
        x = torch.randn(batch, hidden, device="cuda")
        target = torch.randint(0, vocab, (batch,), device="cuda")
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if fixed:
            all_logits.append(logits.argmax(-1).cpu())
        else:
            all_logits.append(logits)
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.02)
    result(peak_bytes=torch.cuda.max_memory_allocated(), steps=steps)


def torch_fragmentation(fixed):
    """Pages of a cache freed in a checkerboard and refilled with smaller blocks, then one large
    request: more than it is free inside PyTorch's reserved segments, but no hole is big enough."""
    import torch

    total = torch_total()
    n = int(total * 0.85 / GiB)
    pages = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(n)]
    print(f"cache: {n} pages of 1 GiB", flush=True)
    for i in range(0, n, 2):
        pages[i] = None
    small = [torch.empty(768 * MiB, dtype=torch.uint8, device="cuda") for _ in range(0, n, 2)]
    free_device, _ = torch.cuda.mem_get_info()
    unallocated = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    request = (free_device + unallocated // 2) // MiB * MiB
    print(f"refilled {len(small)} holes with 768 MiB blocks; requesting {request / GiB:.2f} GiB", flush=True)
    big = torch.empty(request, dtype=torch.uint8, device="cuda")
    big.fill_(1)
    result(peak_bytes=torch.cuda.max_memory_allocated(), request_bytes=request)


HOLDER = """
import sys, time
frac = float(sys.argv[1]); lib = sys.argv[2]
if lib == "torch":
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    x = torch.empty(int(total * frac), dtype=torch.uint8, device="cuda")
else:
    import jax, jax.numpy as jnp
    x = jnp.ones((1024, 1024))
    x.block_until_ready()
print("holder ready", flush=True)
time.sleep(300)
"""


def start_holder(frac, lib, env=None):
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(frac), lib],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    line = p.stdout.readline()
    if "holder ready" not in line:
        raise RuntimeError("the holder process did not start")
    return p


def torch_other_process(fixed):
    """Another process on the same GPU holds 60% of it; the trainer needs about half."""
    holder = None if fixed else start_holder(0.6, "torch")
    try:
        torch_batch(False, share=0.4)
    finally:
        if holder:
            holder.kill()


def torch_eval_grad(fixed):
    """Evaluation without torch.no_grad(), summing the loss tensors: every eval batch keeps its graph."""
    import torch

    width, layers = 8192, 8
    model = torch_mlp(width, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    per_row = layers * 2 * width * 4
    batch_size = int(torch_total() * 0.1 / per_row) // 256 * 256
    print(f"batch_size={batch_size}", flush=True)
    for step in range(20):
        x = torch.randn(batch_size, width, device="cuda")
        loss = torch_train_step(model, opt, x, x)
        if step % 5 == 0:
            print(f"epoch 0 step {step} train loss {loss.item():.4f}", flush=True)
    print("epoch 0: evaluating", flush=True)
    total_loss = 0.0
    model.eval()
    for i in range(40):
        x = torch.randn(batch_size, width, device="cuda")
        if fixed:
            with torch.no_grad():
                total_loss += ((model(x) - x) ** 2).mean().item()
        else:
            total_loss += ((model(x) - x) ** 2).mean()
    print(f"eval loss {float(total_loss) / 40:.4f}", flush=True)
    result(peak_bytes=torch.cuda.max_memory_allocated(), batch_size=batch_size)


def jax_torch_same_process(fixed):
    """JAX (which preallocates 75% of the GPU) and PyTorch in one process: PyTorch gets the rest."""
    import jax
    import jax.numpy as jnp

    emb = jnp.ones((4096, 1024), jnp.float32)
    print(f"jax embeddings ready: {emb.sum()} on {jax.devices()[0]}", flush=True)
    torch_batch(False, share=0.4)


# --------------------------------------------------------------------------------------------
# JAX programs


def jax_mlp_grad(width, layers, batch, dtype="float32"):
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)

    def loss_fn(params, x, y):
        h = x
        for w in params:
            h = jax.nn.gelu(h @ w)
        return jnp.mean((h - y) ** 2)

    train_grad = jax.jit(jax.grad(loss_fn))
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (width, width), dt) * 0.01 for i in range(layers)]
    x = jnp.ones((batch, width), dt)
    y = jnp.zeros((batch, width), dt)
    g = train_grad(params, x, y)
    jax.block_until_ready(g)
    return g


def jax_stats():
    import jax

    s = jax.devices()[0].memory_stats() or {}
    return {k: s.get(k) for k in ("peak_bytes_in_use", "bytes_limit", "bytes_in_use")}


def jax_batch(fixed, share=1.5, env_note=""):
    """An MLP's gradient on a batch whose saved activations need `share` of JAX's pool."""
    import jax

    total = jax.devices()[0].memory_stats()["bytes_limit"]
    width, layers = 8192, 8
    per_row = layers * 2 * width * 4
    batch = int(total * share / per_row) // 1024 * 1024
    if fixed:
        batch //= 4
    print(f"{env_note}batch={batch} width={width} layers={layers} pool={total}", flush=True)
    jax_mlp_grad(width, layers, batch)
    print("step 0 done", flush=True)
    result(batch=batch, **jax_stats())


def jax_mem_fraction(fixed):
    """XLA_PYTHON_CLIENT_MEM_FRACTION caps JAX's pool far below what the program needs."""
    import jax

    width, layers = 8192, 8
    per_row = layers * 2 * width * 4
    # the program needs about 30% of the GPU whatever the pool
    import subprocess as sp

    total_mib = int(sp.check_output(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]).split()[0])
    batch = int(total_mib * MiB * 0.3 / per_row) // 1024 * 1024
    print(f"XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION')} batch={batch}", flush=True)
    jax_mlp_grad(width, layers, batch)
    print("step 0 done", flush=True)
    result(batch=batch, **jax_stats())


def jax_other_process(fixed):
    """Two JAX processes on one GPU: the first preallocated 75% of it."""
    env = dict(os.environ)
    holder = start_holder(0, "jax", env=env)
    try:
        jax_batch(False, share=0.4)
    finally:
        holder.kill()


def jax_leak(fixed):
    """A loop that keeps each step's device logits in a list for later metrics."""
    import jax
    import jax.numpy as jnp

    pool = jax.devices()[0].memory_stats()["bytes_limit"]
    vocab, hidden = 32768, 1024
    batch = max(256, int(pool / 300 / (vocab * 4)) // 64 * 64)
    key = jax.random.PRNGKey(0)
    w1 = jax.random.normal(key, (hidden, hidden)) * 0.02
    w2 = jax.random.normal(jax.random.fold_in(key, 1), (hidden, vocab)) * 0.02

    @jax.jit
    def step_fn(w1, w2, x):
        logits = jax.nn.gelu(x @ w1) @ w2
        loss = jnp.mean(jax.nn.logsumexp(logits, -1))
        return logits, loss

    print(f"batch {batch}, vocab {vocab}: logits {batch * vocab * 4 / MiB:.0f} MiB per step", flush=True)
    kept = []
    steps = 400 if fixed else 100000
    for step in range(steps):
        x = jax.random.normal(jax.random.fold_in(key, step + 2), (batch, hidden))
        logits, loss = step_fn(w1, w2, x)
        kept.append(jax.device_get(jnp.argmax(logits, -1)) if fixed else logits)
        if step % 10 == 0:
            print(f"step {step} loss {float(loss):.4f}", flush=True)
        time.sleep(0.02)
    result(steps=steps, **jax_stats())


# --------------------------------------------------------------------------------------------
# CuPy and Numba


def cupy_pairwise(fixed):
    """Pairwise distances of a point cloud at once (an N x N matrix) instead of in row blocks."""
    import cupy as cp

    free, total = cp.cuda.runtime.memGetInfo()
    n = int((total * 1.2 / 4) ** 0.5) // 1024 * 1024
    pts = cp.random.random((n, 3), dtype=cp.float32)
    print(f"points: {n}", flush=True)
    if fixed:
        nearest = cp.empty(n, dtype=cp.float32)
        block = 4096
        for i in range(0, n, block):
            d = cp.sqrt(((pts[i : i + block, None, :] - pts[None, :, :]) ** 2).sum(-1))
            d[cp.arange(d.shape[0]), cp.arange(i, i + d.shape[0])] = cp.inf
            nearest[i : i + block] = d.min(1)
    else:
        d = cp.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1))
        cp.fill_diagonal(d, cp.inf)
        nearest = d.min(1)
    print(f"mean nearest distance {float(nearest.mean()):.6f}", flush=True)
    result(peak_bytes=cp.get_default_memory_pool().total_bytes(), n=n)


def numba_after_torch(fixed):
    """PyTorch's caching allocator keeps freed memory reserved; a Numba kernel's buffer then fails."""
    import numpy as np
    import torch
    from numba import cuda

    total = torch_total()
    scratch = torch.empty(int(total * 0.7), dtype=torch.uint8, device="cuda")
    scratch.fill_(0)
    del scratch
    if fixed:
        torch.cuda.empty_cache()
    print(f"torch reserved after preprocessing: {torch.cuda.memory_reserved() / GiB:.2f} GiB", flush=True)
    host = np.ones(int(total * 0.4) // 4, dtype=np.float32)
    dev = cuda.to_device(host)
    print(f"numba buffer ready: {dev.size}", flush=True)
    result(torch_reserved=torch.cuda.memory_reserved())


# --------------------------------------------------------------------------------------------
# Cases: (name, function, fixed?, extra env, purpose, label of the broken case)

RUNTIME = "runtime_allocation"
CASES = [
    ("torch_batch", torch_batch, {}, "PyTorch: an MLP whose batch's saved activations need 1.5x the GPU; fixed: batch / 4",
     {"category": RUNTIME, "causes": ["batch_too_large"], "stage": "train"}),
    ("torch_leak", torch_leak, {}, "PyTorch: every step's logits kept on the GPU for metrics; OOM after a few hundred steps; fixed: keep argmax on the host",
     {"category": RUNTIME, "causes": ["memory_leak"], "stage": "train"}),
    ("torch_fragmentation", torch_fragmentation, {}, "PyTorch: a checkerboard of freed 1 GiB pages refilled with 768 MiB blocks, then one large request; fixed: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
     {"category": "runtime_allocation", "causes": ["fragmentation"], "stage": "train"}),
    ("torch_other_process", torch_other_process, {}, "PyTorch: another process holds 60% of the GPU, the trainer needs about 40% more; fixed: the other process is gone",
     {"category": RUNTIME, "causes": ["other_process"], "stage": "train"}),
    ("torch_eval_grad", torch_eval_grad, {}, "PyTorch: evaluation without torch.no_grad() sums loss tensors, keeping every eval batch's graph; fixed: no_grad and .item()",
     {"category": RUNTIME, "causes": ["memory_spike", "memory_leak"], "stage": "eval"}),
    ("jax_torch_same_process", jax_torch_same_process, {}, "JAX preallocates 75% of the GPU, then PyTorch in the same process needs 40%; fixed: XLA_PYTHON_CLIENT_PREALLOCATE=false",
     {"category": RUNTIME, "causes": ["preallocation", "other_process"], "stage": "train"}),
    ("jax_batch", jax_batch, {}, "JAX: an MLP gradient whose saved activations need 1.5x JAX's pool; fixed: batch / 4",
     {"category": RUNTIME, "causes": ["batch_too_large"], "stage": "train"}),
    ("jax_mem_fraction", jax_mem_fraction, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".05"}, "JAX: XLA_PYTHON_CLIENT_MEM_FRACTION=.05 while the program needs 30% of the GPU; fixed: .75 (JAX's default)",
     {"category": RUNTIME, "causes": ["preallocation"], "stage": "train"}),
    ("jax_other_process", jax_other_process, {}, "JAX: a second JAX process while the first holds its 75% pool; fixed: XLA_PYTHON_CLIENT_PREALLOCATE=false in both",
     {"category": RUNTIME, "causes": ["other_process", "preallocation"], "stage": "train"}),
    ("jax_leak", jax_leak, {}, "JAX: each step's device logits kept in a Python list; OOM after a few hundred steps; fixed: keep argmax on the host",
     {"category": RUNTIME, "causes": ["memory_leak"], "stage": "train"}),
    ("cupy_pairwise", cupy_pairwise, {}, "CuPy: an N x N distance matrix at once (1.2x the GPU); fixed: 4096-row blocks",
     {"category": RUNTIME, "category_also": ["single_large_allocation"], "causes": ["large_activation", "batch_too_large"], "stage": "unknown"}),
    ("numba_after_torch", numba_after_torch, {}, "Numba after PyTorch in one process: PyTorch's cache keeps 70% reserved, Numba's 40% buffer fails; fixed: torch.cuda.empty_cache()",
     {"category": RUNTIME, "causes": ["other_process"], "stage": "unknown"}),
]

# seconds a child may run (the JAX leak retries its last allocation for a while before failing)
TIMEOUT = {"jax_leak": 170}

FIX_ENV = {
    "torch_fragmentation": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "jax_torch_same_process": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "jax_mem_fraction": {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".75"},
    "jax_other_process": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
}


def versions():
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "jax", "jaxlib", "cupy", "numba"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing library is recorded as missing
            out[mod] = None
    return out


def gpu():
    try:
        q = "name,memory.total,driver_version"
        line = subprocess.check_output(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], text=True)
        name, total, driver = [s.strip() for s in line.splitlines()[0].split(",")]
        return {"name": name, "memory_total": total, "driver": driver}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def prune_dump(dump):
    """Keeps what `hbm-doctor analyze` reads of the jitted program's module (jit_loss_fn)."""
    if not os.path.isdir(dump):
        return
    for f in os.listdir(dump):
        path = os.path.join(dump, f)
        if os.path.isdir(path) or "jit_loss_fn" not in f or not f.endswith(KEEP_DUMP):
            if os.path.isdir(path):
                import shutil

                shutil.rmtree(path)
            else:
                os.remove(path)
        else:
            with open(path) as fh:
                text = fh.read()
            with open(path, "w") as fh:
                fh.write(text.replace(ROOT, ""))


def run_one(name, fixed, out_dir, hbm_doctor):
    case = [c for c in CASES if c[0] == name][0]
    env = dict(os.environ)
    env.update(case[2])
    if fixed:
        env.update(FIX_ENV.get(name, {}))
    env["PYTHONUNBUFFERED"] = "1"
    if name == "jax_batch":
        dump = os.path.join(out_dir, name + ("_fixed" if fixed else ""), "dump")
        env["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
    dirname = name + ("_fixed" if fixed else "")
    d = os.path.join(out_dir, dirname)
    os.makedirs(d, exist_ok=True)
    args = [sys.executable, HERE, "--worker", name] + (["--fixed"] if fixed else [])
    t0 = time.time()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                         start_new_session=True)
    rec = None
    if hbm_doctor and name.endswith("_leak"):
        rec = subprocess.Popen([hbm_doctor, "record", "-o", os.path.join(d, "record.jsonl"),
                                "--pid", str(p.pid), "--interval", "100ms", "--no-libtpu"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out, _ = p.communicate(timeout=TIMEOUT.get(name, 60))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        out += f"\n[generate.py: killed after {TIMEOUT.get(name, 60)} s]\n"
    if rec:
        try:
            rec.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rec.send_signal(signal.SIGINT)
            rec.wait(timeout=10)
    res = None
    kept = []
    for line in out.splitlines(keepends=True):
        if line.startswith(RESULT):
            res = json.loads(line[len(RESULT):])
        else:
            kept.append(line)
    with open(os.path.join(d, "stderr.log"), "w") as f:
        f.write("".join(kept).replace(ROOT, ""))
    prune_dump(os.path.join(d, "dump"))
    meta = {
        "case": dirname,
        "purpose": case[3],
        "expect": "ok" if fixed else "oom",
        "returncode": p.returncode,
        "seconds": round(time.time() - t0, 1),
        "result": res,
        "env": {k: v for k, v in {**case[2], **(FIX_ENV.get(name, {}) if fixed else {})}.items()},
        "gpu": gpu(),
        "versions": versions(),
    }
    if not fixed:
        meta["label"] = dict(case[4], fixed=name + "_fixed")
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    status = "ok" if p.returncode == 0 else f"rc={p.returncode}"
    print(f"{dirname}: {status} in {meta['seconds']} s", flush=True)


def relabel(out_dir, name):
    """Writes the broken case's label basis from what its fixed twin measured."""
    broken = os.path.join(out_dir, name, "meta.json")
    twin = os.path.join(out_dir, name + "_fixed", "meta.json")
    if not (os.path.exists(broken) and os.path.exists(twin)):
        return
    with open(broken) as f:
        meta = json.load(f)
    with open(twin) as f:
        t = json.load(f)
    res = t.get("result") or {}
    peak = res.get("peak_bytes") or res.get("peak_bytes_in_use")
    if t.get("returncode") == 0:
        basis = f"measured: {name}_fixed ran to the end on the same GPU"
        if peak:
            basis += f", peak {peak / GiB:.2f} GiB"
    else:
        basis = f"unverified: {name}_fixed exited {t.get('returncode')}"
    meta["label"]["basis"] = basis
    with open(broken, "w") as f:
        json.dump(meta, f, indent=2)


def main():
    argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        fn = [c for c in CASES if c[0] == argv[1]][0][1]
        fn("--fixed" in argv)
        return
    if argv and argv[0] == "--relabel":
        for c in CASES:
            relabel(os.path.dirname(HERE), c[0])
        return
    if argv and argv[0] == "--list":
        for c in CASES:
            print(f"{c[0]:24} {c[3]}")
        return
    out_dir = "gpu-out"
    if "--out" in argv:
        i = argv.index("--out")
        out_dir = argv[i + 1]
        del argv[i : i + 2]
    names = argv or [c[0] for c in CASES]
    hbm_doctor = os.environ.get("HBM_DOCTOR")
    os.makedirs(out_dir, exist_ok=True)
    if hbm_doctor:
        for args, fname in (([], "top-once.txt"), (["--format", "json"], "top.json")):
            r = subprocess.run([hbm_doctor, "top", "--once", "--no-libtpu", *args], capture_output=True, text=True)
            with open(os.path.join(out_dir, fname), "w") as f:
                f.write(r.stdout + r.stderr + f"\n[exit {r.returncode}]\n")
    for name in names:
        for fixed in (False, True):
            try:
                run_one(name, fixed, out_dir, hbm_doctor)
            except Exception as e:  # noqa: BLE001 - one case's failure must not stop the others
                print(f"{name} fixed={fixed}: generate.py error {e!r}", flush=True)
        relabel(out_dir, name)


if __name__ == "__main__":
    main()
