"""POST /v1/embeddings: the embeddings protocol on the runtime's ``embed`` operation.

``create_embedding`` parses the body (``protocol``), checks the caller's key may use the model,
asks the runtime (``OP_EMBED``: the same model lookup, lifecycle rejections, admission, fair-share
scheduler and error codes as a generation) and shapes OpenAI's ``CreateEmbeddingResponse``:
``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage":
{"prompt_tokens", "total_tokens"}}``.  ``encoding_format: "base64"`` sends each vector as the
base64 of its little-endian float32 values, as OpenAI does (the openai client asks for it by
default and decodes it).  ``embeddings_app`` serves it from ASGI, at its path in the route table
(``api.routes``).
"""
from __future__ import annotations

import base64
import struct

from models_app.api.embeddings.protocol import EMBEDDINGS_PATH, parse_embedding_body
from models_app.api.inference import embed, inference_app, parsed
from models_app.api.keys import Caller


async def create_embedding(data, caller: Caller) -> dict:
    """Run one embeddings request; raises its error (LLMPoolError)."""
    call = await parsed(parse_embedding_body, data, caller.fairness_key)
    model = await caller.resolve(call.embedding.model)
    result = await embed(call.embedding, model)
    encode = _base64 if call.encoding_format == "base64" else list
    tokens = result["usage"]["prompt_tokens"]
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": encode(vector)}
            for index, vector in enumerate(result["vectors"])
        ],
        "model": call.embedding.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


embeddings_app = inference_app(create_embedding, EMBEDDINGS_PATH)
