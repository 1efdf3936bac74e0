"""A generation's ``Finished`` crosses the engine process's pipe whole: its cached tokens and
speculative decoding's drafted and accepted tokens, or none of them."""
from __future__ import annotations

import json

import pytest

from runtime.backends.base import Finished
from runtime.engine_process.child import _generation_frame
from runtime.engine_process.engine import _Stream


@pytest.mark.parametrize("finished", [Finished(10, 20, "length", 3, 12, 9), Finished(4, 2)])
async def test_finished_crosses_the_pipe_with_its_figures(finished):
    stream = _Stream()
    stream.put(json.loads(json.dumps(_generation_frame("g1", finished))))
    assert await stream.next_event() == finished
