"""The chosen device reaches the engines (issue 18): CUDA_VISIBLE_DEVICES in an engine process
placed on GPUs (a fresh process, not the spare) and in a managed server, nothing on cpu; the
llama_cpp main_gpu of a placement; a fake NVML with two GPUs."""
from __future__ import annotations

import json
from pathlib import Path

from runtime.backends.llama_cpp.engine import main_gpu
from runtime.pool.devices import cuda_visible_devices
from runtime.pool.model_pool import ModelPool
from tests.engines.test_gpu import FakeNvml, install_nvml
from tests.managed.helpers import records


def environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in items if b"=" in item)


def test_visible_devices_and_main_gpu():
    assert cuda_visible_devices(["cuda:1"]) == "1"
    assert cuda_visible_devices(["cuda:0", "cuda:2"]) == "0,2"
    assert cuda_visible_devices(["cpu"]) is None and cuda_visible_devices(None) is None
    assert main_gpu(["cuda:1"], visible="1") == 0  # an engine process that sees that GPU alone
    assert main_gpu(["cuda:1"], visible="") == 1  # in the runtime's own process, every GPU seen
    assert main_gpu(["cuda:2"], visible="0,2") == 1
    assert main_gpu(["cpu"], visible="") == 0


async def test_engine_processes_and_managed_servers_get_their_gpus(tmp_path, monkeypatch, fake_bin):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    install_nvml(monkeypatch, FakeNvml([("GPU A", 0, 10000), ("GPU B", 0, 20000)]))
    models = {
        "gpu1": {"backend": "stub", "device": "cuda:1", "stub_vram_mib": 10, "isolation": "process"},
        "cpu": {"backend": "stub", "device": "cpu", "stub_vram_mib": 10, "isolation": "process"},
        "server": {"backend": "vllm_serve", "vllm_serve_model": "org/model", "device": "cuda:0",
                   "vllm_serve_binary": str(fake_bin / "vllm"), "vllm_kv_cache_memory_bytes": 2**28,
                   "vllm_serve_env": {"FAKE_RECORD": str(tmp_path / "record.jsonl"), "CUDA_VISIBLE_DEVICES": "5"},
                   "vllm_serve_startup_timeout_seconds": 20.0},
    }
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"models": models, "memory": {}}))
    pool = ModelPool(str(path))
    await pool.start(load_enabled=False)
    try:
        for name in models:
            await pool.controller(name).load({}, None)
            assert pool.controller(name).last_error is None, pool.controller(name).last_error
        gpu1 = pool.controller("gpu1").engines[0].process.pid
        assert environ(gpu1)["CUDA_VISIBLE_DEVICES"] == "1"
        assert "CUDA_VISIBLE_DEVICES" not in environ(pool.controller("cpu").engines[0].process.pid)
        server = records(tmp_path / "record.jsonl")[-1]["pid"]
        assert environ(server)["CUDA_VISIBLE_DEVICES"] == "0"  # the placement wins over the definition's env
        assert pool.controller("server").placement == ["cuda:0"]
    finally:
        await pool.shutdown()
