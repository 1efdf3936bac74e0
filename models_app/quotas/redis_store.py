"""The split's counters: every key's windows in Redis, shared by all API processes of the pool.

Each admission is one Lua script (one round trip, atomic), so two API processes never both let
in the 61st request of a 60 rpm key; a request's end is another (its tokens counted, its slot
freed), sent once its answer is; the clock is Redis's own (``TIME``), so API processes on
hosts whose clocks differ still agree on the windows.  Per key, under the pool's prefix:

- ``<prefix>:quota:<key>:req``: a sorted set of the admitted requests (score: admission time, ms);
- ``<prefix>:quota:<key>:tok`` and ``:toksum``: the charged answers (member ``<request>:<tokens>``, score:
  answer time) and their sum, which the script lowers as members leave the window;
- ``<prefix>:quota:<key>:run``: the requests in flight (score: the end of their lease);
- ``<prefix>:quota:<key>:budget:<period>``: the tokens charged in a budget period (kept until it ends).

A request in flight holds a lease of ``LEASE_SECONDS`` that its API process renews
(``renew_leases``, from the usage task): the slots of an API process that died free themselves
within a lease.
"""
from __future__ import annotations

import asyncio
import weakref

from django.conf import settings

from models_app.quotas import policy
from models_app.quotas.policy import BudgetPeriod, KeyLimits, Verdict, Window
from models_app.transport import nodes

LEASE_SECONDS = 30
_REFUSALS = (None, policy.BUDGET_EXHAUSTED, policy.RATE_LIMITED, policy.TOKEN_RATE_LIMITED, policy.CONCURRENCY_LIMITED)

# KEYS: req, tok, toksum, run, budget.  ARGV: rpm, tpm, max_concurrent, budget (0: none), the ms
# left in the budget period, the request's id, the lease (ms).
# Returns {refusal (index into _REFUSALS), wait ms, requests counted, requests reset ms, tokens
# counted, tokens reset ms}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = %d
local edge = now - window
local rpm, tpm, maxc, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local refused, wait = 0, 0
local requests, requests_reset, tokens, tokens_reset = 0, 0, 0, 0
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', edge)
  requests = redis.call('ZCARD', KEYS[1])
end
if tpm > 0 then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', edge)
  if #gone > 0 then
    local sum = 0
    for _, member in ipairs(gone) do sum = sum + tonumber(string.match(member, ':(%%d+)$')) end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', edge)
    redis.call('DECRBY', KEYS[3], sum)
  end
  tokens = tonumber(redis.call('GET', KEYS[3]) or '0')
end
if maxc > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now) end
if budget > 0 and tonumber(redis.call('GET', KEYS[5]) or '0') >= budget then
  refused, wait = 1, tonumber(ARGV[5])
elseif rpm > 0 and requests >= rpm then
  local first = redis.call('ZRANGE', KEYS[1], requests - rpm, requests - rpm, 'WITHSCORES')
  refused, wait = 2, tonumber(first[2]) + window - now
elseif tpm > 0 and tokens >= tpm then
  local over = tokens - tpm
  local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    over = over - tonumber(string.match(entries[i], ':(%%d+)$'))
    if over < 0 then
      wait = tonumber(entries[i + 1]) + window - now
      break
    end
  end
  refused = 3
elseif maxc > 0 and redis.call('ZCARD', KEYS[4]) >= maxc then
  refused, wait = 4, %d
end
if refused == 0 then
  if rpm > 0 then
    redis.call('ZADD', KEYS[1], now, ARGV[6])
    redis.call('PEXPIRE', KEYS[1], window)
    requests = requests + 1
  end
  if maxc > 0 then
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[7]), ARGV[6])
    redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[7]))
  end
end
if requests > 0 then
  requests_reset = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) + window - now
end
if tpm > 0 and tokens > 0 then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if oldest[2] then tokens_reset = tonumber(oldest[2]) + window - now end
end
return {refused, wait, requests, requests_reset, tokens, tokens_reset}
""" % (int(policy.WINDOW_SECONDS * 1000), int(policy.CONCURRENCY_RETRY_SECONDS * 1000))

# KEYS: tok, toksum, budget, run.  ARGV: tokens, the request's id, tpm counted (1/0), budget
# counted (1/0), the budget key's life (s), release the slot (1/0).
_FINISH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tokens = tonumber(ARGV[1])
if ARGV[3] == '1' and tokens > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[2] .. ':' .. tokens)
  redis.call('INCRBY', KEYS[2], tokens)
  redis.call('PEXPIRE', KEYS[1], %d)
  redis.call('PEXPIRE', KEYS[2], %d)
end
if ARGV[4] == '1' and tokens > 0 then
  redis.call('INCRBY', KEYS[3], tokens)
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[5]))
end
if ARGV[6] == '1' then redis.call('ZREM', KEYS[4], ARGV[2]) end
return 1
""" % (int(policy.WINDOW_SECONDS * 1000), int(policy.WINDOW_SECONDS * 1000))

# KEYS: run keys.  ARGV: the lease (ms), then one request id per key.
_RENEW = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for index, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', until_ms, ARGV[index + 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[1]))
end
return 1
"""

# Kept a day past its period's end, so a clock a little off never restarts a period's count.
BUDGET_KEEP_SECONDS = 86_400


class RedisStore:
    def __init__(self):
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> (client, scripts)
        # This process's requests in flight that hold a slot: request id -> key (their leases are renewed).
        self.held: dict[str, int | str] = {}

    def client(self):
        """This event loop's Redis client."""
        return self._scripts()[0]

    def _scripts(self):
        from redis import asyncio as aioredis

        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            client = aioredis.from_url(settings.REDIS_URL, socket_timeout=nodes.REDIS_TIMEOUT_SECONDS,
                                       socket_connect_timeout=nodes.REDIS_TIMEOUT_SECONDS)
            found = self._clients[loop] = (client, client.register_script(_ADMIT), client.register_script(_FINISH),
                                           client.register_script(_RENEW))
        return found

    @staticmethod
    def _key(key: int | str, part: str) -> str:
        return f"{nodes.prefix()}:quota:{key}:{part}"

    async def admit(self, key: int | str, limits: KeyLimits, request_id: str, period: BudgetPeriod | None) -> Verdict:
        _client, admit, _finish, _renew = self._scripts()
        budget_key = self._key(key, f"budget:{period.name}") if period is not None else self._key(key, "budget")
        keys = [self._key(key, "req"), self._key(key, "tok"), self._key(key, "toksum"), self._key(key, "run"),
                budget_key]
        args = [limits.requests_per_minute or 0, limits.tokens_per_minute or 0, limits.max_concurrent or 0,
                limits.token_budget if period is not None else 0,
                int(period.seconds_left * 1000) if period is not None else 0, request_id, LEASE_SECONDS * 1000]
        refused, wait, requests, requests_reset, tokens, tokens_reset = await admit(keys=keys, args=args)
        if refused == 0 and limits.max_concurrent is not None:
            self.held[request_id] = key
        requests_window = tokens_window = None
        if limits.requests_per_minute is not None:
            requests_window = Window(limits.requests_per_minute, max(0, limits.requests_per_minute - requests),
                                     requests_reset / 1000)
        if limits.tokens_per_minute is not None:
            tokens_window = Window(limits.tokens_per_minute, max(0, limits.tokens_per_minute - tokens),
                                   tokens_reset / 1000)
        return Verdict(_REFUSALS[refused], max(0, wait) / 1000, requests_window, tokens_window)

    async def finish(self, key: int | str, limits: KeyLimits, tokens: int, request_id: str,
                     period: BudgetPeriod | None, release: bool) -> None:
        """The end of a request: its answer's ``tokens`` counted, its concurrency slot freed (``release``)."""
        _client, _admit, finish, _renew = self._scripts()
        self.held.pop(request_id, None)
        budget_key = self._key(key, f"budget:{period.name}") if period is not None else self._key(key, "budget")
        await finish(
            keys=[self._key(key, "tok"), self._key(key, "toksum"), budget_key, self._key(key, "run")],
            args=[tokens, request_id, int(limits.tokens_per_minute is not None), int(period is not None),
                  int(period.seconds_left) + BUDGET_KEEP_SECONDS if period is not None else 0, int(release)],
        )

    async def renew_leases(self) -> None:
        """Renew the leases of this process's requests in flight."""
        held = list(self.held.items())
        if not held:
            return
        _client, _admit, _finish, renew = self._scripts()
        await renew(keys=[self._key(key, "run") for _, key in held],
                    args=[LEASE_SECONDS * 1000, *(request_id for request_id, _ in held)])


SPLIT_STORE = RedisStore()
