"""Load progress of a managed server for real: llama-server serving SmolLM2 reports its stages."""
from __future__ import annotations

from runtime.model.load_progress import STAGE_HEALTHY, STAGE_LISTENING, STAGE_LOADING_WEIGHTS, STAGE_SPAWNED
from runtime.model.replicas import load_replicas, release_replicas


async def test_llama_server_reports_spawned_listening_loading_weights_healthy(
    runtime_service, llama_server_binary, smollm2_gguf, state_dir
):
    service, _ = await runtime_service({"ls": {
        "backend": "llama_server", "model_path": smollm2_gguf, "llama_server_binary": llama_server_binary,
        "llama_server_n_ctx": 512, "llama_server_startup_timeout_seconds": 60.0,
    }})
    progress: list[tuple[str, float | None]] = []
    engines, _ = await load_replicas(service.pool.controller("ls").entry, {}, 1, lambda message, replica: None,
                                     on_load_progress=lambda stage, fraction: progress.append((stage, fraction)))
    assert await release_replicas(engines) == []
    stages = [stage for stage, _ in progress]
    assert stages[0] == STAGE_SPAWNED and progress[-1] == (STAGE_HEALTHY, 1.0)
    assert STAGE_LOADING_WEIGHTS in stages and STAGE_LISTENING in stages
    assert stages.count(STAGE_SPAWNED) == stages.count(STAGE_LISTENING) == stages.count(STAGE_HEALTHY) == 1
