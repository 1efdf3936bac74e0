"""Saved KV caches of the llama_cpp engine: a conversation's cache outlives the model leaving.

When a replica unloads, sleeps or shuts down cleanly, it writes the KV state of each of its
sequences (``llama_state_seq_get_data``, least recently used first) with the tokens it holds to
``<state dir>/kv/<identity>/``; when the model is loaded again, a request whose prompt shares a
longer prefix with a saved sequence than with what its sequence of the context holds restores that
state into that sequence (``llama_state_seq_set_data``) and decodes only the rest, as with any
other cached prefix.

The identity is everything a KV state depends on: the model file (real path, size, mtime), n_ctx,
the K and V cache types, flash attention (it changes the V cache's layout) and the llama.cpp
build; a state saved under another identity lives in another folder and is never read, and each
file repeats its identity, checked on read.  A file is written to a temporary name and renamed,
and carries the SHA-256 of its tokens and state: a corrupt, truncated or mismatched file is
deleted with a warning and the request prefills as usual.  ``engine.kv_store`` bounds the disk
used (per identity and in all; least recently used files go first) or turns saving off.

Everything here runs on the replica's worker thread, like the context it reads and writes.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import struct
import time
from array import array
from pathlib import Path

import orjson

from runtime.backends.llama_cpp.native import common_prefix
from runtime.backends.shared.kv_files import SUFFIX, identity_folder, keep_budgets
from runtime.backends.shared.kv_files import mtime as _mtime
from runtime.backends.shared.kv_files import remove as _remove
from runtime.backends.shared.kv_files import touch as _touch

logger = logging.getLogger("llmpool.llama_cpp")

MAGIC = b"LLMPKV1\n"
_HEAD = struct.Struct("<I")  # the header's length, after MAGIC
_STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a writer that died


class CorruptKvFile(ValueError):
    """A saved KV file that cannot be used (its reason is the message)."""


def kv_identity(model_path: str, settings, llama_version: str) -> dict:
    """What a saved KV state of ``model_path`` under context ``settings`` depends on."""
    stat = os.stat(model_path)
    return {
        "model": os.path.realpath(model_path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
        "n_ctx": settings.n_ctx, "type_k": settings.type_k or "f16", "type_v": settings.type_v or "f16",
        "flash_attn": settings.flash_attn, "llama_cpp": llama_version,
    }


class KvStore:
    """The saved sequences of one identity: a folder of files, an index of their tokens."""

    def __init__(self, root: Path, identity: dict, *, max_bytes: int, max_model_bytes: int, min_tokens: int):
        self.root = root
        self.identity = identity
        self.folder = identity_folder(root, identity)
        self.max_bytes = max_bytes
        self.max_model_bytes = max_model_bytes
        self.min_tokens = min_tokens
        self._index: dict[Path, list[int]] = {}  # file -> the tokens its state holds
        self._scan()

    @classmethod
    def from_settings(cls, settings: dict | None, state_dir, model_path: str, context_settings,
                      llama_version: str) -> KvStore | None:
        """The store of a replica (``settings``: ``engine.kv_store``); None when it is off or
        the model cannot be identified."""
        if not settings or not settings.get("enabled") or state_dir is None or context_settings.pooling:
            return None  # an embedding context keeps no sequence between requests
        try:
            identity = kv_identity(model_path, context_settings, llama_version)
            return cls(Path(state_dir) / "kv", identity, max_bytes=settings["max_mib"] * 2**20,
                       max_model_bytes=settings["max_model_mib"] * 2**20, min_tokens=settings["min_tokens"])
        except OSError as exc:
            logger.warning("the KV store is off for %s: %s", model_path, exc)
            return None

    # -- reading ---------------------------------------------------------------------------
    def _scan(self) -> None:
        if not self.folder.is_dir():
            return  # nothing saved yet: the folder is made by the first save
        now = time.time()
        for path in self.folder.iterdir():
            if path.name.startswith(".tmp-"):
                if now - _mtime(path) > _STALE_TEMP_SECONDS:
                    _remove(path)
            elif path.suffix == SUFFIX:
                try:
                    self._index[path] = self._read(path, with_state=False)[0]
                except (OSError, CorruptKvFile) as exc:
                    self._drop(path, exc)

    def _read(self, path: Path, *, with_state: bool) -> tuple[list[int], bytearray | None]:
        """(tokens, state) of a saved file, every check done; raises CorruptKvFile."""
        with open(path, "rb") as handle:
            if handle.read(len(MAGIC)) != MAGIC:
                raise CorruptKvFile("not a saved KV file")
            raw = handle.read(_HEAD.size)
            if len(raw) != _HEAD.size:
                raise CorruptKvFile("truncated header")
            try:
                header = orjson.loads(handle.read(_HEAD.unpack(raw)[0]))
                n_tokens, state_bytes = int(header["n_tokens"]), int(header["state_bytes"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                raise CorruptKvFile("unreadable header") from None
            if header.get("identity") != self.identity:
                raise CorruptKvFile("saved for another model file or KV setting")
            expected = handle.tell() + 4 * n_tokens + state_bytes
            if os.fstat(handle.fileno()).st_size != expected:
                raise CorruptKvFile(f"{os.fstat(handle.fileno()).st_size} bytes where {expected} were written")
            tokens_raw = handle.read(4 * n_tokens)
            if hashlib.sha256(tokens_raw).hexdigest() != header.get("tokens_sha256"):
                raise CorruptKvFile("its tokens do not match their checksum")
            tokens = array("i")
            tokens.frombytes(tokens_raw)
            if not with_state:
                return tokens.tolist(), None
            state = bytearray(state_bytes)
            if handle.readinto(state) != state_bytes or hashlib.sha256(state).hexdigest() != header.get("state_sha256"):
                raise CorruptKvFile("its KV state does not match its checksum")
            return tokens.tolist(), state

    def restore(self, context, seq: int, prompt: list[int]) -> int:
        """Put the saved sequence sharing the longest prefix with ``prompt`` into sequence
        ``seq`` of ``context`` when it shares more than that sequence holds already (at least
        ``min_tokens``); returns the tokens restored (0: none, the sequence untouched or, after
        a failure, cleared)."""
        held = common_prefix(context.sequences[seq], prompt)
        if held >= len(prompt) - 1:
            return 0  # the context holds all of it that can be reused
        # A saved sequence that differs from the prompt at ``held`` cannot beat the context.
        candidates = ((common_prefix(tokens, prompt), path) for path, tokens in self._index.items()
                      if len(tokens) > held and tokens[held] == prompt[held])
        best, best_path = max(candidates, default=(0, None), key=lambda item: item[0])
        if best_path is None or best < self.min_tokens or best <= held:
            return 0
        try:
            tokens, state = self._read(best_path, with_state=True)
        except (OSError, CorruptKvFile) as exc:
            self._drop(best_path, exc)
            return 0
        lib = context._lib
        context.clear(seq)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if lib.llama_state_seq_set_data(context.ctx, buffer, len(state), seq) == 0:
            context.clear(seq)
            self._drop(best_path, CorruptKvFile("llama.cpp could not restore its state"))
            return 0
        context.sequences[seq] = tokens
        _touch(best_path)
        logger.info("restored %d cached tokens from %s", len(tokens), best_path.name)
        return len(tokens)

    # -- writing ---------------------------------------------------------------------------
    def save(self, context, seq: int = 0) -> Path | None:
        """Write sequence ``seq`` of the context (when it holds at least ``min_tokens``), then
        keep the budgets; never raises (a failed save is a warning: the next load prefills)."""
        tokens = list(context.sequences[seq])
        if len(tokens) < self.min_tokens:
            return None
        tokens_raw = array("i", tokens).tobytes()
        path = self.folder / (hashlib.sha256(tokens_raw).hexdigest()[:32] + SUFFIX)
        try:
            if path in self._index and path.exists():  # the same tokens and identity: the same state
                _touch(path)
                return path
            lib = context._lib
            size = lib.llama_state_seq_get_size(context.ctx, seq)
            if size == 0 or size + len(tokens_raw) > min(self.max_model_bytes, self.max_bytes):
                return None
            state = (ctypes.c_uint8 * size)()
            written = lib.llama_state_seq_get_data(context.ctx, state, size, seq)
            if written == 0:
                return None
            data = memoryview(state)[:written]
            header = orjson.dumps({
                "identity": self.identity, "n_tokens": len(tokens), "state_bytes": written,
                "tokens_sha256": hashlib.sha256(tokens_raw).hexdigest(), "state_sha256": hashlib.sha256(data).hexdigest(),
            })
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary = self.folder / f".tmp-{path.name}-{os.getpid()}"
            with open(temporary, "wb") as handle:
                handle.write(MAGIC + _HEAD.pack(len(header)) + header + tokens_raw)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            logger.warning("could not save the KV cache of %d tokens to %s: %s", len(tokens), path, exc)
            _remove(self.folder / f".tmp-{path.name}-{os.getpid()}")
            return None
        self._index[path] = tokens
        logger.info("saved the KV cache of %d tokens to %s", len(tokens), path)
        self.keep_budgets()
        return path

    def keep_budgets(self) -> None:
        """Hold ``engine.kv_store``'s budgets (``kv_files.keep_budgets``) and forget what went."""
        for path in keep_budgets(self.folder, self.root, self.max_model_bytes, self.max_bytes):
            self._index.pop(path, None)

    def _drop(self, path: Path, reason: Exception) -> None:
        logger.warning("dropped the saved KV cache %s: %s", path, reason)
        _remove(path)
        self._index.pop(path, None)
