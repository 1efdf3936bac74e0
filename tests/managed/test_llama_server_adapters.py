"""LoRA adapters on llama-server for real: SmolLM2 started with the tests' rank-4 adapter
(``--lora``, ``--lora-init-without-apply``), the adapter's model id answering through the
pass-through with the adapter's effect (the body's ``lora`` field), the base's own requests
unchanged, scale 0 the base's answer, and the typed path (``/v1/responses``) alike."""
from __future__ import annotations

import pytest

from tests.llama_cpp.lora_gguf import write_lora_gguf
from tests.managed.helpers import pidfiles

QUESTION = [{"role": "user", "content": "Name three colours of the sea."}]


@pytest.fixture
def smol(live_service, llama_server_binary, smollm2_gguf, tmp_path):
    lora = write_lora_gguf(smollm2_gguf, tmp_path / "sea.gguf")
    model = {
        "backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 1024, "llama_server_startup_timeout_seconds": 60.0, "target_inflight": 2,
        "adapters": {"sea": {"path": str(lora)}, "quiet": {"path": str(lora), "scale": 0.0}},
    }
    service = live_service({"smol": model}, env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with service.client(timeout=120) as http:
        assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
    yield service, pidfiles(tmp_path / "state")[0]["argv"], str(lora)
    assert service.stop() == 0


def chat(http, model: str) -> str:
    answer = http.post("/v1/chat/completions", json={"model": model, "messages": QUESTION, "max_tokens": 12,
                                                     "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]["content"]


def respond(http, model: str) -> str:
    answer = http.post("/v1/responses", json={"model": model, "input": QUESTION[0]["content"],
                                              "max_output_tokens": 12, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()["output"][0]["content"][0]["text"]


def test_the_adapters_model_id_answers_with_the_adapter_on_the_one_server(smol):
    service, argv, lora = smol
    assert argv[argv.index("--lora") + 1] == lora and argv.count("--lora") == 2
    assert "--lora-init-without-apply" in argv
    with service.client(timeout=120) as http:
        base, adapted, quiet = chat(http, "smol"), chat(http, "smol:sea"), chat(http, "smol:quiet")
        assert adapted != base
        assert quiet == base and chat(http, "smol") == base  # the adapter left the base's requests alone
        assert respond(http, "smol:sea") != respond(http, "smol")
