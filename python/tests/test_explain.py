"""explain() on real messages: the TPU compiler's own (tests/corpus/tpu) and users' (issues)."""

import json
import re
import tomllib

import pytest

import hbm_doctor

TPU_OOM = [
    "aggregate_v5e",
    "aggregate_v4",
    "aggregate_v5p",
    "aggregate_v6e",
    "huge_alloc_v5e",
    "replicated_v5e",
    "padding_v5e",
    "debug_print_v5e",
    "arguments_v5e",
    "no_donation_v5e",
    "remat_v6e",
    "hbm_cap_v5e",
    "terabyte_v5e",
]


def close(size_text: str, got, tol=0.006):
    m = re.fullmatch(r"([0-9.]+)\s*([KMGT])(?:i?B)?", size_text.strip())
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
    return got is not None and abs(got - float(m.group(1)) * unit) <= tol * unit


@pytest.mark.parametrize("case", TPU_OOM)
def test_tpu_compiler_exceptions(corpus, case):
    meta = json.loads((corpus / "tpu" / case / "meta.json").read_text())
    d = hbm_doctor.explain((corpus / "tpu" / case / "exception.txt").read_text())
    assert d, "an OOM must be found"
    e = d.main_event
    f = meta["figures"]
    assert (e.phase, e.backend, e.framework, e.memory_space) == ("compile", "tpu", "jax", "hbm")
    assert close(f["exception_required"], e.used_bytes), (f["exception_required"], e.used_bytes)
    assert close(f["exception_available"], e.limit_bytes)
    assert d.exceeded_bytes == e.used_bytes - e.limit_bytes
    assert d.causes and all(c.actions for c in d.causes)
    text = str(d)
    assert f["exception_required"] in text and "plan:" in text


@pytest.mark.parametrize(
    "case,category",
    [
        ("aggregate_v5e", "aggregate"),
        ("arguments_v5e", "arguments"),
        ("huge_alloc_v5e", "single_large_allocation"),
        ("vmem_pallas", "vmem"),
        ("scoped_vmem_pallas", "vmem"),
        ("smem_pallas", "vmem"),
    ],
)
def test_tpu_categories_from_stderr(corpus, case, category):
    d = hbm_doctor.explain((corpus / "tpu" / case / "stderr.log").read_text())
    assert d.category == category


def test_with_dump_joins_the_analysis(corpus):
    case = corpus / "tpu" / "no_donation_v5e"
    d = hbm_doctor.explain((case / "stderr.log").read_text(), dump=case / "dump")
    assert "no_donation" in [c.cause for c in d.causes[:3]]
    # The dump lists the buffers at the peak with their source.
    assert d.main_event.allocations and any(a.shape for a in d.main_event.allocations)


def _issue_fixtures():
    import pathlib

    manifest = pathlib.Path(__file__).resolve().parents[2] / "tests" / "corpus" / "issues" / "MANIFEST.toml"
    out = []
    for f in tomllib.loads(manifest.read_text())["fixture"]:
        if not f.get("oom") or "used" not in f or "limit" not in f:
            continue
        if not all(re.fullmatch(r"[0-9.]+\s*[KMGT](?:i?B)?", f[k]) for k in ("used", "limit")):
            continue
        out.append(f)
    return out


@pytest.mark.parametrize("fx", _issue_fixtures(), ids=lambda f: f["file"])
def test_user_messages_from_issues(corpus, fx):
    d = hbm_doctor.explain((corpus / "issues" / fx["file"]).read_bytes())
    assert d
    e = d.main_event
    assert close(fx["used"], e.used_bytes), (fx["used"], e.used_bytes)
    assert close(fx["limit"], e.limit_bytes), (fx["limit"], e.limit_bytes)


def test_negative_and_empty():
    assert not hbm_doctor.explain("Traceback (most recent call last):\nValueError: shapes do not match\n")
    assert not hbm_doctor.explain("")
    assert "no out-of-memory" in str(hbm_doctor.explain("all good"))


def test_exception_object_and_html():
    msg = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
        "(17.75G) exceeds available HBM (15.75G)."
    )
    try:
        raise RuntimeError(msg)
    except RuntimeError as e:
        d = hbm_doctor.explain(e)
    assert d.used_bytes == 19058917376 and d.limit_bytes == 16911433728
    html = d._repr_html_()
    # A headline without its listing: `unknown` (labelling.md), with a plan and what to collect.
    assert "<ol>" in html and "unknown" in html and "<script" not in html
    doc = d.to_json()
    assert doc["schema_version"] == 1 and doc["diagnosis"]["category"] == "unknown"
    assert doc["diagnosis"]["missing"]


def test_bad_dump_is_an_error_that_says_what_to_do(tmp_path):
    with pytest.raises(hbm_doctor.HbmDoctorError) as e:
        hbm_doctor.explain("RESOURCE_EXHAUSTED: Ran out of memory", dump=tmp_path / "missing")
    assert "hbm-doctor" in str(e.value)


def _torch_xla_fixtures():
    import pathlib

    manifest = pathlib.Path(__file__).resolve().parents[2] / "tests" / "corpus" / "issues" / "MANIFEST.toml"
    return [f for f in tomllib.loads(manifest.read_text())["fixture"] if f.get("framework") == "pytorch_xla"]


@pytest.mark.parametrize("fx", _torch_xla_fixtures(), ids=lambda f: f["file"])
def test_pytorch_xla_messages(corpus, fx):
    """PyTorch/XLA users' real messages (torch_xla itself is not installed here; see docs/python.md)."""
    d = hbm_doctor.explain((corpus / "issues" / fx["file"]).read_bytes())
    if not fx["oom"]:
        assert not any(e.raw.get("fatal") for e in d.events)
        return
    e = d.main_event
    assert e.phase == fx["phase"]
    for key in ("used", "limit", "requested"):
        want = fx.get(key)
        if want and re.fullmatch(r"[0-9.]+\s*[KMGT](?:i?B)?", want):
            assert close(want, getattr(e, f"{key}_bytes")), (key, want)
    if fx["memory_space"] in ("vmem", "smem"):
        assert d.category == "vmem"
