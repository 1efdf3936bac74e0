"""OpenAPI 3.0 request schemas from the pydantic models that really validate the bodies, and the
inference endpoints' operations in the document.

drf-spectacular writes OpenAPI 3.0.3; pydantic writes JSON Schema 2020-12.  ``request_schema``
inlines pydantic's ``$defs`` and turns what 3.0 spells differently into its spelling:
``anyOf [T, null]`` -> ``T`` with ``nullable``, ``const`` -> a one-value ``enum``, a numeric
``exclusiveMinimum``/``exclusiveMaximum`` -> ``minimum``/``maximum`` with the boolean flag, and
drops ``discriminator`` (its mapping names the inlined definitions).  A field that a validator
widens before validation (a string ``input`` or ``content``) is documented in its full form.

drf-spectacular writes the admin views' operations from the DRF views.  The inference endpoints
are plain ASGI apps, not DRF views: the route table's hook (``api.routes.add_inference_operations``,
a drf-spectacular postprocessing hook, ``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``) adds their
operations with ``with_inference_operations``, each request body's schema from its pydantic model,
or, for a body no pydantic model validates (the audio endpoints' multipart form, checked field by
field in code), the schema its parser's module writes beside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


# What an inference endpoint answers with the error envelope.
INFERENCE_ERROR_STATUSES = (400, 401, 403, 404, 405, 409, 413, 429, 502, 503, 504)


KEYS_NOTE = (
    "With service.api_keys set, it needs Authorization: Bearer <API key> (401 invalid_api_key) and a model the "
    "key may use (403 model_not_allowed), and the key decides the fairness key. Else the fairness key is the "
    "first of service.fairness_key_headers present (default X-LLMPool-Fairness-Key), else the user field."
)
# The paths that run a model: a key's limits admit their requests (models_app.quotas).
LIMITED_NOTE = KEYS_NOTE + (
    " A key of the database may carry limits: over one, 429 rate_limited, token_rate_limited, concurrency_limited "
    "or budget_exhausted with Retry-After, and its answers carry the x-ratelimit-* headers (docs/api.md)."
)


@dataclass(frozen=True)
class InferenceOperation:
    """One inference path's operation in the OpenAPI document.

    ``body`` is the pydantic model that validates the request body, whose schema is the document's,
    so the two cannot drift apart.  A body that no model validates is given as its schema: a
    ``multipart/form-data`` form arrives as text parts and files, repeated names and all, and is
    checked by its protocol's parser, so a model of it would be a second validator that validates
    nothing; its parser's module writes the schema from the parser's own constants instead.
    """

    path: str
    body: type[BaseModel] | dict | None  # the body's model, or its schema as it is; None: no body
    summary: str
    description: str
    streams: bool  # whether ``stream: true`` answers a stream (of ``stream_type``)
    method: str = "post"
    stream_type: str = "text/event-stream"
    tag: str | None = None  # None: the path's first segment
    # The error body's component, and its schema where the admin views do not declare it already.
    error_component: str = "ErrorEnvelope"
    error_schema: dict | None = None
    media_type: str = "application/json"  # the request body's
    # What a 200 may be besides JSON and the stream: plain media types, each a string (a transcript as text).
    answer_types: tuple[str, ...] = ()


_OPERATION_VERBS = {"post": "create", "get": "retrieve", "delete": "destroy"}


def with_inference_operations(result: dict, operations: list[InferenceOperation]) -> dict:
    """The document drf-spectacular generated with ``operations`` added (the paths kept in its
    order, by path), and the error components they name that it lacks."""
    paths = dict(result["paths"])
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for operation in operations:
        paths[operation.path] = {**paths.get(operation.path, {}), operation.method: inference_operation(operation)}
        if operation.error_schema is not None:
            schemas.setdefault(operation.error_component, operation.error_schema)
    result["paths"] = dict(sorted(paths.items()))
    return result


def inference_operation(operation: InferenceOperation) -> dict:
    """One ``InferenceOperation`` as an OpenAPI operation."""
    segments = operation.path.strip("/").split("/")
    answer = {"application/json": {"schema": {"type": "object", "additionalProperties": {}}},
              **{kind: {"schema": {"type": "string"}} for kind in operation.answer_types}}
    if operation.streams:
        answer[operation.stream_type] = {"schema": {"type": "string"}}
    error = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{operation.error_component}"}}},
             "description": ""}
    document = {
        "operationId": "_".join(segments) + "_" + _OPERATION_VERBS[operation.method],
        "description": operation.description,
        "summary": operation.summary,
        "tags": [operation.tag or segments[0]],
        "responses": {
            "200": {"content": answer, "description": ""},
            **{str(status): error for status in INFERENCE_ERROR_STATUSES},
        },
    }
    if operation.body is not None:
        # Required: every inference body names its model.
        schema = operation.body if isinstance(operation.body, dict) else request_schema(operation.body)
        document["requestBody"] = {"content": {operation.media_type: {"schema": schema}}, "required": True}
    return document


def request_schema(model: type[BaseModel]) -> dict:
    schema = model.model_json_schema(mode="validation")
    definitions = schema.pop("$defs", {})
    return _convert(schema, definitions)


def _convert(node: Any, definitions: dict) -> Any:
    if isinstance(node, list):
        return [_convert(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _convert(definitions[node["$ref"].rsplit("/", 1)[-1]], definitions)
    node = {key: value for key, value in node.items() if key not in ("discriminator", "title")}
    for union in ("anyOf", "oneOf"):
        kinds = node.get(union)
        if kinds and any(kind.get("type") == "null" for kind in kinds):
            rest = [kind for kind in kinds if kind.get("type") != "null"]
            del node[union]
            node["nullable"] = True
            if len(rest) == 1:
                node.update(rest[0])
            else:
                node[union] = rest
    if "$ref" in node:  # a nullable reference: the definition, nullable
        reference = node.pop("$ref")
        return _convert({**definitions[reference.rsplit("/", 1)[-1]], **node}, definitions)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(exclusive), (int, float)) and not isinstance(node[exclusive], bool):
            node[bound] = node.pop(exclusive)
            node[exclusive] = True
    # properties and $defs-like maps hold names, not keywords: convert their values only.
    return {
        key: ({name: _convert(value, definitions) for name, value in sub.items()}
              if key == "properties" and isinstance(sub, dict) else _convert(sub, definitions))
        for key, sub in node.items()
    }


def tool_choice_schema(named: dict) -> dict:
    """``tool_choice`` as both APIs take it: none, auto, required, or a named function
    (``{"type": "function", **named}``, each protocol's shape), or null.  The protocols validate
    it in code (their ``_tool_choice``, with messages that say what is wrong); this states it."""
    function = {"type": "object", "properties": {"type": {"type": "string", "enum": ["function"]}, **named},
                "required": ["type", *named], "additionalProperties": False}
    return {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, function, {"type": "null"}]}


def response_format_schema(schema_keys: tuple[str, ...]) -> dict:
    """``response_format`` as the protocols check it in code (their ``_response_format``): type
    text or json_object, or json_schema with its schema object under one of ``schema_keys``; other
    keys are the client's (a name, strict), or null."""
    kinds = [{"type": "object", "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}},
              "required": ["type"]}]
    kinds += [{"type": "object", "properties": {"type": {"type": "string", "enum": ["json_schema"]},
                                               key: {"type": "object"}}, "required": ["type", key]}
              for key in schema_keys]
    return {"anyOf": [*kinds, {"type": "null"}]}
