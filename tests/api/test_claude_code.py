"""Claude Code itself (npm @anthropic-ai/claude-code, pinned and installed outside the repository by
scripts/install_claude_code.sh) against a live service: ``claude -p`` answers with the stub's text,
its whole request (a system prompt in blocks with cache_control, about a dozen tools with rich
schemas, max_tokens 32000) accepted, by the model's own name and by a dated claude-* name that a
pattern alias maps onto it.  Nothing leaves the machine: HOME is a fresh folder, telemetry, error
reports, auto-updates and every other non-essential call are off."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LiveService, write_settings

ROOT = Path(__file__).resolve().parents[2]
REPLY = "hello from the stub"
MODELS = {"stub-claude": {"backend": "stub", "stub_reply": REPLY, "tools": True, "aliases": ["claude-*"]}}


@pytest.fixture(scope="module")
def claude() -> str:
    done = subprocess.run([str(ROOT / "scripts" / "install_claude_code.sh")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    folder = tmp_path_factory.mktemp("claude_code")
    # Claude Code's metadata.user_id (its device and conversation) as the fairness key.
    settings = write_settings(folder, MODELS, service={"fairness_key_from_metadata": True})
    live = LiveService(settings, folder / "db.sqlite3").start()
    try:
        with live.client() as http:
            assert http.post("/v1/admin/models/stub-claude/load").status_code == 200
        yield live
    finally:
        live.stop()


def run_claude(claude: str, service: LiveService, home: Path, model: str) -> subprocess.CompletedProcess:
    home.mkdir(exist_ok=True)
    # Claude Code asks the claude-* models it knows for thinking ("enabled"), which a model without
    # thinking modes refuses (thinking_unsupported): MAX_THINKING_TOKENS=0 turns it off (docs/api.md).
    env = {"MAX_THINKING_TOKENS": "0",
        "PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": service.url, "ANTHROPIC_API_KEY": "unused",
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return subprocess.run([claude, "-p", "hi", "--model", model], cwd=home, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("model", ["stub-claude", "claude-sonnet-4-5-20250929"])
def test_claude_print_mode_answers_with_the_stubs_text(claude, service, tmp_path, model):
    done = run_claude(claude, service, tmp_path / "home", model)
    assert (done.returncode, done.stdout.strip()) == (0, REPLY), done.stdout + done.stderr
    with service.client() as http:
        requests = http.get("/v1/admin/activity", params={"model": "stub-claude"}).json()["requests"]
    # Claude Code's own request: its system prompt and tool schemas make thousands of words.
    (big,) = [r for r in requests if r["endpoint"] == "messages" and r["input_tokens"] > 1000][-1:]
    assert big["status"] == 200 and big["fairness_key"]
