"""A ``multipart/form-data`` body, as OpenAI's audio endpoints take it: its text fields and its
files, parsed by python-multipart (the parser Starlette and FastAPI use) from the body the ASGI
front read whole (bounded by ``service.audio_max_upload_bytes``).

A body that is not multipart, a part without a name, a text field that is not UTF-8 or a
malformed body is refused with 400 ``invalid_request``; a file over the upload bound with 413
``request_too_large`` (param ``file``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from runtime.errors import InvalidRequest, RequestTooLarge

MAX_PARTS = 64  # OpenAI's audio requests have a dozen fields at most
MAX_FIELD_BYTES = 64 * 1024  # a text field (a prompt) at most


@dataclass
class UploadedFile:
    filename: str
    content_type: str | None
    data: bytes


@dataclass
class Form:
    """The parts of a form: every text field's values by name (in order; a repeated name, as
    ``timestamp_granularities[]``, has several), and every file by name."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, UploadedFile] = field(default_factory=dict)


class _Part:
    def __init__(self):
        self.headers: dict[str, bytes] = {}
        self.data: list[bytes] = []
        self.size = 0
        self.header_field = b""  # the header whose name is being read


def parse_form(body: bytes, content_type: str | None, max_file_bytes: int) -> Form:
    """``body`` as a ``multipart/form-data`` form (its ``content_type`` header names the boundary)."""
    kind, options = parse_options_header(content_type or "")
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequest("the request body must be multipart/form-data (a file and its fields, as OpenAI's "
                             "audio endpoints take them)")
    parts: list[_Part] = []

    def on_part_begin() -> None:
        if len(parts) >= MAX_PARTS:
            raise InvalidRequest(f"the form has more than {MAX_PARTS} parts")
        parts.append(_Part())

    def on_part_data(data: bytes, start: int, end: int) -> None:
        part = parts[-1]
        part.size += end - start
        if part.size > max_file_bytes:
            raise RequestTooLarge(f"the uploaded file is larger than service.audio_max_upload_bytes "
                                  f"({max_file_bytes} bytes)", param="file")
        part.data.append(data[start:end])

    def on_header_field(data: bytes, start: int, end: int) -> None:
        parts[-1].header_field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        part = parts[-1]
        name = part.header_field.lower()
        part.headers[name] = part.headers.get(name, b"") + data[start:end]

    def on_header_end() -> None:
        parts[-1].header_field = b""

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_part_data": on_part_data, "on_header_field": on_header_field,
        "on_header_value": on_header_value, "on_header_end": on_header_end,
    })
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise InvalidRequest(f"the multipart/form-data body is malformed: {exc}") from None
    return _form_of(parts)


def _form_of(parts: list[_Part]) -> Form:
    form = Form()
    for part in parts:
        _, options = parse_options_header(part.headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        if not name:
            raise InvalidRequest("a part of the form has no name (Content-Disposition: form-data; name=...)")
        name = name.decode("utf-8", "replace")
        data = b"".join(part.data)
        if b"filename" in options:
            content_type = part.headers.get(b"content-type")
            form.files[name] = UploadedFile(options[b"filename"].decode("utf-8", "replace") or "audio",
                                            content_type.decode("latin-1") if content_type else None, data)
            continue
        if len(data) > MAX_FIELD_BYTES:
            raise InvalidRequest(f"the form field {name} is longer than {MAX_FIELD_BYTES} bytes", param=name)
        try:
            form.fields.setdefault(name, []).append(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidRequest(f"the form field {name} is not UTF-8 text", param=name) from None
    return form
