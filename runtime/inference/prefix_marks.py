"""The prefix marks of a request's conversation: what the scheduler's routing matches against the
prefixes each replica's cache holds (runtime.model.routing).

A mark is ``(hash, characters)``: the hash of the conversation up to a boundary, chained from the
previous mark, and the conversation's size up to there.  The first mark covers what every turn of
a conversation starts with: its tools, its instructions and its leading system (or developer)
messages, which conversations of one agent share; without any, its first message.  Each message
after it adds one.  The next turn of a conversation repeats its earlier messages, so its marks
start with all of the previous turn's: the replica that served that turn holds the longest prefix.
A raw prompt (POST /v1/completions) has a mark every ``RAW_BLOCK_CHARS`` characters and one at
its end, so a prompt that grows by appending matches the blocks it shares.

Hashes are 64-bit BLAKE2b of the messages' canonical JSON (keys sorted): a collision only sends
a request to a replica that lacks its prefix, which then prefills as any other.
"""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator

import orjson

from runtime.inputs.request import GenerationRequest

Mark = tuple[int, int]  # (hash of the conversation up to a boundary, its characters up to there)

RAW_BLOCK_CHARS = 512


def prefix_marks(request: GenerationRequest) -> tuple[Mark, ...]:
    """The marks of ``request``'s conversation, shortest prefix first (empty: nothing to match)."""
    return tuple(_marks(request))


def _marks(request: GenerationRequest) -> Iterator[Mark]:
    """``prefix_marks`` one at a time: a caller that needs the first few hashes no more."""
    if request.prompt is not None:
        text = request.prompt.encode()
        pieces = (text[start:start + RAW_BLOCK_CHARS] for start in range(0, len(text), RAW_BLOCK_CHARS))
    elif request.messages:
        messages = request.messages
        lead = _head(request)
        # The adapter too: a cache computed with one LoRA adapter is no use to a request with another.
        head = orjson.dumps([request.adapter, request.tools, request.instructions, messages[:lead]],
                            option=orjson.OPT_SORT_KEYS)
        pieces = itertools.chain((head,), (orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
                                           for message in messages[lead:]))
    else:
        return
    digest, size = b"", 0
    for piece in pieces:
        digest = hashlib.blake2b(digest + piece, digest_size=8).digest()
        size += len(piece)
        yield int.from_bytes(digest, "little"), size


def _head(request: GenerationRequest) -> int:
    """How many messages the first mark covers: the leading system (or developer) ones, or
    without any (and without tools or instructions) the first message."""
    messages, lead = request.messages, 0
    while lead < len(messages) and messages[lead]["role"] in ("system", "developer"):
        lead += 1
    if not (request.tools or request.instructions or lead):
        return 1  # a head shared by every conversation without a system part would match them all
    return lead


def conversation_mark(request: GenerationRequest) -> tuple[int, bool] | None:
    """The hash that names ``request``'s conversation, the same on each of its turns, and whether
    the request continues it (it carries more than that, so a cache may hold the rest); None
    where there is nothing to mark.  Placement keeps a conversation on one node by it
    (``models_app.placement.decide``).

    For messages: the mark up to the conversation's first user message (with its system part,
    tools and instructions), which every later turn repeats; conversations of one agent share
    their system part and any fixed opening before it (an assistant's greeting) but not this.
    For a raw prompt: its first block's, once the prompt fills one (a shorter prompt that grows
    by appending would change it from call to call: None), never continuing (a completion has
    no turns to tell apart)."""
    marks = _marks(request)
    first = next(marks, None)
    if first is None:
        return None
    if request.prompt is not None:
        return (first[0], False) if first[1] >= RAW_BLOCK_CHARS else None
    messages, lead = request.messages, _head(request)
    user = next((index for index, message in enumerate(messages) if message["role"] == "user"), len(messages) - 1)
    mark = first
    for _ in range(max(0, user - lead + 1)):  # the marks of the messages after the head, up to the user's
        mark = next(marks, mark)
    return mark[0], next(marks, None) is not None
