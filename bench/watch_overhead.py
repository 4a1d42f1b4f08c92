"""Overhead of hbm_doctor.watch() when nothing fails, on a loop of small jitted steps (CPU JAX).

Three loops of the same N steps, interleaved over R rounds (their order rotating) so that machine
load hits them alike:
  bare:   for i in range(N): x = step(x)
  with:   with hbm_doctor.watch(): for i in range(N): x = step(x)
  steps:  w = hbm_doctor.watch(); with w: for i in w.steps(range(N)): x = step(x)   (w.step follows)
Prints the median time per step of each, the overhead of the last two over the first in each
round (median [min, max]), and the Python work watch() adds, timed alone.

usage: JAX_PLATFORMS=cpu PYTHONPATH=python python bench/watch_overhead.py [N] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp

import hbm_doctor


@jax.jit
def step(x):
    return jnp.tanh(x @ x) * 0.5  # f32[64,64]: a few microseconds of compute


def bare(x, n):
    for _ in range(n):
        x = step(x)
    return x.block_until_ready()


def with_watch(x, n):
    with hbm_doctor.watch():
        for _ in range(n):
            x = step(x)
    return x.block_until_ready()


def with_steps(x, n):
    w = hbm_doctor.watch()
    with w:
        for _ in w.steps(range(n)):
            x = step(x)
    return x.block_until_ready()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    x = jnp.ones((64, 64), jnp.float32) * 0.01
    runs = {"bare": bare, "with": with_watch, "steps": with_steps}
    for f in runs.values():  # compile and warm up
        f(x, 200)
    times = {k: [] for k in runs}
    order = list(runs)
    for r in range(rounds):
        for k in order[r % 3 :] + order[: r % 3]:  # rotate: no loop always runs first
            f = runs[k]
            t = time.perf_counter()
            f(x, n)
            times[k].append((time.perf_counter() - t) / n)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {n} steps x {rounds} rounds (median per step)")
    for k in runs:
        pairs = sorted((a / b - 1) * 100 for a, b in zip(times[k], times["bare"]))
        print(f"  {k:6s} {med[k] * 1e6:8.2f} us/step   overhead per round: median {statistics.median(pairs):+.2f}% "
              f"[{pairs[0]:+.1f}%, {pairs[-1]:+.1f}%]")
    # The loops' difference drowns in the machine's noise; what watch() adds is exactly this
    # Python work, timed alone over many iterations: enter/exit once, and steps() per step.
    m = 1_000_000
    empty = min(_timed(lambda: _drain(range(m))) for _ in range(5)) / m
    gen = min(_timed(lambda: _drain(hbm_doctor.watch().steps(range(m)))) for _ in range(5)) / m
    enter = min(_timed(_enter_exit) for _ in range(5)) / 10_000
    print(f"  steps() adds {(gen - empty) * 1e9:.0f} ns/step = {(gen - empty) / med['bare'] * 100:.2f}% of a step; "
          f"with watch(): {enter * 1e6:.2f} us once per loop")


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def _drain(it) -> None:
    for _ in it:
        pass


def _enter_exit() -> None:
    for _ in range(10_000):
        with hbm_doctor.watch():
            pass


if __name__ == "__main__":
    main()
