"""Embedding vectors as the local engines answer them: L2-normalized, as OpenAI's and llama-server's."""
from __future__ import annotations

import math


def normalized(vector: list[float]) -> list[float]:
    """``vector`` scaled to unit length (L2); a zero vector stays as it is."""
    norm = math.sqrt(sum(value * value for value in vector))
    return [value / norm for value in vector] if norm > 0 else list(vector)
