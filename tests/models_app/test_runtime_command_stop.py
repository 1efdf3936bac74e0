"""``manage.py runtime`` (and ``serve``) stop on SIGTERM even when a task drops the cancel that
stops it.

CI hung for 30 s on a split runtime worker's SIGTERM (twice in a row; reproduced 4 times in 36
loaded runs of tests/api/test_responses.py[split]): the stack dump showed the worker's
task marked cancelling yet back in the channel layer's blocking pop, serving on.  The cancel had
landed inside a redis-py call, which dropped it under Python 3.11, and the command waited for the
task with a plain ``gather``.  The command now cancels again until its tasks end (and ends every
task it leaves before ``asyncio.run`` does, which would wait on them with no second cancel).

The worker here is wrapped so that it drops the first cancel exactly as that call did, in a
process started the way ``LiveService`` starts one (the wrapper is this test's, not the
service's).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from tests.conftest import REDIS_URL, ROOT, forget_prefix, free_port, wait_until, write_settings

# Runs a manage.py command (its arguments) with models_app.host.worker.run_runtime_worker replaced.
WRAPPER = r'''
import asyncio, os, sys
sys.path.insert(0, os.environ["ROOT"])
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmpool.settings")
import django
django.setup()
from models_app.host import worker

real = worker.run_runtime_worker
WHERE = os.environ["DROP_IN"]


async def drops_one_cancel():
    """Sleeps as a library call would, drops the first cancel and sleeps on."""
    dropped = False
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if dropped:
                raise
            dropped = True
            print(f"dropped a cancel ({WHERE})", flush=True)


async def wrapped():
    if WHERE == "worker":  # the channel loop itself: the cancel is lost, and it waits on
        try:
            await real()
        except asyncio.CancelledError:
            print(f"dropped a cancel ({WHERE})", flush=True)
        await asyncio.sleep(3600)
    else:  # a task left running when the worker ends (a heartbeat, a give-back)
        asyncio.get_running_loop().create_task(drops_one_cancel(), name="left-behind")
        await real()

worker.run_runtime_worker = wrapped
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", *sys.argv[1:]])
'''


@pytest.mark.parametrize("command", ["runtime", "serve"])
@pytest.mark.parametrize("where", ["worker", "left-behind"])
def test_sigterm_stops_the_worker_though_a_task_drops_the_cancel(tmp_path, where, command):
    settings = write_settings(tmp_path / "conf", {"m": {"backend": "stub"}})
    env = {**os.environ, "ROOT": str(ROOT), "DROP_IN": where, "PYTHONUNBUFFERED": "1",
           "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3"),
           "LLMPOOL_STATE_DIR": str(tmp_path / "state")}
    for name in ("LLMPOOL_DATABASE_URL", "LLMPOOL_REDIS_URL"):
        env.pop(name, None)
    arguments = [command]
    if command == "runtime":  # the split's worker, over Redis
        env.update({"LLMPOOL_REDIS_URL": REDIS_URL, "LLMPOOL_CHANNEL_PREFIX": f"llmpooltest-{uuid.uuid4().hex[:10]}:",
                    "LLMPOOL_NODE_ID": f"stop-{uuid.uuid4().hex[:8]}"})
    else:  # the embedded default: its runtime worker runs beside the HTTP server
        arguments += ["--port", str(free_port())]
    log = tmp_path / "runtime.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", WRAPPER, *arguments], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "serving channel" in log.read_text(errors="replace"), 30), log.read_text()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=25)  # hung forever before the re-cancel
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        forget_prefix(REDIS_URL, env.get("LLMPOOL_CHANNEL_PREFIX", ""))
    text = log.read_text(errors="replace")
    assert f"dropped a cancel ({where})" in text, text
    assert code == 0, text
