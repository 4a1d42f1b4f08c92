"""Locate the ``hbm-doctor`` binary that ships in this package's wheel.

The wheel is built with maturin ``bindings = "bin"`` (like ruff and py-spy), so pip installs the
binary into the interpreter's scripts directory (``<venv>/bin``), not inside the package. This
module finds it the way ruff's ``find_ruff_bin`` does, with two additions for development:
``$HBM_DOCTOR_BIN`` wins over everything, and ``PATH`` is searched last (``cargo install``).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

__all__ = ["find_hbm_doctor_bin"]

ENV = "HBM_DOCTOR_BIN"


def _exe() -> str:
    return "hbm-doctor" + (sysconfig.get_config_var("EXE") or "")


def _candidates() -> list[str]:
    exe = _exe()
    out = [os.path.join(sysconfig.get_path("scripts"), exe)]
    # The user scheme (`pip install --user`).
    if sys.version_info >= (3, 10):
        user_scheme = sysconfig.get_preferred_scheme("user")
    elif os.name == "nt":
        user_scheme = "nt_user"
    elif sys.platform == "darwin" and getattr(sys, "_framework", None):
        user_scheme = "osx_framework_user"
    else:
        user_scheme = "posix_user"
    try:
        out.append(os.path.join(sysconfig.get_path("scripts", scheme=user_scheme), exe))
    except KeyError:
        pass
    # `bin` beside the package root (`pip install --target DIR`).
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out.append(os.path.join(pkg_root, "bin", exe))
    # The interpreter's own directory (a venv whose python is not in `scripts`, e.g. conda).
    out.append(os.path.join(os.path.dirname(sys.executable), exe))
    return out


def find_hbm_doctor_bin() -> str:
    """Returns the path of the ``hbm-doctor`` binary.

    Order: ``$HBM_DOCTOR_BIN``; the interpreter's scripts directory (where ``pip install``
    puts it); the user scheme's scripts directory; ``bin/`` beside the package (``pip install
    --target``); the interpreter's directory; then ``PATH`` (``cargo install``).

    Raises:
        FileNotFoundError: with the places searched and how to install the binary.

    Example:
        >>> from hbm_doctor import find_hbm_doctor_bin
        >>> find_hbm_doctor_bin()  # doctest: +SKIP
        '/home/me/.venv/bin/hbm-doctor'
    """
    env = os.environ.get(ENV)
    if env:
        if os.path.isfile(env):
            return env
        raise FileNotFoundError(f"${ENV} is set to {env!r}, which is not a file; unset it or point it at the binary")
    tried = _candidates()
    for path in tried:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which(_exe())
    if found:
        return found
    raise FileNotFoundError(
        "hbm-doctor binary not found (looked in "
        + ", ".join(tried)
        + " and PATH); install it with `pip install hbm-doctor` or "
        "`cargo install --path crates/hbm_doctor`, or set $HBM_DOCTOR_BIN"
    )
