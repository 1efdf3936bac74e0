"""POST /v1/rerank (and /rerank, /v1/reranking): the Jina / Cohere rerank protocol on the
runtime's ``rerank`` operation.

``create_rerank`` parses the body (``protocol``), checks the caller's key may use the model, asks
the runtime (``OP_RERANK``: the same model lookup, lifecycle rejections, admission, fair-share
scheduler and error codes as an embedding) for one score per document, and shapes the answer:
``{"object": "list", "model", "results": [{"index", "relevance_score", "document": {"text"}}],
"usage": {"prompt_tokens", "total_tokens"}}``, the results sorted by score, highest first (equal
scores in the documents' order), the first ``top_n`` of them; ``document`` only with
``return_documents``.  ``RERANK_ROUTES`` serves it from ASGI at each of its paths (``api.routes``).
"""
from __future__ import annotations

from models_app import placement
from models_app.api.inference import inference_app, parsed, runtime_wire
from models_app.api.keys import Caller
from models_app.quotas import admission
from models_app.api.rerank.protocol import RERANK_PATHS, parse_rerank_body
from models_app.transport.messages import OP_RERANK


async def create_rerank(data, caller: Caller) -> dict:
    """Run one rerank request; raises its error (LLMPoolError)."""
    call = await parsed(parse_rerank_body, data, caller.fairness_key)
    model = await caller.resolve(call.rerank.model)
    result = await placement.call(OP_RERANK, runtime_wire({**call.rerank.to_wire(), "model": model}))
    admission.count(model, result["usage"])
    ranked = sorted(enumerate(result["scores"]), key=lambda pair: -pair[1])[: call.top_n]  # sorted() is stable
    documents = call.rerank.documents
    tokens = result["usage"]["prompt_tokens"]
    return {
        "object": "list",
        "model": call.rerank.model,
        "results": [
            {"index": index, "relevance_score": score,
             **({"document": {"text": documents[index]}} if call.return_documents else {})}
            for index, score in ranked
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


RERANK_ROUTES = {path: inference_app(create_rerank, path) for path in RERANK_PATHS}
