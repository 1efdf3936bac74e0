"""The admin WebSocket, in process: a real runtime (stub models) publishing over the in-memory layer,
the real runtime consumer serving the ``llmpool-runtime`` channel, and Channels' WebsocketCommunicator."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.test import Client

from models_app import selectors, services
from models_app.host import catalog_mirror, runtime_host
from models_app.host.consumer import RuntimeConsumer
from models_app.host.event_publisher import RuntimeEventPublisher
from models_app.transport.messages import (
    EVENT_CATALOG,
    EVENT_COUNTERS,
    EVENT_SNAPSHOT,
    EVENT_TRANSITION,
    OP_GENERATE,
    RUNTIME_CHANNEL,
)
from models_app.workbench.consumers import AdminEventsConsumer
from runtime.errors import InvalidLoadRequest
from runtime.service import RuntimeService
from tests.conftest import write_settings

# Channels closes old database connections around each message: the tests need database access.
pytestmark = pytest.mark.django_db(transaction=True)

WS_PATH = "/admin/llm-pool/ws"
MODELS = {
    "quick": {"backend": "stub", "stub_load_seconds": 0.05, "stub_vram_mib": 100},
    "broken": {"backend": "stub", "stub_load_seconds": 0.05, "stub_fail_load": "weights are corrupt"},
    "talker": {"backend": "stub", "stub_token_delay_ms": 60, "stub_reply": "one two three four five six"},
}
TIMEOUT = 5


@pytest.fixture
async def runtime(tmp_path, monkeypatch):
    """A started runtime with its event publisher, served on the runtime channel of a fresh layer."""
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    layer = get_channel_layer()
    settings_path = write_settings(tmp_path, MODELS)
    publisher = RuntimeEventPublisher(layer, counter_interval=0.05)
    service = RuntimeService(
        str(settings_path), listeners=[publisher.on_transition], reload_listeners=[catalog_mirror.sync]
    )
    publisher.attach(service.pool, runtime_host.event_entry(service))  # as runtime_host wires it
    publisher.start()
    await service.start(load_enabled=False)
    monkeypatch.setattr(runtime_host, "_service", service)

    async def serve_runtime_channel():
        consumer = RuntimeConsumer()
        while True:
            message = await layer.receive(RUNTIME_CHANNEL)
            await getattr(consumer, message["type"].replace(".", "_"))(message)

    server = asyncio.create_task(serve_runtime_channel())
    yield service
    server.cancel()
    await asyncio.gather(server, return_exceptions=True)
    await service.shutdown()
    await publisher.stop()
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


def staff(**extra) -> User:
    return User(**{"username": "op", "is_staff": True, "is_active": True, **extra})


async def connected(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(AdminEventsConsumer.as_asgi(), WS_PATH)
    communicator.scope["user"] = user
    ok, _ = await communicator.connect(timeout=TIMEOUT)
    assert ok
    return communicator


async def next_event(communicator, *, kind: str | None = None, model: str | None = None) -> dict:
    """The next event of that kind and model (others in between are skipped)."""
    while True:
        event = await communicator.receive_json_from(timeout=TIMEOUT)
        if (kind is None or event["kind"] == kind) and (model is None or event.get("model") == model):
            return event


async def transitions(communicator, model: str, count: int) -> list[dict]:
    return [await next_event(communicator, kind=EVENT_TRANSITION, model=model) for _ in range(count)]


# ---- who may connect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user",
    [None, AnonymousUser(), User(username="plain", is_staff=False, is_active=True), staff(is_active=False)],
    ids=["no-user", "anonymous", "not-staff", "inactive-staff"],
)
async def test_only_active_staff_may_connect(runtime, user):
    communicator = WebsocketCommunicator(AdminEventsConsumer.as_asgi(), WS_PATH)
    if user is not None:
        communicator.scope["user"] = user
    ok, code = await communicator.connect(timeout=TIMEOUT)
    assert not ok
    assert code == 4403
    await communicator.disconnect()


async def test_staff_gets_a_snapshot_of_every_model_first(runtime):
    communicator = await connected(staff())
    snapshot = await communicator.receive_json_from(timeout=TIMEOUT)
    assert snapshot["kind"] == EVENT_SNAPSHOT and snapshot["error"] is None
    assert [entry["name"] for entry in snapshot["models"]] == list(MODELS)
    assert snapshot["models"] == await selectors.models_list()
    await communicator.send_json_to({"op": EVENT_SNAPSHOT})
    assert (await communicator.receive_json_from(timeout=TIMEOUT))["kind"] == EVENT_SNAPSHOT
    await communicator.disconnect()


# ---- transitions ------------------------------------------------------------------------------------


async def test_a_load_and_an_unload_push_every_transition_in_order(runtime):
    communicator = await connected(staff())
    await next_event(communicator, kind=EVENT_SNAPSHOT)
    loaded = await services.model_load("quick", {"replicas": 1})
    assert loaded["runtime_state"] == "loaded"
    events_seen = await transitions(communicator, "quick", 2)
    assert [(e["from"], e["to"]) for e in events_seen] == [("unloaded", "loading"), ("loading", "loaded")]
    assert events_seen[0]["entry"]["runtime_state"] in ("loading", "loaded")
    assert events_seen[1]["entry"] == loaded
    assert all(e["last_error"] is None and e["at"].endswith("Z") for e in events_seen)
    await services.model_unload("quick")
    events_seen = await transitions(communicator, "quick", 2)
    assert [(e["from"], e["to"]) for e in events_seen] == [("loaded", "unloading"), ("unloading", "unloaded")]
    assert events_seen[1]["entry"]["runtime_state"] == "unloaded"
    await communicator.disconnect()


async def test_a_failed_load_carries_its_last_error(runtime):
    communicator = await connected(staff())
    await next_event(communicator, kind=EVENT_SNAPSHOT)
    answer = await services.model_load("broken", None)
    assert answer["runtime_state"] == "failed"
    loading, failed = await transitions(communicator, "broken", 2)
    assert (loading["to"], loading["last_error"]) == ("loading", None)
    assert failed["to"] == "failed"
    assert "weights are corrupt" in failed["last_error"]
    assert failed["entry"]["last_error"] == failed["last_error"] == answer["last_error"]
    await communicator.disconnect()


async def test_a_rejected_load_pushes_nothing(runtime):
    communicator = await connected(staff())
    await next_event(communicator, kind=EVENT_SNAPSHOT)
    with pytest.raises(InvalidLoadRequest):
        await services.model_load("quick", {"replicas": 9})
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_every_connected_browser_gets_the_events(runtime):
    first, second = await connected(staff()), await connected(staff())
    for communicator in (first, second):
        await next_event(communicator, kind=EVENT_SNAPSHOT)
    await services.model_load("quick", None)
    for communicator in (first, second):
        assert [e["to"] for e in await transitions(communicator, "quick", 2)] == ["loading", "loaded"]
    await first.disconnect()
    await services.model_unload("quick")
    assert [e["to"] for e in await transitions(second, "quick", 2)] == ["unloading", "unloaded"]
    await second.disconnect()


# ---- counters -----------------------------------------------------------------------------------------


async def test_counter_changes_are_pushed_while_a_request_runs(runtime):
    communicator = await connected(staff())
    await next_event(communicator, kind=EVENT_SNAPSHOT)
    await services.model_load("talker", None)
    await transitions(communicator, "talker", 2)
    request = {
        "model": "talker",
        "request_id": "r1",
        "messages": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "stream": False,
    }

    async def emit(_chunk):
        return None

    generation = asyncio.create_task(runtime.handle(OP_GENERATE, request, emit))
    busy = await next_event(communicator, kind=EVENT_COUNTERS, model="talker")
    assert busy["inflight_requests"] == 1 and busy["runtime_inflight"] == 1 and busy["queue_depth"] == 0
    assert busy["loaded_replicas"] == 1 and busy["replicas"] == 1
    assert set(busy["fairness"]) == {"rejected_per_key_limit", "rejected_executor_limit", "keys"}
    assert (await generation)["text"] == "one two three four five six"
    idle = await next_event(communicator, kind=EVENT_COUNTERS, model="talker")
    assert idle["inflight_requests"] == 0 and idle["runtime_inflight"] == 0
    await communicator.disconnect()


# ---- catalog ---------------------------------------------------------------------------------------------


async def test_a_settings_reload_is_announced(runtime):
    communicator = await connected(staff())
    await next_event(communicator, kind=EVENT_SNAPSHOT)
    write_settings(Path(runtime.pool.settings_path).parent, {**MODELS, "newcomer": {"backend": "stub"}})
    diff = await services.settings_reload()
    assert diff["added_models"] == ["newcomer"]
    event = await next_event(communicator, kind=EVENT_CATALOG)
    assert event["added_models"] == ["newcomer"] and event["unchanged_models"] == sorted(MODELS)
    await communicator.disconnect()


# ---- the real ASGI application: session login and origin check ---------------------------------------------


async def test_the_asgi_app_authenticates_the_admin_session(runtime):
    from llmpool.asgi import application

    user = await sync_to_async(User.objects.create_superuser)("boss", "boss@example.com", "pw")
    client = Client()
    await sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    headers = [(b"cookie", cookie), (b"origin", b"http://testserver"), (b"host", b"testserver")]
    communicator = WebsocketCommunicator(application, WS_PATH, headers=headers)
    ok, _ = await communicator.connect(timeout=TIMEOUT)
    assert ok
    assert (await communicator.receive_json_from(timeout=TIMEOUT))["kind"] == EVENT_SNAPSHOT
    await communicator.disconnect()

    anonymous = WebsocketCommunicator(application, WS_PATH, headers=headers[1:])
    ok, _ = await anonymous.connect(timeout=TIMEOUT)
    assert not ok
    await anonymous.disconnect()
