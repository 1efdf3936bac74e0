"""Which sequence of a batched llama_cpp replica a request gets (batching.choose_sequence)."""
from __future__ import annotations

from runtime.backends.llama_cpp.batching import choose_sequence

CONVERSATION = list(range(100))


def test_the_longest_cached_prefix_wins_over_recency():
    sequences = [CONVERSATION[:40], CONVERSATION[:90], [], CONVERSATION[:10] + [7]]
    assert choose_sequence(sequences, [0, 1, 2, 3], CONVERSATION + [1, 2], {0: 1, 1: 5, 2: 0, 3: 2}) == 1


def test_only_free_sequences_are_chosen():
    sequences = [CONVERSATION[:40], CONVERSATION[:90], [], []]
    assert choose_sequence(sequences, [0, 2, 3], CONVERSATION, {0: 3, 2: 1, 3: 2}) == 0


def test_equal_prefixes_go_to_the_least_recently_used():
    sequences = [CONVERSATION[:50], CONVERSATION[:50], [5], []]
    assert choose_sequence(sequences, [0, 1], CONVERSATION, {0: 9, 1: 4}) == 1
    assert choose_sequence(sequences, [2, 3], CONVERSATION, {2: 9, 3: 4}) == 3  # no prefix: the older one


def test_a_prefix_of_a_tenth_of_the_prompt_or_less_counts_as_none():
    sequences = [CONVERSATION[:10] + [500], [], CONVERSATION[:11]]
    # 10 shared tokens of a 100-token prompt: not worth taking that conversation's sequence
    assert choose_sequence(sequences[:2], [0, 1], CONVERSATION, {0: 1, 1: 2}) == 0  # LRU: 0 is older
    assert choose_sequence(sequences[:2], [0, 1], CONVERSATION, {0: 2, 1: 1}) == 1
    assert choose_sequence(sequences, [0, 1, 2], CONVERSATION, {0: 1, 1: 1, 2: 3}) == 2  # 11 > 10
