"""``runtime.inference.stop_sequences.StopWatch``: the runtime's stop sequences (every backend) and
llama_cpp's template stop strings.  Where it cuts must be where a plain search of the text so far
cuts once a stop sequence is whole, and what it holds back exactly the end of the text that may
still begin one, however the text is split into pieces."""
from __future__ import annotations

import random

import pytest

from runtime.inference.stop_sequences import StopWatch


def test_stop_strings_are_held_back_until_they_cannot_match():
    stop = StopWatch(("\nUser:",))
    assert stop.feed("Hello") == ("Hello", False)
    assert stop.feed(" there\nUs") == (" there", False)
    assert stop.feed("ually") == ("\nUsually", False)
    assert stop.feed("\nUser: more") == ("", True)
    assert StopWatch(()).feed("\nUser:") == ("\nUser:", False)


def test_the_earliest_of_several_stops_cuts_and_a_flush_gives_back_what_was_held():
    stop = StopWatch(["END", "ND!", ""])
    assert stop.feed("aE") == ("a", False)
    assert stop.feed("N") == ("", False)
    assert stop.flush() == "EN"
    assert stop.feed("xND!yEND") == ("x", True)
    assert stop.found == "ND!"  # the sequence that cut the text, as the Messages API reports it


def test_found_names_no_sequence_until_one_cuts():
    stop = StopWatch(["brown", "fox"])
    assert stop.feed("the quick bro") == ("the quick ", False) and stop.found is None
    assert stop.feed("wn fox") == ("", True) and stop.found == "brown"


def plain_search(stops: list[str], text: str) -> tuple[str, bool]:
    """The answer a search of the whole text gives: cut before the earliest stop sequence."""
    found = [index for index in (text.find(stop) for stop in stops if stop) if index >= 0]
    return (text[: min(found)], True) if found else (text, False)


def longest_partial(stops: list[str], text: str) -> int:
    """How much of the text's end may still begin a stop sequence."""
    return max((size for stop in stops for size in range(1, len(stop)) if text.endswith(stop[:size])), default=0)


@pytest.mark.parametrize("seed", range(4))
def test_any_split_of_the_text_gives_what_a_plain_search_gives(seed):
    chance = random.Random(seed)
    for _ in range(2000):
        alphabet = chance.choice(["ab", "abc", "aab"])
        stops = ["".join(chance.choice(alphabet) for _ in range(chance.randint(1, 7))) for _ in range(chance.randint(1, 3))]
        text = "".join(chance.choice(alphabet) for _ in range(chance.randint(0, 40)))
        cuts = sorted(chance.sample(range(len(text) + 1), chance.randint(0, min(len(text) + 1, 10))))
        watch, sent, seen = StopWatch(stops), "", ""
        for start, end in zip([0, *cuts], [*cuts, len(text)]):
            piece, stopped = watch.feed(text[start:end])
            sent, seen = sent + piece, text[:end]
            if stopped:
                break
            # Held back: exactly the end that may still begin a stop sequence.
            assert len(seen) - len(sent) == longest_partial(stops, seen), (stops, text, cuts)
        if not stopped:
            sent += watch.flush()
        # The text up to the piece in which a stop sequence was first whole, cut as a plain search cuts it.
        assert (sent, stopped) == plain_search(stops, seen), (stops, text, cuts)


def test_a_long_piece_after_a_partial_match_still_finds_the_stop_across_pieces():
    stop = "ab" * 300 + "c"
    watch = StopWatch([stop])
    assert watch.feed("x" + "ab" * 200) == ("x", False)
    # A piece longer than the stop: what may begin it is read from the piece's end alone.
    assert watch.feed("ab" * 1000) == ("ab" * 900, False)
    assert watch.held == "ab" * 300
    assert watch.feed("c tail") == ("", True)
