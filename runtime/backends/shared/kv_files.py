"""Saved KV caches on disk, whichever engine writes them (the llama_cpp engine's ``KvStore``,
llama-server's saved slots): ``<state dir>/kv/<identity key>/*.kv``.

An identity is everything a saved state depends on (the model file, the context's size and cache
types, the build that wrote it); each identity has a folder of its own, named by the hash of the
identity, so a state saved under another one is never read.  ``keep_budgets`` holds the disk
budgets of ``engine.kv_store`` over all of them: one identity's folder, then the whole store, least
recently used files (by modification time: saving or restoring a file touches it) out first.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import orjson

logger = logging.getLogger("llmpool.runtime")

SUFFIX = ".kv"


def identity_folder(root: Path, identity: dict) -> Path:
    """The folder of the states saved under ``identity`` in the store at ``root``."""
    return root / hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def keep_budgets(folder: Path, root: Path, max_model_bytes: int, max_bytes: int) -> list[Path]:
    """Delete the least recently used files until ``folder`` holds at most ``max_model_bytes`` and
    the whole store at ``root`` at most ``max_bytes``; the files deleted."""
    deleted = _trim(sorted(folder.glob("*" + SUFFIX), key=mtime), max_model_bytes)
    return deleted + _trim(sorted(root.glob("*/*" + SUFFIX), key=mtime), max_bytes)


def _trim(files: list[Path], budget: int) -> list[Path]:
    total, deleted = sum(size(path) for path in files), []
    for path in files:
        if total <= budget:
            break
        total -= size(path)
        remove(path)
        deleted.append(path)
    return deleted


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not delete %s: %s", path, exc)
