"""In-process device-memory sampler for hbm-doctor (pure Python, no dependencies).

Samples ``jax.Device.memory_stats()`` or ``torch_xla`` ``xm.get_memory_info()`` inside the
training process and appends JSON lines that ``hbm-doctor top/record/exporter --samples FILE``
follow. The lines are ``sample`` lines of hbm-doctor's recording format (docs/recording.md), so
the file is itself a recording. Inside the trainer is the only truthful place when a framework
preallocates (JAX on GPU) or caches, and the only place at all where libtpu serves no metrics
(Kaggle, Colab).

Usage::

    from hbm_doctor import sampler
    s = sampler.Sampler("/tmp/hbm.jsonl", every_steps=50)   # or every_seconds=1.0
    for step, batch in enumerate(loader):
        train_step(batch)
        s.step(step)            # samples when due; never raises into the training loop

    sampler.start("/tmp/hbm.jsonl", every_seconds=1.0)   # or a background thread

Each sampler also keeps its last ``keep`` snapshots (default 256 per device round) in memory;
the evidence written at an out-of-memory failure (docs/evidence.md) includes them as ``series``.
``Sampler(write=False)`` keeps them in memory only, with no file.

The path defaults to ``$HBM_DOCTOR_SAMPLES``. Set that variable when you launch the trainer and
``hbm-doctor top --pid PID`` finds the file by itself. Each sampling round is one ``os.write`` of
complete lines to a file opened with ``O_APPEND``, so a killed trainer leaves at worst a torn
last line, which hbm-doctor skips.
"""

import json
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque

__all__ = ["Sampler", "start", "read_devices", "recent_series"]

ENV = "HBM_DOCTOR_SAMPLES"
KEEP = 256  # snapshots kept in memory per sampler

_samplers = weakref.WeakSet()  # live samplers, for recent_series()


def _jax_devices():
    import jax  # noqa: PLC0415 (imported only when the trainer uses JAX)

    return list(jax.local_devices())


def _jax_sample(device):
    stats = device.memory_stats() or {}

    def get(key):
        v = stats.get(key)
        return int(v) if isinstance(v, (int, float)) and v >= 0 else None

    return {
        "id": str(getattr(device, "id", 0)),
        "accelerator": str(getattr(device, "platform", "tpu")).lower(),
        "kind": getattr(device, "device_kind", None),
        "source": "jax",
        "used_bytes": get("bytes_in_use"),
        "limit_bytes": get("bytes_limit"),
        "peak_bytes": get("peak_bytes_in_use"),
        "largest_free_block_bytes": get("largest_free_block_bytes"),
    }


def _torch_xla_sample():
    import torch_xla.core.xla_model as xm  # noqa: PLC0415

    try:
        import torch_xla.runtime as xr  # noqa: PLC0415

        ordinal = xr.global_ordinal()
    except Exception:  # older torch_xla
        ordinal = xm.get_ordinal()
    device = xm.xla_device()
    info = xm.get_memory_info(device)
    # Three shapes over versions (monitoring.md section 4.1).
    if "bytes_used" in info:
        used, limit = int(info["bytes_used"]), int(info["bytes_limit"])
        peak = info.get("peak_bytes_used")
        peak = int(peak) if peak is not None else None
    else:
        total = int(info["kb_total"]) * 1024
        used, limit, peak = total - int(info["kb_free"]) * 1024, total, None
    try:
        hw = xm.xla_device_hw(device).lower()
    except Exception:
        hw = "tpu"
    return {
        "id": str(ordinal),
        "accelerator": hw,
        "kind": None,
        "source": "torch_xla",
        "used_bytes": used,
        "limit_bytes": limit,
        "peak_bytes": peak,
    }


def read_devices(devices=None, framework=None):
    """One dict per local device, in the recording's ``sample`` shape (without ``ts``)."""
    if devices is not None:
        return [_jax_sample(d) for d in devices]
    if framework is None:
        framework = "jax" if "jax" in sys.modules else "torch_xla" if "torch_xla" in sys.modules else "jax"
    if framework == "torch_xla":
        return [_torch_xla_sample()]
    return [_jax_sample(d) for d in _jax_devices()]


class Sampler:
    """Appends one line per device every ``every_steps`` steps and/or ``every_seconds``."""

    def __init__(self, path=None, every_steps=None, every_seconds=None, devices=None, framework=None, keep=KEEP,
                 write=True):
        self.path = path or os.environ.get(ENV) or "hbm-doctor-samples.%d.jsonl" % os.getpid()
        self.write = write
        self.recent = deque(maxlen=keep)  # the last snapshots, oldest first (evidence `series`)
        _samplers.add(self)
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.devices = devices
        self.framework = framework
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._fd = None
        self._last_step = None
        self._last_time = 0.0
        self._thread = None
        self._stop = threading.Event()
        self._warned = False
        self._lock = threading.Lock()

    def _due(self, step):
        if self.every_steps is None and self.every_seconds is None:
            return True
        if self.every_steps is not None and step is not None:
            if self._last_step is None or step - self._last_step >= self.every_steps:
                return True
        if self.every_seconds is not None and time.time() - self._last_time >= self.every_seconds:
            return True
        return False

    def step(self, step=None):
        """Call once per training step; samples when due. Never raises."""
        if self._due(step):
            self.sample(step)

    def sample(self, step=None):
        """Samples every device now and appends the lines. Returns the number of lines written."""
        try:
            ts = time.time()
            lines = []
            for d in read_devices(self.devices, self.framework):
                self.recent.append({
                    "step": int(step) if step is not None else None,
                    "time": ts,
                    "device": d["id"],
                    "bytes_in_use": d.get("used_bytes"),
                    "peak_bytes_in_use": d.get("peak_bytes"),
                    "bytes_limit": d.get("limit_bytes"),
                })
                if not self.write:
                    continue
                d.update({"type": "sample", "host": self.host, "pid": self.pid, "ts": ts})
                if step is not None:
                    d["step"] = int(step)
                lines.append(json.dumps(d, separators=(",", ":")) + "\n")
            if not self.write:
                self._last_step, self._last_time = step, ts
                return 0
            data = "".join(lines).encode()
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.write(self._fd, data)  # one write of complete lines
            self._last_step, self._last_time = step, ts
            return len(lines)
        except Exception as e:  # never break the training loop
            if not self._warned:
                self._warned = True
                sys.stderr.write("hbm_doctor.sampler: cannot sample device memory: %r\n" % (e,))
            return 0

    def start(self):
        """Samples every ``every_seconds`` (default 1 s) on a daemon thread."""
        interval = self.every_seconds or 1.0

        def loop():
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(interval)

        self._thread = threading.Thread(target=loop, name="hbm-doctor-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stops the thread and closes the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def start(path=None, every_seconds=1.0, **kwargs):
    """Starts a background sampler and returns it."""
    return Sampler(path, every_seconds=every_seconds, **kwargs).start()


def recent_series(limit=KEEP):
    """The last snapshots of every live sampler, oldest first (at most ``limit`` per device)."""
    rows = []
    for s in list(_samplers):
        rows.extend(list(s.recent))
    rows.sort(key=lambda r: r["time"])
    per_device = {}
    for r in rows:
        per_device[r["device"]] = per_device.get(r["device"], 0) + 1
    skip = {d: max(0, n - limit) for d, n in per_device.items()}
    out = []
    for r in rows:
        if skip[r["device"]] > 0:
            skip[r["device"]] -= 1
            continue
        out.append(r)
    return out
