"""The usage rows (``services.key_usage_add``, ``key_usage_prune``; ``quotas.usage.flush``): a
batch adds to the row of each key, model and day (made on first use), a deleted key's counts are
dropped, a failed write keeps its counts for the next one, old rows are pruned, and the
selectors read a period's tokens and the totals the metric exports."""
from __future__ import annotations

from datetime import date

import pytest
from asgiref.sync import sync_to_async

from models_app import selectors, services
from models_app.quotas import usage

pytestmark = pytest.mark.django_db(transaction=True)

DAY = date(2026, 12, 5)


def make_key(name: str) -> int:
    row, _secret = services.key_create(fields=services.validated_key_fields({"name": name}))
    return row.pk


def rows(key: int | str) -> list[tuple]:
    return [(use.model, use.day, use.input_tokens, use.output_tokens, use.requests)
            for use in selectors.key_usage(key, date(2000, 1, 1))]


def test_a_batch_adds_to_each_keys_model_and_day_and_drops_a_deleted_keys_counts():
    alice, bob = make_key("alice"), make_key("bob")
    services.key_usage_add({(alice, "echo", DAY): [10, 5, 1], (bob, "echo", DAY): [1, 1, 1]})
    services.key_delete(pk=bob)
    services.key_usage_add({(alice, "echo", DAY): [3, 2, 1], (alice, "vec", DAY): [7, 0, 1],
                            (bob, "echo", DAY): [100, 100, 1]})
    assert rows(alice) == [("echo", DAY, 13, 7, 2), ("vec", DAY, 7, 0, 1)]
    assert rows(bob) == []
    assert selectors.key_tokens_between(alice, DAY, DAY) == 27
    assert selectors.key_token_totals() == [
        {"name": "alice", "model": "echo", "input": 13, "output": 7},
        {"name": "alice", "model": "vec", "input": 7, "output": 0},
    ]


def test_a_key_of_settings_json_has_rows_of_its_own_by_name():
    """A key of settings.json has no row: its usage is kept under its name, apart from the
    database keys', and read back by its quota key."""
    alice = make_key("alice")
    services.key_usage_add({("settings:ops", "echo", DAY): [5, 1, 1], (alice, "echo", DAY): [1, 1, 1]})
    services.key_usage_add({("settings:ops", "echo", DAY): [2, 2, 1]})
    assert rows("settings:ops") == [("echo", DAY, 7, 3, 2)]
    assert rows(alice) == [("echo", DAY, 1, 1, 1)]
    assert selectors.key_tokens_between("settings:ops", DAY, DAY) == 10
    assert selectors.key_token_totals() == [
        {"name": "alice", "model": "echo", "input": 1, "output": 1},
        {"name": "ops", "model": "echo", "input": 7, "output": 3},
    ]


def test_rows_of_days_before_the_cut_are_pruned():
    alice = make_key("alice")
    services.key_usage_add({(alice, "echo", date(2025, 1, 1)): [1, 1, 1], (alice, "echo", DAY): [2, 2, 1]})
    assert services.key_usage_prune(before=date(2026, 1, 1)) == 1
    assert rows(alice) == [("echo", DAY, 2, 2, 1)]


async def test_a_failed_write_keeps_its_counts_for_the_next(monkeypatch):
    alice = await sync_to_async(make_key)("alice")
    ledger = usage.UsageLedger()
    monkeypatch.setattr(usage, "LEDGER", ledger)
    ledger.record(alice, "echo", 4, 6, DAY)
    real = services.key_usage_add

    def broken(counts):
        raise OSError("the database is away")

    monkeypatch.setattr(services, "key_usage_add", broken)
    await usage.flush()
    assert ledger.pending_tokens(alice, DAY, DAY) == 10
    monkeypatch.setattr(services, "key_usage_add", real)
    ledger.record(alice, "echo", 1, 1, DAY)
    await usage.flush()
    assert ledger.pending_tokens(alice, DAY, DAY) == 0
    assert await sync_to_async(rows)(alice) == [("echo", DAY, 5, 7, 2)]
