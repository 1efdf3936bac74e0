"""A settings file that is not UTF-8 or is nested too deeply: invalid_settings, on reload
(400, the catalog unchanged) and at start-up (exit 2, no traceback)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from runtime.config import load_settings
from runtime.errors import InvalidSettings
from tests.conftest import ROOT, LiveService, model_entry, write_settings

TOKEN = "settings-token"
BAD_FILES = {
    "latin-1": '{"models": {"caf\xe9": {"backend": "stub"}}}'.encode("latin-1"),
    "deep": b'{"models": {"m": {"backend": "stub", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}}}",
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_the_settings_reader_says_invalid_settings(tmp_path, kind):
    path = tmp_path / "settings.json"
    path.write_bytes(BAD_FILES[kind])
    with pytest.raises(InvalidSettings, match=str(path)):
        load_settings(str(path))


def test_start_up_with_a_non_utf8_settings_file_exits_2(tmp_path):
    path = tmp_path / "settings.json"
    path.write_bytes(BAD_FILES["latin-1"])
    env = {"LLMPOOL_SETTINGS": str(path), "LLMPOOL_DB_PATH": str(tmp_path / "db.sqlite3"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "serve", "--port", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "invalid_settings" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_reload_of_a_bad_file_is_400_and_keeps_the_catalog(tmp_path, kind):
    folder = tmp_path / "svc"
    path = write_settings(folder, {"keep": {"backend": "stub"}}, service={"admin_token": TOKEN})
    live = LiveService(path, folder / "db.sqlite3", mode="embedded").start()
    try:
        with live.client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            path.write_bytes(BAD_FILES[kind])
            answer = http.post("/v1/admin/settings/reload")
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_settings"
            assert model_entry(http, "keep")["runtime_state"] == "unloaded"
    finally:
        assert live.stop() == 0
