"""Third-party clients unchanged against a live ``serve``: langchain-openai ``ChatOpenAI`` (its
default chat completions mode), pydantic-ai ``Agent`` on ``OpenAIChatModel`` + ``OpenAIProvider``
and litellm ``completion("openai/...")``, each plain and streamed, on a stub model (exact text
and usage) and on SmolLM2 for real (the mechanics: text, usage, finish reason); and an inference
key (service.api_keys) through each of them.

litellm reads its model cost map at import; LITELLM_LOCAL_MODEL_COST_MAP keeps it from asking
the network for it (nothing outside this machine is reachable).
"""
from __future__ import annotations

import asyncio
import os
import secrets

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import openai  # noqa: E402
import pytest  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.exceptions import ModelHTTPError  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from models_app.api.keys import hash_key  # noqa: E402
from tests.conftest import LiveService  # noqa: E402
from tests.llama_cpp.llama_helpers import SMOLLM2_MODEL, load, start_service  # noqa: E402

REPLY = "alpha beta gamma delta"
PROMPT = "hello there"  # the stub counts words: 2 input tokens
MODELS = {"fixed": {"backend": "stub", "stub_reply": REPLY}, "smol": SMOLLM2_MODEL}
SMOL_INSTRUCTIONS = "You are brief."
SMOL_PROMPT = "What is the capital of France?"
SMOL_MESSAGES = [{"role": "system", "content": SMOL_INSTRUCTIONS}, {"role": "user", "content": SMOL_PROMPT}]
SMOL_MAX_TOKENS = 12
WEBUI_KEY = secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    live = start_service(tmp_path_factory.mktemp("client_libraries"), MODELS,
                         engine={"decoding": {"temperature": 0.0}})
    try:
        with live.client(timeout=120) as http:
            for name in MODELS:
                assert load(http, name)["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def keyed_service(tmp_path_factory, api_shape):
    """Only the key "webui" may call, and only the model fixed."""
    key = {"name": "webui", "key_sha256": hash_key(WEBUI_KEY), "models": ["fixed"]}
    live = start_service(tmp_path_factory.mktemp("client_libraries_keys"), {"fixed": MODELS["fixed"]},
                         service={"api_keys": [key]})
    try:
        with live.client() as http:
            assert load(http, "fixed")["runtime_state"] == "loaded"
        yield live
    finally:
        live.stop()


def base_url(live: LiveService) -> str:
    return live.url + "/v1"


# ---- langchain-openai ------------------------------------------------------------------


def chat_openai(live: LiveService, model: str, api_key: str = "unused", **options) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url(live), api_key=api_key, model=model, max_retries=0, timeout=120, **options)


def test_langchain_invoke_on_a_stub(service):
    message = chat_openai(service, "fixed").invoke(PROMPT)
    assert message.content == REPLY
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.response_metadata["model_name"] == "fixed"
    assert message.usage_metadata["input_tokens"] == 2
    assert message.usage_metadata["output_tokens"] == 4
    assert message.usage_metadata["total_tokens"] == 6


def test_langchain_stream_on_a_stub(service):
    chunks = list(chat_openai(service, "fixed").stream(PROMPT))
    assert "".join(chunk.content for chunk in chunks) == REPLY
    merged = sum(chunks[1:], chunks[0])
    assert merged.response_metadata["finish_reason"] == "stop"
    assert merged.usage_metadata is None  # the default mode asks for no usage from a non-OpenAI base_url
    with_usage = list(chat_openai(service, "fixed", stream_usage=True).stream(PROMPT))
    merged = sum(with_usage[1:], with_usage[0])
    assert merged.content == REPLY
    assert (merged.usage_metadata["input_tokens"], merged.usage_metadata["output_tokens"]) == (2, 4)


def test_langchain_on_smollm2_for_real(service):
    llm = chat_openai(service, "smol", max_tokens=SMOL_MAX_TOKENS, stream_usage=True)
    message = llm.invoke(SMOL_MESSAGES)
    assert message.content.strip()
    assert message.response_metadata["finish_reason"] in ("stop", "length")
    assert message.usage_metadata["input_tokens"] > 5
    assert 0 < message.usage_metadata["output_tokens"] <= SMOL_MAX_TOKENS
    chunks = list(llm.stream(SMOL_MESSAGES))
    merged = sum(chunks[1:], chunks[0])
    assert merged.content.strip()
    assert merged.response_metadata["finish_reason"] in ("stop", "length")
    assert merged.usage_metadata["input_tokens"] == message.usage_metadata["input_tokens"]
    assert 0 < merged.usage_metadata["output_tokens"] <= SMOL_MAX_TOKENS


# ---- pydantic-ai -----------------------------------------------------------------------


def agent(live: LiveService, model: str, api_key: str = "unused", **options) -> Agent:
    provider = OpenAIProvider(base_url=base_url(live), api_key=api_key)
    return Agent(OpenAIChatModel(model, provider=provider), **options)


async def run_stream(runner: Agent, prompt: str) -> tuple[list[str], str, object, object]:
    """(the text deltas, the output, the run's usage, the final model response) of a streamed run."""
    async with runner.run_stream(prompt) as stream:
        deltas = [delta async for delta in stream.stream_text(delta=True, debounce_by=None)]
        output = await stream.get_output()
        return deltas, output, stream.usage, stream.response


def test_pydantic_ai_run_on_a_stub(service):
    result = agent(service, "fixed").run_sync(PROMPT)
    assert result.output == REPLY
    assert result.response.finish_reason == "stop"
    assert result.response.model_name == "fixed"
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.requests) == (2, 4, 1)


def test_pydantic_ai_run_stream_on_a_stub(service):
    deltas, output, usage, response = asyncio.run(run_stream(agent(service, "fixed"), PROMPT))
    assert "".join(deltas) == REPLY
    assert output == REPLY
    assert response.finish_reason == "stop"
    assert (usage.input_tokens, usage.output_tokens) == (2, 4)


def test_pydantic_ai_on_smollm2_for_real(service):
    runner = agent(service, "smol", instructions=SMOL_INSTRUCTIONS, model_settings={"max_tokens": SMOL_MAX_TOKENS})
    result = runner.run_sync(SMOL_PROMPT)
    assert result.output.strip()
    assert result.response.finish_reason in ("stop", "length")
    assert result.usage.input_tokens > 5
    assert 0 < result.usage.output_tokens <= SMOL_MAX_TOKENS
    deltas, output, usage, response = asyncio.run(run_stream(runner, SMOL_PROMPT))
    assert "".join(deltas) == output and output.strip()
    assert response.finish_reason in ("stop", "length")
    assert usage.input_tokens == result.usage.input_tokens
    assert 0 < usage.output_tokens <= SMOL_MAX_TOKENS


# ---- litellm ---------------------------------------------------------------------------


def litellm_completion(live: LiveService, model: str, messages, api_key: str = "unused", **options):
    return litellm.completion(model=f"openai/{model}", api_base=base_url(live), api_key=api_key,
                              messages=messages, timeout=120, **options)


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_litellm_completion_on_a_stub(service):
    answer = litellm_completion(service, "fixed", user(PROMPT))
    assert answer.choices[0].message.content == REPLY
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (2, 4, 6)


def test_litellm_streamed_completion_on_a_stub(service):
    chunks = list(litellm_completion(service, "fixed", user(PROMPT), stream=True,
                                     stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 4)


def test_litellm_on_smollm2_for_real(service):
    answer = litellm_completion(service, "smol", SMOL_MESSAGES, max_tokens=SMOL_MAX_TOKENS)
    assert answer.choices[0].message.content.strip()
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > 5
    assert 0 < answer.usage.completion_tokens <= SMOL_MAX_TOKENS
    chunks = list(litellm_completion(service, "smol", SMOL_MESSAGES, max_tokens=SMOL_MAX_TOKENS, stream=True,
                                     stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(reasons) == 1 and reasons[0] in ("stop", "length")
    assert chunks[-1].usage.prompt_tokens == answer.usage.prompt_tokens
    assert 0 < chunks[-1].usage.completion_tokens <= SMOL_MAX_TOKENS


# ---- an inference key through each client ----------------------------------------------


def test_an_api_key_works_through_each_client(keyed_service):
    assert chat_openai(keyed_service, "fixed", api_key=WEBUI_KEY).invoke(PROMPT).content == REPLY
    assert "".join(c.content for c in chat_openai(keyed_service, "fixed", api_key=WEBUI_KEY).stream(PROMPT)) == REPLY
    assert agent(keyed_service, "fixed", api_key=WEBUI_KEY).run_sync(PROMPT).output == REPLY
    assert asyncio.run(run_stream(agent(keyed_service, "fixed", api_key=WEBUI_KEY), PROMPT))[1] == REPLY
    answer = litellm_completion(keyed_service, "fixed", user(PROMPT), api_key=WEBUI_KEY)
    assert answer.choices[0].message.content == REPLY
    chunks = litellm_completion(keyed_service, "fixed", user(PROMPT), api_key=WEBUI_KEY, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY


def test_a_wrong_api_key_is_each_clients_authentication_error(keyed_service):
    with pytest.raises(openai.AuthenticationError) as raised:
        chat_openai(keyed_service, "fixed", api_key="wrong").invoke(PROMPT)
    assert raised.value.code == "invalid_api_key"
    with pytest.raises(ModelHTTPError) as raised:
        agent(keyed_service, "fixed", api_key="wrong").run_sync(PROMPT)
    assert raised.value.status_code == 401
    assert raised.value.body["code"] == "invalid_api_key"
    with pytest.raises(litellm.AuthenticationError) as raised:
        litellm_completion(keyed_service, "fixed", user(PROMPT), api_key="wrong")
    assert raised.value.status_code == 401
    assert "the API key is not valid" in str(raised.value)  # the envelope's message


def test_a_model_the_key_may_not_use_is_each_clients_permission_error(keyed_service):
    with pytest.raises(openai.PermissionDeniedError) as raised:
        chat_openai(keyed_service, "smol", api_key=WEBUI_KEY).invoke(PROMPT)
    assert raised.value.code == "model_not_allowed"
    with pytest.raises(ModelHTTPError) as raised:
        agent(keyed_service, "smol", api_key=WEBUI_KEY).run_sync(PROMPT)
    assert raised.value.status_code == 403
    assert raised.value.body["code"] == "model_not_allowed"
    with pytest.raises(litellm.APIError) as raised:  # litellm maps an OpenAI-style 403 to its APIError
        litellm_completion(keyed_service, "smol", user(PROMPT), api_key=WEBUI_KEY)
    assert raised.value.status_code == 403
    assert "may not use the model 'smol'" in str(raised.value)
