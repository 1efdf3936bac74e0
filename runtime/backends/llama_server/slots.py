"""Saved slots of llama_server: a conversation's KV cache outlives the server leaving.

A server started with ``--slot-save-path`` (the folder of its identity in the KV store,
``runtime.backends.shared.kv_files``) writes a slot's cache and tokens to a file there on ``POST
/slots/{id}?action=save`` and reads one back into a slot on ``action=restore``.  Before a replica's
server stops (an unload by an operator, a TTL, a swap group's turn, an eviction, a clean shutdown),
each slot that served a prompt of at least ``engine.kv_store.min_tokens`` tokens is saved; when the
model is loaded again, the most recently used files are restored into its slots, one each, so a
returning conversation finds its prefix in a slot (llama-server picks the slot whose cache shares
the most with the prompt) and llama-server decodes only the rest.

The identity is what a slot's state depends on: the GGUF (real path, size, mtime), ``-c`` and the
slot count that divides it, the K and V cache types, flash attention, the multimodal projector and
the llama-server binary (real path, size, mtime); a changed one is another folder, never read.
llama-server aborts on a truncated slot file (``GGML_ASSERT(nread <= state_size)``), so a file is
checked before it is restored: llama-server writes it under a temporary name, and it is renamed to
the SHA-256 of its content; one whose content no longer matches its name (truncated, corrupt) is
deleted with a warning, as is one llama-server refuses, and the conversation prefills as usual.
The files count in ``engine.kv_store``'s budgets with the llama_cpp engine's.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from runtime.backends.shared.kv_files import SUFFIX, identity_folder, keep_budgets, mtime, remove, size, touch
from runtime.pool.model_files import ModelFileError, resolve_model_file

logger = logging.getLogger("llmpool.runtime")

SLOT_CALL_SECONDS = 120.0  # a save or restore writes or reads the slot's whole cache
PART = ".part-"  # the prefix of a file llama-server is writing (not yet a saved slot)
STALE_PART_SECONDS = 3600  # a part this old was left by a server that stopped while saving


def file_identity(path: str) -> dict:
    stat = os.stat(path)
    return {"path": os.path.realpath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def slot_identity(config: dict[str, Any], base_dir: str) -> dict:
    """What a saved slot of a replica of ``config`` depends on (OSError, ModelFileError: unknown)."""
    binary = shutil.which(config["llama_server_binary"])
    if binary is None:
        raise FileNotFoundError(f"{config['llama_server_binary']} is not found")
    mmproj = config["llama_server_mmproj"]
    return {
        "engine": "llama-server", "binary": file_identity(binary),
        "model": file_identity(resolve_model_file(config["model_path"], base_dir)),
        "mmproj": file_identity(resolve_model_file(mmproj, base_dir)) if mmproj else None,
        "n_ctx": config["llama_server_n_ctx"], "slots": config["target_inflight"],
        "type_k": config["llama_server_type_k"] or "f16", "type_v": config["llama_server_type_v"] or "f16",
        "flash_attn": config["llama_server_flash_attn"],
    }


class SlotStore:
    """The saved slots of one identity, and the calls that save and restore them."""

    def __init__(self, root: Path, identity: dict, *, max_bytes: int, max_model_bytes: int, min_tokens: int):
        self.root = root
        self.folder = identity_folder(root, identity)
        self.max_bytes = max_bytes
        self.max_model_bytes = max_model_bytes
        self.min_tokens = min_tokens

    @classmethod
    def for_replica(cls, config: dict[str, Any], context: dict) -> SlotStore | None:
        """The store of a replica (``context``'s ``kv_store`` settings and state folder); None when
        saving is off or the replica's files cannot be identified."""
        settings, state_dir = context.get("kv_store"), context.get("state_dir")
        if not settings or not settings.get("enabled") or state_dir is None:
            return None
        try:
            identity = slot_identity(config, context["base_dir"])
        except (OSError, ModelFileError) as exc:
            logger.warning("llama-server slots of %s are not saved: %s", config["model_path"], exc)
            return None
        return cls(Path(state_dir) / "kv", identity, max_bytes=settings["max_mib"] * 2**20,
                   max_model_bytes=settings["max_model_mib"] * 2**20, min_tokens=settings["min_tokens"])

    def save_path(self) -> str:
        """``--slot-save-path``: llama-server joins it and a file name without a separator."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return str(self.folder) + os.sep

    async def save(self, client: httpx.AsyncClient) -> list[str]:
        """Save every idle slot that served at least ``min_tokens`` prompt tokens, then hold the
        budgets; the files written.  Never raises: a failed save is a warning."""
        written = []
        self._remove_stale_parts()
        try:
            slots = (await client.get("/slots")).raise_for_status().json()
            for slot in slots:
                if slot.get("is_processing") or "id_task" not in slot:
                    continue  # busy (the server is stopping under it), or never used since its start
                if slot.get("n_prompt_tokens", 0) < self.min_tokens:
                    continue  # a restored slot that served nothing since has no task: not saved again
                name = await self._save_slot(client, slot["id"])
                if name is not None:
                    written.append(name)
        except (httpx.HTTPError, OSError, ValueError, TypeError, KeyError) as exc:
            logger.warning("saving llama-server's slots failed: %s", exc)
        if written:
            logger.info("saved %d llama-server slot(s) to %s", len(written), self.folder)
            keep_budgets(self.folder, self.root, self.max_model_bytes, self.max_bytes)
        return written

    async def _save_slot(self, client: httpx.AsyncClient, slot: int) -> str | None:
        """Have llama-server write ``slot`` to a part, then name it by its content's hash."""
        part = self.folder / f"{PART}{uuid.uuid4().hex}"
        try:
            answer = await client.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": part.name})
            if answer.status_code != 200:
                logger.warning("llama-server could not save slot %s: %s", slot, answer.text[:200])
                return None
            if size(part) > self.max_model_bytes:
                return None  # one conversation larger than the model's whole budget
            path = self.folder / (await asyncio.to_thread(content_name, part))
            os.replace(part, path)
            return path.name
        finally:
            remove(part)

    def _remove_stale_parts(self) -> None:
        for part in self.folder.glob(PART + "*"):
            if time.time() - mtime(part) > STALE_PART_SECONDS:
                remove(part)

    async def restore(self, client: httpx.AsyncClient, slots: int) -> list[str]:
        """Restore the most recently used saved files into slots 0, 1, ... (at most ``slots``);
        the files restored.  A file the server refuses is deleted; never raises."""
        files = sorted(self.folder.glob("*" + SUFFIX), key=mtime, reverse=True)
        restored, slot = [], 0
        for path in files:
            if slot >= slots:
                break
            if await asyncio.to_thread(content_name, path) != path.name:
                logger.warning("dropped the saved llama-server slot %s: its content does not match its name", path)
                remove(path)
                continue
            try:
                answer = await client.post(f"/slots/{slot}", params={"action": "restore"}, json={"filename": path.name})
            except httpx.HTTPError as exc:
                logger.warning("restoring llama-server's slot %d failed: %s", slot, exc)
                break
            if answer.status_code != 200:
                logger.warning("dropped the saved llama-server slot %s: %s", path, answer.text[:200])
                remove(path)
                continue
            touch(path)
            restored.append(path.name)
            slot += 1
        if restored:
            logger.info("restored %d llama-server slot(s) from %s", len(restored), self.folder)
        return restored


def content_name(path: Path) -> str:
    """The name a saved slot file goes by: the SHA-256 of its content (checked before a restore)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:32] + SUFFIX
