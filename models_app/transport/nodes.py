"""The nodes of one pool: their channels, and the registry that says which are alive and what they serve.

Every runtime worker (``manage.py runtime``) is a node: it serves the models whose ``node`` field
includes its name (``LLMPOOL_NODE_ID``, default the host name, sanitised by ``node_name``) and
listens on its own channel, ``llmpool-runtime.<node>``.  All nodes of a pool share one channel
prefix (``LLMPOOL_CHANNEL_PREFIX``) on one Redis.  Each node announces itself every
``HEARTBEAT_SECONDS`` (``models_app.host.announcer``):

- ``<prefix>:node:<name>``: its record (JSON: node, channel, models with their aliases and state,
  devices, started_at, at), kept ``RECORD_TTL_SECONDS`` so the API knows a dead node's models;
- ``<prefix>:node-alive:<name>``: set with an expiry of ``EXPIRY_SECONDS``: the node is alive while
  it exists;
- ``<prefix>:node-names``: the set of the names.

The API reads all of it in one round trip, at most every ``CACHE_SECONDS`` per process.  The
embedded shape (``manage.py serve``, in-memory layer) has one node, in-process: its channel is the
plain ``llmpool-runtime`` and it serves every model; its runtime hands this process's registry its
record (``Registry.announce_here``: its models and their aliases) when it starts and after each
reload, as a split node writes its record to Redis.

The records are the API's view of the catalog: ``Registry.model_names`` resolves the name a request gives
(a model's name or an alias, ``runtime.pool.catalog.canonical_model``) over every node's record, and
``Node.serves``/``Node.model`` find a node's model by the same rule (placement routes with them:
``models_app.placement``).
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import weakref
from dataclasses import dataclass, field
from functools import cached_property

from django.conf import settings

from models_app.transport.messages import RUNTIME_CHANNEL
from runtime.pool.catalog import adapter_bases, base_of, canonical_model, model_names
from runtime.errors import RuntimeUnavailable

HEARTBEAT_SECONDS = 1.0
EXPIRY_SECONDS = 5.0  # a node whose heartbeat is this late is down
RECORD_TTL_SECONDS = 7 * 24 * 3600  # a node gone this long is forgotten (its models then answer 404)
CACHE_SECONDS = 0.5
REDIS_TIMEOUT_SECONDS = 2.0

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def node_name(raw: str) -> str:
    """``raw`` (a host name, LLMPOOL_NODE_ID) as a node name a channel name can carry: every
    character but letters, digits, ``_``, ``.`` and ``-`` becomes ``_``, at most 80 characters."""
    name = _UNSAFE.sub("_", raw.strip())[:80] or "node"
    return name if name[0].isalnum() else f"n{name[:79]}"


def node_channel(node: str) -> str:
    """The channel the runtime worker of ``node`` listens on."""
    return f"{RUNTIME_CHANNEL}.{node_name(node)}"


def this_node() -> str:
    """This process's node name (``LLMPOOL_NODE_ID``, default the host name)."""
    return node_name(settings.LLMPOOL_NODE_ID)


def is_split() -> bool:
    return bool(settings.REDIS_URL)


def prefix() -> str:
    """The pool's key prefix in Redis: the channel layer's, so one prefix is one pool."""
    return settings.CHANNEL_LAYERS["default"]["CONFIG"].get("prefix", "llmpool")


def own_channel() -> str:
    """The channel this process's runtime worker listens on (the plain one when embedded)."""
    return node_channel(this_node()) if is_split() else RUNTIME_CHANNEL


def keys(pfx: str) -> dict[str, str]:
    return {"names": f"{pfx}:node-names", "record": f"{pfx}:node:", "alive": f"{pfx}:node-alive:"}


@dataclass
class Node:
    name: str
    channel: str
    alive: bool
    record: dict = field(default_factory=dict)

    @cached_property
    def _models(self) -> dict[str, dict]:
        return {m["name"]: m for m in self.record.get("models", ())}

    @cached_property
    def names(self) -> dict[str, str]:
        """The name and aliases of each model this node serves -> the model (``runtime.pool.catalog``)."""
        return _names_in([self])

    @cached_property
    def bases(self) -> dict[str, tuple[str, str]]:
        """Each adapter's model id this node serves -> (its base, the adapter) (``runtime.pool.catalog``)."""
        return adapter_bases({m["name"]: m.get("adapters") or {} for m in self.record.get("models", ())})

    def serves(self, name: str) -> bool:
        """Whether ``name`` (a model's name, an alias, an adapter's id) means a model this node serves."""
        return canonical_model(name, self.names) is not None

    def model(self, name: str) -> dict | None:
        """This node's record of the model ``name`` (a name, an alias, an adapter's id: its
        base) means, or None."""
        return self._models.get(base_of(canonical_model(name, self.names) or "", self.bases)[0])

    def describe(self) -> dict:
        """What GET /v1/admin/nodes and the merged answers say of this node."""
        return {
            "node": self.name,
            "alive": self.alive,
            "models": sorted(m["name"] for m in self.record.get("models", ())),
            "devices": self.record.get("devices", []),
            "started_at": self.record.get("started_at"),
            "heartbeat_at": self.record.get("at"),
        }


# KEYS[1]: the names set; ARGV: the record key prefix, the alive key prefix.
_READ = """
local names = redis.call('smembers', KEYS[1])
local out = {}
for _, name in ipairs(names) do
  out[#out + 1] = name
  out[#out + 1] = redis.call('get', ARGV[1] .. name) or ''
  out[#out + 1] = redis.call('exists', ARGV[2] .. name)
end
return out
"""


class Registry:
    """The API's view of the pool's nodes (cached ``CACHE_SECONDS``)."""

    def __init__(self):
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> Redis client
        self._cached: list[Node] | None = None
        self._cached_at = 0.0
        self._refreshing: asyncio.Future | None = None
        self._here: list[Node] | None = None  # embedded: the in-process runtime's node, its record included
        self._names: tuple[list[Node], dict[str, str]] | None = None  # the nodes read last, their names

    def _redis(self):
        from redis import asyncio as aioredis

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = aioredis.from_url(settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                       socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
            self._clients[loop] = client
        return client

    async def nodes(self) -> list[Node]:
        """Every node known to the pool, sorted by name (embedded: the one, alive)."""
        if not is_split():
            return self._here or [Node(this_node(), RUNTIME_CHANNEL, True)]
        if self._cached is not None and time.monotonic() - self._cached_at < CACHE_SECONDS:
            return self._cached
        try:
            self._cached = await self._read()
            self._cached_at = time.monotonic()
        except Exception as exc:
            if self._cached is None:
                raise RuntimeUnavailable(f"the pool's registry in Redis cannot be read: {exc}") from exc
            # Redis away for a moment: the last view holds until the layer itself fails.
        return self._cached

    async def _read(self) -> list[Node]:
        k = keys(prefix())
        raw = await self._redis().eval(_READ, 1, k["names"], k["record"], k["alive"])
        nodes = []
        for index in range(0, len(raw), 3):
            name = raw[index].decode()
            record = json.loads(raw[index + 1]) if raw[index + 1] else None
            if record is None:
                continue  # forgotten (its record expired); announcer re-adds it when it comes back
            nodes.append(Node(name, record.get("channel") or node_channel(name), bool(raw[index + 2]), record))
        return sorted(nodes, key=lambda n: n.name)

    def forget_cache(self) -> None:
        """The next ``nodes`` reads Redis again (the last view stays for when Redis is away)."""
        self._cached_at = 0.0

    def announce_here(self, record: dict | None) -> None:
        """Embedded: the in-process runtime's record (``models``: each model's ``name`` and
        ``aliases``), what a split node's announcer writes to Redis; None once it stopped."""
        self._here = None if record is None else [Node(this_node(), RUNTIME_CHANNEL, True, record)]

    async def model_names(self) -> dict[str, str]:
        """Each name a client may give a model of the pool -> the model, over every node this
        process knows, down ones too (their models answer 503, not 404).  Built once per view of
        the nodes."""
        nodes = await self.nodes()
        if self._names is None or self._names[0] is not nodes:
            self._names = (nodes, _names_in(nodes))
        return self._names[1]

    async def adapter_bases(self) -> dict[str, tuple[str, str]]:
        """Each adapter's model id of the pool -> (its base, the adapter) (``runtime.pool.catalog``)."""
        return {model_id: base for node in await self.nodes() for model_id, base in node.bases.items()}


REGISTRY = Registry()


def _names_in(nodes: list[Node]) -> dict[str, str]:
    """``runtime.pool.catalog.model_names`` over the models of ``nodes``' records."""
    models: dict[str, list[str]] = {}
    adapters: dict[str, dict[str, list[str]]] = {}
    for node in nodes:
        for model in node.record.get("models", ()):
            models.setdefault(model["name"], []).extend(model.get("aliases") or ())
            adapters.setdefault(model["name"], {}).update(model.get("adapters") or {})
    return model_names(models, adapters)
