"""models_app.diagnostics: the stacks a slow stop writes by itself (the SIGUSR1 dump of a live
service is tests/api/test_smoke.py's)."""
from __future__ import annotations

import time

from models_app import diagnostics


def test_a_stop_slower_than_its_limit_writes_every_threads_stack(capfd):
    with diagnostics.stacks_if_slow(0.2):
        time.sleep(1.2)  # a stop stuck well past the limit (faulthandler's thread fires at 0.2 s)
    err = capfd.readouterr().err
    assert "Timeout (0:00:00.200000)!" in err  # faulthandler's heading
    assert "test_diagnostics.py" in err and "in test_a_stop_slower_than_its_limit" in err


def test_a_stop_within_its_limit_writes_nothing(capfd):
    with diagnostics.stacks_if_slow(0.5):
        time.sleep(0.05)
    time.sleep(0.7)  # past the limit: the watch was cancelled when the block ended
    assert "Timeout" not in capfd.readouterr().err
