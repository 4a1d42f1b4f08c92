"""install_excepthook() and the IPython extension print the diagnosis under OOM tracebacks."""

import subprocess
import sys
import textwrap

import hbm_doctor

MSG = (
    "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
    "required for HLO temporaries (17.75G) exceeds available HBM (15.75G)."
)


def run(code: str):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_uncaught_oom_gets_the_diagnosis():
    p = run(f"""
        import hbm_doctor
        hbm_doctor.install_excepthook()
        raise RuntimeError({MSG!r})
    """)
    assert p.returncode == 1
    tb, _, diag = p.stderr.partition("hbm-doctor:")
    assert "Traceback (most recent call last)" in tb and "RESOURCE_EXHAUSTED" in tb  # the traceback first
    assert "17.75G" in diag and "unknown" in diag and "plan:" in diag


def test_other_errors_are_untouched_and_previous_hook_runs():
    p = run("""
        import sys, hbm_doctor
        def mine(t, v, tb):
            sys.stderr.write("MINE " + str(v) + "\\n")
        sys.excepthook = mine
        hbm_doctor.install_excepthook()
        hbm_doctor.install_excepthook()   # idempotent
        raise ValueError("shape mismatch")
    """)
    assert p.stderr.count("MINE shape mismatch") == 1
    assert "hbm-doctor" not in p.stderr


def test_chained_and_threads():
    p = run(f"""
        import threading, hbm_doctor
        hbm_doctor.install_excepthook()
        def work():
            try:
                raise RuntimeError({MSG!r})
            except RuntimeError as e:
                raise KeyError("step 12") from e
        t = threading.Thread(target=work); t.start(); t.join()
    """)
    assert "KeyError" in p.stderr and "hbm-doctor:" in p.stderr and "15.75G" in p.stderr


def test_uninstall():
    hbm_doctor.install_excepthook()
    assert sys.excepthook is not sys.__excepthook__
    hbm_doctor.uninstall_excepthook()
    assert sys.excepthook is sys.__excepthook__


class FakeShell:
    """The two IPython InteractiveShell methods the extension uses."""

    def __init__(self):
        self.handler = None
        self.shown = []

    def set_custom_exc(self, exc_tuple, handler):
        self.exc_tuple, self.handler = exc_tuple, handler

    def showtraceback(self, exc_tuple=None, tb_offset=None):
        self.shown.append(exc_tuple[1])


def test_ipython_extension(capsys):
    shell = FakeShell()
    hbm_doctor.load_ipython_extension(shell)
    assert shell.exc_tuple == (Exception,)
    try:
        raise RuntimeError(MSG)
    except RuntimeError as e:
        shell.handler(shell, type(e), e, e.__traceback__)
        err = e
    assert shell.shown == [err]  # the traceback is still shown
    out = capsys.readouterr().out
    assert "17.75G" in out or "Diagnosis" in out  # text rendering (no IPython display here)
    hbm_doctor.unload_ipython_extension(shell)
    assert shell.exc_tuple == ()
