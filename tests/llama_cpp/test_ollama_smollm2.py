"""Ollama's API on a real model: SmolLM2-135M-Instruct through the official ``ollama`` client.
/api/show reads the GGUF header (architecture, context, size label, quantization); chat and
generate answer with real token counts and durations.  Mechanics only, never the exact text."""
from __future__ import annotations

import ollama
import pytest
from llama_helpers import SMOLLM2_MODEL, load, start_service

from runtime.pool.gguf_info import read_gguf_info


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    live = start_service(tmp_path_factory.mktemp("ollama_smollm2"), {"smol": {**SMOLLM2_MODEL, "gguf_n_ctx": 1024}},
                         engine={"decoding": {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 16}})
    with live.client(timeout=120) as http:
        load(http, "smol")
    yield live
    assert live.stop() == 0


@pytest.fixture(scope="module")
def client(service):
    return ollama.Client(host=service.url, timeout=120)


def test_show_reads_the_gguf_header(client, smollm2_gguf):
    header = read_gguf_info(str(smollm2_gguf))
    shown = client.show("smol")
    assert shown.modelinfo["general.architecture"] == header.architecture == "llama"
    assert shown.modelinfo["llama.context_length"] == 1024  # the loaded context, not the trained one
    assert shown.details.format == "gguf" and shown.details.family == "llama"
    assert shown.details.quantization_level == "Q4_1"
    running = {model.name: model for model in client.ps().models}
    assert running["smol"].context_length == 1024 and running["smol"].size > smollm2_gguf.stat().st_size // 2
    listed = next(model for model in client.list().models if model.model == "smol")
    assert listed.size == smollm2_gguf.stat().st_size


def test_chat_and_generate_count_and_time_real_tokens(client):
    answer = client.chat(model="smol", messages=[{"role": "user", "content": "Name a colour."}],
                         options={"num_predict": 8, "temperature": 0})
    assert answer.done and answer.message.content and 0 < answer.eval_count <= 8
    assert answer.prompt_eval_count > 5 and answer.prompt_eval_duration > 0 and answer.eval_duration > 0
    assert answer.total_duration > answer.eval_duration
    pieces = list(client.chat(model="smol", messages=[{"role": "user", "content": "Name a colour."}], stream=True,
                              options={"num_predict": 8, "temperature": 0}))
    assert "".join(piece.message.content for piece in pieces) == answer.message.content
    assert pieces[-1].done and pieces[-1].eval_count == answer.eval_count
    generated = client.generate(model="smol", prompt="Count: one, two,", options={"num_predict": 4})
    assert generated.done and generated.response and generated.eval_count <= 4
