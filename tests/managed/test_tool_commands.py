"""Managed servers started for tool calling: the exact flags per server, the extra args that
may not set them, and capabilities.tools / tool_choice following the definition."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.backends import BACKENDS
from runtime.backends.llama_server.spec import llama_server_command
from runtime.backends.sglang_serve.spec import sglang_serve_command
from runtime.backends.trtllm_serve.spec import trtllm_serve_command
from runtime.backends.vllm_serve.spec import vllm_serve_command
from tests.managed.helpers import TARGET
from tests.managed.test_commands import BASE, HOST, LLAMA_BASE, PORT, VLLM_BASE, YAML, effective

ALL_CHOICES = ["none", "auto", "required", "function"]


def test_llama_server_is_started_with_jinja_unless_tools_are_off():
    config = effective("llama_server", {"model_path": "/models/m.gguf"}, {})
    assert config["llama_server_tools"] is True
    assert llama_server_command(config, HOST, PORT, BASE) == [
        *LLAMA_BASE, "--parallel", "1", "-c", "4096", "--flash-attn", "auto", "--jinja",
    ]
    config = effective("llama_server", {"model_path": "/models/m.gguf", "llama_server_tools": False}, {})
    assert llama_server_command(config, HOST, PORT, BASE) == [
        *LLAMA_BASE, "--parallel", "1", "-c", "4096", "--flash-attn", "auto",
    ]


def test_vllm_serve_with_a_tool_call_parser_enables_auto_tool_choice():
    config = effective("vllm_serve", {"vllm_serve_model": TARGET, "vllm_tool_call_parser": "hermes",
                                      "vllm_serve_extra_args": ["--tool-parser-plugin", "/p/parser.py"]}, {})
    assert vllm_serve_command(config, HOST, PORT, BASE) == [
        *VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--tool-parser-plugin", "/p/parser.py",
    ]
    config = effective("vllm_serve", {"vllm_serve_model": TARGET}, {})
    assert config["vllm_tool_call_parser"] is None
    assert vllm_serve_command(config, HOST, PORT, BASE) == [
        *VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto",
    ]


def test_the_in_process_vllm_backend_has_no_tool_call_parser_field():
    with pytest.raises(ValidationError, match="vllm_tool_call_parser"):
        BACKENDS["vllm"].definition_model.model_validate(
            {"backend": "vllm", "model_path": TARGET, "vllm_tool_call_parser": "hermes"}
        )


def test_sglang_serve_passes_its_tool_call_parser():
    config = effective("sglang_serve", {"sglang_serve_model": TARGET, "sglang_tool_call_parser": "qwen25"}, {})
    assert sglang_serve_command(config, HOST, PORT, BASE) == [
        "sglang", "serve", "--model-path", TARGET, "--host", HOST, "--port", "8100",
        "--max-running-requests", "1", "--tool-call-parser", "qwen25",
    ]


def test_trtllm_serve_passes_its_tool_parser():
    config = effective("trtllm_serve", {"trtllm_serve_model": TARGET, "trtllm_tool_parser": "qwen3_coder"}, {})
    assert trtllm_serve_command(config, HOST, PORT, BASE, YAML) == [
        "trtllm-serve", TARGET, "--host", HOST, "--port", "8100",
        "--config", str(YAML), "--tool_parser", "qwen3_coder",
    ]


@pytest.mark.parametrize(
    "backend, args, flag, owner",
    [
        ("vllm_serve", ["--tool-call-parser", "hermes"], "--tool-call-parser", "vllm_tool_call_parser"),
        ("vllm_serve", ["--enable-auto-tool-choice"], "--enable-auto-tool-choice", "vllm_tool_call_parser"),
        ("vllm_serve", ["--tool_call_parser=hermes"], "--tool_call_parser", "vllm_tool_call_parser"),
        ("sglang_serve", ["--tool-call-parser=qwen"], "--tool-call-parser", "sglang_tool_call_parser"),
        ("trtllm_serve", ["--tool_parser", "qwen3"], "--tool_parser", "trtllm_tool_parser"),
    ],
)
def test_extra_args_may_not_set_the_tool_flags(backend, args, flag, owner):
    with pytest.raises(ValidationError) as raised:
        BACKENDS[backend].definition_model.model_validate(
            {"backend": backend, f"{backend}_model": TARGET, f"{backend}_extra_args": args}
        )
    assert f"{backend}_extra_args must not set {flag}; {owner} owns it" in str(raised.value)


@pytest.mark.parametrize(
    "backend, fields, tools",
    [
        ("llama_server", {"model_path": "/models/m.gguf"}, True),
        ("llama_server", {"model_path": "/models/m.gguf", "llama_server_tools": False}, False),
        ("vllm_serve", {"vllm_serve_model": TARGET, "vllm_tool_call_parser": "llama3_json"}, True),
        ("vllm_serve", {"vllm_serve_model": TARGET}, False),
        ("sglang_serve", {"sglang_serve_model": TARGET, "sglang_tool_call_parser": "hermes"}, True),
        ("sglang_serve", {"sglang_serve_model": TARGET}, False),
        ("trtllm_serve", {"trtllm_serve_model": TARGET, "trtllm_tool_parser": "qwen3"}, True),
        ("trtllm_serve", {"trtllm_serve_model": TARGET}, False),
        ("openai_remote", {"remote_base_url": "https://api.example/v1", "remote_model": "gpt"}, True),
    ],
)
def test_capabilities_say_whether_the_server_takes_tools(backend, fields, tools):
    spec = BACKENDS[backend]
    capabilities = spec.capabilities(spec.definition_model.model_validate({"backend": backend, **fields}))
    assert capabilities["tools"] is tools
    assert capabilities["tool_choice"] == (ALL_CHOICES if tools else ["none"])
