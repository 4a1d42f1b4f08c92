"""Byte sizes as XLA prints them (binary units: ``17.75G`` is 17.75 GiB) and back.

The same spelling as the Rust side's one formatter (``crates/hbm_doctor_units/src/size.rs``):
TSL's ``HumanReadableNumBytes`` without ``iB``, one decimal in K, two above (``4.0K``,
``528.00M``). ``crates/hbm_doctor_units/tests/vectors.json`` holds the cases both must agree on.
"""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}


def format_size(n: int) -> str:
    """``19058917376`` -> ``'17.75G'``, ``4096`` -> ``'4.0K'``; negative sizes keep their sign."""
    if n < 0:
        return "-" + format_size(-n)
    if n < 1024:
        return f"{n}B"
    v = n / 1024
    for unit in ("K", "M", "G", "T", "P", "E"):
        if v < 1024 or unit == "E":
            return f"{v:.1f}{unit}" if unit == "K" else f"{v:.2f}{unit}"
        v /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``'16G'``, ``'15.75GiB'``, ``'512M'``, ``'17179869184'`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTPE]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (try 16G, 15.75GiB or a number of bytes)")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).upper()]))
