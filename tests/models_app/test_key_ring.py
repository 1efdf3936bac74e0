"""The key ring of an API process (``models_app.api.keys.key_ring``): the keys of the database
merged with those of settings.json, a write of this process seen at once (``forget``), a write of
another process seen once ``CHECK_SECONDS`` pass and not before (one version query, no query per
request), and a database that cannot be read: 503 before the first read, the last ring after."""
from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError

from models_app import selectors, services
from models_app.api import keys
from runtime.errors import ApiKeysUnavailable, InvalidApiKey

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_ring(monkeypatch):
    monkeypatch.setattr(keys, "_cache", keys._RingCache())


def bearer(key: str):
    return {"authorization": f"Bearer {key}"}.get


def fields(name: str, **more) -> dict:
    return services.validated_key_fields({"name": name, **more})


async def create(name: str, **more):
    return await sync_to_async(services.key_create)(fields=fields(name, **more))


async def test_without_keys_anyone_calls_and_a_key_made_here_counts_at_once():
    assert (await keys.key_ring()).caller({}.get).models is None
    row, secret = await create("alice", models=["echo"], fairness_key="team-a")
    keys.forget()
    ring = await keys.key_ring()
    assert ring.needs_key
    caller = ring.caller(bearer(secret))
    assert (caller.fairness_key, caller.models) == ("team-a", frozenset({"echo"}))
    assert ring.caller({"x-api-key": secret}.get).fairness_key == "team-a"
    with pytest.raises(InvalidApiKey):
        ring.caller({}.get)
    with pytest.raises(InvalidApiKey):
        ring.caller(bearer(secret + "x"))


async def test_a_change_of_another_process_is_seen_after_check_seconds_and_not_before(monkeypatch):
    row, secret = await create("bob")
    assert (await keys.key_ring()).caller(bearer(secret)).fairness_key == "bob"
    queries = []
    real = selectors.key_ring_rows
    monkeypatch.setattr(selectors, "key_ring_rows", lambda known: queries.append(known) or real(known))
    # Another process disables the key: no forget() here.
    await sync_to_async(services.key_update)(pk=row.pk, changes={"disabled": True})
    for _ in range(100):
        (await keys.key_ring()).caller(bearer(secret))  # still the ring read before
    assert queries == []
    monkeypatch.setattr(keys, "CHECK_SECONDS", 0.05)
    time.sleep(0.06)
    with pytest.raises(InvalidApiKey, match="disabled"):
        (await keys.key_ring()).caller(bearer(secret))
    assert len(queries) == 1
    time.sleep(0.06)
    await keys.key_ring()  # the version did not move: one query, the rows are not read again
    assert len(queries) == 2 and queries[1] == await sync_to_async(selectors.key_ring_version)()


async def test_a_deleted_key_is_refused():
    row, secret = await create("carol")
    _, kept = await create("dave")
    version = await sync_to_async(selectors.key_ring_version)()
    await sync_to_async(services.key_delete)(pk=row.pk)
    assert await sync_to_async(selectors.key_ring_version)() == version + 1
    keys.forget()
    with pytest.raises(InvalidApiKey, match="not valid"):
        (await keys.key_ring()).caller(bearer(secret))
    assert (await keys.key_ring()).caller(bearer(kept)).fairness_key == "dave"


async def test_an_unreadable_database_before_the_first_read_refuses_with_503(monkeypatch):
    def broken(known):
        raise OperationalError("connection refused")

    monkeypatch.setattr(selectors, "key_ring_rows", broken)
    with pytest.raises(ApiKeysUnavailable) as refused:
        await keys.key_ring()
    assert (refused.value.http_status, refused.value.retry_after) == (503, 1)


async def test_an_unreadable_database_after_a_read_keeps_the_last_ring(monkeypatch):
    row, secret = await create("erin")
    assert (await keys.key_ring()).caller(bearer(secret)).fairness_key == "erin"

    def broken(known):
        raise OperationalError("connection refused")

    monkeypatch.setattr(selectors, "key_ring_rows", broken)
    keys.forget()
    assert (await keys.key_ring()).caller(bearer(secret)).fairness_key == "erin"


async def test_a_process_that_starts_before_its_database_is_ready_reads_its_keys_once_it_is(monkeypatch):
    """The API process's start warms its key ring, trying again until the database answers (an API
    process may start before the runtime worker has migrated it); then an outage finds the keys read."""
    row, secret = await create("frank")
    real = selectors.key_ring_rows
    answers = iter([OperationalError("relation does not exist"), OperationalError("still migrating")])

    def migrating(known):
        failure = next(answers, None)
        if failure is not None:
            raise failure
        return real(known)

    monkeypatch.setattr(selectors, "key_ring_rows", migrating)
    monkeypatch.setattr(keys, "WARM_RETRY_SECONDS", 0.01)
    await keys.warm_key_ring()

    def away(known):
        raise OperationalError("connection refused")

    monkeypatch.setattr(selectors, "key_ring_rows", away)
    keys.forget()
    assert (await keys.key_ring()).caller(bearer(secret)).fairness_key == "frank"


async def test_a_key_s_queue_timeout_bounds_the_header_s_and_its_weight_goes_with_its_requests():
    """The key's queue_timeout_seconds is the longest its requests wait: the header may shorten it,
    not lengthen it; the key's weight is among the request's queue terms (what crosses to the runtime)."""
    row, secret = await create("patient", queue_timeout_seconds=2, weight=2)
    plain_row, plain = await create("plain")
    ring = await keys.key_ring()

    def terms(key: str, header: str | None = None) -> dict:
        headers = {"authorization": f"Bearer {key}"}
        if header is not None:
            headers["x-llmpool-queue-timeout"] = header
        return ring.caller(headers.get).queue_terms()

    assert terms(secret) == {"priority": "default", "queue_timeout_seconds": 2, "weight": 2}
    assert terms(secret, "0.5")["queue_timeout_seconds"] == 0.5
    assert terms(secret, "30")["queue_timeout_seconds"] == 2
    assert terms(plain) == {"priority": "default", "queue_timeout_seconds": None, "weight": None}
    assert terms(plain, "30")["queue_timeout_seconds"] == 30
