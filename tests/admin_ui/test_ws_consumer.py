"""The admin WebSocket, in process: a real runtime (stub models) publishing over the in-memory layer,
the real runtime consumer serving the ``llmpool-runtime`` channel, and Channels' WebsocketCommunicator."""
from __future__ import annotations

import asyncio
import json
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
from runtime.redaction import REDACTED
from runtime.service import RuntimeService
from tests.conftest import write_settings

# Channels closes old database connections around each message: the tests need database access.
pytestmark = pytest.mark.django_db(transaction=True)

WS_PATH = "/admin/llm-pool/ws"
MODELS = {
    "quick": {"backend": "stub", "stub_load_seconds": 0.05, "stub_vram_mib": 100},
    "broken": {"backend": "stub", "stub_load_seconds": 0.05, "stub_fail_load": "weights are corrupt"},
    "talker": {"backend": "stub", "stub_token_delay_ms": 60, "stub_reply": "one two three four five six"},
    # Secrets the snapshot must show redacted (runtime.redaction).
    "keyed": {"backend": "openai_remote", "remote_base_url": "http://127.0.0.1:9/v1", "remote_model": "gpt",
              "remote_api_key": "sk-ws-secret-key", "remote_headers": {"X-Api-Key": "ws-header-secret"}},
    "served": {"backend": "llama_server", "model_path": "/nonexistent/m.gguf",
               "llama_server_env": {"HF_TOKEN": "hf_ws_secret_token"}},
}
SECRETS = ("sk-ws-secret-key", "ws-header-secret", "hf_ws_secret_token")
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
    definitions = {entry["name"]: entry["definition"] for entry in snapshot["models"]}
    assert definitions["keyed"]["remote_api_key"] == REDACTED
    assert definitions["keyed"]["remote_headers"] == {"X-Api-Key": REDACTED}
    assert definitions["served"]["llama_server_env"] == {"HF_TOKEN": REDACTED}
    assert definitions["served"]["llama_server_api_key"] is None
    assert not any(secret in json.dumps(snapshot) for secret in SECRETS)
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


async def test_a_transition_carries_the_entry_with_its_secrets_redacted(runtime):
    communicator = await connected(staff())
    await next_event(communicator, kind=EVENT_SNAPSHOT)
    assert (await services.model_load("keyed", None))["runtime_state"] == "loaded"
    loading, loaded = await transitions(communicator, "keyed", 2)
    assert loaded["entry"]["definition"]["remote_api_key"] == REDACTED
    assert not any(secret in json.dumps([loading, loaded]) for secret in SECRETS)
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


def superuser() -> User:
    return User.objects.filter(username="boss").first() or User.objects.create_superuser("boss", "boss@example.com", "pw")


async def session_cookie() -> tuple[bytes, bytes]:
    """The cookie header of a new session of a superuser."""
    user = await sync_to_async(superuser)()
    client = Client()
    await sync_to_async(client.force_login)(user)
    return b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()


async def test_the_asgi_app_authenticates_the_admin_session(runtime):
    from llmpool.asgi import application

    headers = [await session_cookie(), (b"origin", b"http://testserver"), (b"host", b"testserver")]
    communicator = WebsocketCommunicator(application, WS_PATH, headers=headers)
    ok, _ = await communicator.connect(timeout=TIMEOUT)
    assert ok
    assert (await communicator.receive_json_from(timeout=TIMEOUT))["kind"] == EVENT_SNAPSHOT
    await communicator.disconnect()

    anonymous = WebsocketCommunicator(application, WS_PATH, headers=headers[1:])
    ok, _ = await anonymous.connect(timeout=TIMEOUT)
    assert not ok
    await anonymous.disconnect()


# A page of another site opens the WebSocket with the operator's cookie: the browser sends its own
# Origin (``null`` from a sandboxed frame or a file), the service's Host.
FOREIGN_ORIGINS = {
    "another-site": [(b"origin", b"https://evil.example"), (b"host", b"testserver")],
    "null-origin": [(b"origin", b"null"), (b"host", b"testserver")],
    "no-origin": [(b"host", b"testserver")],
    "other-port": [(b"origin", b"http://testserver:8081"), (b"host", b"testserver")],
    "other-scheme": [(b"origin", b"https://testserver"), (b"host", b"testserver")],
    "sub-domain": [(b"origin", b"http://evil.testserver"), (b"host", b"testserver")],
    "no-host": [(b"origin", b"http://testserver")],
}


@pytest.mark.parametrize("headers", list(FOREIGN_ORIGINS.values()), ids=list(FOREIGN_ORIGINS))
async def test_another_origin_is_refused_whatever_allowed_hosts_says(runtime, settings, headers):
    from llmpool.asgi import application

    settings.ALLOWED_HOSTS = ["*"]
    communicator = WebsocketCommunicator(application, WS_PATH, headers=[await session_cookie(), *headers])
    ok, _ = await communicator.connect(timeout=TIMEOUT)
    assert not ok
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def same_origin_connects(headers, scheme: str = "ws") -> bool:
    from llmpool.asgi import application

    communicator = WebsocketCommunicator(application, WS_PATH, headers=[await session_cookie(), *headers])
    communicator.scope["scheme"] = scheme
    ok, _ = await communicator.connect(timeout=TIMEOUT)
    if ok:
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["kind"] == EVENT_SNAPSHOT
    await communicator.disconnect()
    return ok


async def test_the_services_own_origin_is_allowed_on_any_host_and_port(runtime, settings):
    settings.ALLOWED_HOSTS = ["*"]
    assert await same_origin_connects([(b"origin", b"http://llm.example:8080"), (b"host", b"LLM.example:8080")])


async def test_over_wss_the_own_origin_is_https(runtime, settings):
    settings.ALLOWED_HOSTS = ["*"]
    assert await same_origin_connects([(b"origin", b"https://llm.example"), (b"host", b"llm.example")], "wss")
    assert not await same_origin_connects([(b"origin", b"http://llm.example"), (b"host", b"llm.example")], "wss")


async def test_a_host_outside_allowed_hosts_is_refused(runtime, settings):
    settings.ALLOWED_HOSTS = ["llm.example"]
    assert not await same_origin_connects([(b"origin", b"http://other.example"), (b"host", b"other.example")])


async def test_a_trusted_origin_of_a_reverse_proxy_is_allowed(runtime, settings):
    """Behind a proxy that changes the host, LLMPOOL_CSRF_TRUSTED_ORIGINS names the public origin."""
    settings.ALLOWED_HOSTS = ["*"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://llm.example.com", "https://*.internal.example"]
    assert await same_origin_connects([(b"origin", b"https://llm.example.com"), (b"host", b"127.0.0.1:8080")])
    assert await same_origin_connects([(b"origin", b"https://a.internal.example"), (b"host", b"127.0.0.1:8080")])
    assert not await same_origin_connects([(b"origin", b"http://llm.example.com"), (b"host", b"127.0.0.1:8080")])
