"""runtime.metrics: bounded fairness series under a flood of keys, parsed with prometheus-client."""
from prometheus_client.parser import text_string_to_metric_families

from runtime.activity import RequestRecord
from runtime.metrics import KeyTally


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
