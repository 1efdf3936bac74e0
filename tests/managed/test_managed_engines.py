"""The managed backends driven in-process through the pool, against the fake servers."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import pytest
import yaml

from runtime.backends.base import Finished, GenerationRequest, TextDelta
from runtime.backends.sglang_serve.spec import sglang_serve_command
from runtime.backends.trtllm_serve.spec import trtllm_serve_command
from runtime.backends.vllm_serve.spec import vllm_serve_command
from runtime.errors import BackendError, ContextLengthExceeded, InvalidRequest
from runtime.model.state import RuntimeState
from tests.managed.helpers import (
    TARGET,
    alive,
    eventually,
    pidfiles,
    records,
    requests_logged,
)
from tests.runtime.helpers import LOAD_CYCLE, UNLOAD_CYCLE, moves, start_pool
from tests.spec_examples import REPLICAS_BODY, SGLANG_BODY, TRTLLM_BODY, VLLM_BODY


def definition(backend: str, fake_bin, tmp_path, **fields) -> dict:
    """A definition whose binary is the fake and whose fake records into ``tmp_path``."""
    prefix = {"vllm_serve": "vllm_serve", "sglang_serve": "sglang_serve", "trtllm_serve": "trtllm_serve"}[backend]
    binary = {"vllm_serve": "vllm", "sglang_serve": "sglang", "trtllm_serve": "trtllm-serve"}[backend]
    env = {"FAKE_RECORD": str(tmp_path / "record.jsonl"), "FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl")}
    env.update(fields.pop("env", {}))
    return {
        "backend": backend,
        f"{prefix}_model": TARGET,
        f"{prefix}_binary": str(fake_bin / binary),
        f"{prefix}_env": env,
        f"{prefix}_library_path": "/opt/engine/lib",
        f"{prefix}_startup_timeout_seconds": 20.0,
        "replica_max": 3,
        **fields,
    }


def ask(text: str, **fields) -> GenerationRequest:
    message = {"role": "user", "content": [{"type": "input_text", "text": text}]}
    return GenerationRequest(request_id="r1", messages=[message], **{"max_output_tokens": 256, **fields}).resolved()


async def collect(engine, request) -> tuple[str, Finished]:
    pieces, finished = [], None
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            pieces.append(event.text)
        else:
            finished = event
    return "".join(pieces), finished


def command_for(backend: str, config: dict, port: int, yaml_path=None) -> list[str]:
    if backend == "vllm_serve":
        return vllm_serve_command(config, "127.0.0.1", port, "")
    if backend == "sglang_serve":
        return sglang_serve_command(config, "127.0.0.1", port, "")
    return trtllm_serve_command(config, "127.0.0.1", port, "", yaml_path)


EXAMPLES = [
    ("vllm_serve", {}),
    ("vllm_serve", REPLICAS_BODY),
    ("vllm_serve", VLLM_BODY),
    ("sglang_serve", REPLICAS_BODY),
    ("sglang_serve", SGLANG_BODY),
    ("trtllm_serve", REPLICAS_BODY),
    ("trtllm_serve", TRTLLM_BODY),
]


@pytest.mark.parametrize("backend, body", EXAMPLES, ids=[f"{b}-{i}" for i, (b, _) in enumerate(EXAMPLES)])
async def test_a_load_starts_exactly_the_command_of_its_body_and_unload_stops_it(
    backend, body, fake_bin, state_dir, tmp_path
):
    pool, events = await start_pool(tmp_path, {"m": definition(backend, fake_bin, tmp_path)})
    controller = pool.controller("m")
    overrides = {key: value for key, value in body.items() if key != "replicas"}
    await controller.load(overrides, body.get("replicas"))
    assert controller.state is RuntimeState.LOADED, controller.last_error
    starts = records(tmp_path / "record.jsonl")
    assert len(starts) == len(controller.engines) == body.get("replicas", 1)
    config = controller.entry.spec.effective_config(controller.entry.definition, overrides)
    engines = sorted(controller.engines, key=lambda engine: engine.process.pid)
    for start, engine in zip(sorted(starts, key=lambda start: start["pid"]), engines, strict=True):
        port = int(start["argv"][start["argv"].index("--port") + 1])
        yaml_path = engine.process.command.temp_files[0] if backend == "trtllm_serve" else None
        assert [engine.process.command.argv[0], *start["argv"]] == command_for(backend, config, port, yaml_path)
        assert start["ld_library_path"].startswith("/opt/engine/lib")
        assert start["pgid"] == start["pid"] == engine.process.pid
        if backend == "trtllm_serve":
            assert start["config"] == yaml.safe_load(yaml_path.read_text())
            assert start["config"]["max_batch_size"] == body.get("target_inflight", 1)
    assert len({engine.base_url for engine in controller.engines}) == len(controller.engines)
    assert len(pidfiles(state_dir)) == len(starts)
    await controller.unload()
    assert moves(events, "m") == LOAD_CYCLE + UNLOAD_CYCLE
    assert not any(alive(start["pid"]) for start in starts)
    assert pidfiles(state_dir) == []
    assert list((state_dir / "tmp").iterdir()) == []  # the temporary YAML is gone
    await pool.shutdown()


async def test_requests_are_forwarded_as_chat_completions_and_streamed_back(fake_bin, state_dir, tmp_path):
    fields = definition("vllm_serve", fake_bin, tmp_path, vllm_serve_api_key="k-123", prompt_format="gemma4_template")
    pool, _ = await start_pool(tmp_path, {"m": fields})
    controller = pool.controller("m")
    await controller.load({}, None)
    engine = controller.engines[0]
    streamed = ask("hello there friend", instructions="be brief", thinking="enabled", stream=True)
    text, finished = await collect(engine, streamed)
    assert text == "echo: hello there friend"
    assert finished == Finished(input_tokens=5, output_tokens=4, finish_reason="stop")
    for stream in (True, False):
        text, finished = await collect(engine, ask("one two three four", max_output_tokens=2, stream=stream))
        assert (text, finished.finish_reason, finished.output_tokens) == ("echo: one", "length", 2)
    text, finished = await collect(engine, ask("hello there friend", instructions="be brief", thinking="enabled"))
    assert text == "echo: hello there friend"
    assert finished == Finished(input_tokens=5, output_tokens=4, finish_reason="stop")
    schema = {"type": "json_schema", "name": "echo", "schema": {"type": "object"}, "strict": True}
    text, _ = await collect(engine, ask("structured", response_format=schema))
    assert text == '{"echo": "structured"}'
    await collect(engine, ask("sampled", seed=3, presence_penalty=0.5, frequency_penalty=0.25, top_k=1,
                              repeat_penalty=1.1))
    first, _, _, fourth, fifth, sixth = requests_logged(tmp_path / "requests.jsonl")
    assert first == {
        "model": TARGET,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there friend"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 256,
        "temperature": 0.7,
        "top_p": 1.0,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    # A client that does not stream gets one upstream answer: no chunk per token on either side.
    assert fourth == {**{k: v for k, v in first.items() if k != "stream_options"}, "stream": False}
    assert fifth["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "echo", "schema": {"type": "object"}, "strict": True}
    }
    # The typed request's sampling options by vLLM's names (llama-server's repeat_penalty: test_llama_server).
    assert {key: sixth[key] for key in set(sixth) - set(first)} == {
        "seed": 3, "presence_penalty": 0.5, "frequency_penalty": 0.25, "top_k": 1, "repetition_penalty": 1.1}
    await pool.shutdown()


async def test_upstream_refusals_keep_their_message(fake_bin, state_dir, tmp_path):
    pool, _ = await start_pool(tmp_path, {"m": definition("sglang_serve", fake_bin, tmp_path)})
    controller = pool.controller("m")
    await controller.load({}, None)
    engine = controller.engines[0]
    with pytest.raises(InvalidRequest, match="answered 400: bad request for the fake"):
        await collect(engine, ask("__error_400__"))
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 16 tokens"):
        await collect(engine, ask("__context__"))
    with pytest.raises(BackendError, match="answered 500: the fake broke"):
        await collect(engine, ask("__error_500__"))
    assert controller.state is RuntimeState.LOADED
    await pool.shutdown()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_server_that_dies_while_loaded_fails_the_model_and_its_requests_at_once(
    fake_bin, state_dir, tmp_path, stream
):
    fields = definition("vllm_serve", fake_bin, tmp_path, env={"FAKE_TOKEN_DELAY_MS": "300"})
    pool, events = await start_pool(tmp_path, {"m": fields})
    controller = pool.controller("m")
    await controller.load({}, None)
    engine = controller.engines[0]
    pid = engine.process.pid
    in_flight = asyncio.create_task(collect(engine, ask(" ".join(["word"] * 50), stream=stream)))
    await asyncio.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    began = time.monotonic()
    with pytest.raises(BackendError) as raised:
        await in_flight
    assert time.monotonic() - began < 2
    assert str(raised.value) == "vllm serve for model m, replica 1 exited with code -9 (SIGKILL) while generating"
    await eventually(lambda: controller.state is RuntimeState.FAILED, 5, message="model failed")
    assert moves(events, "m") == LOAD_CYCLE + [("loaded", "failed")]
    assert controller.last_error.startswith(
        "vllm serve for model m, replica 1 exited with code -9 (SIGKILL) while loaded"
    )
    assert "INFO listening on 127.0.0.1" in controller.last_error
    await eventually(lambda: pidfiles(state_dir) == [], 5, message="released")
    await pool.shutdown()


async def test_load_failures_end_in_failed_with_the_reason(fake_bin, state_dir, tmp_path):
    (tmp_path / "base.yaml").write_text("max_batch_size: 64\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        models = {
            "exits": definition("sglang_serve", fake_bin, tmp_path, env={"FAKE_EXIT_AT_START": "3"}),
            "taken": definition("vllm_serve", fake_bin, tmp_path, vllm_serve_port=taken),
            "batch": definition("trtllm_serve", fake_bin, tmp_path, trtllm_config_yaml="base.yaml"),
            "slow": definition(
                "vllm_serve", fake_bin, tmp_path, env={"FAKE_READY_AFTER": "60"}, vllm_serve_startup_timeout_seconds=0.5
            ),
            "nofile": {"backend": "llama_server", "model_path": "missing.gguf"},
        }
        pool, _ = await start_pool(tmp_path, models)
        for name in models:
            await pool.controller(name).load({}, None)
    errors = {name: pool.controller(name).last_error for name in models}
    assert all(pool.controller(name).state is RuntimeState.FAILED for name in models)
    assert errors["exits"].startswith(
        "replica 1 of 1 failed to load: sglang serve for model exits, replica 1 exited with code 3 before it was ready"
    )
    assert "FATAL fake sglang: cannot load" in errors["exits"]
    assert errors["taken"] == f"replica 1 of 1 failed to load: port {taken} on 127.0.0.1 is already in use"
    assert errors["batch"].endswith("trtllm_config_yaml must not set max_batch_size; target_inflight owns it")
    assert "was not ready within 0.5 s" in errors["slow"]
    assert errors["nofile"].endswith(f"model file not found: {tmp_path / 'missing.gguf'} (model_path 'missing.gguf')")
    assert pidfiles(state_dir) == [] and list((state_dir / "tmp").iterdir()) == []
    await pool.shutdown()


async def test_a_configured_port_is_used_by_replica_one_and_counted_up(fake_bin, state_dir, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fields = definition("vllm_serve", fake_bin, tmp_path, vllm_serve_port=port)
    pool, _ = await start_pool(tmp_path, {"m": fields})
    controller = pool.controller("m")
    await controller.load({}, 2)
    assert controller.state is RuntimeState.LOADED, controller.last_error
    assert [engine.base_url for engine in controller.engines] == [
        f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    ]
    await pool.shutdown()
    assert pidfiles(state_dir) == []


@pytest.mark.parametrize("dropped, answered", [(1, True), (2, False)])
async def test_a_connection_closed_before_any_answer_is_retried_once(fake_bin, state_dir, tmp_path, dropped, answered):
    fields = definition("vllm_serve", fake_bin, tmp_path, env={"FAKE_DROP_REQUESTS": str(dropped)})
    pool, _ = await start_pool(tmp_path, {"m": fields})
    controller = pool.controller("m")
    await controller.load({}, None)
    if answered:
        assert (await collect(controller.engines[0], ask("again")))[0] == "echo: again"
    else:
        with pytest.raises(BackendError, match="lost the connection to vllm serve for model m, replica 1"):
            await collect(controller.engines[0], ask("again"))
    assert len(requests_logged(tmp_path / "requests.jsonl")) == 2
    assert controller.state is RuntimeState.LOADED
    await pool.shutdown()
