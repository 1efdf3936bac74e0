"""Speculative decoding in the llama_cpp batch loop, for real (SmolLM2): prompt lookup
(``ngram-simple``) and a draft model (SmolLM2 drafting for itself) answer token for token what
plain decoding answers at temperature 0, one request at a time and several at once, with their
drafted and accepted tokens in ``Finished``; the rejected drafts leave no position behind.

Flash attention is off, as in test_batching.py: its CPU kernels round by the rows per sequence of
a micro-batch, and a draft verified in one batch has several.  The KV cache is in f32: with f16 K
and V, llama.cpp's CPU attention rounds one query row of a sequence and several apart.  Even in
f32 the two part once a sequence holds about 186 tokens (plain decoding fed two tokens at a time
does too: docs/backends/llama_cpp.md, "Same answers"); these prompts meet no near tie there.
"""
from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from llama_helpers import SMOLLM2_MODEL, SMOLLM2_MODEL_PATH, answer_of

from runtime.backends import BACKENDS
from runtime.backends.base import GenerationRequest
from runtime.backends.llama_cpp.engine import LlamaCppEngine
from runtime.backends.llama_cpp.native import EngineLoadError

SPEC = BACKENDS["llama_cpp"]
SLOTS = 3
TABLE = "\n".join(f"| {i} | item-{i} | {i * 7 % 13} kg | shelf {chr(65 + i % 5)} |" for i in range(1, 9))
PROMPTS = [
    f"Copy this table exactly, row by row:\n{TABLE}",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nWrite mul and div the same way.",
    f"Here is a stock list:\n{TABLE}\nWrite it again with the rows in the same order.",
]


def make_engine(state, **fields) -> LlamaCppEngine:
    definition = SPEC.definition_model.model_validate(
        {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "gguf_flash_attn": "off", "target_inflight": SLOTS,
         "gguf_type_k": "f32", "gguf_type_v": "f32", **fields})
    return SPEC.create_engine("m", SPEC.effective_config(definition, {}), 0, {"base_dir": str(state)})


def ask(prompt: str, max_output_tokens: int = 48, **sampling) -> GenerationRequest:
    return GenerationRequest("r", [{"role": "user", "content": [{"type": "input_text", "text": prompt}]}],
                             max_output_tokens=max_output_tokens, **{"temperature": 0.0, **sampling}).resolved()


async def on_worker(engine: LlamaCppEngine, work, *args):
    return await asyncio.get_running_loop().run_in_executor(engine._worker, work, *args)


async def one_by_one(engine: LlamaCppEngine, requests):
    answers = []
    for request in requests:
        await on_worker(engine, engine.context.clear)
        answers.append(await answer_of(engine, request))
    return answers


def plain(answers) -> list[tuple[str, int, str]]:
    return [(text, finished.output_tokens, finished.finish_reason) for text, finished in answers]


def positions_held(engine: LlamaCppEngine) -> list[int]:
    """Each sequence's positions in the KV cache (its last position + 1)."""
    lib = engine.context._lib
    memory = lib.llama_get_memory(engine.context.ctx)
    return [lib.llama_memory_seq_pos_max(memory, seq) + 1 for seq in range(engine.context.n_seq)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def reference(tmp_path_factory):
    """Plain decoding's answers: each prompt alone, then all at once."""
    engine = make_engine(tmp_path_factory.mktemp("plain"))
    await engine.load()
    try:
        requests = [ask(prompt) for prompt in PROMPTS]
        alone = await one_by_one(engine, requests)
        await on_worker(engine, engine.context.clear)
        together = await asyncio.gather(*(answer_of(engine, request) for request in requests))
        yield plain(alone), plain(together)
    finally:
        await engine.unload()


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize(
    "fields",
    [
        {"gguf_spec_type": "ngram-simple", "gguf_spec_draft_n_max": 6},
        {"gguf_spec_type": "draft-simple", "gguf_spec_draft_model": SMOLLM2_MODEL_PATH, "gguf_spec_draft_n_max": 4},
    ],
    ids=["ngram-simple", "draft-simple"],
)
async def test_speculative_answers_are_plain_decodings_token_for_token(reference, tmp_path, fields):
    alone_expected, together_expected = reference
    engine = make_engine(tmp_path, **fields)
    await engine.load()
    try:
        requests = [ask(prompt) for prompt in PROMPTS]
        alone = await one_by_one(engine, requests)
        assert plain(alone) == alone_expected
        await on_worker(engine, engine.context.clear)
        together = await asyncio.gather(*(answer_of(engine, request) for request in requests))
        assert plain(together) == together_expected
        for _, finished in [*alone, *together]:
            assert finished.draft_tokens is not None and 0 <= finished.accepted_tokens <= finished.draft_tokens
        drafted = sum(finished.draft_tokens for _, finished in together)
        accepted = sum(finished.accepted_tokens for _, finished in together)
        assert drafted > 0 and accepted > 0
        if fields["gguf_spec_type"] == "draft-simple":
            # A model drafting for itself is right but where the two contexts round a near tie apart.
            assert accepted >= 0.9 * drafted
        # The rejected drafts were cut: each sequence's cache holds exactly its tokens.
        assert positions_held(engine) == [len(tokens) for tokens in engine.context.sequences]
    finally:
        await engine.unload()


async def test_a_plain_model_reports_no_speculative_figures(tmp_path):
    engine = make_engine(tmp_path)
    await engine.load()
    try:
        _, finished = await answer_of(engine, ask(PROMPTS[0], max_output_tokens=4))
        assert finished.draft_tokens is None and finished.accepted_tokens is None
    finally:
        await engine.unload()


async def test_a_draft_model_on_another_vocabulary_fails_the_load(tmp_path, gemma3_gguf):
    engine = make_engine(tmp_path, gguf_spec_type="draft-simple", gguf_spec_draft_model=str(gemma3_gguf))
    with pytest.raises(EngineLoadError, match="vocabulary"):
        await engine.load()
    assert engine.weights is None and engine.context is None
