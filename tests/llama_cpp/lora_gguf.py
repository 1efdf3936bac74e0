"""A rank-4 LoRA adapter GGUF for a base GGUF, written with the ``gguf`` package from random
(seeded) tensors, as llama.cpp's ``convert_lora_to_gguf.py`` writes one and
``llama_adapter_lora_init`` reads it (src/llama-adapter.cpp):

- ``general.type`` ``adapter``, ``general.architecture`` the base's, ``adapter.type`` ``lora``,
  ``adapter.lora.alpha`` (llama.cpp scales the product by scale * alpha / rank);
- for each adapted base tensor ``X.weight`` of shape (ggml order) ``[n_in, n_out]``, the pair
  ``X.weight.lora_a`` ``[n_in, rank]`` and ``X.weight.lora_b`` ``[rank, n_out]`` (numpy shapes
  reversed: ``(rank, n_in)`` and ``(n_out, rank)``).

The attention projections of every block are adapted (``attn_q``, ``attn_k``, ``attn_v``,
``attn_output``), strongly enough that a greedy answer of SmolLM2 differs from the base's.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy

RANK = 4
ADAPTED = ("attn_q", "attn_k", "attn_v", "attn_output")


def write_lora_gguf(base: Path, path: Path, *, seed: int = 3, alpha: float = 8.0, spread: float = 0.2) -> Path:
    reader = gguf.GGUFReader(str(base))
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    rng = numpy.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for tensor in reader.tensors:
        name = tensor.name
        if not (name.startswith("blk.") and name.split(".")[2] in ADAPTED and name.endswith(".weight")):
            continue
        n_in, n_out = (int(n) for n in tensor.shape[:2])
        lora_a = (rng.standard_normal((RANK, n_in)) * spread).astype(numpy.float32)
        lora_b = (rng.standard_normal((n_out, RANK)) * spread).astype(numpy.float32)
        writer.add_tensor(f"{name}.lora_a", lora_a)
        writer.add_tensor(f"{name}.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
