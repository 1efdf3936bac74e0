"""GGUF metadata, read from the file header without loading weights.

``gguf.GGUFReader`` parses every tensor and the whole vocabulary (seconds for a
small model); the runtime only needs a handful of keys (architecture, layer and
head counts, the chat template), so this module walks the key/value header
itself, using the ``gguf`` package's value types, key names and GGML type
table, and skips the large arrays without decoding them.  Results are cached
per file (path, size, mtime), so a VRAM estimate reads a file once.
"""
from __future__ import annotations

import functools
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import gguf

# Arrays longer than this are skipped (the vocabulary, merges, scores), not decoded.
_MAX_ARRAY_ITEMS = 4096

_SCALAR_FORMATS = {
    gguf.GGUFValueType.UINT8: "B",
    gguf.GGUFValueType.INT8: "b",
    gguf.GGUFValueType.UINT16: "H",
    gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I",
    gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f",
    gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT64: "Q",
    gguf.GGUFValueType.INT64: "q",
    gguf.GGUFValueType.FLOAT64: "d",
}


# enum llama_pooling_type (``{arch}.pooling_type``) by value.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class GgufError(ValueError):
    """The file is not a readable GGUF file."""


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array too long to keep; only its element type and length are recorded."""

    item_type: gguf.GGUFValueType
    length: int


@dataclass(frozen=True)
class GgufInfo:
    path: str
    file_size: int
    metadata: dict[str, Any] = field(repr=False)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get(gguf.Keys.General.ARCHITECTURE)

    def arch_value(self, key_template: str):
        """A ``{arch}.…`` key of ``gguf.Keys`` for this file's architecture, or None."""
        if self.architecture is None:
            return None
        return self.metadata.get(key_template.format(arch=self.architecture))

    @property
    def chat_template(self) -> str | None:
        template = self.metadata.get(gguf.Keys.Tokenizer.CHAT_TEMPLATE)
        return template if isinstance(template, str) and template.strip() else None

    @property
    def context_length(self) -> int | None:
        return self.arch_value(gguf.Keys.LLM.CONTEXT_LENGTH)

    @property
    def pooling_type(self) -> str | None:
        """``{arch}.pooling_type`` by llama.cpp's name (none, mean, cls, last, rank), or None
        when the file declares none (generative models do not)."""
        value = self.arch_value(gguf.Keys.LLM.POOLING_TYPE)
        return POOLING_NAMES.get(value) if isinstance(value, int) else None

    @property
    def embedding_pooling(self) -> str:
        """How llm-pool pools this model's embeddings (``embeddings: true``): the pooling an
        embedding model declares (mean, cls or last), else mean, the average of the tokens'
        embeddings (a generative model, a reranker's rank pooling)."""
        declared = self.pooling_type
        return declared if declared in ("mean", "cls", "last") else "mean"

    def kv_cache_bytes(self, n_ctx: int, type_k: str | None, type_v: str | None) -> int | None:
        """Bytes of one context's K and V cache: layers × KV heads × head dims × n_ctx × type size.

        ``type_k``/``type_v`` are GGML type names (``None`` is llama.cpp's default, f16).  Returns
        None when the header lacks the layer or head counts.  Sliding-window layers are counted
        at full n_ctx (llama.cpp allocates them fully by default, ``swa_full``).
        """
        layers = self.arch_value(gguf.Keys.LLM.BLOCK_COUNT)
        heads = self.arch_value(gguf.Keys.Attention.HEAD_COUNT)
        kv_heads = self.arch_value(gguf.Keys.Attention.HEAD_COUNT_KV)
        embedding = self.arch_value(gguf.Keys.LLM.EMBEDDING_LENGTH)
        if not isinstance(layers, int) or layers <= 0:
            return None
        per_layer_kv = _per_layer(kv_heads if kv_heads is not None else heads, layers)
        per_layer_heads = _per_layer(heads, layers)
        if per_layer_kv is None:
            return None
        key_length = self.arch_value(gguf.Keys.Attention.KEY_LENGTH)
        value_length = self.arch_value(gguf.Keys.Attention.VALUE_LENGTH)
        if key_length is None or value_length is None:
            if not isinstance(embedding, int) or per_layer_heads is None or not max(per_layer_heads):
                return None
            head_dim = embedding // max(per_layer_heads)
            key_length = key_length or head_dim
            value_length = value_length or head_dim
        total_kv_heads = sum(per_layer_kv)
        k_bytes = ggml_type_bytes(type_k or "f16", total_kv_heads * key_length * n_ctx)
        v_bytes = ggml_type_bytes(type_v or "f16", total_kv_heads * value_length * n_ctx)
        return k_bytes + v_bytes


def _per_layer(value, layers: int) -> list[int] | None:
    if isinstance(value, int):
        return [value] * layers
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def ggml_type(name: str) -> gguf.GGMLQuantizationType:
    """The GGML type of a cache type name such as ``"q8_0"`` (KeyError if unknown)."""
    return gguf.GGMLQuantizationType[name.upper()]


def ggml_type_bytes(name: str, elements: int) -> int:
    block_size, type_size = gguf.GGML_QUANT_SIZES[ggml_type(name)]
    return -(-elements // block_size) * type_size


def read_gguf_info(path: str) -> GgufInfo:
    """Metadata of the GGUF file at ``path`` (cached while the file is unchanged).

    Raises OSError when the file cannot be read and GgufError when it is not GGUF.
    """
    stat = os.stat(path)
    return _read_cached(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, size: int, mtime_ns: int) -> GgufInfo:
    with open(path, "rb") as handle:
        if size < 24:
            raise GgufError(f"{path} is not a GGUF file (only {size} bytes)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            metadata = _HeaderParser(data, path).parse()
    return GgufInfo(path=path, file_size=size, metadata=metadata)


class _HeaderParser:
    def __init__(self, data: mmap.mmap, path: str):
        self.data = data
        self.path = path
        self.offset = 0
        self.endian = "<"

    def parse(self) -> dict[str, Any]:
        (magic,) = struct.unpack_from("<I", self.data, 0)
        if magic != gguf.GGUF_MAGIC:
            raise GgufError(f"{self.path} is not a GGUF file (bad magic)")
        self.offset = 4
        version = self._scalar("I")
        if version & 0xFFFF == 0 and version:  # written big-endian
            self.endian = ">"
            self.offset = 4
            version = self._scalar("I")
        if version < 2:
            raise GgufError(f"{self.path}: GGUF version {version} is not supported")
        self._scalar("Q")  # tensor count
        kv_count = self._scalar("Q")
        metadata: dict[str, Any] = {}
        try:
            for _ in range(kv_count):
                key = self._string()
                value_type = gguf.GGUFValueType(self._scalar("I"))
                metadata[key] = self._value(value_type)
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise GgufError(f"{self.path}: the GGUF header is damaged ({exc})") from exc
        return metadata

    def _scalar(self, fmt: str):
        (value,) = struct.unpack_from(self.endian + fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._scalar("Q")
        end = self.offset + length
        if end > len(self.data):
            raise ValueError("string runs past the end of the file")
        text = self.data[self.offset:end].decode("utf-8")
        self.offset = end
        return text

    def _value(self, value_type: gguf.GGUFValueType):
        if value_type is gguf.GGUFValueType.STRING:
            return self._string()
        if value_type is gguf.GGUFValueType.ARRAY:
            item_type = gguf.GGUFValueType(self._scalar("I"))
            length = self._scalar("Q")
            if length > _MAX_ARRAY_ITEMS:
                self._skip_array(item_type, length)
                return SkippedArray(item_type, length)
            return [self._value(item_type) for _ in range(length)]
        return self._scalar(_SCALAR_FORMATS[value_type])

    def _skip_array(self, item_type: gguf.GGUFValueType, length: int) -> None:
        if item_type is gguf.GGUFValueType.STRING:
            unpack = struct.Struct(self.endian + "Q").unpack_from
            data, offset = self.data, self.offset
            for _ in range(length):
                offset += 8 + unpack(data, offset)[0]
            self.offset = offset
        elif item_type is gguf.GGUFValueType.ARRAY:
            for _ in range(length):
                self._value(gguf.GGUFValueType.ARRAY)
        else:
            self.offset += struct.calcsize(_SCALAR_FORMATS[item_type]) * length
