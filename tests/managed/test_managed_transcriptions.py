"""POST /v1/audio/transcriptions and /translations passed through to a managed server whose
definition says it serves them (``audio_transcription: true``), through a real ``manage.py serve``
and the fake vllm: the upstream gets OpenAI's form (its own model name, the file as sent,
verbose_json asked for whatever the client asked), and its segments come back in the client's
shape; an upstream's refusal is 400; a vllm_serve model without the field is 400
transcription_unsupported."""
from __future__ import annotations

import json

import openai

from tests.managed.helpers import TARGET, vllm_model

AUDIO = b"RIFF fake audio bytes" * 10


def test_vllm_serve_passes_transcriptions_through(live_service, fake_bin, tmp_path):
    models = {"ears": vllm_model(fake_bin, tmp_path, audio_transcription=True), "chat": vllm_model(fake_bin, tmp_path)}
    service = live_service(models, env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with service.client() as http, openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0) as client:
        assert http.post("/v1/admin/models/ears/load").json()["runtime_state"] == "loaded"
        assert http.get("/v1/models/ears").json()["capabilities"]["audio_transcription"] is True

        plain = client.audio.transcriptions.create(model="ears", file=("a.ogg", AUDIO), language="de", prompt="Hi")
        assert plain.text == f"heard {len(AUDIO)} bytes" and plain.usage.seconds == 3
        logged = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
        assert logged[-1] == {"path": "/v1/audio/transcriptions", "filename": "a.ogg", "size": len(AUDIO), "fields": {
            "model": [TARGET], "response_format": ["verbose_json"], "language": ["de"], "prompt": ["Hi"]}}

        verbose = client.audio.translations.create(model="ears", file=("a.ogg", AUDIO), response_format="verbose_json")
        assert [(s.start, s.end, s.text) for s in verbose.segments] == [(0.0, 1.0, " heard"), (1.0, 2.5, f" {len(AUDIO)} bytes")]
        assert verbose.task == "translate" and verbose.duration == 2.5

        words = client.audio.transcriptions.create(model="ears", file=("a.ogg", AUDIO), response_format="verbose_json",
                                                   timestamp_granularities=["word"])
        assert [word.word for word in words.words] == ["heard", str(len(AUDIO)), "bytes"]

        vtt = http.post("/v1/audio/transcriptions", files={"file": ("a.ogg", AUDIO)},
                        data={"model": "ears", "response_format": "vtt"})
        assert vtt.text == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nheard\n\n00:00:01.000 --> 00:00:02.500\n{len(AUDIO)} bytes\n"

        refused = http.post("/v1/audio/transcriptions", files={"file": ("a.ogg", b"__error_400__")}, data={"model": "ears"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "file", refused.text
        unsupported = http.post("/v1/audio/transcriptions", files={"file": ("a.ogg", AUDIO)}, data={"model": "chat"})
        assert unsupported.json()["error"]["code"] == "transcription_unsupported"


def test_llama_server_declares_the_route_by_its_definition():
    from runtime.backends import BACKENDS

    spec = BACKENDS["llama_server"]
    served = spec.definition_model.model_validate({"backend": "llama_server", "model_path": "/m/a.gguf",
                                                   "audio_transcription": True}, strict=True)
    plain = spec.definition_model.model_validate({"backend": "llama_server", "model_path": "/m/a.gguf"}, strict=True)
    assert spec.capabilities(served)["audio_transcription"] and not spec.capabilities(plain)["audio_transcription"]
    assert spec.generates(served)  # the same server still chats
