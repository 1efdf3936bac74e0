"""How the runtime's usage (``cached_tokens`` among it) shows in each protocol's usage object."""
from models_app.api.openai_protocol import usage
from models_app.api.responses.shapes import ResponseBuilder
from runtime.inputs.request import GenerationRequest

MESSAGES = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def result(**used) -> dict:
    return {"text": "x", "finish_reason": "stop", "usage": {"input_tokens": 30, "output_tokens": 4, **used}}


def test_chat_shows_the_reused_prompt_tokens_where_the_engine_counted_them():
    assert usage(result(cached_tokens=25))["prompt_tokens_details"] == {"cached_tokens": 25}
    assert usage(result(cached_tokens=0))["prompt_tokens_details"] == {"cached_tokens": 0}
    # An engine that keeps no cache says nothing, and the usage object stays as it was.
    assert usage(result()) == {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}


def test_responses_shows_the_reused_input_tokens_and_zero_where_none_were_counted():
    builder = ResponseBuilder(GenerationRequest("r", MESSAGES))
    assert builder.response("completed", [], result(cached_tokens=25))["usage"]["input_tokens_details"] == {
        "cached_tokens": 25, "cache_write_tokens": 0,
    }
    assert builder.response("completed", [], result())["usage"]["input_tokens_details"]["cached_tokens"] == 0
