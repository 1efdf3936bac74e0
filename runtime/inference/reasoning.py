"""A thinking model's reasoning, split off its answer as the text arrives.

Qwen3, DeepSeek-R1 and their kin write their reasoning between two tags before the answer
(``<think>...</think>``; each backend says which tags a model uses, ``BackendSpec.reasoning_tags``).
``ReasoningSplitter`` reads the generated text once, for every engine alike: a start tag at the
very beginning of the output (whitespace before it allowed) opens the reasoning, the end tag
closes it, and the whitespace right after it is dropped; the tags themselves belong to neither
part.  Output that does not begin with the start tag is all answer.  Text is held back only
while it may still be the beginning of a tag (or is whitespace at the edge of the reasoning).

``split_reasoning`` applies it to an engine's event stream: each ``TextDelta`` becomes a
``ReasoningDelta`` (the reasoning's text and tokens) and/or a ``TextDelta`` of the answer (its
logprobs with it); the tokens of the events it yields add up to the engine's.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from runtime.backends.base import Finished, TextDelta

_OPEN, _REASONING, _AFTER, _ANSWER = "open", "reasoning", "after", "answer"


class ReasoningSplitter:
    """``feed`` answers the (reasoning, answer) text that may go out now; ``flush`` what was
    held back when the output ends.

    After a ``feed``, ``undecided`` tells that the output may still open with the start tag
    (nothing is known of it yet), and ``reasoning_tokens`` how many of the fed piece's tokens
    were reasoning (its tags and the whitespace after it included): all of them while the
    reasoning lasts, a share by characters of a piece that ends it and begins the answer (an
    engine process joins the pieces of a lagging stream), none once the answer runs.
    """

    def __init__(self, tags: tuple[str, str] | None):
        self.start, self.end = tags or ("", "")
        self.state = _OPEN if tags else _ANSWER
        self.held = ""
        self.reasoned = False  # any reasoning text went out
        self.opened = False  # the output began with the start tag
        self.fed = 0  # characters fed so far
        self.answer_start: int | None = None  # where the answer begins in the output, once known
        self.reasoning_tokens = 0

    @property
    def undecided(self) -> bool:
        return self.state == _OPEN

    def feed(self, text: str, tokens: int = 1, token_texts: list[str] | None = None) -> tuple[str, str]:
        """``token_texts`` (the piece's tokens, from its logprobs entries) make the share exact."""
        if self.state == _ANSWER:
            self.reasoning_tokens = 0
            return "", text
        offset, self.fed = self.fed, self.fed + len(text)
        self.held += text
        reasoning, answer = self._advance()
        if not self.opened or self.state == _OPEN:
            self.reasoning_tokens = 0
        elif self.answer_start is None:
            self.reasoning_tokens = tokens
        else:
            self.reasoning_tokens = _tokens_before(self.answer_start - offset, text, tokens, token_texts)
        return reasoning, answer

    def flush(self) -> tuple[str, str]:
        held, self.held = self.held, ""
        if self.state == _REASONING:
            return held.rstrip(), ""
        if self.state == _AFTER:
            return "", ""
        return "", held

    def _advance(self) -> tuple[str, str]:
        reasoning = answer = ""
        if self.state == _OPEN:
            lead = self.held.lstrip()
            if lead.startswith(self.start):
                self.state, self.held, self.opened = _REASONING, lead[len(self.start):].lstrip(), True
            elif lead and not self.start.startswith(lead):
                return "", self._begin_answer()
        if self.state == _REASONING:
            reasoning = self._reasoning_ready()
        if self.state == _AFTER:
            self.held = self.held.lstrip()
            if self.held:
                answer = self._begin_answer()
        return reasoning, answer

    def _begin_answer(self) -> str:
        """Everything held is the answer's beginning (``held`` is always the output's tail)."""
        self.state, self.answer_start = _ANSWER, self.fed - len(self.held)
        answer, self.held = self.held, ""
        return answer

    def _reasoning_ready(self) -> str:
        if not self.reasoned:
            self.held = self.held.lstrip()
        cut = self.held.find(self.end)
        if cut >= 0:
            ready, self.held = self.held[:cut].rstrip(), self.held[cut + len(self.end):]
            self.state = _AFTER
        else:
            keep = max(_partial_tag(self.held, self.end), len(self.held) - len(self.held.rstrip()))
            ready, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
        self.reasoned = self.reasoned or bool(ready)
        return ready


def _tokens_before(boundary: int, text: str, tokens: int, token_texts: list[str] | None) -> int:
    """How many of a piece's ``tokens`` lie before character ``boundary`` of its ``text``: counted
    from the tokens' own texts when they add up to the piece, else a share by characters."""
    if token_texts is not None and len(token_texts) == tokens and sum(map(len, token_texts)) == len(text):
        end = count = 0
        for token_text in token_texts:
            end += len(token_text)
            if end > boundary:
                break
            count += 1
        return count
    share = boundary / len(text) if text else 0.0
    return min(tokens, max(0, round(tokens * share)))


def _partial_tag(text: str, tag: str) -> int:
    """The longest tail of ``text`` that is the beginning of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ReasoningDelta:
    """Reasoning text (maybe empty: a tag held back) and the tokens that produced it."""

    text: str
    tokens: int = 0


async def split_reasoning(events: AsyncIterator, tags: tuple[str, str] | None) -> AsyncIterator:
    """``events`` (an engine's generate) with the reasoning split off the answer; other events
    pass as they are.  A delta's logprobs entries go with the answer's share of its tokens (the
    last ones).  Closing it closes ``events``."""
    if tags is None:
        async with aclosing(events):
            async for event in events:
                yield event
        return
    splitter = ReasoningSplitter(tags)
    undecided = TextDelta("", tokens=0, logprobs=None)  # deltas fed while the output's start was unknown
    async with aclosing(events):
        async for event in events:
            if isinstance(event, Finished):
                reasoning, answer = splitter.flush()  # reasoning only if it opened, else the answer's rest
                if reasoning:
                    yield ReasoningDelta(reasoning)
                if answer or undecided.tokens:
                    yield TextDelta(answer, tokens=undecided.tokens, logprobs=undecided.logprobs)
                yield event
                continue
            if not isinstance(event, TextDelta):
                yield event
                continue
            token_texts = None if event.logprobs is None else [entry["token"] for entry in event.logprobs]
            reasoning, answer = splitter.feed(event.text, event.tokens, token_texts)
            if splitter.undecided:
                undecided = _joined(undecided, event)
                continue
            held, undecided = undecided, TextDelta("", tokens=0, logprobs=None)
            thought = splitter.reasoning_tokens + (held.tokens if splitter.opened else 0)
            if thought or reasoning:
                yield ReasoningDelta(reasoning, thought)
            said = event.tokens - splitter.reasoning_tokens
            logprobs = None if event.logprobs is None else event.logprobs[splitter.reasoning_tokens:]
            if not splitter.opened:
                said += held.tokens
                logprobs = None if logprobs is None else [*(held.logprobs or ()), *logprobs]
            if answer or said or logprobs:
                yield TextDelta(answer, tokens=said, logprobs=logprobs)


def _joined(first: TextDelta, second: TextDelta) -> TextDelta:
    logprobs = None if first.logprobs is None and second.logprobs is None else [
        *(first.logprobs or ()), *(second.logprobs or ())
    ]
    return TextDelta(first.text + second.text, first.tokens + second.tokens, logprobs)
