"""A node name that a channel cannot carry is sanitised, and the node lock keys on the sanitised
name: two workers whose LLMPOOL_NODE_ID sanitise alike are one node (the second is refused)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, wait_until
from tests.multinode.pool_processes import Pool

SETTINGS = {"models": {"m": {"backend": "stub", "node": "gpu_host_1"}}}


@pytest.fixture
def pool(tmp_path):
    pool = Pool(tmp_path / "pool", SETTINGS)
    try:
        yield pool
    finally:
        pool.stop()


def test_two_ids_that_sanitise_alike_are_one_node(pool):
    first = pool._spawn([sys.executable, str(ROOT / "manage.py"), "runtime"], LLMPOOL_NODE_ID="gpu host:1")
    pool.nodes["gpu_host_1"] = first
    assert wait_until(lambda: pool.alive("gpu_host_1") or first.poll() is not None, timeout=60), pool.log()
    assert first.poll() is None, pool.log()
    second = subprocess.run([sys.executable, str(ROOT / "manage.py"), "runtime"], cwd=ROOT,
                            env={**pool.env, "LLMPOOL_NODE_ID": "gpu_host_1"}, capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 3 and "runtime_already_running" in second.stderr, second.stderr
    pool.start_api()
    with pool.client() as http:
        assert [(m["name"], m["node"]) for m in http.get("/v1/admin/models").json()["models"]] == [("m", "gpu_host_1")]
