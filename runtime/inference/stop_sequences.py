"""Finding a generation's first stop sequence as its text arrives, in time linear in the text.

``StopWatch.feed`` answers the text that may go out now (never a piece that could begin a stop
sequence) and whether a stop sequence was found (``found`` then names it); ``flush`` what was
held back.  Each piece is searched once: a stop sequence that ends in it starts at most
``len(stop) - 1`` characters before it, inside the held text, so ``str.find`` over the held text
and the piece finds it.
Which tail of the text may begin a stop sequence is kept per sequence as the length of its
longest prefix that ends the text (Knuth-Morris-Pratt's state, moved on by each new character),
so a piece costs its own length per sequence, never the sequence's length squared.
"""
from __future__ import annotations


class StopWatch:
    def __init__(self, stops: list[str] | tuple[str, ...] | None):
        self._stops = [_Stop(stop) for stop in dict.fromkeys(stops or ()) if stop]
        self.held = ""
        self.found: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        held = self.held + text
        found = [(index, stop.text) for stop in self._stops if (index := held.find(stop.text)) >= 0]
        if found:
            self.held = ""
            for stop in self._stops:
                stop.matched = 0
            cut, self.found = min(found)
            return held[:cut], True
        keep = max(stop.advance(text) for stop in self._stops)
        self.held = held[len(held) - keep:] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        for stop in self._stops:
            stop.matched = 0
        return held


class _Stop:
    """One stop sequence and how much of it ends the text seen so far (``matched``)."""

    def __init__(self, text: str):
        self.text = text
        self.matched = 0
        self._fallback: list[int] | None = None  # built on first use: most pieces miss the first character

    def advance(self, text: str) -> int:
        """``matched`` after ``text`` (which holds no whole occurrence once joined to the held text)."""
        stop, matched = self.text, self.matched
        if not matched and stop[0] not in text:
            return 0
        if len(text) >= len(stop):
            # Only the last len(stop) - 1 characters can hold the prefix that ends the text.
            text, matched = text[len(text) - len(stop) + 1:], 0
        fallback = self._fallback_table()
        for char in text:
            while matched and stop[matched] != char:
                matched = fallback[matched - 1]
            if stop[matched] == char:
                matched += 1
        self.matched = matched
        return matched

    def _fallback_table(self) -> list[int]:
        """For each prefix of the stop sequence, the length of its longest proper prefix that is
        also its suffix (the KMP failure function)."""
        if self._fallback is None:
            stop, table, length = self.text, [0] * len(self.text), 0
            for index in range(1, len(stop)):
                while length and stop[index] != stop[length]:
                    length = table[length - 1]
                if stop[index] == stop[length]:
                    length += 1
                table[index] = length
            self._fallback = table
        return self._fallback
