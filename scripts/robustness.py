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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wrappers", nargs="?", default="all", help="comma-separated, or all: " + ",".join(WRAPPERS))
    ap.add_argument("-v", "--verbose", action="store_true", help="list the posts that changed")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "hbm-doctor"))
    ap.add_argument("--jobs", type=int, default=4)
    a = ap.parse_args()
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
