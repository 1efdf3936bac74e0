"""The repository's settings.json serves SmolLM2 on CPU out of the box, from any folder."""
from __future__ import annotations

import json
import time

from tests.conftest import ROOT

MODEL = "smollm2-135m-instruct"


def test_the_default_settings_load_smollm2_at_start_up_and_answer(live_service):
    settings = json.loads((ROOT / "settings.json").read_text())
    definition = settings["models"][MODEL]
    assert definition["enabled"] is True and definition["model_path"].startswith("package:")
    assert {"stub-echo", "stub-slow", "stub-thinker"} <= set(settings["models"])
    # A copy in another folder: the package: model_path does not depend on where the file lies.
    service = live_service(settings["models"], service=settings["service"], engine=settings["engine"])
    with service.client(timeout=60) as http:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == MODEL)
            if state["runtime_state"] != "loading":
                break
            time.sleep(0.1)
        assert (state["runtime_state"], state["last_error"]) == ("loaded", None)
        assert state["vram_estimate_source"] == "model_artifact_size"
        answer = http.post("/v1/responses", json={"model": MODEL, "input": "Say hello.", "max_output_tokens": 8})
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"][0]["content"][0]["text"].strip()
