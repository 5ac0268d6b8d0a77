"""An operator's SIGTERM to a real `faultwatch run` is a stop, not a failure decision."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # compiling the built-in rules takes a while on a busy machine

# ignores SIGTERM: the run escalates to SIGKILL after --term-grace-s; faultwatch then exits
# 143, its own code for "stopped by SIGTERM" (the exit contract: never the child's 137)
CHILD = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('up', flush=True); time.sleep(300)")


def test_sigterm_to_faultwatch_run_is_reported_as_a_stop() -> None:
    p = subprocess.Popen([sys.executable, "-m", "faultwatch", "run", "--term-grace-s", "1",
                          "--", sys.executable, "-c", CHILD],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"up\n"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM
    # the stop happened as an operator asked (positive control: escalated, child gone)
    assert b"event=escalate" in err and b"event=child_exit" in err, err[-2000:]
    assert b"event=decision" not in err and b"exit-sigkill" not in err, err[-2000:]
