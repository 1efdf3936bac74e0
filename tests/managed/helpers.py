"""Helpers for the managed-server tests: process checks and what the fake servers recorded."""
from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).resolve().parent / "fakes"

TARGET = "google/gemma-4-26B-A4B-it"
ASSISTANT = "google/gemma-4-26B-A4B-it-assistant"

FAKE_PROGRAMS = {"vllm": "fake_vllm", "sglang": "fake_sglang", "trtllm-serve": "fake_trtllm_serve"}


def vllm_model(fake_bin: Path, folder: Path, **fields) -> dict:
    """A vllm_serve definition on the fake vllm, its start recorded in ``folder/vllm.jsonl`` and its
    requests in ``folder/requests.jsonl``."""
    return {
        "backend": "vllm_serve",
        "vllm_serve_model": TARGET,
        "vllm_serve_binary": str(fake_bin / "vllm"),
        "vllm_serve_env": {"FAKE_RECORD": str(folder / "vllm.jsonl"), "FAKE_REQUEST_LOG": str(folder / "requests.jsonl")},
        "vllm_serve_startup_timeout_seconds": 30.0,
        **fields,
    }


def smollm2_server(llama_server_binary: str, smollm2_gguf: str) -> dict:
    """SmolLM2 on the cached llama-server build, one slot of 2,048 tokens."""
    return {
        "backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 2048, "llama_server_startup_timeout_seconds": 60.0, "target_inflight": 1,
    }


@contextmanager
def smollm2_client(live_service, llama_server_binary: str, smollm2_gguf: str, state: Path):
    """A client of a live service with ``smollm2_server`` as model ``smol``, its state (and saved
    caches) in ``state``; the service must stop cleanly after."""
    service = live_service({"smol": smollm2_server(llama_server_binary, smollm2_gguf)},
                           env={"LLMPOOL_STATE_DIR": str(state)})
    with service.client(timeout=120) as client:
        yield client
    assert service.stop() == 0


def librarian(shelves: int) -> str:
    """A system prompt of about ``shelves`` x 20 tokens that a conversation's later turns repeat."""
    return "You are the librarian of a small town. Answer in one short sentence. " + " ".join(
        f"Shelf {i} holds the books whose authors' names start with letter {chr(65 + i % 26)}."
        for i in range(1, shelves + 1)
    )


def process_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (R, S, Z...), or None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(")") + 2]


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


def wait_until(condition, timeout: float = 10.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {timeout} s")
        time.sleep(interval)


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment carries ``LLMPOOL_TEST_MARKER=<marker>``."""
    needle = f"LLMPOOL_TEST_MARKER={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = Path(f"/proc/{entry.name}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def environ_of(pid: int) -> dict:
    """The environment process ``pid`` was started with."""
    with open(f"/proc/{pid}/environ", "rb") as source:
        pairs = [item.split(b"=", 1) for item in source.read().split(b"\0") if b"=" in item]
    return {key.decode(): value.decode() for key, value in pairs}


def pidfiles(state: Path) -> list[dict]:
    folder = state / "managed"
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def records(path: Path) -> list[dict]:
    """The start records a fake appended to its ``FAKE_RECORD`` file."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def requests_logged(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def sse_events(response) -> list[dict]:
    """The data of every SSE event of a streamed ``/v1/responses`` answer."""
    return [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line.startswith("data: ")]


def output_text(body: dict) -> str:
    return body["output"][0]["content"][0]["text"]


async def eventually(condition, timeout: float = 10.0, message: str = "condition"):
    """``wait_until`` for async tests: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {timeout} s")
        await asyncio.sleep(0.05)
