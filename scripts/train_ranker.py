#!/usr/bin/env python3
"""Fit explain's cause re-ranker on the labelled corpus, and measure it the way a model is measured.

    python3 scripts/train_ranker.py            # dump the cases, cross-validate, compare; write nothing
    python3 scripts/train_ranker.py --write    # and write the model fitted on every case

What it does (docs/accuracy.md, "The re-ranker"):
1. Runs the accuracy harness with HBM_DOCTOR_RANK_DUMP set: every explained, labelled case is
   written out with what the re-ranker sees (the case's features; the candidate causes the rules
   proposed, with their hand scores and the rules' names) and the causes its label accepts.
2. Cross-validates, grouped by batch of posts (a batch was collected together: its posts share a
   theme, so a fold never sees a sibling of what it is scored on), and prints cause@1 / cause@3 of
   the hand order and of the fitted order on the held-out folds; also a split by time (fit on the
   batches before posts29, score on the later ones), closer to how new posts arrive.
3. With --write, fits on every case and writes crates/hbm_doctor_analysis/data/ranker.json. Ship
   a model only when it beats the rules' own order under cross-validation AND on posts measured
   blind (docs/accuracy.md); the shipped file is empty until one does.

The model is a conditional logit over the candidates of a case (crates/hbm_doctor_analysis/src/
rank.rs): u(c) = w_hand*hand(c) + bias[c] + sum cross[c|f] + sum rule[r], trained by gradient
descent on -log P(a label cause), with an L2 penalty that pulls every weight to zero and w_hand to
1 (no data: the hand order). Pure Python, no dependencies, deterministic.
"""

import argparse
import collections
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUMP = os.path.join(ROOT, "target", "rank-cases.jsonl")
MODEL = os.path.join(ROOT, "crates", "hbm_doctor_analysis", "data", "ranker.json")


def dump_cases():
    env = dict(os.environ, HBM_DOCTOR_RANK_DUMP=DUMP)
    # The harness fails on a ratchet drop; the dump is written before that check.
    subprocess.run(
        ["cargo", "test", "-q", "-p", "hbm_doctor", "--test", "accuracy", "--", "--nocapture"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=False)
    return load(DUMP)


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            r["cands"] = [c["cause"] for c in r["rank"]["candidates"]]
            rows.append(r)
    return rows


class Model:
    def __init__(self):
        self.hand = 1.0
        self.w = collections.defaultdict(float)  # "b:cause", "x:cause|feature", "r:rule"

    def keys(self, row, i):
        c = row["rank"]["candidates"][i]
        name = c["cause"]
        ks = ["b:" + name]
        ks += ["x:%s|%s" % (name, f) for f in row["rank"]["features"]]
        ks += ["r:" + r for r in c["rules"]]
        return ks

    def utilities(self, row, keys):
        cands = row["rank"]["candidates"]
        return [self.hand * c["hand"] + sum(self.w[k] for k in ks) for c, ks in zip(cands, keys)]

    def order(self, row):
        keys = [self.keys(row, i) for i in range(len(row["cands"]))]
        u = self.utilities(row, keys)
        return sorted(range(len(u)), key=lambda i: (-u[i], i))


def fit(rows, lam, hand_lam, epochs=250, lr=0.1, hand=1.0):
    """Gradient descent with Adam on the mean negative log-likelihood plus the penalties."""
    m = Model()
    m.hand = hand
    data = []
    for r in rows:
        good = [i for i, c in enumerate(r["cands"]) if c in r["causes"]]
        if not good or len(r["cands"]) < 2:
            continue
        data.append((r, [m.keys(r, i) for i in range(len(r["cands"]))], good))
    if not data:
        return m
    n = len(data)
    mom = collections.defaultdict(float)
    vel = collections.defaultdict(float)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, epochs + 1):
        grad = collections.defaultdict(float)
        ghand = 0.0
        for r, keys, good in data:
            u = m.utilities(r, keys)
            top = max(u)
            e = [math.exp(x - top) for x in u]
            z = sum(e)
            p = [x / z for x in e]
            pg = sum(p[i] for i in good)
            # d(-log sum_good p)/du_i = p_i - [i in good] * p_i / pg
            for i, ks in enumerate(keys):
                g = p[i] - (p[i] / pg if i in good else 0.0)
                if g == 0.0:
                    continue
                g /= n
                ghand += g * r["rank"]["candidates"][i]["hand"]
                for k in ks:
                    grad[k] += g
        for k in list(m.w.keys()) + list(grad.keys()):
            grad[k] += lam * m.w[k] / n
        ghand += (hand_lam or 0.0) * (m.hand - 1.0) / n
        for k, g in list(grad.items()) + [("@hand", ghand)]:
            mom[k] = b1 * mom[k] + (1 - b1) * g
            vel[k] = b2 * vel[k] + (1 - b2) * g * g
            step = lr * (mom[k] / (1 - b1 ** t)) / (math.sqrt(vel[k] / (1 - b2 ** t)) + eps)
            if k == "@hand":
                if hand_lam is not None:
                    m.hand -= step
            else:
                m.w[k] -= step
    return m


def score(rows, model):
    """cause@1, cause@3 per set over the rows whose label names causes (the harness's measure)."""
    out = collections.defaultdict(lambda: [0, 0, 0])
    for r in rows:
        if not r["causes"]:
            continue
        order = model.order(r) if model else list(range(len(r["cands"])))
        got = [r["cands"][i] for i in order]
        s = out[r["set"]]
        s[0] += 1
        s[1] += bool(got[:1]) and got[0] in r["causes"]
        s[2] += any(c in r["causes"] for c in got[:3])
    return out


def merge(a, b):
    for k, v in b.items():
        for i in range(3):
            a[k][i] += v[i]


def fmt(s):
    n, c1, c3 = s
    return "%4d  cause@1 %5.1f%% (%d)  cause@3 %5.1f%% (%d)" % (
        n, 100 * c1 / max(n, 1), c1, 100 * c3 / max(n, 1), c3)


def cross_validate(rows, lam, hand_lam, folds=10):
    groups = sorted({r["group"] for r in rows})
    fold_of = {g: i % folds for i, g in enumerate(groups)}
    total = collections.defaultdict(lambda: [0, 0, 0])
    for k in range(folds):
        train = [r for r in rows if fold_of[r["group"]] != k]
        test = [r for r in rows if fold_of[r["group"]] == k]
        merge(total, score(test, fit(train, lam, hand_lam)))
    return total


def batch_no(group):
    return int(group[5:]) if group.startswith("posts") and group[5:].isdigit() else None


def write(model, path, meta):
    w = {"hand": round(model.hand, 4), "bias": {}, "cross": {}, "rule": {}, "meta": meta}
    for k, v in sorted(model.w.items()):
        if abs(v) < 1e-3:
            continue
        kind, key = k.split(":", 1)
        w[{"b": "bias", "x": "cross", "r": "rule"}[kind]][key] = round(v, 4)
    with open(path, "w") as f:
        json.dump(w, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="write the model fitted on every case")
    ap.add_argument("--cases", help="a dump already written (skips the harness run)")
    ap.add_argument("--lam", type=float, nargs="*", default=[1.0, 3.0, 10.0])
    ap.add_argument("--hand-lam", type=float, default=10.0)
    ap.add_argument("--split", type=int, nargs="*", default=[29],
                    help="score each later set of batches, fitted on the batches before it")
    args = ap.parse_args()
    rows = load(args.cases) if args.cases else dump_cases()
    print("cases: %d explained, %d with label causes, %d with a label cause among the candidates" % (
        len(rows), sum(1 for r in rows if r["causes"]),
        sum(1 for r in rows if set(r["causes"]) & set(r["cands"]))))
    print("\nhand order (in sample: the priors were set on these cases)")
    for k, v in sorted(score(rows, None).items()):
        print("  %-20s %s" % (k, fmt(v)))
    best = None
    for lam in args.lam:
        cv = cross_validate(rows, lam, args.hand_lam)
        print("\nfitted, 10-fold cross-validation grouped by batch, lambda=%g" % lam)
        for k, v in sorted(cv.items()):
            print("  %-20s %s" % (k, fmt(v)))
        posts = cv["posts"]
        if best is None or posts[1] > best[1][1]:
            best = (lam, posts)
    lam = best[0]
    for cut in args.split:
        early = [r for r in rows if (batch_no(r["group"]) or 0) < cut]
        late = [r for r in rows if (batch_no(r["group"]) or 0) >= cut]
        print("\nsplit by time (fit before posts%d, score posts%d on), lambda=%g" % (cut, cut, lam))
        print("  hand   %s" % fmt(score(late, None)["posts"]))
        print("  fitted %s" % fmt(score(late, fit(early, lam, args.hand_lam))["posts"]))
    if not args.write:
        return
    model = fit(rows, lam, args.hand_lam)
    meta = {"cases": len(rows), "lambda": lam, "cv_posts": best[1],
            "script": "scripts/train_ranker.py"}
    write(model, MODEL, meta)
    print("\nwrote %s (lambda %g)" % (os.path.relpath(MODEL, ROOT), lam))


if __name__ == "__main__":
    sys.exit(main())
