"""Packaging: the binary is found, `python -m hbm_doctor` runs it, imports stay cheap."""

import os
import subprocess
import sys

import hbm_doctor


def test_installed_package_is_tested():
    if os.environ.get("HBM_DOCTOR_TEST_INSTALLED") == "1":
        # scripts/python-tests.sh: the wheel, not the source tree.
        assert "site-packages" in hbm_doctor.__file__, hbm_doctor.__file__
        assert "site-packages" not in hbm_doctor.find_hbm_doctor_bin()
        assert os.path.dirname(hbm_doctor.find_hbm_doctor_bin()) == os.path.dirname(sys.executable)


def test_binary_is_found_and_runs():
    exe = hbm_doctor.find_hbm_doctor_bin()
    assert os.access(exe, os.X_OK)
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("hbm-doctor ")


def test_python_m_hbm_doctor_runs_the_binary(corpus):
    v = subprocess.run([sys.executable, "-m", "hbm_doctor", "--version"], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.startswith("hbm-doctor ")
    # Exit codes pass through: explain exits 1 when it finds an OOM event.
    exc = corpus / "tpu" / "aggregate_v5e" / "exception.txt"
    e = subprocess.run(
        [sys.executable, "-m", "hbm_doctor", "explain", str(exc), "--format", "json"], capture_output=True, text=True
    )
    assert e.returncode == 1, e.stderr
    # The exception alone is a headline without its listing: `unknown` (labelling.md).
    assert '"category": "unknown"' in e.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "hbm_doctor", "explain", "/nonexistent"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "hbm-doctor" in bad.stderr


def test_import_is_cheap_and_sampler_still_imports():
    code = "import sys, hbm_doctor, hbm_doctor.sampler; print('jax' in sys.modules); print(hbm_doctor.sampler.Sampler.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "Sampler"]


def test_bin_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("HBM_DOCTOR_BIN", str(tmp_path / "missing"))
    try:
        hbm_doctor.find_hbm_doctor_bin()
    except FileNotFoundError as e:
        assert "HBM_DOCTOR_BIN" in str(e)
    else:
        raise AssertionError("a missing $HBM_DOCTOR_BIN must be an error")


def test_sizes():
    assert hbm_doctor.format_size(19058917376) == "17.75G"
    assert hbm_doctor.parse_size("15.75GiB") == 16911433728
    assert hbm_doctor.parse_size("512M") == 512 << 20


def test_sizes_agree_with_the_rust_formatter():
    """The cases crates/hbm_doctor_units/src/size.rs is tested on: one spelling everywhere."""
    import json as _json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "crates/hbm_doctor_units/tests/vectors.json"
    vectors = _json.loads(path.read_text())
    for n, text in vectors["format"]:
        assert hbm_doctor.format_size(n) == text, (n, text)
    for text, n in vectors["parse"]:
        if n is None:
            try:
                hbm_doctor.parse_size(text)
            except ValueError:
                continue
            raise AssertionError(f"{text!r} is not a size")
        assert hbm_doctor.parse_size(text) == n, (text, n)


def test_chip_table_is_the_binarys():
    """fit reads the chip facts from the Rust table (`hbm-doctor chips --format json`); the built-in
    copy, used only without the binary, is the same."""
    import json as _json

    from hbm_doctor._diagnosis import run_binary
    from hbm_doctor.jax import _BUILTIN_CHIPS, chip_table

    doc = _json.loads(run_binary(["chips", "--format", "json"], ok_codes=(0,)).stdout)
    table = {t["name"]: (t["physical_bytes"], t["usable_bytes"]) for t in doc["tpus"]}
    assert table == chip_table() == _BUILTIN_CHIPS
    assert table["v4"] == (32 << 30, 33_017_561_088) and table["v7"] == (96 << 30, 101_732_843_520)
