"""Prompt lookup's drafts (``ngram-simple``), without a model: llama.cpp's
``common_ngram_simple_draft`` (common/ngram-map.cpp) with n-gram ``size_n`` and m-gram ``n_max``,
then cut to the step's limit.  The history's last token is the one being decoded."""
from __future__ import annotations

import random

from runtime.backends.llama_cpp.speculative import NgramDrafter


def llama_cpp_draft(history: list[int], n: int, m: int) -> list[int]:
    """common_ngram_simple_draft, line for line: ``tokens`` and ``sampled`` are the history."""
    tokens, sampled = history[:-1], history[-1]
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = tokens[cur_len - n + 1:] + [sampled]
    match_pos = next((j for j in range(cur_len - n - 1, 0, -1) if tokens[j:j + n] == pattern), 0)
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    return tokens[match_pos + n:match_pos + n + copy_max] if copy_max >= n else []


def test_prompt_lookup_drafts_what_followed_the_latest_match_of_the_ngram():
    drafter = NgramDrafter(size_n=3, n_max=4)
    history = [0, 1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 1, 2, 3]
    assert drafter.propose(history, limit=10) == [4, 5, 9, 2]  # "1 2 3" near the start, not "2 3" after 9
    history += [7, 8]
    assert drafter.propose(history, limit=2) == [6, 1]  # "3 7 8" matched, the draft cut to the limit


def test_prompt_lookup_tries_no_shorter_ngram():
    """Only the whole n-gram is looked up: "2 3" and "3" occurred before, "9 2 3" did not."""
    drafter = NgramDrafter(size_n=3, n_max=4)
    assert drafter.propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3], limit=4) == []


def test_prompt_lookup_drafts_nothing_when_fewer_than_n_tokens_can_be_copied():
    """What follows the match, up to the history's last token (the one being decoded) and not it."""
    drafter = NgramDrafter(size_n=2, n_max=3)
    assert drafter.propose([0, 0, 0, 0, 5, 1, 2, 1, 2], limit=3) == []  # "1" only: one of two
    drafter = NgramDrafter(size_n=2, n_max=3)
    assert drafter.propose([0, 0, 0, 5, 1, 2, 9, 8, 1, 2], limit=3) == [9, 8, 1]
    drafter = NgramDrafter(size_n=2, n_max=3)
    assert drafter.propose([0, 0, 0, 5, 1, 2, 9, 8, 1, 2], limit=1) == [9]  # the step's limit cuts it after


def test_prompt_lookup_drafts_nothing_without_a_match_or_room():
    drafter = NgramDrafter(size_n=2, n_max=4)
    assert drafter.propose([5, 6, 7, 1, 2, 3, 4, 8, 9], limit=4) == []
    assert drafter.propose([5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6], limit=0) == []


def test_prompt_lookup_drafts_what_llama_cpp_drafts_step_by_step():
    """Random histories that grow as an answer does, against the C++ rule ported above."""
    rng = random.Random(7)
    for _ in range(400):
        n, m = rng.randint(1, 4), rng.randint(1, 8)
        drafter, vocab = NgramDrafter(size_n=n, n_max=m), rng.randint(2, 5)
        history = [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
        for _ in range(30):
            history += [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
            assert drafter.propose(history, limit=100) == llama_cpp_draft(history, n, m), (n, m, history)
