"""hbm-doctor: why your XLA program ran out of accelerator memory, what to change, and whether
it fits a TPU before you pay for one.

The work is done by the ``hbm-doctor`` binary that this package ships (maturin
``bindings = "bin"``, like ruff and py-spy); these functions run it and return typed results.
Importing the package is cheap: JAX is imported only by :mod:`hbm_doctor.jax`; the evidence
captured at an out-of-memory error reads JAX or torch_xla only when the program imported them.

Examples::

    import hbm_doctor
    try:
        train_step(state, batch)
    except Exception as e:
        print(hbm_doctor.explain(e))          # the diagnosis, ranked causes and actions

    hbm_doctor.install_excepthook()           # or, in IPython/Jupyter: %load_ext hbm_doctor
    with hbm_doctor.watch():                  # an OOM inside: what held the memory, to a file
        train()

    from hbm_doctor.jax import fit
    r = fit(train_step, state, batch, target="v5e-8", try_fixes=True)   # no TPU needed
    print(r)

The command line is the same binary: ``hbm-doctor --help`` or ``python -m hbm_doctor --help``.
See docs/python.md and docs/fit.md.
"""

from __future__ import annotations

from typing import Any

from hbm_doctor._diagnosis import (
    Allocation,
    Cause,
    Diagnosis,
    Event,
    HbmDoctorError,
    explain,
)
from hbm_doctor._find_bin import find_hbm_doctor_bin
from hbm_doctor._hook import (
    install_excepthook,
    load_ipython_extension,
    uninstall_excepthook,
    unload_ipython_extension,
)
from hbm_doctor._size import format_size, parse_size
from hbm_doctor._watch import watch

__all__ = [
    "Allocation",
    "Cause",
    "Diagnosis",
    "Event",
    "HbmDoctorError",
    "explain",
    "find_hbm_doctor_bin",
    "format_size",
    "install_excepthook",
    "load_ipython_extension",
    "parse_size",
    "uninstall_excepthook",
    "unload_ipython_extension",
    "watch",
]


def __getattr__(name: str) -> Any:
    # `hbm_doctor.jax` and `hbm_doctor.sampler` import lazily: JAX is heavy and optional.
    if name in ("jax", "sampler"):
        import importlib  # noqa: PLC0415

        return importlib.import_module(f"hbm_doctor.{name}")
    raise AttributeError(f"module 'hbm_doctor' has no attribute {name!r}")
