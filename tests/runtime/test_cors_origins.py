"""service.cors_allowed_origins: what the schema takes as an origin, and the invalid_settings
answer naming the entry for anything a browser would never send as its Origin header."""
from __future__ import annotations

import pytest

from runtime.config import validate_settings
from runtime.errors import InvalidSettings


def test_cors_is_off_by_default():
    assert validate_settings({}).service.cors_allowed_origins == []


def test_origins_as_browsers_send_them_are_accepted():
    origins = ["https://chat.example.com", "http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080",
               "chrome-extension://abcdefgh", "*"]
    assert validate_settings({"service": {"cors_allowed_origins": origins}}).service.cors_allowed_origins == origins


@pytest.mark.parametrize(("origins", "path", "message"), [
    (["https://chat.example.com/"], "$.service.cors_allowed_origins[0]", "is not an origin"),
    (["https://ok.example.com", "chat.example.com"], "$.service.cors_allowed_origins[1]", "is not an origin"),
    (["HTTPS://Chat.Example.com"], "$.service.cors_allowed_origins[0]", "is not an origin"),
    (["https://chat.example.com/path"], "$.service.cors_allowed_origins[0]", "is not an origin"),
    (["https://*.example.com"], "$.service.cors_allowed_origins[0]", "is not an origin"),
    (["null"], "$.service.cors_allowed_origins[0]", "is not an origin"),
    ("*", "$.service.cors_allowed_origins", "valid list"),
    ([7], "$.service.cors_allowed_origins[0]", "valid string"),
])
def test_anything_else_is_invalid_settings_naming_the_entry(origins, path, message):
    with pytest.raises(InvalidSettings) as raised:
        validate_settings({"service": {"cors_allowed_origins": origins}})
    assert raised.value.code == "invalid_settings"
    [problem] = raised.value.details
    assert problem["path"] == path
    assert message in problem["message"]
