"""Speculative decoding's figures, for real (SmolLM2 with prompt lookup, through the runtime):
each answer's drafted and accepted tokens reach the activity view, the model's rolling ``stats``
and ``/metrics`` (``llmpool_spec_decode_*_total``); a model without speculation reports none.
An upstream's figures come from llama-server's ``timings``."""
from __future__ import annotations

from llama_helpers import SMOLLM2_MODEL
from prometheus_client.parser import text_string_to_metric_families

from runtime.backends.shared.openai_chat import upstream_finished
from runtime.service import RuntimeService
from tests.conftest import write_settings
from tests.engines.runtime_driver import user_input

# A table SmolLM2 copies row for row (bench/speculative.py's): prompt lookup's drafts are right there.
TABLE = "\n".join(f"| {i} | part-{i:03d} | {i * 7 % 13} kg | shelf {chr(65 + i % 5)} | in stock |" for i in range(1, 13))


async def _ignore(event: dict) -> None:
    pass


def samples(text: str, name: str) -> dict[str, float]:
    """``{model: value}`` of counter ``name``'s ``_total`` samples."""
    return {sample.labels["model"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


async def test_drafted_and_accepted_tokens_reach_activity_stats_and_metrics(tmp_path):
    common = {**SMOLLM2_MODEL, "gguf_n_ctx": 512, "isolation": "none"}
    service = RuntimeService(str(write_settings(tmp_path, {
        "spec": {**common, "gguf_spec_type": "ngram-simple"},
        "plain": common,
    })))
    await service.start(load_enabled=False)
    try:
        results = {}
        for name in ("spec", "plain"):
            await service.handle("load", {"name": name, "body": None}, None)
            payload = {"request_id": name, "model": name, "messages": user_input(f"Copy this table exactly, every row:\n{TABLE}"),
                       "max_output_tokens": 40, "temperature": 0.0}
            results[name] = await service.handle("generate", payload, _ignore)
        usage = results["spec"]["usage"]
        assert usage["draft_tokens"] > 0 and 0 < usage["accepted_draft_tokens"] <= usage["draft_tokens"]
        assert "draft_tokens" not in results["plain"]["usage"]

        activity = {item["model"]: item for item in (await service.handle("activity", {}, None))["requests"]}
        assert activity["spec"]["draft_tokens"] == usage["draft_tokens"]
        assert activity["spec"]["accepted_draft_tokens"] == usage["accepted_draft_tokens"]
        assert activity["plain"]["draft_tokens"] is None

        stats = (await service.handle("get_model", {"name": "spec"}, None))["stats"]
        assert (stats["draft_tokens"], stats["accepted_draft_tokens"]) == (usage["draft_tokens"],
                                                                          usage["accepted_draft_tokens"])
        assert stats["draft_acceptance_rate"] == round(usage["accepted_draft_tokens"] / usage["draft_tokens"], 3)
        plain_stats = (await service.handle("get_model", {"name": "plain"}, None))["stats"]
        assert plain_stats["draft_tokens"] == 0 and plain_stats["draft_acceptance_rate"] is None

        text = (await service.handle("metrics", {}, None))["text"]
        assert samples(text, "llmpool_spec_decode_draft_tokens_total") == {"spec": usage["draft_tokens"]}
        assert samples(text, "llmpool_spec_decode_accepted_tokens_total") == {"spec": usage["accepted_draft_tokens"]}
    finally:
        await service.shutdown()


def test_llama_servers_timings_give_an_upstreams_figures():
    timings = {"cache_n": 3, "predicted_n": 20, "draft_n": 12, "draft_n_accepted": 9}
    finished = upstream_finished({"prompt_tokens": 10, "completion_tokens": 20}, timings, "stop", 0)
    assert (finished.draft_tokens, finished.accepted_tokens, finished.cached_tokens) == (12, 9, 3)
    # without speculation llama-server writes neither
    plain = upstream_finished({"prompt_tokens": 10, "completion_tokens": 20}, {"cache_n": 0}, "stop", 0)
    assert (plain.draft_tokens, plain.accepted_tokens) == (None, None)
