#!/usr/bin/env python3
"""Metamorphic check: wrappers that real logs put around a message must not change the answer.

Each real post of tests/corpus/issues is explained as it is and again under each wrapper (a
launcher's or a log shipper's prefix on every line, structured JSON lines, CRLF, markdown
quotes...). For every post where the plain text has an out-of-memory event, it counts the posts
whose event is lost, whose figures (used, limit, requested, free, reserved, allocated) change,
whose first cause or category changes. Prose told in a sentence is expected to be lost under
`quote` and `indent` (a quoted or indented sentence is someone else's text or code); every
printed message should survive every wrapper.

    cargo build --release
    python3 scripts/robustness.py                 # all wrappers
    python3 scripts/robustness.py k8s,json -v     # some, listing the posts that changed
    python3 scripts/robustness.py --series -v     # trend: generated series in other tools' formats

No third-party modules. About 2 minutes per wrapper on 2 cores.
"""
import argparse
import collections
import glob
import html
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRAPPERS = {
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "ray": lambda t: "".join("(RayTrainWorker pid=48213, ip=10.0.3.7) " + l for l in t.splitlines(True)),
    "k8s": lambda t: "".join("2024-05-01T12:00:00.123456Z stderr F " + l for l in t.splitlines(True)),
    "python_log": lambda t: "".join("[2024-05-01 12:00:00,123][train][ERROR] - " + l for l in t.splitlines(True)),
    "json": lambda t: "".join(
        json.dumps({"severity": "ERROR", "message": l.rstrip("\n")}) + "\n" for l in t.splitlines(True)
    ),
    "tqdm": lambda t: "".join(
        " 45%|\u2588\u2588\u2588\u2588\u258c     | 450/1000 [00:12<00:15, 36.1it/s]\r" + l for l in t.splitlines(True)
    ),
    "html": lambda t: html.escape(t, quote=False),
    "bare_ansi": lambda t: re.sub(r"(\w*Error)", lambda m: "[31m" + m.group(1) + "[0m", t),
    "quote": lambda t: "".join("> " + l for l in t.splitlines(True)),
    "indent": lambda t: "".join("    " + l for l in t.splitlines(True)),
}

FIGURES = ("used_bytes", "limit_bytes", "requested_bytes", "free_bytes", "reserved_bytes", "allocated_bytes")


def explain(binary, text):
    p = subprocess.run(
        [binary, "explain", "-", "-f", "json"],
        input=text.encode("utf-8", "surrogateescape"),
        capture_output=True,
    )
    try:
        r = json.loads(p.stdout)
    except ValueError:
        return None
    d = r.get("diagnosis")
    if not d:
        return None
    e = r["events"][d["event"]]
    return {
        "family": e.get("family"),
        "category": d["category"],
        "figures": tuple(e.get(k) for k in FIGURES),
        "cause": tuple(c["cause"] for c in d["causes"][:1]),
    }


# Series: each generated single-device CSV of tests/corpus/trend/gen (step and bytes_in_use) is
# written again as the memory lines of other tools; `trend`'s verdict must not change.
SERIES_FORMATS = {
    "mmdet": lambda rows: "".join(
        f"2026-11-25 10:00:00,000 - mmdet - INFO - Iter [{s}/1000000]\tlr: 1.000e-02, eta: 1:23:45, "
        f"time: 0.345, data_time: 0.012, memory: {b // 2**20}, loss: 1.2345\n"
        for s, b, _ in rows
    ),
    "detectron2": lambda rows: "".join(
        f"[11/25 10:00:00 d2.utils.events]:  eta: 1:23:45  iter: {s}  total_loss: 1.234  "
        f"lr: 0.02  max_mem: {b // 2**20}M\n"
        for s, b, _ in rows
    ),
    "deepspeed": lambda rows: "".join(
        f"[2026-11-25 10:00:00,000] [INFO] [engine.py:1] step {s}\n"
        f"[2026-11-25 10:00:00,000] [INFO] [utils.py:803:see_memory_usage] MA {b / 2**30:.2f} GB"
        f"         Max_MA {b / 2**30:.2f} GB         CA {b / 2**30:.2f} GB         Max_CA {b / 2**30:.0f} GB \n"
        for s, b, _ in rows
    ),
    "megatron": lambda rows: "".join(
        f" iteration {s}/ 1000000 | lm loss: 2.345E+00 |\n[Rank 0] (after {s} iterations) memory (MB) | "
        f"allocated: {b / 2**20:.1f} | max allocated: {b / 2**20:.1f} | reserved: {b / 2**20:.1f} | "
        f"max reserved: {b / 2**20:.1f}\n"
        for s, b, _ in rows
    ),
    "wandb": lambda rows: '"Step","run-1 - system/gpu.0.memoryAllocatedBytes"\n'
    + "".join(f'"{s}","{b}"\n' for s, b, _ in rows),
    "jax_dict": lambda rows: "".join(
        f"step {s} {{'bytes_in_use': {b}, 'peak_bytes_in_use': {b}, 'bytes_limit': {l or 0}}}\n"
        for s, b, l in rows
    ),
}


def trend_verdicts(binary, text, suffix):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as fh:
        fh.write(text)
        path = fh.name
    try:
        p = subprocess.run([binary, "trend", path, "-f", "json"], capture_output=True)
        r = json.loads(p.stdout)
        return tuple(s["verdict"] for s in r.get("series", []))
    except ValueError:
        return None
    finally:
        os.unlink(path)


def series(binary, verbose):
    import csv

    gen = os.path.join(ROOT, "tests", "corpus", "trend", "gen")
    stats = collections.defaultdict(collections.Counter)
    changed = []
    for f in sorted(glob.glob(os.path.join(gen, "*.csv"))):
        with open(f) as fh:
            rows = list(csv.DictReader(fh))
        if not rows or "step" not in rows[0] or any(k in rows[0] for k in ("device", "host", "pid")):
            continue
        try:
            data = [
                (int(r["step"]), int(float(r["bytes_in_use"])), int(float(r.get("bytes_limit") or 0)))
                for r in rows
            ]
        except (ValueError, OverflowError):
            continue  # the bad-values cases
        with open(f) as fh:
            base = trend_verdicts(binary, fh.read(), ".csv")
        for name, fn in SERIES_FORMATS.items():
            got = trend_verdicts(binary, fn(data), ".csv" if name == "wandb" else ".log")
            stats[name]["series"] += 1
            if got != base:
                stats[name]["changed"] += 1
                changed.append((name, os.path.basename(f), base, got))
    print(f"{'format':12} {'series':>6} {'verdict changed':>16}")
    for name in SERIES_FORMATS:
        print(f"{name:12} {stats[name]['series']:6} {stats[name]['changed']:16}")
    if verbose:
        for name, f, base, got in changed:
            print(f"  {name:12} {f:40} {base} -> {got}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wrappers", nargs="?", default="all", help="comma-separated, or all: " + ",".join(WRAPPERS))
    ap.add_argument("-v", "--verbose", action="store_true", help="list the posts that changed")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "hbm-doctor"))
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--series", action="store_true", help="the memory-series check instead (trend)")
    a = ap.parse_args()
    if a.series:
        series(a.binary, a.verbose)
        return
    chosen = WRAPPERS if a.wrappers == "all" else {k: WRAPPERS[k] for k in a.wrappers.split(",")}
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "corpus", "issues", "*.txt")))

    def one(f):
        with open(f, encoding="utf-8", errors="surrogateescape") as fh:
            t = fh.read()
        base = explain(a.binary, t)
        if base is None:
            return f, None, {}
        return f, base, {k: explain(a.binary, fn(t)) for k, fn in chosen.items()}

    results = list(ThreadPoolExecutor(a.jobs).map(one, files))
    stats = collections.defaultdict(collections.Counter)
    changed = collections.defaultdict(list)
    for f, base, res in results:
        if base is None:
            continue
        for k, r in res.items():
            stats[k]["posts"] += 1
            what = (
                "lost" if r is None
                else "figures" if r["figures"] != base["figures"]
                else "first cause" if r["cause"] != base["cause"]
                else "category" if r["category"] != base["category"]
                else None
            )
            if what:
                stats[k][what] += 1
                changed[k].append((os.path.basename(f), what, base["family"]))
    print(f"{'wrapper':12} {'posts':>6} {'lost':>6} {'figures':>8} {'cause':>6} {'category':>9}")
    for k in chosen:
        s = stats[k]
        print(f"{k:12} {s['posts']:6} {s['lost']:6} {s['figures']:8} {s['first cause']:6} {s['category']:9}")
    if a.verbose:
        for k in chosen:
            for name, what, family in changed[k]:
                print(f"  {k:12} {what:12} {family:22} {name}")


if __name__ == "__main__":
    main()
