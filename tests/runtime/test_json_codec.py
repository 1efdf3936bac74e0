"""runtime.json_codec: orjson's speed with the standard library's answers."""
from __future__ import annotations

import json
import math

import pytest

from runtime.json_codec import dumps, loads


def standard(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("value", [
    {"id": "chatcmpl-1", "choices": [{"delta": {"content": "héllo ✓ \u2028"}, "index": 0, "finish_reason": None}]},
    {"usage": {"prompt_tokens": 30, "completion_tokens": 1}, "ok": True, "none": None, "list": [1, 2.5, -3]},
    ["\x00 control \t", {"nested": {"deeper": [[]]}}],
])
def test_dumps_is_the_compact_utf8_json_the_edge_wrote_before(value):
    assert dumps(value) == standard(value)


def test_what_orjson_refuses_falls_back_to_the_standard_library():
    assert dumps({1: "a"}) == standard({1: "a"}) == b'{"1":"a"}'  # a key that is not a string
    big = 2**70
    assert dumps({"n": big}) == standard({"n": big})


def test_loads_takes_bytes_and_text_and_what_json_takes():
    assert loads(b'{"a": [1, "\xc3\xa9"]}') == {"a": [1, "é"]}
    assert loads('{"a": 1}') == {"a": 1}
    assert math.isnan(loads('{"x": NaN}')["x"])  # json takes NaN; orjson alone would not
    with pytest.raises(ValueError):
        loads(b"{not json")
