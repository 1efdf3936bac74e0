"""Pass-through for real: chat completions through ``manage.py serve`` to the cached llama-server
build serving SmolLM2, with the official openai client; fields only llama-server has come back,
its refusals are our 400, and a client that leaves frees llama-server's slot at once."""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.managed.helpers import pidfiles, wait_until

SAY_YES = [{"role": "user", "content": "Say yes."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


@pytest.fixture
def smol(live_service, llama_server_binary, smollm2_gguf, tmp_path):
    """A service with SmolLM2 on llama-server (one slot) loaded: (the service, llama-server's URL)."""
    model = {
        "backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 1024, "llama_server_startup_timeout_seconds": 60.0, "target_inflight": 1,
        # Every call streamed, short ones too: the answers compared with llama-server's own below are
        # put back together from its stream (forwarding.assemble); test_llama_server_unstreamed.py
        # covers the short calls that go unstreamed by default.
        "llama_server_unstreamed_max_tokens": 0,
    }
    service = live_service({"smol": model}, env={"LLMPOOL_STATE_DIR": str(tmp_path / "state")})
    with service.client(timeout=120) as http:
        assert http.post("/v1/admin/models/smol/load").json()["runtime_state"] == "loaded"
    argv = pidfiles(tmp_path / "state")[0]["argv"]
    yield service, f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    assert service.stop() == 0


def busy(server: str) -> bool:
    return any(slot["is_processing"] for slot in httpx.get(server + "/slots", timeout=10).json())


@contextmanager
def polling_slots(server: str, every: float = 0.1):
    """Ask llama-server for its /slots every ``every`` seconds in a thread while the block runs."""
    done = threading.Event()

    def poll():
        while not done.wait(every):
            busy(server)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield
    finally:
        done.set()
        poller.join()


def test_llama_servers_own_answer_comes_back_with_its_fields(smol):
    service, server = smol
    with openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        # n_probs is llama-server's own field: the typed path would refuse it.
        fields = {"messages": SAY_YES, "max_tokens": 4, "temperature": 0}
        answer = client.chat.completions.with_raw_response.create(model="smol", **fields, extra_body={"n_probs": 2})
        raw = json.loads(answer.text)
        completion = ChatCompletion.model_validate(raw, strict=True)
        assert completion.model == "smol"
        assert "timings" in raw  # llama-server's own answer, not one llm-pool shaped
        probabilities = completion.choices[0].logprobs.content
        assert len(probabilities) == completion.usage.completion_tokens
        assert all(len(token.top_logprobs) == 2 for token in probabilities)
        direct = httpx.post(server + "/v1/chat/completions", json={"model": "x", "n_probs": 2, **fields}, timeout=60)
        assert raw["choices"] == direct.json()["choices"]  # greedy: what llama-server answers directly

        # A grammar (llama-server's GBNF) holds the answer to it.
        constrained = client.chat.completions.create(
            model="smol", messages=SAY_YES, max_tokens=4, temperature=0, extra_body={"grammar": 'root ::= "maybe"'}
        )
        assert constrained.choices[0].message.content == "maybe"

        # Streamed, with the usage chunk asked for and logprobs on every token.
        chunks = list(client.chat.completions.create(
            model="smol", messages=SAY_YES, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}, logprobs=True, top_logprobs=1,
        ))
        assert {chunk.model for chunk in chunks} == {"smol"}
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        assert text == completion.choices[0].message.content  # greedy: the same answer as above
        assert sum(len(chunk.choices[0].logprobs.content) for chunk in chunks
                   if chunk.choices and chunk.choices[0].logprobs) == 4


def test_streamed_chunks_are_strict_chat_completion_chunks(smol):
    service, _ = smol
    body = {"model": "smol", "messages": SAY_YES, "max_tokens": 4, "temperature": 0, "stream": True}
    with service.client(timeout=120) as http, http.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True) for line in lines[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks)  # not asked for: left out again


def test_llama_servers_refusals_are_our_400(smol):
    service, _ = smol
    with service.client(timeout=120) as http:
        for stream in (False, True):
            def ask(**fields) -> dict:
                answer = http.post("/v1/chat/completions",
                                   json={"model": "smol", "messages": SAY_YES, "stream": stream, **fields})
                assert answer.status_code == 400, answer.text
                return answer.json()["error"]

            error = ask(n=2)
            assert error["code"] == "invalid_request" and "Value must be between 1 <= value <= 1, but got 2" in error["message"]
            assert ask(grammar="root ::= (")["message"].endswith("failed to parse grammar")
            too_long = [{"role": "user", "content": "word " * 3000}]
            assert ask(messages=too_long)["code"] == "context_length_exceeded"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_frees_llama_servers_slot_at_once(smol, stream):
    service, server = smol
    # ignore_eos (llama-server's own field, passed through): the answer runs its 2,000 tokens.
    body = {"model": "smol", "messages": STORY, "max_tokens": 2000, "temperature": 0, "stream": stream,
            "ignore_eos": True}
    # Streamed, the client leaves after the first chunk; not streamed, it gives up after 2 s (read
    # timeout) and closes its connection: llama-server is generating by then.
    with service.client(timeout=httpx.Timeout(120, read=None if stream else 2.0)) as leaving:
        if stream:
            with leaving.stream("POST", "/v1/chat/completions", json=body) as answer:
                # The line iterator stays referenced: a throwaway one is closed (and with it the
                # connection) as soon as next() returns, so the client would leave before the check.
                lines = answer.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                wait_until(lambda: busy(server), timeout=5, message="llama-server generating")
        else:
            # Polling /slots the while (as a busy server answers other tasks all the time) is what
            # kept llama-server from noticing a non-streamed client that left: it looks only after a
            # second in which no task of its own answered anything (runtime.backends.shared.forwarding).
            with polling_slots(server), pytest.raises(httpx.ReadTimeout):
                leaving.post("/v1/chat/completions", json=body)
    # Within seconds, where the abandoned 2,000 tokens would take half a minute or more here.
    wait_until(lambda: not busy(server), timeout=10, message="llama-server's slot freed after the client left")
    # One slot: a following request is served at once, not after the abandoned 2,000 tokens.
    with service.client(timeout=30) as http:
        answer = http.post("/v1/chat/completions", json={"model": "smol", "messages": SAY_YES, "max_tokens": 2})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
