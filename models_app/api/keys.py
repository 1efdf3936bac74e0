"""Inference keys: who may use the models (``service.api_keys``), and whose fairness share a
request takes.

Every inference endpoint (POST /v1/responses, /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/messages, GET /v1/models and /v1/models/{id}) asks ``key_ring().caller(header)`` once per
request, before anything else:

- no keys configured: anyone may call, every model; the fairness key is the first of
  ``service.fairness_key_headers`` the request carries, else None (the parser then takes the
  body's ``user``);
- keys configured: ``Authorization: Bearer <key>`` (or, without it, ``x-api-key: <key>``, as
  Anthropic's clients send it) must name one (401 ``invalid_api_key`` otherwise); the key may
  use only its models (403 ``model_not_allowed``), and its bucket (``fairness_key``, else its
  name) is the fairness key, whatever the ``user`` field or a fairness header say, so a caller
  cannot leave its share.

A request's model is resolved once, here (``Caller.resolve``), by the one rule
(``runtime.pool.catalog.canonical_model``) over the pool's names as the nodes announce them: the key
check compares the models meant on both sides (a key that lists a model may use it by any of its
aliases, one that lists an alias may use the model by its name and its other aliases), and the
request goes on to routing and the runtime under the model's own name.

A presented key is hashed (sha256) and compared with ``hmac.compare_digest`` to every configured
hash, all of them, so the time taken does not tell which key nearly matched.  The API process
reads the keys once (``models_app.conf.service_settings``): a change needs a restart.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from models_app.api.limits import check_fairness_key
from models_app.conf import service_settings
from models_app.transport import nodes
from runtime.pool.catalog import canonical_model
from runtime.config import ApiKey, ServiceSettings
from runtime.errors import InvalidApiKey, ModelNotAllowed

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


class KeyRing:
    """The configured keys (only their hashes) and the fairness headers."""

    def __init__(self, service: ServiceSettings):
        self._keys: list[tuple[bytes, ApiKey]] = [(bytes.fromhex(key.key_sha256), key) for key in service.api_keys]
        self._fairness_headers = [name.lower() for name in service.fairness_key_headers]

    def caller(self, header: HeaderLookup) -> Caller:
        """The request's caller; raises 401 invalid_api_key when keys are configured and the
        request carries none of them."""
        if not self._keys:
            return Caller(fairness_key=self._fairness_header(header))
        key = self._match(header("authorization"), header("x-api-key"))
        return Caller(fairness_key=key.bucket, models=None if key.models == "*" else frozenset(key.models))

    def _fairness_header(self, header: HeaderLookup) -> str | None:
        for name in self._fairness_headers:
            value = header(name)
            if value is not None:
                check_fairness_key(value, param=name)
                return value
        return None

    def _match(self, authorization: str | None, x_api_key: str | None) -> ApiKey:
        scheme, _, given = (authorization or "").partition(" ")
        given = given.strip()
        if authorization is None and x_api_key:  # Anthropic's clients send the key so
            scheme, given = "bearer", x_api_key.strip()
        if scheme.lower() != "bearer" or not given:
            raise InvalidApiKey("this endpoint requires Authorization: Bearer <API key> (or x-api-key: <API key>)")
        digest = hashlib.sha256(given.encode("latin-1", "replace")).digest()
        found = None
        for expected, key in self._keys:
            # Every hash is compared, also after a match: the time taken is the same for every key.
            if hmac.compare_digest(digest, expected) and found is None:
                found = key
        if found is None:
            raise InvalidApiKey("the API key is not valid")
        return found


_built: list[tuple[ServiceSettings, KeyRing]] = []


def key_ring() -> KeyRing:
    """The API process's key ring, built once from its service settings (and again only if
    those are read again, as tests do)."""
    service = service_settings()
    if not _built or _built[0][0] is not service:
        _built[:] = [(service, KeyRing(service))]
    return _built[0][1]


def hash_key(key: str) -> str:
    """The ``key_sha256`` of ``key`` in service.api_keys."""
    return hashlib.sha256(key.encode()).hexdigest()
