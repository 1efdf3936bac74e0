"""Make-before-break reconfigure where memory allows (runtime.model.residency, llama_cpp), on SmolLM2 in an
engine process at 8,192 tokens: with room for two contexts the new one is built before the old is
freed (the process's peak RSS, VmHWM reset before, rises by about one KV cache); on a cpu budget
that holds the new configuration but not both, the old one is freed first (the peak stays about
where it was).  The ``reconfigured`` event says which (``mode``)."""
from __future__ import annotations

import pytest
from llama_helpers import SMOLLM2_MODEL

from runtime.pool.devices import MemorySettings
from runtime.model.residency import ModelEvent
from runtime.service import RuntimeService
from tests.conftest import write_settings

SMOL = {**SMOLLM2_MODEL, "gguf_n_ctx": 8192, "isolation": "process"}
MIB = 2**20


@pytest.fixture
async def service(tmp_path):
    service = RuntimeService(str(write_settings(tmp_path, {"smol": SMOL})))
    service.events = []
    service.pool.listeners.append(service.events.append)
    await service.start(load_enabled=False)
    await service.handle("load", {"name": "smol", "body": None}, None)
    try:
        yield service
    finally:
        await service.shutdown()


def _peak_after_reset(pid: int):
    """Reset the process's peak RSS to its RSS now; a function that reads the peak since (MiB)."""
    with open(f"/proc/{pid}/clear_refs", "w") as target:
        target.write("5")

    def peak() -> float:
        with open(f"/proc/{pid}/status") as source:
            fields = dict(line.split(":", 1) for line in source if ":" in line)
        return int(fields["VmHWM"].split()[0]) / 1024

    return peak


async def _rss_mib(engine) -> float:
    return (await engine.stats())["rss_bytes"] / MIB


async def test_the_new_context_is_built_first_only_where_both_fit(service):
    controller = service.pool.controller("smol")
    memory = service.pool.memory
    engine = controller.engines[0]
    kv_mib = memory.estimate_parts(controller, {})["kv_cache_mib"]
    assert kv_mib > 150  # SmolLM2's KV cache at 8,192 tokens, f16

    # Plenty of room: make-before-break (same sizes, another K type name: a new context all the same).
    peak = _peak_after_reset(engine.process.pid)
    before = await _rss_mib(engine)
    answer = await service.handle("reconfigure", {"name": "smol", "body": {"gguf_type_k": "f16"}}, None)
    assert answer["reconfigured"]["mode"] == "make_before_break"
    assert peak() - before > 0.7 * kv_mib, (peak(), before, kv_mib)

    # A budget that holds the new configuration but not a second context: break-then-make.
    held = memory.charges["smol"].mib["cpu"]
    memory.configure(MemorySettings.model_validate({"devices": {"cpu": {"budget_mib": held + kv_mib // 2}}}))
    peak = _peak_after_reset(engine.process.pid)
    before = await _rss_mib(engine)
    answer = await service.handle("reconfigure", {"name": "smol", "body": {"gguf_type_k": None}}, None)
    assert answer["reconfigured"]["mode"] == "break_then_make"
    assert peak() - before < 0.3 * kv_mib, (peak(), before, kv_mib)
    assert [e.details["mode"] for e in service.events if isinstance(e, ModelEvent)] == [
        "make_before_break", "break_then_make"
    ]
