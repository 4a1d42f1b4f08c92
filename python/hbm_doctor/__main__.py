"""``python -m hbm_doctor ARGS`` runs the ``hbm-doctor`` binary with ARGS (as ``python -m ruff``)."""

from __future__ import annotations

import os
import subprocess
import sys

from hbm_doctor._find_bin import find_hbm_doctor_bin


def main() -> int:
    try:
        exe = find_hbm_doctor_bin()
    except FileNotFoundError as e:
        sys.stderr.write(f"hbm-doctor: error: {e}\n")
        return 2
    # `hbm-doctor fit` runs Python itself: make it use this interpreter.
    os.environ.setdefault("HBM_DOCTOR_PYTHON", sys.executable)
    if sys.platform == "win32":
        return subprocess.run([exe, *sys.argv[1:]]).returncode
    os.execvp(exe, [exe, *sys.argv[1:]])
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
