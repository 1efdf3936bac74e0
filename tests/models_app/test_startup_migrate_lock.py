"""Start-up migrations of several processes sharing one fresh SQLite file take turns (a file lock
beside it, ``models_app.conf``), where migrating at once had all but one fail.  The PostgreSQL
advisory lock is tested with real runtime workers (tests/multinode/test_concurrent_start.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

MIGRATE = ("import django, sys; django.setup(); from models_app.conf import startup_migrate; "
           "startup_migrate(sys.stderr)")


def test_processes_migrating_one_fresh_sqlite_file_together_all_succeed(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text('{"models": {"m": {"backend": "stub"}}}')
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llmpool.settings", "LLMPOOL_SETTINGS": str(settings),
           "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3")}
    for name in ("LLMPOOL_REDIS_URL", "LLMPOOL_DATABASE_URL"):
        env.pop(name, None)
    processes = [subprocess.Popen([sys.executable, "-c", MIGRATE], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                                  text=True) for _ in range(3)]
    results = [(process.wait(timeout=120), process.stderr.read()) for process in processes]
    assert [code for code, _ in results] == [0, 0, 0], [err[-600:] for _, err in results]
