"""A state folder that cannot be written at start: exit 2 with state_dir_unwritable, settings untouched."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port, write_settings


def unwritable_folder(tmp_path, how: str):
    if how == "under_a_file":  # mkdir fails even for root
        blocker = tmp_path / "a-file"
        blocker.write_text("not a folder")
        return blocker / "state"
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    return folder


@pytest.mark.parametrize("how", ["under_a_file", "read_only"])
def test_serve_refuses_to_start_on_an_unwritable_state_folder(tmp_path, how):
    folder = unwritable_folder(tmp_path, how)
    settings = write_settings(tmp_path / "conf", {"m": {"backend": "stub", "enabled": True}})
    before = settings.read_bytes()
    env = {**os.environ, "LLMPOOL_SETTINGS": str(settings), "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3"),
           "LLMPOOL_STATE_DIR": str(folder)}
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(free_port())],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"state_dir_unwritable: the state folder {folder} (LLMPOOL_STATE_DIR) is not writable" in result.stderr
    assert "Traceback" not in result.stderr
    assert settings.read_bytes() == before
