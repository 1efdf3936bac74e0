"""SmolLM2 loaded by its requests, for real: a live ``serve``, the openai client, 100 concurrent
requests for the unloaded model -> exactly one load (seen on the admin event stream), all
answered; then a streamed request after its TTL unloaded it loads it again.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from llama_helpers import SMOLLM2_MODEL, start_service

from tests.admin_ui.helpers import EventStream
from tests.conftest import model_entry, wait_until

REQUESTS = 100


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    models = {"smol": {**SMOLLM2_MODEL, "load_on_request": True, "ttl_seconds": 2, "aliases": ["gpt-4o-mini"]}}
    live = start_service(
        tmp_path_factory.mktemp("on_demand_smollm2"), models,
        engine={"decoding": {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 4},
                "fairness": {"per_key_queue_limit": REQUESTS, "executor_queue_limit": REQUESTS}},
    )
    yield live
    assert live.stop() == 0


def test_a_hundred_concurrent_requests_load_smollm2_once_and_are_all_answered(service):
    client = openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0, timeout=300)
    seen: list[dict] = []
    with EventStream(service) as stream:
        collecting = threading.Thread(target=lambda: seen.extend(stream.transitions(2)), daemon=True)
        collecting.start()

        def ask(index: int) -> str:
            answer = client.chat.completions.create(
                model="gpt-4o-mini" if index % 2 else "smol",
                messages=[{"role": "user", "content": f"Say hello {index}"}],
                max_tokens=1,  # one token each: the hundred requests, not their length, are the test
            )
            return answer.choices[0].message.content

        with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
            answers = list(pool.map(ask, range(REQUESTS)))
        collecting.join(timeout=30)
    assert len(answers) == REQUESTS and all(isinstance(text, str) and text for text in answers)
    assert [(e["from"], e["to"], e["reason"]) for e in seen] == [
        ("unloaded", "loading", "request"), ("loading", "loaded", "request")
    ]
    with service.client() as http:
        entry = model_entry(http, "smol")
    assert entry["runtime_state"] == "loaded" and entry["waiting_requests"] == 0


def test_after_its_ttl_a_streamed_request_loads_it_again(service):
    with service.client(timeout=120) as http:
        assert wait_until(lambda: model_entry(http, "smol")["runtime_state"] == "unloaded", timeout=30)
        with openai.OpenAI(base_url=service.url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
            events = list(client.responses.create(model="smol", input="Hi", stream=True))
        # max_output_tokens 4: the answer is cut (incomplete), never an error
        assert events[-1].type == "response.incomplete"
        assert events[-1].response.usage.output_tokens == 4 and events[-1].response.output_text
        entry = model_entry(http, "smol")
        assert (entry["runtime_state"], entry["last_reason"]) == ("loaded", "request")
