"""RuntimeService.generate against the model's writer: the dispatch hands over a lease, not an index."""
import asyncio

import pytest

from runtime.backends.stub.spec import StubEngine
from runtime.errors import BackendError, RequestTimeout
from runtime.model.tickets import Ticket
from runtime.service import RuntimeService
from runtime.model.state import RuntimeState
from tests.engines.runtime_driver import user_input
from tests.conftest import write_settings
from tests.runtime.helpers import moves


@pytest.fixture
async def service(tmp_path):
    service = RuntimeService(str(write_settings(tmp_path, {"m": {"backend": "stub", "stub_reply": "a b c"}})))
    events: list = []
    service.pool.listeners.append(events.append)
    await service.start(load_enabled=False)
    await service.handle("load", {"name": "m", "body": None}, None)
    service.events = events
    yield service
    await service.shutdown()


async def _ignore(event: dict) -> None:
    pass


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def _payload(request_id: str, **fields) -> dict:
    return {"request_id": request_id, "model": "m", "messages": user_input("hi"), **fields}


async def test_engine_failed_between_dispatch_and_resume_is_a_backend_error(service):
    """The writer dispatches a queued request and, before its caller resumes, handles an
    engine_failed already in its inbox (which empties ``engines``): the caller gets 502
    backend_error naming the failure, never an IndexError (500)."""
    controller = service.pool.controller("m")
    holder = Ticket("holder", None)
    await (await controller.admit(holder))  # the only slot is taken: the next request queues
    queued = asyncio.create_task(service.handle("generate", _payload("queued"), _ignore))
    while controller.scheduler.queue_depth == 0:
        await asyncio.sleep(0)
    # Both commands are in the inbox before the writer runs: finish dispatches "queued",
    # engine_failed follows in the same run of the writer, before "queued" resumes.
    controller.finish(holder, 1)
    controller.engine_failed("engine process died of SIGSEGV")
    with pytest.raises(BackendError, match="model m failed while loaded"):
        await asyncio.wait_for(queued, 2)
    assert controller.state is RuntimeState.FAILED
    assert moves(service.events, "m")[-1] == ("loaded", "failed")


async def test_engine_failed_while_a_stream_is_admitted_is_a_backend_error(service):
    """A streamed request's admission yields (the ``admitted`` event) before it reads its
    lease; a failure landing then still reaches it as backend_error."""
    controller = service.pool.controller("m")

    async def fail_on_admission(event: dict) -> None:
        if event["event"] == "admitted":
            controller.engine_failed("engine process exited with code 134")
            while controller.state is not RuntimeState.FAILED:
                await asyncio.sleep(0)

    with pytest.raises(BackendError, match="model m failed while loaded"):
        await service.handle("generate", _payload("streamed", stream=True), fail_on_admission)



async def test_request_timeout_cancels_the_engine_and_frees_the_slot(tmp_path, monkeypatch):
    models = {"m": {"backend": "stub", "stub_reply": "a " * 50, "stub_token_delay_ms": 50,
                    "request_timeout_seconds": 0.2}}
    service = RuntimeService(str(write_settings(tmp_path, models)))
    await service.start(load_enabled=False)
    await service.handle("load", {"name": "m", "body": None}, None)
    ended: list[str] = []
    generate = StubEngine.generate

    async def recording_generate(self, request):
        try:
            async for event in generate(self, request):
                yield event
        except (asyncio.CancelledError, GeneratorExit) as exc:
            ended.append(type(exc).__name__)
            raise

    monkeypatch.setattr(StubEngine, "generate", recording_generate)
    try:
        with pytest.raises(RequestTimeout, match="request_timeout_seconds=0.2"):
            await service.handle("generate", _payload("slow"), _ignore)
        assert ended == ["CancelledError"]  # the engine saw the cancel, not a silent abandon
        controller = service.pool.controller("m")
        await asyncio.wait_for(_until(lambda: controller.scheduler.inflight == 0), 2)  # finish is a command
        assert controller.state is RuntimeState.LOADED
        result = await service.handle("generate", _payload("next", max_output_tokens=1), _ignore)
        assert result["text"] == "a"  # the freed slot serves the next request
    finally:
        await service.shutdown()
