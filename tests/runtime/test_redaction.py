"""Secrets in model definitions: marked in the schema, redacted in every dump the runtime hands out,
real where the runtime uses them (runtime.redaction)."""
from __future__ import annotations

import re

import pytest

from runtime.backends import BACKENDS
from runtime.pool.catalog import CatalogEntry
from runtime.redaction import REDACTED, redact_flag_values, redacted_dump, secret_fields

# A field whose name says it holds a key, a token, a password, an environment or request headers.
SECRET_LOOKING = re.compile(r"(api_key|token|secret|password|_env|headers)$")
# Names of environment variables, not their values.
NOT_SECRET = {"remote_api_key_env"}
MANAGED_SERVERS = ("llama_server", "vllm_serve", "trtllm_serve", "sglang_serve")


def definition(backend: str, **fields):
    return BACKENDS[backend].definition_model.model_validate({"backend": backend, **fields})


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_field_that_looks_secret_is_marked_in_the_schema(backend):
    model = BACKENDS[backend].definition_model
    properties = model.model_json_schema()["properties"]
    looking = {name for name in model.model_fields if SECRET_LOOKING.search(name)} - NOT_SECRET
    assert looking <= set(secret_fields(model)), f"{backend}: unmarked {looking - set(secret_fields(model))}"
    for name, mark in secret_fields(model).items():
        assert properties[name]["secret"] == mark


@pytest.mark.parametrize("backend", MANAGED_SERVERS)
def test_a_managed_servers_key_env_and_secret_flags_are_marked(backend):
    marks = secret_fields(BACKENDS[backend].definition_model)
    assert marks == {f"{backend}_api_key": True, f"{backend}_env": True, f"{backend}_extra_args": "flag_values"}


def test_the_remote_key_and_headers_are_marked():
    assert secret_fields(BACKENDS["openai_remote"].definition_model) == {"remote_api_key": True, "remote_headers": True}


def test_the_dump_redacts_values_keeps_keys_and_nulls():
    server = definition("llama_server", model_path="/m.gguf", llama_server_env={"HF_TOKEN": "hf_x", "A": "1"},
                        llama_server_extra_args=["--ctx-size", "8"])
    dumped = redacted_dump(server)
    assert dumped["llama_server_env"] == {"HF_TOKEN": REDACTED, "A": REDACTED}
    assert dumped["llama_server_api_key"] is None
    assert dumped["llama_server_extra_args"] == ["--ctx-size", "8"]
    assert {k: v for k, v in dumped.items() if not k.endswith(("_env", "_api_key"))} == {
        k: v for k, v in server.model_dump().items() if not k.endswith(("_env", "_api_key"))
    }
    remote = definition("openai_remote", remote_base_url="https://api.example/v1", remote_model="m",
                        remote_api_key="sk-1", remote_headers={})
    assert redacted_dump(remote)["remote_api_key"] == REDACTED
    assert redacted_dump(remote)["remote_headers"] == {}


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--hf-token", "hf_x", "--port", "1"], ["--hf-token", REDACTED, "--port", "1"]),
        (["--api-key=k", "--api_key", "k"], [f"--api-key={REDACTED}", "--api_key", REDACTED]),
        (["--admin-password", "p", "--client-secret=s"], ["--admin-password", REDACTED, f"--client-secret={REDACTED}"]),
        (["--max-num-batched-tokens", "8192", "--tokenizer", "t"], ["--max-num-batched-tokens", "8192", "--tokenizer", "t"]),
        (["--hf-token"], ["--hf-token"]),
    ],
    ids=["next-argument", "equals-and-underscore", "password-and-secret", "look-alikes", "flag-last"],
)
def test_secret_flag_values_are_redacted(args, shown):
    assert redact_flag_values(args) == shown


def test_the_runtime_reads_the_real_values():
    server = definition("vllm_serve", vllm_serve_model="org/m", vllm_serve_api_key="sk-real",
                        vllm_serve_env={"HF_TOKEN": "hf_real"})
    config = BACKENDS["vllm_serve"].effective_config(server, {})
    assert config["vllm_serve_api_key"] == "sk-real" and config["vllm_serve_env"] == {"HF_TOKEN": "hf_real"}


def test_a_changed_secret_is_a_changed_definition():
    """A settings reload that rotates a key updates the model, though its redacted dump is the same."""
    old, new = (CatalogEntry("r", definition("openai_remote", remote_base_url="https://a.example/v1",
                                             remote_model="m", remote_api_key=key), (), ".")
                for key in ("sk-old", "sk-new"))
    assert old.definition_dict() == new.definition_dict()
    assert not old.same_definition(new)
