"""runtime.observe.metrics: bounded fairness series under a flood of keys, parsed with prometheus-client."""
from prometheus_client.parser import text_string_to_metric_families

from runtime.observe.records import RequestRecord
from runtime.observe.metrics import KeyTally


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_ten_thousand_fairness_keys_give_the_busiest_n_plus_other(runtime_service):
    service, _ = await runtime_service({"m": {"backend": "stub"}})
    top = service.pool.settings.engine.fairness.reported_keys
    for index in range(10_000):
        record = RequestRecord("responses", f"key-{index}", model="m")
        record.succeeded(1, 1 + (index % 7 == 0) * 100)  # every 7th key is busier
        service.metrics.observe_request(record)
    busiest = RequestRecord("responses", "heavy", model="m")
    busiest.succeeded(5000, 5000)
    service.metrics.observe_request(busiest)
    served = families(await service.metrics.exposition())["llmpool_fairness_served_tokens"]
    keys = {sample.labels["key"]: sample.value for sample in served.samples if sample.name.endswith("_total")}
    assert len(keys) == top + 1 and "other" in keys
    assert keys["heavy"] == 10_000
    assert sum(keys.values()) == 10_000 + sum(2 + (i % 7 == 0) * 100 for i in range(10_000))
    assert len(service.metrics.keys.keys) <= service.metrics.keys.capacity


def test_key_tally_evicts_the_smallest_into_other():
    tally = KeyTally(capacity=2)
    tally.add("a", tokens=10)
    tally.add("b", tokens=1)
    tally.add("c", tokens=5, rejections=1)  # evicts b
    assert sorted(tally.keys) == ["a", "c"]
    assert tally.report(1) == [("a", 10, 0), ("other", 6, 1)]
    assert tally.report(5) == [("a", 10, 0), ("c", 5, 1), ("other", 1, 0)]


async def test_memory_figures_per_device_and_per_model(tmp_path):
    """The memory section's figures (runtime.pool.memory): each device's budget, what is charged on it
    by kind, and each model's charge, moving as models load and unload."""
    import json

    from runtime.service import RuntimeService

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({
        "models": {
            "a": {"backend": "stub", "device": "cpu", "stub_vram_mib": 100},
            "b": {"backend": "stub", "device": "cpu", "stub_vram_mib": 30, "stub_observed_mib": 40},
        },
        "memory": {"devices": {"cpu": {"budget_mib": 500}}},
    }))
    service = RuntimeService(str(path))
    await service.start(load_enabled=False)
    mib = 1024 * 1024
    try:
        for name in ("a", "b"):
            await service.pool.controller(name).load({}, None)
        scraped = families(await service.metrics.exposition())
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in scraped.values() for s in f.samples}
        assert samples[("llmpool_device_budget_bytes", (("device", "cpu"),))] == 500 * mib
        assert samples[("llmpool_device_charged_bytes", (("device", "cpu"), ("kind", "measured")))] == 140 * mib
        assert samples[("llmpool_device_charged_bytes", (("device", "cpu"), ("kind", "reserved")))] == 0
        charged = (("device", "cpu"), ("kind", "measured"), ("model", "b"))
        assert samples[("llmpool_model_charged_bytes", charged)] == 40 * mib  # what was measured, not the estimate
        await service.pool.controller("b").unload()
        scraped = families(await service.metrics.exposition())
        models = {s.labels["model"] for s in scraped["llmpool_model_charged_bytes"].samples}
        assert models == {"a"}
    finally:
        await service.shutdown()
