"""Inference keys: who may use the models, and whose fairness share a
request takes.

Every inference endpoint (POST /v1/responses, /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/rerank, /v1/messages, GET /v1/models and /v1/models/{id}) asks ``(await key_ring()).caller(header)``
once per request, before anything else:

- no keys configured: anyone may call, every model; the fairness key is the first of
  ``service.fairness_key_headers`` the request carries, else None (the parser then takes the
  body's ``user``);
- keys configured: ``Authorization: Bearer <key>`` (or, without it, ``x-api-key: <key>``, as
  Anthropic's clients send it) must name one (401 ``invalid_api_key`` otherwise); the key may
  use only its models (403 ``model_not_allowed``), and its bucket (``fairness_key``, else its
  name) is the fairness key, whatever the ``user`` field or a fairness header say, so a caller
  cannot leave its share.

Either way the caller's priority class is its key's (``default`` without keys), or what the
header ``service.priority_header`` asks within it.  Its queue timeout is the shorter of the
``X-LLMPool-Queue-Timeout`` header's (``api.queue_headers``) and its key's
``queue_timeout_seconds``: the key's bounds how long its requests wait, and the header may only
shorten that (as Envoy's ``max_grpc_timeout`` caps a gRPC client's deadline); with neither, the
model's applies.  A database key's ``weight`` goes with its requests to the scheduler (a key of
settings.json has its weight in the runtime's ``engine.fairness`` already).  A key of either kind
has the same limits (``runtime.key_terms``), counted under its ``quota_key``.

A request's model is resolved once, here (``Caller.resolve``), by the one rule
(``runtime.pool.catalog.canonical_model``) over the pool's names as the nodes announce them: the key
check compares the models meant on both sides (a key that lists a model may use it by any of its
aliases, one that lists an alias may use the model by its name and its other aliases), and the
request goes on to routing and the runtime under the model's own name.

The keys are those of settings.json (``service.api_keys``, read-only here) and those of the
database (``models_app.models.InferenceKey``, managed through ``/v1/admin/keys`` and
``manage.py create_api_key``).  A disabled key is refused as an unknown one is (401
invalid_api_key), and counts as configured: disabling the last key does not open the service.
Only the sha256 of a key is kept; a presented key is hashed, looked up and compared in constant
time (``KeyRing._match``).  ``key_ring()`` says how a change reaches every API process.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import DatabaseError

from models_app import selectors
from models_app.api import queue_headers
from models_app.api.limits import check_fairness_key
from models_app.conf import service_settings
from models_app.key_fields import settings_id
from models_app.quotas.policy import KeyLimits
from models_app.transport import nodes
from runtime.pool.catalog import canonical_model
from runtime.config import ApiKey, ServiceSettings
from runtime.errors import ApiKeysUnavailable, InvalidApiKey, ModelNotAllowed
from runtime.key_terms import LIMIT_NAMES
from runtime.queue_terms import DEFAULT_PRIORITY, PRIORITY_CLASSES

logger = logging.getLogger("llmpool.api")

# A request's header by lower-case name, or None: ``dict.get`` of the ASGI headers, Django's ``request.headers.get``.
HeaderLookup = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Caller:
    """Who sent an inference request, as the edge decided it."""

    # The fairness key the request gets: the API key's bucket, else a fairness header's value; None
    # leaves it to the body's ``user`` field.
    fairness_key: str | None
    # The models the caller may use, as its key lists them (names or aliases); None: every model.
    models: frozenset[str] | None = None
    # The class its request queues in (runtime.queue_terms.PRIORITY_CLASSES).
    priority: str = DEFAULT_PRIORITY
    # The seconds its request may wait before it starts; None: its model's queue_timeout_seconds.
    queue_timeout_seconds: float | None = None
    # Its key's fairness weight; None: the runtime's engine.fairness weight of its fairness key.
    weight: float | None = None
    # What its key's limits and usage are counted under (a database key's primary key, a key of
    # settings.json its "settings:<name>"; None: no key), and those limits.
    quota_key: int | str | None = None
    limits: KeyLimits | None = None

    def queue_terms(self) -> dict:
        """What the runtime queues the request with: the typed request's fields of the same names."""
        return {"priority": self.priority, "queue_timeout_seconds": self.queue_timeout_seconds, "weight": self.weight}

    def allows(self, model: str, names: Mapping[str, str]) -> bool:
        """Whether the key lists the model ``model`` (a name or an alias) means, every name on
        both sides resolved over ``names`` (``runtime.pool.catalog.model_names``); a name ``names``
        does not know stands for itself."""
        if self.models is None:
            return True
        wanted = _meant(model, names)
        return any(_meant(listed, names) == wanted for listed in self.models)

    async def resolve(self, model: str) -> str:
        """The model a request's ``model`` means, once the key may use it: its configured name,
        or ``model`` as given when the pool knows no such name (the runtime then answers 404).

        Raises 403 model_not_allowed for a model the key may not use, before the model is looked
        up, so a key learns nothing of the models it may not use."""
        names = await nodes.REGISTRY.model_names()
        if not self.allows(model, names):
            raise ModelNotAllowed(f"this API key may not use the model {model!r}", param="model")
        return _meant(model, names)


def _meant(name: str, names: Mapping[str, str]) -> str:
    return canonical_model(name, names) or name


_PREFIX = 16  # bytes of a digest the ring looks a key up by: two random keys never share them


@dataclass(frozen=True)
class KeyRecord:
    """What the ring knows of one key, from settings.json or the database."""

    name: str
    models: list[str] | str  # "*": every model
    bucket: str  # the fairness key of its requests
    disabled: bool = False
    priority: str = DEFAULT_PRIORITY
    pk: int | None = None  # a database key's primary key
    limits: KeyLimits | None = None
    queue_timeout_seconds: float | None = None  # the longest its requests wait before they start
    weight: float | None = None  # a database key's fairness weight

    @property
    def quota_key(self) -> int | str:
        return self.pk if self.pk is not None else settings_id(self.name)

    @classmethod
    def from_settings(cls, key: ApiKey) -> KeyRecord:
        return cls(name=key.name, models=key.models, bucket=key.bucket, priority=key.priority,
                   limits=KeyLimits.from_row(key.model_dump(include=set(LIMIT_NAMES))),
                   queue_timeout_seconds=key.queue_timeout_seconds)

    @classmethod
    def from_row(cls, row: Mapping) -> KeyRecord:
        bucket = row["fairness_key"] if row["fairness_key"] is not None else row["name"]
        return cls(name=row["name"], models=row["models"], bucket=bucket, disabled=row["disabled"],
                   priority=row["priority"], pk=row["id"], limits=KeyLimits.from_row(row),
                   queue_timeout_seconds=row["queue_timeout_seconds"], weight=row["weight"])


class KeyRing:
    """The keys of settings.json and of the database (only their hashes), the fairness headers and
    the priority header."""

    def __init__(self, service: ServiceSettings, rows: list[Mapping] = ()):
        records = [(key.key_sha256, KeyRecord.from_settings(key)) for key in service.api_keys]
        records += [(row["key_sha256"], KeyRecord.from_row(row)) for row in rows]
        self._keys: dict[bytes, tuple[bytes, KeyRecord]] = {
            bytes.fromhex(sha)[:_PREFIX]: (bytes.fromhex(sha), record) for sha, record in records
        }
        self._fairness_headers = [name.lower() for name in service.fairness_key_headers]
        self._priority_header = service.priority_header.lower() if service.priority_header else None

    @property
    def needs_key(self) -> bool:
        """Whether a request must carry a key: one is configured, disabled or not."""
        return bool(self._keys)

    def caller(self, header: HeaderLookup) -> Caller:
        """The request's caller; raises 401 invalid_api_key when keys are configured and the
        request carries none of them, or a disabled one, then the queue headers' errors (400, 403)."""
        key = None
        if not self._keys:  # any class may be asked for
            fairness_key, models = self._fairness_header(header), None
            own, ceiling = DEFAULT_PRIORITY, PRIORITY_CLASSES[0]
        else:
            key = self._match(header("authorization"), header("x-api-key"))
            models = None if key.models == "*" else frozenset(key.models)
            fairness_key, own, ceiling = key.bucket, key.priority, key.priority
        priority = own
        if self._priority_header is not None:
            priority = queue_headers.priority(header(self._priority_header), self._priority_header, own=own,
                                              ceiling=ceiling)
        timeout = queue_headers.queue_timeout(header(queue_headers.QUEUE_TIMEOUT_HEADER))
        if key is None:
            return Caller(fairness_key=fairness_key, models=models, priority=priority, queue_timeout_seconds=timeout)
        if key.queue_timeout_seconds is not None:
            timeout = min(timeout or key.queue_timeout_seconds, key.queue_timeout_seconds)
        return Caller(fairness_key=fairness_key, models=models, priority=priority, queue_timeout_seconds=timeout,
                      weight=key.weight, quota_key=key.quota_key, limits=key.limits)

    def _fairness_header(self, header: HeaderLookup) -> str | None:
        for name in self._fairness_headers:
            value = header(name)
            if value is not None:
                check_fairness_key(value, param=name)
                return value
        return None

    def _match(self, authorization: str | None, x_api_key: str | None) -> KeyRecord:
        scheme, _, given = (authorization or "").partition(" ")
        given = given.strip()
        if authorization is None and x_api_key:  # Anthropic's clients send the key so
            scheme, given = "bearer", x_api_key.strip()
        if scheme.lower() != "bearer" or not given:
            raise InvalidApiKey("this endpoint requires Authorization: Bearer <API key> (or x-api-key: <API key>)")
        digest = hashlib.sha256(given.encode("latin-1", "replace")).digest()
        # Looked up by the digest's first bytes, then compared whole in constant time: the only
        # value a caller steers is the sha256 of its guess, so what the lookup's timing could tell
        # of the stored digests brings no guess nearer a secret.
        entry = self._keys.get(digest[:_PREFIX])
        if entry is None or not hmac.compare_digest(digest, entry[0]):
            raise InvalidApiKey("the API key is not valid")
        found = entry[1]
        if found.disabled:
            raise InvalidApiKey("the API key is disabled")
        return found


# How long an API process trusts its key ring before it asks the database whether a key changed.
CHECK_SECONDS = 0.5


class _RingCache:
    """This process's key ring and what it was built from."""

    def __init__(self):
        self.ring: KeyRing | None = None
        self.service: ServiceSettings | None = None
        self.rows: list[Mapping] | None = None  # None: the database was never read
        self.version: int | None = None
        self.checked_at = float("-inf")
        self.lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def fresh(self, service: ServiceSettings) -> bool:
        return self.ring is not None and self.service is service and \
            time.monotonic() - self.checked_at < CHECK_SECONDS

    def loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self.lock is None or self.lock[0] is not loop:
            self.lock = (loop, asyncio.Lock())
        return self.lock[1]


_cache = _RingCache()


async def key_ring() -> KeyRing:
    """The API process's key ring: the keys of its service settings and of the database.

    The ring is trusted for ``CHECK_SECONDS``; the first request after that reads the keys'
    version in the database (one single-row query, in Django's database thread) and the keys
    themselves only when it moved.  A write through this process's keys API calls ``forget``, so
    it takes effect at once here, and within ``CHECK_SECONDS`` in every other API process.  While
    the database cannot be read the ring last read stays (logged); before the first read, a
    request is refused with 503 api_keys_unavailable rather than let in without its key check."""
    service = service_settings()
    if _cache.fresh(service):
        return _cache.ring
    async with _cache.loop_lock():
        if not _cache.fresh(service):
            await _refresh(service)
    return _cache.ring


async def _refresh(service: ServiceSettings) -> None:
    try:
        version, rows = await sync_to_async(selectors.key_ring_rows)(_cache.version)
    except DatabaseError as exc:
        if _cache.rows is None:
            raise ApiKeysUnavailable(f"the inference keys could not be read from the database: {exc}") from None
        logger.warning("the inference keys could not be read (the last ones read stay in use): %s", exc)
        version, rows = _cache.version, None
    if rows is not None or _cache.service is not service or _cache.ring is None:
        _cache.rows = rows if rows is not None else _cache.rows
        _cache.ring = KeyRing(service, _cache.rows)
        _cache.service, _cache.version = service, version
    _cache.checked_at = time.monotonic()


# How often an API process that could not read its keys at start tries again (in the background).
WARM_RETRY_SECONDS = 1.0


async def warm_key_ring() -> None:
    """Read the key ring as the API process starts, so that a database that goes away later finds
    the keys already read (the last ring read stays in use) instead of a process that never read
    them (which refuses inference with 503 api_keys_unavailable until it can).  Tried again every
    ``WARM_RETRY_SECONDS`` until it is read: an API process may start before the runtime worker
    has migrated the database."""
    failures = 0
    while _cache.rows is None:
        try:
            await key_ring()
        except ApiKeysUnavailable as exc:
            failures += 1
            if failures == 1:
                logger.warning("the inference keys could not be read at start (tried again every %g s): %s",
                               WARM_RETRY_SECONDS, exc)
            await asyncio.sleep(WARM_RETRY_SECONDS)


def forget() -> None:
    """Read the keys again on the next request (this process changed one)."""
    _cache.checked_at = float("-inf")
    _cache.version = None


def hash_key(key: str) -> str:
    """The ``key_sha256`` of ``key`` in service.api_keys."""
    return hashlib.sha256(key.encode()).hexdigest()
