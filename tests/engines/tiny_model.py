"""A tiny chat model built offline: a byte-level BPE tokenizer, a 2-layer Llama, and its CTranslate2 conversion.

Nothing is downloaded: the tokenizer is trained on an in-memory text, the model
has random (seeded) weights.  ``build_tiny_chat_model(folder)`` writes
``folder/hf`` (the Hugging Face model with its tokenizer and ChatML template)
and ``folder/ct2`` (the converted model with the tokenizer files copied beside
it, as the ct2 backend expects them).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, how are you today?",
    "llm-pool serves local language models through one API; models load and unload on demand.",
    "Streaming answers arrive token by token, and usage counts report the tokens of each request.",
] * 20
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]


@dataclass(frozen=True)
class TinyModel:
    hf_path: Path
    ct2_path: Path


def build_tiny_chat_model(folder: Path) -> TinyModel:
    import torch
    from ctranslate2.converters import TransformersConverter
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # The alphabet is the corpus's own characters (no full byte alphabet), so every token
    # decodes to printable ASCII and streamed text compares exactly with a full decode.
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE

    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    hf_path, ct2_path = folder / "hf", folder / "ct2"
    model.save_pretrained(hf_path)
    fast.save_pretrained(hf_path)
    copy = [name for name in TOKENIZER_FILES if (hf_path / name).exists()]
    TransformersConverter(str(hf_path), copy_files=copy).convert(str(ct2_path), quantization="float32", force=True)
    return TinyModel(hf_path, ct2_path)


@dataclass(frozen=True)
class GreedyRun:
    prompt_ids: list[int]
    output_ids: list[int]  # the eos token included when generation stopped on it
    text: str
    stopped: bool  # True: ended on the eos token; False: ran into max_new_tokens


def transformers_greedy(model: TinyModel, messages: list[dict], max_new_tokens: int) -> GreedyRun:
    """Transformers' greedy decoding of the Hugging Face model, with the chat template applied by
    transformers itself; generation stops at the tokenizer's eos token like the engine under test."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(model.hf_path)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    llama = LlamaForCausalLM.from_pretrained(model.hf_path)
    with torch.no_grad():
        output = llama.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    output_ids = output[0][len(prompt_ids) :].tolist()
    return GreedyRun(
        prompt_ids=prompt_ids,
        output_ids=output_ids,
        text=tokenizer.decode(output_ids, skip_special_tokens=True),
        stopped=output_ids[-1] == tokenizer.eos_token_id,
    )
