"""Usage per key: the tokens each key used, per model and UTC day, kept in the database (a key by
its quota key: a database key's primary key, ``settings:<name>`` for a key of settings.json).

A request's answer adds its tokens to this process's ``LEDGER`` (memory, no I/O on the request's
path); ``run_periodic``, a task of the API process's own event loop (``start_periodic``, with
the HTTP server), writes what the ledger gathered to the usage rows every ``FLUSH_SECONDS`` in
one transaction (``services.key_usage_add``), renews the split's concurrency leases of this
process's requests in flight, and, in one process of the pool, prunes the rows older than
``KEEP_DAYS``.  In the split that one process is elected through Redis (a key set only if
absent, renewed by its holder while it lives); embedded, the one API process does it.  A write that
fails puts its counts back for the next one; ``flush`` at shutdown writes the rest.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone

from asgiref.sync import sync_to_async

from models_app import services
from models_app.quotas.redis_store import SPLIT_STORE
from models_app.transport import nodes

logger = logging.getLogger("llmpool.api")

FLUSH_SECONDS = 2.0
KEEP_DAYS = 400  # a year of days and a month's margin: a budget per month never reads a pruned row
PRUNE_SECONDS = 3600.0
ELECTION_SECONDS = 30  # the pruner's key lives this long unless its holder renews it


class UsageLedger:
    """The tokens this process counted and has not written yet: (quota key, model, day) -> counts."""

    def __init__(self):
        self._pending: dict[tuple[int | str, str, date], list[int]] = defaultdict(lambda: [0, 0, 0])

    def record(self, key: int | str, model: str, input_tokens: int, output_tokens: int, day: date | None = None) -> None:
        counts = self._pending[(key, model, day or datetime.now(timezone.utc).date())]
        counts[0] += input_tokens
        counts[1] += output_tokens
        counts[2] += 1

    def take(self) -> dict[tuple[int | str, str, date], list[int]]:
        """Everything gathered; the ledger starts empty."""
        taken, self._pending = self._pending, defaultdict(lambda: [0, 0, 0])
        return dict(taken)

    def put_back(self, taken: dict[tuple[int | str, str, date], list[int]]) -> None:
        for slot, counts in taken.items():
            pending = self._pending[slot]
            for index, count in enumerate(counts):
                pending[index] += count

    def pending_tokens(self, key: int | str, first: date, last: date) -> int:
        return sum(counts[0] + counts[1] for (owner, _model, day), counts in self._pending.items()
                   if owner == key and first <= day <= last)


LEDGER = UsageLedger()


async def flush() -> None:
    """Write the ledger to the usage rows (its counts go back to it when the write fails)."""
    taken = LEDGER.take()
    if not taken:
        return
    try:
        await sync_to_async(services.key_usage_add)(taken)
    except Exception as exc:
        LEDGER.put_back(taken)
        logger.warning("the usage per key could not be written (kept for the next try): %s", exc)


_RUNNING: set[asyncio.Task] = set()  # the loop keeps only a weak reference to a task


def start_periodic() -> None:
    """Start ``run_periodic`` on the running loop (the HTTP server's, as the API process starts)."""
    task = asyncio.ensure_future(run_periodic())
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)


async def run_periodic() -> None:
    """The API process's periodic work on usage (the module docstring), until cancelled."""
    pruned_at = float("-inf")
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(FLUSH_SECONDS)
        await flush()
        try:
            if nodes.is_split():
                await SPLIT_STORE.renew_leases()
            if loop.time() - pruned_at >= PRUNE_SECONDS:
                pruned_at = loop.time()  # elected or not: the next election is an hour away
                if not await _elected():
                    continue
                before = datetime.now(timezone.utc).date() - timedelta(days=KEEP_DAYS)
                await sync_to_async(services.key_usage_prune)(before=before)
        except Exception as exc:
            logger.warning("the periodic work on usage per key failed (tried again): %s", exc)


_IDENTITY = f"{nodes.node_name(os.uname().nodename)}:{os.getpid()}"

# KEYS[1]: the election key.  ARGV: this process's identity, the key's life (s).  1: elected.
_ELECT = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  return 1
end
return 0
"""


async def _elected() -> bool:
    """Whether this process does the pool's pruning: the only process embedded; in the split the
    holder of ``<prefix>:usage-pruner``."""
    if not nodes.is_split():
        return True
    return bool(await SPLIT_STORE.client().eval(_ELECT, 1, f"{nodes.prefix()}:usage-pruner", _IDENTITY,
                                  max(ELECTION_SECONDS, int(PRUNE_SECONDS) + ELECTION_SECONDS)))
