"""GPU memory: NVML faked at its module boundary, nvidia-smi faked on PATH, and observed_load_delta."""
from __future__ import annotations

import os
import sys
import types

import pytest

from runtime import gpu
from runtime.service import RuntimeService
from tests.conftest import LiveService, write_settings

RTX = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
MIB = 1024 * 1024


class FakeNvml:
    """A ``pynvml`` stand-in: GPUs as (name, used MiB, total MiB); ``used`` may be a callable."""

    def __init__(self, gpus=None, init_error: str | None = None):
        self.gpus = gpus or []
        self.init_error = init_error
        self.calls: list[str] = []

    def module(self) -> types.ModuleType:
        fake = self

        class NVMLError(Exception):
            pass

        def nvmlInit():
            fake.calls.append("init")
            if fake.init_error:
                raise NVMLError(fake.init_error)

        def nvmlShutdown():
            fake.calls.append("shutdown")

        def nvmlDeviceGetMemoryInfo(handle):
            _name, used, total = fake.gpus[handle]
            used = used() if callable(used) else used
            return types.SimpleNamespace(used=used * MIB, total=total * MIB, free=(total - used) * MIB)

        module = types.ModuleType("pynvml")
        module.NVMLError = NVMLError
        module.nvmlInit = nvmlInit
        module.nvmlShutdown = nvmlShutdown
        module.nvmlDeviceGetCount = lambda: len(fake.gpus)
        module.nvmlDeviceGetHandleByIndex = lambda index: index
        module.nvmlDeviceGetName = lambda handle: fake.gpus[handle][0].encode()
        module.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo
        return module


def install_nvml(monkeypatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


def fake_nvidia_smi(folder, body: str) -> str:
    """A ``nvidia-smi`` executable in ``folder/bin`` running the shell ``body``; returns the bin folder."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {folder / 'smi-args'}\n{body}\n")
    script.chmod(0o755)
    return str(bin_dir)


@pytest.fixture
def no_smi(monkeypatch, tmp_path):
    """A PATH without nvidia-smi."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


# ---- probe -----------------------------------------------------------------------------


def test_nvml_reports_every_gpu_in_the_spec_shape(monkeypatch):
    fake = install_nvml(monkeypatch, FakeNvml([(RTX, 75603, 97887), ("NVIDIA H200", 0, 143771)]))
    gpus, error = gpu.probe_gpus()
    assert error is None
    assert gpus == [
        {"index": 0, "name": RTX, "used_mib": 75603, "total_mib": 97887, "used_over_total": "75603MiB / 97887MiB"},
        {"index": 1, "name": "NVIDIA H200", "used_mib": 0, "total_mib": 143771, "used_over_total": "0MiB / 143771MiB"},
    ]
    assert fake.calls == ["init", "shutdown"]


def test_without_nvml_nvidia_smi_answers(monkeypatch, tmp_path):
    install_nvml(monkeypatch, FakeNvml(init_error="Driver Not Loaded"))
    bin_dir = fake_nvidia_smi(tmp_path, f'echo "0, {RTX}, 75603, 97887"\necho "1, Tesla T4, 12, 15360"')
    monkeypatch.setenv("PATH", bin_dir)
    gpus, error = gpu.probe_gpus()
    assert error is None
    assert gpus == [
        {"index": 0, "name": RTX, "used_mib": 75603, "total_mib": 97887, "used_over_total": "75603MiB / 97887MiB"},
        {"index": 1, "name": "Tesla T4", "used_mib": 12, "total_mib": 15360, "used_over_total": "12MiB / 15360MiB"},
    ]
    assert (tmp_path / "smi-args").read_text().split() == gpu.NVIDIA_SMI_QUERY[1:]


def test_without_nvml_or_nvidia_smi_the_error_names_both(monkeypatch, no_smi):
    install_nvml(monkeypatch, FakeNvml(init_error="Driver Not Loaded"))
    assert gpu.probe_gpus() == ([], "NVML is unavailable: Driver Not Loaded; nvidia-smi is not on PATH")
    assert gpu.used_memory_mib() is None


def test_missing_nvml_package_falls_back_too(monkeypatch, no_smi):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu.probe_gpus() == ([], "nvidia-ml-py is not installed; nvidia-smi is not on PATH")


@pytest.mark.parametrize(
    "body, error",
    [
        ('echo "NVIDIA-SMI has failed" >&2\nexit 9', "nvidia-smi failed (exit 9): NVIDIA-SMI has failed"),
        ('echo "0, GPU, [N/A], 1024"', "nvidia-smi gave an unreadable answer: not numbers in '0, GPU, [N/A], 1024'"),
        ("true", "no GPU is visible to nvidia-smi"),
    ],
)
def test_a_broken_nvidia_smi_is_reported(monkeypatch, tmp_path, body, error):
    install_nvml(monkeypatch, FakeNvml([]))
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path, body))
    assert gpu.probe_gpus() == ([], f"no GPU is visible to NVML; {error}")


def test_load_delta_is_never_negative_and_needs_both_readings():
    assert gpu.load_delta(1000, 3048) == 2048
    assert gpu.load_delta(3048, 1000) == 0
    assert gpu.load_delta(None, 1000) is None
    assert gpu.load_delta(1000, None) is None


# ---- observed_load_delta in the pool ----------------------------------------------------


class UsedMemory:
    """The used MiB the fake GPU reports; tests move it by hand."""

    def __init__(self, used: int):
        self.used = used

    def __call__(self) -> int:
        return self.used


@pytest.fixture
def memory(monkeypatch):
    readings = UsedMemory(4000)
    install_nvml(monkeypatch, FakeNvml([("NVIDIA H200", readings, 143771)]))
    return readings


async def start_service(folder, models) -> RuntimeService:
    service = RuntimeService(str(write_settings(folder, models)))
    await service.start(load_enabled=False)
    return service


async def test_a_load_records_its_gpu_delta_with_the_replica_count(tmp_path, memory, monkeypatch):
    service = await start_service(tmp_path, {"m": {"backend": "stub", "replicas": 1, "replica_max": 3, "stub_vram_mib": 10}})
    from runtime.backends.stub.spec import StubEngine

    original_load = StubEngine.load

    async def load_taking_memory(self):
        await original_load(self)
        memory.used += 1500  # each replica takes 1500 MiB

    monkeypatch.setattr(StubEngine, "load", load_taking_memory)
    before = await service.handle("get_model", {"name": "m"}, None)
    assert (before["vram_estimate_mib"], before["vram_estimate_replica_count"], before["vram_estimate_source"]) == (
        10, 1, "model_artifact_size"
    )
    loaded = await service.handle("load", {"name": "m", "body": {"replicas": 2}}, None)
    assert (loaded["vram_estimate_mib"], loaded["vram_estimate_replica_count"], loaded["vram_estimate_source"]) == (
        3000, 2, "observed_load_delta"
    )
    unloaded = await service.handle("unload", {"name": "m"}, None)
    assert unloaded["replicas"] == 1  # back to the definition, the estimate keeps its own count
    assert (unloaded["vram_estimate_mib"], unloaded["vram_estimate_replica_count"], unloaded["vram_estimate_source"]) == (
        3000, 2, "observed_load_delta"
    )
    report = await service.handle("gpu_memory", {}, None)
    assert report["gpus"][0]["used_over_total"] == "7000MiB / 143771MiB"
    assert report["models"] == [
        {
            "name": "m",
            "runtime_state": "unloaded",
            "is_loaded": False,
            "configured_target_inflight": 1,
            "effective_target_inflight": 1,
            "vram_estimate_mib": 3000,
            "vram_estimate_replica_count": 2,
            "vram_estimate_source": "observed_load_delta",
        }
    ]
    await service.shutdown()


async def test_a_failed_load_records_nothing_and_a_new_definition_forgets_the_delta(tmp_path, memory):
    models = {"m": {"backend": "stub", "stub_vram_mib": 10}, "broken": {"backend": "stub", "stub_fail_load": "no"}}
    service = await start_service(tmp_path, models)
    failed = await service.handle("load", {"name": "broken"}, None)
    assert (failed["runtime_state"], failed["vram_estimate_source"]) == ("failed", "unavailable")
    loaded = await service.handle("load", {"name": "m"}, None)
    assert (loaded["vram_estimate_mib"], loaded["vram_estimate_source"]) == (0, "observed_load_delta")
    await service.handle("unload", {"name": "m"}, None)
    write_settings(tmp_path, {**models, "m": {"backend": "stub", "stub_vram_mib": 20}})
    await service.handle("reload_settings", {}, None)
    entry = await service.handle("get_model", {"name": "m"}, None)
    assert (entry["vram_estimate_mib"], entry["vram_estimate_source"]) == (20, "model_artifact_size")
    await service.shutdown()


async def test_without_a_gpu_the_estimate_stays_the_artifact_size(tmp_path, monkeypatch, no_smi):
    install_nvml(monkeypatch, FakeNvml(init_error="Driver Not Loaded"))
    service = await start_service(tmp_path, {"m": {"backend": "stub", "stub_vram_mib": 10}})
    loaded = await service.handle("load", {"name": "m"}, None)
    assert (loaded["vram_estimate_mib"], loaded["vram_estimate_source"]) == (10, "model_artifact_size")
    report = await service.handle("gpu_memory", {}, None)
    assert (report["gpus"], report["error"]) == ([], "NVML is unavailable: Driver Not Loaded; nvidia-smi is not on PATH")
    assert report["models"][0]["vram_estimate_source"] == "model_artifact_size"
    await service.shutdown()


# ---- through the API ------------------------------------------------------------------


def test_gpu_memory_endpoint_with_nvidia_smi_and_an_observed_load(tmp_path):
    """The live service: NVML fails (a fake pynvml on PYTHONPATH), a fake nvidia-smi reports 1536 MiB
    more used memory at each call, so one load (a reading before, one after) observes 1536 MiB."""
    fake_modules = tmp_path / "fake-modules"
    fake_modules.mkdir()
    (fake_modules / "pynvml.py").write_text(
        "class NVMLError(Exception):\n    pass\n\n"
        "def nvmlInit():\n    raise NVMLError('Driver Not Loaded')\n\n"
        "def nvmlShutdown():\n    pass\n"
    )
    counter = tmp_path / "smi-calls"
    bin_dir = fake_nvidia_smi(
        tmp_path,
        f'n=$(cat {counter} 2>/dev/null || echo 0)\necho $((n + 1)) > {counter}\necho "0, {RTX}, $((70000 + n * 1536)), 97887"',
    )
    models = {"m": {"backend": "stub", "replicas": 3, "stub_vram_mib": 10}}
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(fake_modules)}
    live = LiveService(write_settings(tmp_path / "svc", models), tmp_path / "db.sqlite3", env=env).start()
    try:
        with live.client() as http:
            first = http.get("/v1/admin/gpu-memory").json()
            assert first["error"] is None
            assert first["gpus"] == [
                {"index": 0, "name": RTX, "used_mib": 70000, "total_mib": 97887, "used_over_total": "70000MiB / 97887MiB"}
            ]
            assert first["models"][0]["vram_estimate_source"] == "model_artifact_size"
            assert first["models"][0]["vram_estimate_mib"] == 30
            http.post("/v1/admin/models/m/load")
            http.post("/v1/admin/models/m/unload")
            after = http.get("/v1/admin/gpu-memory").json()
            model = after["models"][0]
            assert (model["vram_estimate_mib"], model["vram_estimate_replica_count"], model["vram_estimate_source"]) == (
                1536, 3, "observed_load_delta"
            )
    finally:
        assert live.stop() == 0


# ---- one process's device memory (an engine process's stats) ----------------------------
def test_process_gpu_memory_sums_the_process_on_every_gpu(monkeypatch):
    fake = install_nvml(monkeypatch, FakeNvml([(RTX, 10, 100), (RTX, 20, 100)]))
    module = sys.modules["pynvml"]
    listed = {
        0: [types.SimpleNamespace(pid=41, usedGpuMemory=3 * MIB), types.SimpleNamespace(pid=7, usedGpuMemory=9 * MIB)],
        1: [types.SimpleNamespace(pid=41, usedGpuMemory=2 * MIB), types.SimpleNamespace(pid=41, usedGpuMemory=None)],
    }
    module.nvmlDeviceGetComputeRunningProcesses = lambda handle: listed[handle]
    module.nvmlDeviceGetGraphicsRunningProcesses = lambda handle: []
    assert gpu.process_gpu_memory_bytes(41) == 5 * MIB  # None: a driver that hides the figure
    assert gpu.process_gpu_memory_bytes(99) == 0
    assert fake.calls.count("shutdown") == 2


def test_process_gpu_memory_is_none_without_nvml_or_gpus(monkeypatch):
    install_nvml(monkeypatch, FakeNvml(init_error="Driver Not Loaded"))
    assert gpu.process_gpu_memory_bytes(os.getpid()) is None
    install_nvml(monkeypatch, FakeNvml([]))
    assert gpu.process_gpu_memory_bytes(os.getpid()) is None
