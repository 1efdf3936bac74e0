"""llama-server's saved slots: for real (the cached build serving SmolLM2, one slot), a conversation's
cache is saved when the model unloads and restored when it loads again; against a fake server, a
file whose content is not its name never reaches llama-server (which aborts on a truncated one) and
one it refuses is dropped; a changed model file or KV setting is another folder, never read."""
from __future__ import annotations

import hashlib
import json
import os

import httpx
import pytest

from runtime.backends.llama_server.slots import SlotStore, content_name
from tests.managed.helpers import librarian, smollm2_client

SYSTEM = librarian(30)
FIRST, SECOND = "Where are books by Austen?", "And books by Dickens?"


@pytest.fixture
def smol(live_service, llama_server_binary, smollm2_gguf, tmp_path):
    """A service with SmolLM2 on llama-server: (an HTTP client, the KV store's folder)."""
    with smollm2_client(live_service, llama_server_binary, smollm2_gguf, tmp_path / "state") as http:
        yield http, tmp_path / "state" / "kv"


def cycle(http, action: str) -> None:
    state = {"load": "loaded", "unload": "unloaded"}[action]
    assert http.post(f"/v1/admin/models/smol/{action}").json()["runtime_state"] == state


def ask(http, second_turn: bool, answer: str = "") -> dict:
    items = [{"role": "user", "content": FIRST}]
    if second_turn:
        items += [{"role": "assistant", "content": answer}, {"role": "user", "content": SECOND}]
    body = {"model": "smol", "instructions": SYSTEM, "input": items, "max_output_tokens": 8, "temperature": 0.0}
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def saved(kv) -> dict[str, list[str]]:
    return {folder.name: sorted(f.name for f in folder.glob("*.kv")) for folder in kv.iterdir() if folder.is_dir()}


def test_a_conversation_finds_its_saved_slot_after_a_reload(smol):
    http, kv = smol
    cycle(http, "load")
    first = ask(http, False)
    answer = first["output"][-1]["content"][0]["text"]
    cycle(http, "unload")
    [(folder, [name])] = saved(kv).items()
    assert name == content_name(kv / folder / name)

    cycle(http, "load")  # the saved slot is restored: the second turn decodes only its new tokens
    second = ask(http, True, answer)
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"] - 8 > 256
    cycle(http, "unload")
    assert len(saved(kv)[folder]) == 2  # the longer conversation, beside the first


def test_the_slots_identity_is_the_files_and_the_kv_settings(tmp_path):
    binary, model = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    model.write_bytes(b"GGUF")
    config = {"llama_server_binary": str(binary), "model_path": str(model), "llama_server_mmproj": None,
              "llama_server_n_ctx": 2048, "target_inflight": 1, "llama_server_type_k": None,
              "llama_server_type_v": None, "llama_server_flash_attn": "auto"}
    settings = {"enabled": True, "max_mib": 10, "max_model_mib": 5, "min_tokens": 256}
    context = {"kv_store": settings, "state_dir": str(tmp_path / "state"), "base_dir": str(tmp_path)}

    def folder(**changes):
        return SlotStore.for_replica({**config, **changes}, context).folder

    same = folder()
    assert folder() == same and same.parent == tmp_path / "state" / "kv"
    changed = [folder(llama_server_n_ctx=4096), folder(target_inflight=2), folder(llama_server_type_k="q8_0"),
               folder(llama_server_flash_attn="on")]
    assert len({same, *changed}) == 5
    os.utime(model, ns=(0, 10**9))
    assert folder() != same
    assert SlotStore.for_replica(config, {**context, "kv_store": {**settings, "enabled": False}}) is None
    assert SlotStore.for_replica({**config, "llama_server_binary": "no-such-llama-server"}, context) is None


async def test_save_names_the_used_idle_slots_by_content_and_restore_drops_what_does_not_match(tmp_path):
    store = SlotStore(tmp_path / "kv", {"engine": "test"}, max_bytes=10_000, max_model_bytes=1_000, min_tokens=256)
    store.save_path()
    slots = [
        {"id": 0, "id_task": 5, "is_processing": False, "n_prompt_tokens": 300, "prompt": "a", "generated": "b"},
        {"id": 1, "id_task": 6, "is_processing": True, "n_prompt_tokens": 300, "prompt": "c", "generated": ""},
        {"id": 2, "id_task": 7, "is_processing": False, "n_prompt_tokens": 10, "prompt": "d", "generated": ""},
        {"id": 3, "is_processing": False},  # never used since the server started
        {"id": 4, "id_task": 8, "is_processing": False, "n_prompt_tokens": 900, "prompt": "e", "generated": ""},
    ]
    calls = []

    def server(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.path, request.url.params.get("action")))
        if request.url.path == "/slots":
            return httpx.Response(200, json=slots)
        name = json.loads(request.content)["filename"]
        if request.url.params["action"] == "save":  # as llama-server does: the file in --slot-save-path
            (store.folder / name).write_bytes(b"x" * (2_000 if request.url.path == "/slots/4" else 100))
            return httpx.Response(200, json={"filename": name})
        return httpx.Response(200 if name == kept else 400, json={"filename": name})

    def plant(name: str, content: bytes) -> None:
        """A saved file newer than the one kept: restore tries it first."""
        (store.folder / name).write_bytes(content)
        later = (store.folder / kept).stat().st_mtime_ns + 10**9
        os.utime(store.folder / name, ns=(later, later))

    async with httpx.AsyncClient(transport=httpx.MockTransport(server), base_url="http://llama") as client:
        written = await store.save(client)
        # Slot 4's file is larger than the model's budget: deleted, not counted.
        assert calls == [("/slots", None), ("/slots/0", "save"), ("/slots/4", "save")]
        assert written == [content_name(store.folder / written[0])]
        assert [path.name for path in store.folder.iterdir()] == written
        kept = written[0]
        plant("0" * 32 + ".kv", b"truncated")  # its content is not its name: never sent to the server
        calls.clear()
        assert await store.restore(client, slots=2) == [kept]
        assert calls == [("/slots/0", "restore")]
        refused = b"refused by the server"
        plant(content_name_of(refused), refused)
        calls.clear()
        assert await store.restore(client, slots=1) == [kept]
    assert calls == [("/slots/0", "restore"), ("/slots/0", "restore")]
    assert [path.name for path in store.folder.iterdir()] == [kept]


def content_name_of(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()[:32] + ".kv"
