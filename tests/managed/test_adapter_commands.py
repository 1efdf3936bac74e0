"""LoRA adapters on the managed servers' command lines (runtime.backends.shared.adapters): the
exact flags (vllm_serve's modules those ``adapters_loaded`` keeps), and extra args that may not
set them."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.backends.llama_server.spec import llama_server_command
from runtime.backends.shared.adapters import server_lora
from runtime.backends.vllm_serve.spec import vllm_serve_command
from tests.managed.helpers import TARGET
from tests.managed.test_commands import BASE, HOST, LLAMA_BASE, PORT, VLLM_BASE, effective

ADAPTERS = {"sql": {"path": "adapters/sql.gguf", "scale": 0.5}, "poet": {"path": "/lora/poet.gguf"}}


def test_llama_server_loads_each_adapter_unapplied_in_the_declared_order():
    config = effective("llama_server", {"model_path": "/models/m.gguf", "adapters": ADAPTERS}, {})
    assert llama_server_command(config, HOST, PORT, BASE) == [
        *LLAMA_BASE, "--parallel", "1", "-c", "4096", "--flash-attn", "auto", "--jinja",
        "--lora", "/settings/adapters/sql.gguf", "--lora", "/lora/poet.gguf", "--lora-init-without-apply",
    ]


def test_vllm_serve_enables_lora_with_each_module_and_the_rank():
    adapters = {"sql": {"path": "/peft/sql"}, "poet": {"path": "peft/poet"}}
    config = effective("vllm_serve", {"vllm_serve_model": TARGET, "adapters": adapters, "vllm_max_lora_rank": 32}, {})
    assert vllm_serve_command(config, HOST, PORT, BASE) == [
        *VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto",
        "--enable-lora", "--lora-modules", "sql=/peft/sql", "poet=/settings/peft/poet",
        "--max-loras", "2", "--max-lora-rank", "32",
    ]


@pytest.mark.parametrize("kept, modules", [(["poet"], ["--lora-modules", "poet=/settings/peft/poet"]), ([], [])])
def test_vllm_serve_starts_with_the_kept_modules_and_room_for_every_declared_one(kept, modules):
    adapters = {"sql": {"path": "/peft/sql"}, "poet": {"path": "peft/poet"}}
    config = effective("vllm_serve", {"vllm_serve_model": TARGET, "adapters": adapters}, {"adapters_loaded": kept})
    assert vllm_serve_command(config, HOST, PORT, BASE) == [
        *VLLM_BASE, "--max-num-seqs", "1", "--tensor-parallel-size", "1", "--dtype", "auto",
        "--enable-lora", *modules, "--max-loras", "2",
    ]


def test_no_adapters_no_lora_flags():
    config = effective("vllm_serve", {"vllm_serve_model": TARGET, "vllm_max_lora_rank": 32}, {})
    assert not any("lora" in arg for arg in vllm_serve_command(config, HOST, PORT, BASE))


@pytest.mark.parametrize("backend, fields, flag", [
    ("llama_server", {"model_path": "/m.gguf"}, "--lora"),
    ("llama_server", {"model_path": "/m.gguf"}, "--lora-init-without-apply"),
    ("vllm_serve", {"vllm_serve_model": TARGET}, "--lora-modules"),
    ("vllm_serve", {"vllm_serve_model": TARGET}, "--enable-lora"),
])
def test_the_extra_args_may_not_set_the_adapter_flags(backend, fields, flag):
    with pytest.raises(ValidationError, match=f"must not set {flag}; adapters owns it"):
        effective(backend, {**fields, f"{backend}_extra_args": [flag, "x"]}, {})


def test_every_llama_server_request_names_each_adapter_the_asked_one_at_its_scale():
    config = effective("llama_server", {"model_path": "/models/m.gguf", "adapters": ADAPTERS}, {})
    assert server_lora(config, "poet") == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
    assert server_lora(config, "sql") == [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 0.0}]
    assert server_lora(config, None) == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]  # the base
