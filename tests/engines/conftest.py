"""Fixtures of the engine tests: the tiny offline model, recording fakes of vLLM and ExLlamaV3."""
from __future__ import annotations

import pytest

from tests.engines.engine_fakes import install_fake_exllamav3, install_fake_vllm
from tests.engines.tiny_model import TinyModel, build_tiny_chat_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> TinyModel:
    """Built once per session: training the tokenizer and converting takes a few seconds."""
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def fake_vllm(monkeypatch):
    """A recording ``vllm`` module tree in sys.modules; yields its ``Recorder``."""
    return install_fake_vllm(monkeypatch)


@pytest.fixture
def fake_exllamav3(monkeypatch):
    """A recording ``exllamav3`` module in sys.modules; yields its ``Recorder``."""
    return install_fake_exllamav3(monkeypatch)
