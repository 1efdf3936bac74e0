"""The queue headers as the key ring reads them (``KeyRing.caller``, ``api.queue_headers``): the
class a caller's key gives, what ``service.priority_header`` may change of it, the queue timeout
header, and the errors of bad values, which come after the key's own check."""
from __future__ import annotations

import hashlib

import pytest

from models_app.api.keys import KeyRing
from models_app.quotas.policy import KeyLimits
from runtime.config import ApiKey, ServiceSettings
from runtime.errors import InvalidApiKey, InvalidPriority, InvalidQueueTimeout, PriorityNotAllowed

HEADER = "X-LLMPool-Priority"


def row(name: str, priority: str) -> dict:
    return {"name": name, "key_sha256": hashlib.sha256(name.encode()).hexdigest(), "models": "*",
            "fairness_key": None, "disabled": False, "priority": priority, "id": int(hashlib.sha256(name.encode()).hexdigest()[:8], 16),
            "requests_per_minute": None, "tokens_per_minute": None, "max_concurrent": None,
            "token_budget": None, "budget_period": None, "queue_timeout_seconds": None, "weight": None}


def ring(*rows, priority_header: str | None = HEADER) -> KeyRing:
    return KeyRing(ServiceSettings(priority_header=priority_header), list(rows))


def headers(key: str | None = None, **named) -> callable:
    found = {name.replace("_", "-").lower(): value for name, value in named.items()}
    if key is not None:
        found["authorization"] = f"Bearer {key}"
    return found.get


def test_without_keys_the_class_is_default_and_the_header_may_ask_any():
    assert ring().caller(headers()).priority == "default"
    assert ring().caller(headers(x_llmpool_priority="interactive")).priority == "interactive"
    assert ring().caller(headers(x_llmpool_priority=" Batch ")).priority == "batch"


def test_without_a_priority_header_setting_the_header_is_not_read():
    caller = ring(row("jobs", "batch"), priority_header=None).caller(headers("jobs", x_llmpool_priority="urgent"))
    assert caller.priority == "batch"


def test_a_key_s_class_caps_what_the_header_asks():
    keys = ring(row("jobs", "batch"), row("chat", "interactive"))
    assert keys.caller(headers("jobs")).priority == "batch"
    assert keys.caller(headers("chat")).priority == "interactive"
    assert keys.caller(headers("chat", x_llmpool_priority="batch")).priority == "batch"
    assert keys.caller(headers("jobs", x_llmpool_priority="batch")).priority == "batch"
    for asked in ("default", "interactive"):
        with pytest.raises(PriorityNotAllowed) as refused:
            keys.caller(headers("jobs", x_llmpool_priority=asked))
        assert refused.value.param == "x-llmpool-priority"


def test_the_queue_timeout_header():
    assert ring().caller(headers()).queue_timeout_seconds is None
    assert ring().caller(headers(x_llmpool_queue_timeout="2.5")).queue_timeout_seconds == 2.5
    assert ring().caller(headers(x_llmpool_queue_timeout="86400")).queue_timeout_seconds == 86400
    assert ring().caller(headers(x_llmpool_queue_timeout="30")).queue_terms() == {
        "priority": "default", "queue_timeout_seconds": 30.0, "weight": None}


@pytest.mark.parametrize("value", ["", "-1", "0", "0.0", "+5", "1e3", "inf", "nan", "1_000", "86400.5", "10 s",
                                   "9" * 400])
def test_a_bad_queue_timeout_is_refused(value):
    with pytest.raises(InvalidQueueTimeout) as refused:
        ring().caller(headers(x_llmpool_queue_timeout=value))
    assert refused.value.param == "x-llmpool-queue-timeout" and refused.value.http_status == 400


def test_an_unknown_class_is_refused_and_the_key_is_checked_first():
    with pytest.raises(InvalidPriority):
        ring().caller(headers(x_llmpool_priority="urgent"))
    with pytest.raises(InvalidApiKey):
        ring(row("jobs", "batch")).caller(headers("nobody", x_llmpool_priority="urgent", x_llmpool_queue_timeout="-1"))


def test_a_key_of_settings_json_has_its_class_limits_and_queue_timeout():
    """A key of settings.json carries what a key of the database does, read from the file."""
    settings_key = ApiKey(name="ops", key_sha256=hashlib.sha256(b"ops").hexdigest(), models="*", priority="batch",
                          requests_per_minute=2, queue_timeout_seconds=5)
    keys = KeyRing(ServiceSettings(priority_header=HEADER, api_keys=[settings_key]))
    caller = keys.caller(headers("ops", x_llmpool_queue_timeout="60"))
    assert (caller.priority, caller.queue_timeout_seconds, caller.quota_key) == ("batch", 5, "settings:ops")
    assert caller.limits == KeyLimits(requests_per_minute=2)
    with pytest.raises(PriorityNotAllowed):
        keys.caller(headers("ops", x_llmpool_priority="default"))
    plain = ApiKey(name="plain", key_sha256=hashlib.sha256(b"plain").hexdigest(), models="*")
    caller = KeyRing(ServiceSettings(api_keys=[plain])).caller(headers("plain"))
    assert (caller.limits, caller.quota_key, caller.priority) == (None, "settings:plain", "default")
