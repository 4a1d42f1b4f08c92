"""Print hbm-doctor's diagnosis under out-of-memory tracebacks: ``sys.excepthook`` and IPython."""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional

from hbm_doctor import _evidence
from hbm_doctor._diagnosis import exception_text, explain, is_oom_text
from hbm_doctor._watch import DIAGNOSED, diagnose_to

__all__ = ["install_excepthook", "uninstall_excepthook", "load_ipython_extension", "unload_ipython_extension"]

_previous_hook: Optional[Callable[..., Any]] = None
_previous_thread_hook: Optional[Callable[..., Any]] = None


def _diagnose_to(stream, exc: BaseException) -> None:
    """Writes the diagnosis of ``exc`` to ``stream`` when it is an out-of-memory error, with the
    evidence of what held the memory captured first (unless ``watch()`` did). Never raises."""
    diagnose_to(stream, exc)


def _hook(etype, value, tb) -> None:
    prev = _previous_hook or sys.__excepthook__
    prev(etype, value, tb)
    if value is not None and value.__traceback__ is None:
        value = value.with_traceback(tb)
    _diagnose_to(sys.stderr, value)


def _thread_hook(args) -> None:
    prev = _previous_thread_hook or threading.__excepthook__
    prev(args)
    if args.exc_value is not None:
        _diagnose_to(sys.stderr, args.exc_value)


def install_excepthook() -> None:
    """Prints hbm-doctor's diagnosis under any uncaught out-of-memory traceback.

    The traceback is printed first, as usual (by the hook that was installed before, so other
    hooks keep working); then, when it mentions ``RESOURCE_EXHAUSTED`` or running out of memory,
    the evidence of what held the memory is captured from the process (docs/evidence.md; its
    path on one line) and the diagnosis follows on stderr, using it. Other errors are untouched. Threads too
    (``threading.excepthook``). Calling it twice installs it once.

    Example:
        >>> import hbm_doctor
        >>> hbm_doctor.install_excepthook()
        >>> # ... train; an uncaught RESOURCE_EXHAUSTED now ends with the plan to fix it
    """
    global _previous_hook, _previous_thread_hook
    if sys.excepthook is not _hook:
        _previous_hook = sys.excepthook
        sys.excepthook = _hook
    if threading.excepthook is not _thread_hook:
        _previous_thread_hook = threading.excepthook
        threading.excepthook = _thread_hook


def uninstall_excepthook() -> None:
    """Restores the hooks that were installed before :func:`install_excepthook`."""
    global _previous_hook, _previous_thread_hook
    if sys.excepthook is _hook:
        sys.excepthook = _previous_hook or sys.__excepthook__
    if threading.excepthook is _thread_hook:
        threading.excepthook = _previous_thread_hook or threading.__excepthook__
    _previous_hook = _previous_thread_hook = None


# ---- IPython / Jupyter: %load_ext hbm_doctor -------------------------------------------------


def _ipython_handler(shell, etype, value, tb, tb_offset=None):
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    try:
        value = value.with_traceback(tb)
        text = exception_text(value)
        if not is_oom_text(text) or getattr(value, DIAGNOSED, False):
            return None
        _evidence.capture_to_file(value)  # what held the memory, while the cell's frames live
        d = explain(value)
        if d:
            try:
                from IPython.display import display  # noqa: PLC0415

                display(d)  # rich HTML in notebooks (Diagnosis._repr_html_), text in terminals
            except Exception:
                print(d)
    except Exception as e:
        print(f"hbm-doctor: could not diagnose this error: {e}", file=sys.stderr)
    return None


def load_ipython_extension(ipython) -> None:
    """``%load_ext hbm_doctor``: every out-of-memory traceback in the session ends with the diagnosis."""
    ipython.set_custom_exc((Exception,), _ipython_handler)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext hbm_doctor``."""
    ipython.set_custom_exc((), None)
