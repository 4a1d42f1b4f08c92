"""Shared fixtures. The tests run against the installed wheel (scripts/python-tests.sh); for a
development tree set HBM_DOCTOR_BIN=target/release/hbm-doctor and PYTHONPATH=python.

Tests marked ``tpu`` compile deviceless for TPU topologies and need ``jax[tpu]``. They are
skipped when jax is missing, unless ``HBM_DOCTOR_REQUIRE_TPU=1`` (CI), which makes that a failure.
"""

import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "corpus"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def _have_jax_tpu() -> bool:
    try:
        import jax  # noqa: F401
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


HAVE_TPU = _have_jax_tpu()


def pytest_collection_modifyitems(config, items):
    if HAVE_TPU:
        return
    if os.environ.get("HBM_DOCTOR_REQUIRE_TPU") == "1":
        raise pytest.UsageError("HBM_DOCTOR_REQUIRE_TPU=1 but jax[tpu] is not importable")
    skip = pytest.mark.skip(reason="jax[tpu] not installed")
    for item in items:
        if "tpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def corpus():
    return CORPUS
