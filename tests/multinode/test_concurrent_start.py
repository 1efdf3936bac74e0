"""Several runtime workers started at the same moment on a fresh PostgreSQL database all come up:
their start-up migrations take turns (an advisory lock, ``models_app.conf``), where two migrates
at once had one of them fail on tables the other was creating."""
from __future__ import annotations

import sys
import time

from tests.conftest import ROOT
from tests.multinode.pool_processes import Pool

SETTINGS = {"models": {"m": {"backend": "stub", "device": "cpu", "node": "alpha"}}}


def test_runtime_workers_started_together_on_a_fresh_database_all_come_up(tmp_path):
    pool = Pool(tmp_path / "pool", SETTINGS)  # a database of its own, created empty
    try:
        names = ("alpha", "beta", "gamma")
        for name in names:  # no wait between them: their migrations overlap
            pool.nodes[name] = pool._spawn([sys.executable, str(ROOT / "manage.py"), "runtime"], LLMPOOL_NODE_ID=name)
        deadline = time.monotonic() + 60
        while not all(pool.alive(name) for name in names):
            exited = {name: p.returncode for name, p in pool.nodes.items() if p.poll() is not None}
            assert not exited, f"workers exited: {exited}\n{pool.log()[-4000:]}"
            assert time.monotonic() < deadline, pool.log()[-4000:]
            time.sleep(0.1)
        assert all(process.poll() is None for process in pool.nodes.values())
    finally:
        pool.stop()
