"""``api.limits.parse_json``: orjson parses a body first, and the standard library's parser every
body orjson refuses or read inexactly (an integer past 64 bits as a float), so what is accepted and how it is refused are
the standard library's (docs/api.md, "Limits")."""
from __future__ import annotations

import json

import pytest

from models_app.api import limits
from models_app.api.limits import BodyRefused, parse_json

ACCEPTED = [
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0.0}',
    b'{"a": 1, "a": 2}',  # the last of a repeated key, as the standard library
    b'[9223372036854775807, -9223372036854775808]',  # the 64-bit bounds, 19 digits
    b'{"x": 1e400}',  # too large for a double: orjson refuses, the standard library reads inf
    b'"\\ud83d\\ude00"',  # a surrogate pair: one character
    b'\xef\xbb\xbf{}',  # a UTF-8 byte order mark
    '{"x": "é"}'.encode("utf-16"),  # UTF-16, which JSON allows
    b'{"id": "1234567890123456789012"}',  # 22 digits, in a string
    b'[1.0000000000000002, -0, 0.1]',
    b'{"x": 1e19, "y": -9.3e18, "z": 12345678901234567890.5}',  # floats past 2**63, written as floats
]


@pytest.mark.parametrize("body", ACCEPTED)
def test_an_accepted_body_reads_as_the_standard_library_reads_it(body):
    expected = json.loads(body)
    got = parse_json(body)
    assert repr(got) == repr(expected)  # repr: inf and -0 compare as they print


@pytest.mark.parametrize("body, message", [
    (b'[18446744073709551616]', "the integer 18446744073709551616... is outside the signed 64-bit range"),
    (b'[18446744073709551615]', "the integer 18446744073709551615... is outside the signed 64-bit range"),
    (b'[-9223372036854775809]', "the integer -9223372036854775809... is outside the signed 64-bit range"),
    (b'{"n": 123456789012345678901234567890}', "the integer 123456789012345678901234... is outside the signed 64-bit range"),
    (b'{"x": 1.5, "n": [-18446744073709551617]}', "the integer -18446744073709551617... is outside the signed 64-bit range"),
    (b'{"t": NaN}', "JSON parse error - NaN is not JSON"),
    (b'{', "JSON parse error - Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b'[' * 70 + b']' * 70, "the body is nested deeper than 64 levels"),
])
def test_a_refused_body_gets_the_standard_librarys_message(body, message):
    with pytest.raises(BodyRefused) as refused:
        parse_json(body)
    assert refused.value.message == message


@pytest.mark.parametrize("body, message, param", [
    (b'{"messages": [{"content": "x \\ud800 y"}]}', "$.messages[0].content holds a lone UTF-16 surrogate", "messages[0].content"),
    (b'{"a": {"b": ["ok", "\\udfff"]}}', "$.a.b[1] holds a lone UTF-16 surrogate", "a.b[1]"),
    (b'{"a": "\xed\xa0\x80"}', "$.a holds a lone UTF-16 surrogate", "a"),  # the surrogate as UTF-8 bytes
    (b'{"x": 1, "k\\ud800": 2}', "$: the key 'k\\ud800' holds a lone UTF-16 surrogate", None),
    (b'"\\ud800"', "$ holds a lone UTF-16 surrogate", None),
    ('{"a": "\ud800"}'.encode("utf-16", "surrogatepass"), "$.a holds a lone UTF-16 surrogate", "a"),
])
def test_a_lone_surrogate_is_refused_naming_where_it_is(body, message, param):
    """The standard library reads a lone surrogate, which is no text: msgpack (the channel to the
    runtime) and every engine refuse it, so the edge does, naming the field."""
    with pytest.raises(BodyRefused) as refused:
        parse_json(body)
    assert refused.value.message.startswith(message)
    assert refused.value.param == param


def test_an_ordinary_body_never_reaches_the_standard_librarys_parser(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the standard library's parser was called")

    monkeypatch.setattr(limits.json, "loads", refuse)
    assert parse_json(ACCEPTED[0])["max_tokens"] == 1
    assert parse_json(b'{"id": "1234567890123456789012", "n": 9223372036854775807}')["n"] == 2**63 - 1
    with pytest.raises(AssertionError):
        parse_json(b'[18446744073709551616]')  # 20 digits: the standard library's
