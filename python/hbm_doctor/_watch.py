"""``hbm_doctor.watch()``: evidence of what held the memory when an out-of-memory error escapes.

A context manager and a decorator. When nothing fails it costs nothing but the ``with``; when an
out-of-memory error goes through it, it captures the evidence (docs/evidence.md) while the arrays
and the frames that hold them are still alive, writes it to a file, prints its path, and (unless
``install_excepthook()`` will do it) prints the diagnosis. The exception is always re-raised.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from hbm_doctor import _evidence
from hbm_doctor._diagnosis import exception_text, explain, is_oom_text

__all__ = ["watch", "is_oom", "diagnose_to", "DIAGNOSED"]

DIAGNOSED = "__hbm_doctor_diagnosed__"  # set on an exception whose diagnosis was printed
T = TypeVar("T")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it chains to) is an out-of-memory error."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, MemoryError) or is_oom_text(f"{type(e).__name__}: {e}"):
            return True
        e = e.__cause__ or e.__context__
    return False


def diagnose_to(stream: Any, exc: BaseException, capture: bool = True, step: Optional[int] = None) -> None:
    """Captures the evidence of an out-of-memory ``exc`` (once) and writes its diagnosis to
    ``stream`` (once). Never raises: the original error must stay visible."""
    try:
        if getattr(exc, DIAGNOSED, False):
            return
        text = exception_text(exc)
        if not is_oom_text(text):
            return
        if capture:
            _evidence.capture_to_file(exc, step=step, stream=stream)
        d = explain(exc)
        try:
            setattr(exc, DIAGNOSED, True)
        except Exception:
            pass
        if d:
            stream.write("\n" + str(d) + "\n")
            stream.flush()
    except Exception as e:
        try:
            stream.write(f"\nhbm-doctor: could not diagnose this error: {e}\n")
        except Exception:
            pass


def _hook_installed() -> bool:
    from hbm_doctor import _hook  # noqa: PLC0415 (a cycle otherwise)

    return sys.excepthook is _hook._hook


class watch:
    """Watches a block or a function for out-of-memory errors and captures the evidence.

    Args:
        step: the training step, for the evidence: a number, or a callable that returns it
            (``step=lambda: state.step``). ``w.step = i`` and :meth:`steps` set it too.
        sample_every: also keep device-memory snapshots every this many steps of :meth:`steps`
            in memory (``hbm_doctor.sampler``, no file); the evidence includes them as ``series``.
        diagnose: print the diagnosis on stderr when an OOM goes through. ``None`` (default):
            unless ``install_excepthook()`` is installed, which prints it under the traceback.

    Examples::

        with hbm_doctor.watch():
            for step in range(steps):
                state = train_step(state, next(batches))

        w = hbm_doctor.watch(sample_every=100)
        for step in w.steps(range(steps)):          # w.step follows the loop
            state = train_step(state, next(batches))

        @hbm_doctor.watch()
        def train(): ...

    On an out-of-memory error, stderr gets one line with the evidence file's path, then the
    diagnosis; ``w.evidence_path`` holds the path, and the exception is re-raised unchanged
    (``hbm_doctor.explain(e)`` on it later reads the same evidence).
    """

    def __init__(self, step: Any = None, *, sample_every: Optional[int] = None,
                 diagnose: Optional[bool] = None) -> None:
        self._step_fn: Optional[Callable[[], Any]] = step if callable(step) else None
        self.step: Optional[int] = None if callable(step) else step
        self.diagnose = diagnose
        self.evidence_path: Optional[str] = None
        self._sampler: Any = None
        if sample_every:
            from hbm_doctor import sampler  # noqa: PLC0415 (no framework import until it samples)

            self._sampler = sampler.Sampler(every_steps=sample_every, write=False)

    def current_step(self) -> Optional[int]:
        if self._step_fn is not None:
            try:
                return int(self._step_fn())
            except Exception:
                return None
        try:
            return int(self.step) if self.step is not None else None
        except (TypeError, ValueError):
            return None

    def steps(self, iterable: Iterable[T], start: int = 0) -> Iterator[T]:
        """Yields from ``iterable`` and keeps ``self.step``: the item when it is an ``int``
        (``range(resume, n)``), else the count from ``start``."""
        n = start
        s = self._sampler
        for item in iterable:
            self.step = item if type(item) is int else n
            if s is not None:
                s.step(self.step)
            yield item
            n += 1

    def __enter__(self) -> "watch":
        return self

    def __exit__(self, etype: Any, exc: Optional[BaseException], tb: Any) -> bool:
        if exc is None or not isinstance(exc, Exception) or getattr(exc, _evidence.ATTR, None) is not None:
            return False  # nothing failed; KeyboardInterrupt; an inner watch() captured it
        try:
            if not is_oom(exc):
                return False
            if exc.__traceback__ is None and tb is not None:
                exc = exc.with_traceback(tb)
            self.evidence_path = _evidence.capture_to_file(exc, step=self.current_step())
            if self.diagnose or (self.diagnose is None and not _hook_installed()):
                diagnose_to(sys.stderr, exc, capture=False)
        except Exception:
            pass  # never replace the user's exception
        return False

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            with self:
                return fn(*args, **kwargs)

        return wrapper
