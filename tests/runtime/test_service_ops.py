"""RuntimeService.handle: one table of operations, anything else refused."""
import pytest

from runtime.errors import UnknownOperation


async def test_every_operation_is_served_from_the_table(runtime_service):
    service, _ = await runtime_service({"m": {"backend": "stub"}})
    listed = await service.handle("list_models", {}, None)
    assert [m["name"] for m in listed["models"]] == ["m"]
    assert (await service.handle("get_model", {"name": "m"}, None))["name"] == "m"


@pytest.mark.parametrize("op", ["nope", "entry", "handle", "start", "shutdown", "_ops", "op_load", ""])
async def test_a_name_that_is_not_an_operation_is_refused(runtime_service, op):
    # Methods of the service that are not operations (entry, handle, start...) are refused too.
    service, _ = await runtime_service({"m": {"backend": "stub"}})
    with pytest.raises(UnknownOperation, match="unknown runtime operation"):
        await service.handle(op, {"name": "m"}, None)
    assert (await service.handle("get_model", {"name": "m"}, None))["runtime_state"] == "unloaded"
