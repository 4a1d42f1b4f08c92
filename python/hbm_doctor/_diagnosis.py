"""``explain()`` and the typed objects of its JSON (contract.md, ``explain --format json``).

The binary does the work: ``explain`` feeds the text to ``hbm-doctor explain - --format json`` and
wraps the result. Every field of the contract is an attribute; fields beyond it stay reachable in
``raw``. Nothing here parses error messages itself.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from hbm_doctor._find_bin import find_hbm_doctor_bin
from hbm_doctor._size import format_size

__all__ = [
    "Allocation",
    "Cause",
    "Diagnosis",
    "Event",
    "HbmDoctorError",
    "explain",
    "exception_text",
    "is_oom_text",
]


class HbmDoctorError(RuntimeError):
    """The ``hbm-doctor`` binary failed (exit code 2: bad input, or it could not run)."""


@dataclass
class Allocation:
    """One allocation a message lists (``events[].allocations[]``)."""

    size_bytes: Optional[int]
    unpadded_bytes: Optional[int] = None
    shape: Optional[str] = None
    op_name: Optional[str] = None
    source: Optional[str] = None
    label: Optional[str] = None
    allocation_type: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Allocation":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


@dataclass
class Event:
    """One out-of-memory event (``events[]`` of the JSON contract).

    Figures are integers in bytes, or ``None`` when the message does not state them.
    """

    line: int
    phase: Optional[str]
    backend: Optional[str]
    framework: Optional[str]
    memory_space: Optional[str]
    used_bytes: Optional[int]
    limit_bytes: Optional[int]
    exceeded_bytes: Optional[int]
    requested_bytes: Optional[int]
    free_bytes: Optional[int]
    tensorcore_bytes: Optional[int]
    sparsecore_bytes: Optional[int]
    allocations: List[Allocation]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def message(self) -> Optional[str]:
        """The cleaned headline of the message (an extension field)."""
        return self.raw.get("message")

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Event":
        names = [f for f in cls.__dataclass_fields__ if f not in ("allocations", "raw")]
        return cls(
            **{k: d.get(k) for k in names},
            allocations=[Allocation.from_json(a) for a in d.get("allocations") or []],
            raw=d,
        )


@dataclass
class Cause:
    """One ranked cause (``diagnosis.causes[]``).

    ``measured_savings_bytes`` and ``fix`` are set by ``hbm_doctor.jax.fit(try_fixes=True)``: the
    reduction of the peak the compiler measured when the fix was applied, and the fix's name.
    """

    cause: str
    savings_bytes: Optional[int]
    evidence: str
    actions: List[str]
    snippets: List[Dict[str, str]] = field(default_factory=list)
    sufficient: Optional[bool] = None
    measured_savings_bytes: Optional[int] = None
    measured_fits: Optional[bool] = None
    fix: Optional[str] = None
    what_if: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Cause":
        return cls(
            cause=d.get("cause", "unknown"),
            savings_bytes=d.get("savings_bytes"),
            evidence=d.get("evidence") or "",
            actions=list(d.get("actions") or []),
            snippets=list(d.get("snippets") or []),
            sufficient=d.get("sufficient"),
            measured_savings_bytes=d.get("measured_savings_bytes"),
            measured_fits=d.get("measured_fits"),
            fix=d.get("fix"),
            what_if=d.get("what_if"),
        )

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "cause": self.cause,
            "savings_bytes": self.savings_bytes,
            "evidence": self.evidence,
            "actions": self.actions,
            "snippets": self.snippets,
            "sufficient": self.sufficient,
        }
        if self.what_if is not None:
            d["what_if"] = self.what_if
        if self.fix is not None:
            d.update(measured_savings_bytes=self.measured_savings_bytes, measured_fits=self.measured_fits, fix=self.fix)
        return d


@dataclass
class Diagnosis:
    """What ``hbm-doctor explain`` found: the events and the diagnosis of the main one.

    ``bool(d)`` is true when at least one out-of-memory event was found.

    Attributes:
        events: every out-of-memory event, in input order.
        event: index in ``events`` of the main event (the one diagnosed), or ``None``.
        category: ``aggregate``, ``single_large_allocation``, ``arguments``, ``vmem``... (contract.md).
        causes: ranked most likely first (or by measured savings after ``fit(try_fixes=True)``).
        summary: one-sentence verdict.
        chip: the device the figures point to, when they tell.
        fits_on: TPU generations whose usable HBM holds the requirement.
        raw: the JSON document as the binary printed it.
        evidence_path: the evidence file captured in the process (docs/evidence.md), if any.
        evidence_read: whether the binary read it (``explain --evidence``); when it could not
            (an older binary), ``str()`` summarizes the file itself.

    Example:
        >>> import hbm_doctor
        >>> d = hbm_doctor.explain("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
        ...     "required for HLO temporaries (17.75G) exceeds available HBM (15.75G).")
        >>> d.category, d.main_event.exceeded_bytes
        ('aggregate', 2147483648)
    """

    events: List[Event]
    event: Optional[int]
    category: Optional[str]
    causes: List[Cause]
    summary: Optional[str] = None
    chip: Optional[str] = None
    fits_on: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    evidence_path: Optional[str] = None
    evidence_read: Optional[bool] = None

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "Diagnosis":
        """Builds a Diagnosis from ``explain --format json`` (or ``analyze``'s ``diagnosis``)."""
        diag = doc.get("diagnosis") or {}
        return cls(
            events=[Event.from_json(e) for e in doc.get("events") or []],
            event=diag.get("event"),
            category=diag.get("category"),
            causes=[Cause.from_json(c) for c in diag.get("causes") or []],
            summary=diag.get("summary"),
            chip=diag.get("chip"),
            fits_on=list(diag.get("fits_on") or []),
            raw=doc,
        )

    def __bool__(self) -> bool:
        return bool(self.events) or bool(self.causes)

    @property
    def main_event(self) -> Optional[Event]:
        """The event the diagnosis describes (usually the last fatal one)."""
        if self.event is None or not self.events:
            return None
        return self.events[self.event]

    @property
    def used_bytes(self) -> Optional[int]:
        """What the main event says the program needs."""
        e = self.main_event
        return e.used_bytes if e else None

    @property
    def limit_bytes(self) -> Optional[int]:
        """What the main event says is available."""
        e = self.main_event
        return e.limit_bytes if e else None

    @property
    def exceeded_bytes(self) -> Optional[int]:
        """By how much the main event is over."""
        e = self.main_event
        return e.exceeded_bytes if e else None

    def to_json(self) -> Dict[str, Any]:
        """The JSON document, with the causes as ranked here."""
        doc = dict(self.raw)
        diag = dict(doc.get("diagnosis") or {})
        if self.causes or diag:
            diag["causes"] = [c.to_json() for c in self.causes]
            if self.category is not None:
                diag["category"] = self.category
            doc["diagnosis"] = diag
        doc.setdefault("schema_version", 1)
        doc.setdefault("events", [])
        return doc

    # ---- rendering -----------------------------------------------------------------------

    def _figures(self) -> List[tuple]:
        e = self.main_event
        if e is None:
            return []
        rows = []
        for label, key in (
            ("used", "used_bytes"),
            ("limit", "limit_bytes"),
            ("exceeded by", "exceeded_bytes"),
            ("requested", "requested_bytes"),
            ("free", "free_bytes"),
            ("TensorCore", "tensorcore_bytes"),
            ("SparseCore", "sparsecore_bytes"),
        ):
            v = getattr(e, key)
            if v is not None:
                rows.append((label, format_size(v)))
        return rows

    def _headline(self) -> str:
        if not self:
            return "no out-of-memory error found"
        if self.summary:
            return self.summary
        e = self.main_event
        space = (e.memory_space or "memory").upper() if e else "memory"
        return f"Out of {space} ({self.category or 'unknown'})"

    @staticmethod
    def _savings(c: Cause) -> str:
        if c.measured_savings_bytes is not None:
            m = c.measured_savings_bytes
            s = f"measured: saves {format_size(m)}" if m >= 0 else f"measured: costs {format_size(-m)}"
            if c.measured_fits:
                s += ", fits"
            return s
        if c.savings_bytes is None:
            return "savings unknown"
        s = f"saves ~{format_size(c.savings_bytes)}"
        if c.sufficient:
            s += ", enough to fit"
        return s

    def __str__(self) -> str:
        if not self:
            return "hbm-doctor: no out-of-memory error found"
        lines = [f"hbm-doctor: {self._headline()}"]
        e = self.main_event
        if e is not None:
            where = " · ".join(x for x in (e.phase, e.framework, e.backend, e.memory_space) if x)
            lines.append(f"  {self.category or 'unknown'}  {where}")
        figs = self._figures()
        if figs:
            lines.append("  " + "   ".join(f"{k} {v}" for k, v in figs))
        if e is not None and e.allocations:
            lines.append("  largest allocations:")
            for a in e.allocations[:5]:
                size = format_size(a.size_bytes) if a.size_bytes is not None else "?"
                where = a.source or a.op_name or a.label or ""
                lines.append(f"    {size:>9}  {a.shape or ''}  {where}".rstrip())
        if self.causes:
            lines.append("  plan:")
            for i, c in enumerate(self.causes, 1):
                lines.append(f"    {i}. {c.cause}  ({self._savings(c)})")
                if c.evidence:
                    lines.append(f"       {c.evidence}")
                for a in c.actions:
                    lines.append(f"       -> {a}")
                for s in c.snippets:
                    code = s.get("code", "").replace("\n", "\n         ")
                    lines.append(f"       {s.get('framework', '')}:\n         {code}")
        if self.fits_on:
            lines.append("  would fit on one device of: " + ", ".join(self.fits_on))
        lines.extend(self._evidence_lines())
        return "\n".join(lines)

    def _evidence_lines(self) -> List[str]:
        if self.evidence_path is None:
            return []
        out = []
        if not self.evidence_read:
            from hbm_doctor._evidence import read_summary  # noqa: PLC0415

            held = read_summary(self.evidence_path)
            if held:
                out.append("  in this process:")
                out.extend(f"    {line}" for line in held)
        out.append(f"  evidence: {self.evidence_path}")
        return out

    def _repr_html_(self) -> str:
        esc = html.escape
        if not self:
            return "<div><b>hbm-doctor</b>: no out-of-memory error found</div>"
        parts = [
            '<div style="font-family:system-ui,sans-serif;line-height:1.35;max-width:60em">',
            f'<div style="font-weight:600;color:#b00020">&#x2717; {esc(self._headline())}</div>',
        ]
        e = self.main_event
        if e is not None:
            tags = [self.category or "unknown"] + [x for x in (e.phase, e.framework, e.backend, e.memory_space) if x]
            parts.append(
                "<div>"
                + " ".join(
                    f'<span style="background:#eee;border-radius:3px;padding:0 .4em;margin-right:.3em">{esc(t)}</span>'
                    for t in tags
                )
                + "</div>"
            )
        figs = self._figures()
        if figs:
            parts.append('<table style="margin:.4em 0">')
            for k, v in figs:
                parts.append(f'<tr><td style="padding-right:1em">{esc(k)}</td><td><code>{esc(v)}</code></td></tr>')
            parts.append("</table>")
        if e is not None and e.allocations:
            parts.append("<details><summary>largest allocations</summary><table>")
            parts.append("<tr><th>size</th><th>shape</th><th>where</th></tr>")
            for a in e.allocations[:10]:
                size = format_size(a.size_bytes) if a.size_bytes is not None else "?"
                where = a.source or a.op_name or a.label or ""
                parts.append(
                    f"<tr><td><code>{esc(size)}</code></td><td><code>{esc(a.shape or '')}</code></td><td>{esc(where)}</td></tr>"
                )
            parts.append("</table></details>")
        if self.causes:
            parts.append("<ol>")
            for c in self.causes:
                parts.append(f"<li><b>{esc(c.cause)}</b> <i>({esc(self._savings(c))})</i>")
                if c.evidence:
                    parts.append(f"<div>{esc(c.evidence)}</div>")
                if c.actions:
                    parts.append("<ul>" + "".join(f"<li>{esc(a)}</li>" for a in c.actions) + "</ul>")
                for s in c.snippets:
                    parts.append(
                        f'<pre style="background:#f6f8fa;padding:.3em .6em"><code># {esc(s.get("framework", ""))}\n{esc(s.get("code", ""))}</code></pre>'
                    )
                parts.append("</li>")
            parts.append("</ol>")
        if self.fits_on:
            parts.append(f"<div>Would fit on one device of: {esc(', '.join(self.fits_on))}</div>")
        ev = self._evidence_lines()
        if ev:
            parts.append("<pre>" + esc("\n".join(line[2:] for line in ev)) + "</pre>")
        parts.append("</div>")
        return "".join(parts)


# ---- running the binary ---------------------------------------------------------------------


def exception_text(exc: BaseException) -> str:
    """The full traceback of ``exc`` (with its chained causes), as Python would print it."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


_OOM_MARKERS = ("resource_exhausted", "out of memory", "ran out of memory", "outofmemory", "oom when allocating")


def is_oom_text(text: str) -> bool:
    """Whether ``text`` looks like an out-of-memory error (cheap check before running the binary)."""
    low = text.lower()
    return any(m in low for m in _OOM_MARKERS)


def run_binary(
    args: List[str], stdin: Optional[str] = None, ok_codes=(0, 1), timeout: Optional[float] = 600
) -> subprocess.CompletedProcess:
    """Runs ``hbm-doctor ARGS`` and returns the completed process (stdout/stderr as text).

    Raises:
        HbmDoctorError: when the exit code is not in ``ok_codes`` (2: bad input or usage).
    """
    exe = find_hbm_doctor_bin()
    env = dict(os.environ)
    env.setdefault("NO_COLOR", "1")
    proc = subprocess.run(
        [exe, *args],
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=env,
        timeout=timeout,
    )
    if proc.returncode not in ok_codes:
        msg = proc.stderr.strip() or f"hbm-doctor {' '.join(args)} exited with {proc.returncode}"
        raise HbmDoctorError(msg)
    return proc


# Whether to pass `--evidence FILE` to the binary: None tries it and, if the binary is older and
# rejects the flag (exit 2, "unexpected argument"), runs again without it and remembers.
EVIDENCE_FLAG: Optional[bool] = None


def _rejects_evidence_flag(e: HbmDoctorError) -> bool:
    msg = str(e)
    return "unexpected argument" in msg and "--evidence" in msg


def explain(
    exc_or_text: Union[BaseException, str, bytes],
    *,
    dump: Optional[Union[str, os.PathLike]] = None,
    evidence: Optional[Union[str, os.PathLike]] = None,
) -> Diagnosis:
    """Diagnoses an out-of-memory error: an exception, a traceback, or a whole log.

    Runs ``hbm-doctor explain - --format json`` on the text (for an exception: its full
    traceback with chained causes) and returns the typed result.

    Args:
        exc_or_text: the exception you caught, or the text of a message, traceback or log.
        dump: the failing program's XLA dump directory (``--xla_dump_to``), to join its analysis:
            buffers live at the peak with their source lines, and measured causes.
        evidence: an evidence file captured in the process (docs/evidence.md), passed as
            ``--evidence``. By default, the one ``watch()`` or the excepthook recorded on the
            exception. An older binary without the flag is run without it; ``str()`` of the
            result then summarizes the file itself.

    Returns:
        A :class:`Diagnosis`; falsy when no out-of-memory event was found.

    Raises:
        HbmDoctorError: the binary rejected the input (e.g. binary data) or could not run.
        FileNotFoundError: the binary is not installed (see ``find_hbm_doctor_bin``).

    Example:
        >>> import hbm_doctor
        >>> try:
        ...     compiled = lowered.compile()            # doctest: +SKIP
        ... except Exception as e:                       # doctest: +SKIP
        ...     d = hbm_doctor.explain(e)               # doctest: +SKIP
        ...     print(d)                                 # doctest: +SKIP
    """
    if isinstance(exc_or_text, BaseException):
        text = exception_text(exc_or_text)
    elif isinstance(exc_or_text, bytes):
        text = exc_or_text.decode("utf-8", "replace")
    else:
        text = str(exc_or_text)
    args = ["explain", "-", "--format", "json", "--color", "never"]
    if dump is not None:
        args += ["--dump", os.fspath(dump)]
    if evidence is None and isinstance(exc_or_text, BaseException):
        from hbm_doctor._evidence import evidence_path  # noqa: PLC0415

        evidence = evidence_path(exc_or_text)
    path = os.fspath(evidence) if evidence is not None else None
    if not text.strip():
        return Diagnosis(events=[], event=None, category=None, causes=[], raw={"schema_version": 1, "events": []})
    global EVIDENCE_FLAG
    read = False
    if path is not None and EVIDENCE_FLAG is not False:
        try:
            proc = run_binary(args + ["--evidence", path], stdin=text)
            read = True
        except HbmDoctorError as e:
            if EVIDENCE_FLAG or not _rejects_evidence_flag(e):
                raise
            EVIDENCE_FLAG = False  # an older binary: not again in this process
    if not read:
        proc = run_binary(args, stdin=text)
    d = Diagnosis.from_json(json.loads(proc.stdout))
    d.evidence_path, d.evidence_read = path, (read if path is not None else None)
    return d
