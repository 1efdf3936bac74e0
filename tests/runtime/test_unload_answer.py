"""An unload answers the state the unload produced, even when a load starts right after it."""
import asyncio

from runtime.model.state import RuntimeState


async def test_an_unload_answer_is_not_the_state_of_a_load_that_followed(runtime_service):
    service, _ = await runtime_service({"m": {"backend": "stub", "stub_unload_seconds": 0.1}})
    await service.op_load({"name": "m", "body": {}}, None)
    controller = service.pool.controller("m")
    reloads: list[asyncio.Future] = []

    def load_again_at_once(event) -> None:
        # Another caller's load, queued the moment the model is unloaded: the writer takes it
        # before the unload's caller resumes.
        if event.model == "m" and event.new is RuntimeState.UNLOADED and not reloads:
            reloads.append(controller.begin_load())

    service.pool.listeners.append(load_again_at_once)
    unloaded = await service.op_unload({"name": "m"}, None)
    assert controller.state is RuntimeState.LOADING  # the other load is under way
    assert (unloaded["runtime_state"], unloaded["is_loaded"]) == ("unloaded", False)
    await reloads[0]
    assert controller.state is RuntimeState.LOADED
