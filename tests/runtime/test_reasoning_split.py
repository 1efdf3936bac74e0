"""The runtime's reasoning split (runtime/inference/reasoning.py): the splitter on its own, exactly, and
through RuntimeService.generate with the stub's scripted reasoning (reasoning events, result,
reasoning tokens, stop sequences and logprobs of the answer only, reasoning_effort -> thinking),
for every typed engine alike and through an engine process."""
from __future__ import annotations

import pytest

from runtime.config import validate_settings
from runtime.errors import InvalidRequest, InvalidSettings
from runtime.inference.reasoning import ReasoningSplitter
from tests.engines.runtime_driver import load, user_input, without_timings

TAGS = ("<think>", "</think>")


def split(pieces: list[str], tags=TAGS) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    splitter = ReasoningSplitter(tags)
    return [splitter.feed(piece) for piece in pieces], splitter.flush()


def joined(pieces: list[str], tags=TAGS) -> tuple[str, str]:
    fed, flushed = split(pieces, tags)
    return "".join(r for r, _ in fed) + flushed[0], "".join(a for _, a in fed) + flushed[1]


# ---- the splitter ---------------------------------------------------------------------------


def test_reasoning_between_the_tags_is_split_off_the_answer():
    fed, flushed = split(["<think>", "\nI", " reason", "\n", "</think>", "\n\n", "The", " answer"])
    assert fed == [("", ""), ("I", ""), (" reason", ""), ("", ""), ("", ""), ("", ""), ("", "The"), ("", " answer")]
    assert flushed == ("", "")


@pytest.mark.parametrize(
    "pieces",
    [
        ["<think>I reason</think>The answer"],  # all in one delta
        ["<", "th", "ink>I re", "ason</", "thi", "nk>", "The answer"],  # tags cut anywhere
        ["  \n<think>  I reason  </think>\n\n  The answer"],  # whitespace around the reasoning dropped
        list("<think>I reason</think>The answer"),  # a character at a time
    ],
)
def test_the_split_does_not_depend_on_how_the_text_is_cut(pieces):
    assert joined(pieces) == ("I reason", "The answer")


def test_output_that_does_not_begin_with_the_start_tag_is_all_answer():
    assert joined(["\nHello", " <think>not reasoning</think>"]) == ("", "\nHello <think>not reasoning</think>")
    assert joined(["<th", "e end"]) == ("", "<the end")  # a tag's beginning that goes elsewhere
    assert joined(["<thi"]) == ("", "<thi")  # held back, then flushed as the answer


def test_reasoning_cut_off_by_the_length_limit_is_flushed_as_reasoning():
    assert joined(["<think>", "still", " thinking  ", "</th"]) == ("still thinking  </th".rstrip(), "")


def test_no_tags_pass_everything_through_as_answer():
    assert split(["<think>x</think>y"], None) == ([("", "<think>x</think>y")], ("", ""))


def test_reasoning_tokens_are_those_of_the_reasoning_its_tags_and_the_whitespace_after_it():
    splitter = ReasoningSplitter(TAGS)
    counted = []
    for piece in ["<think>", "a", " b", "</think>", "\n\n", "c"]:
        splitter.feed(piece)
        counted.append(splitter.reasoning_tokens)
    assert counted == [1, 1, 1, 1, 1, 0]


def test_a_joined_piece_that_ends_the_reasoning_shares_its_tokens_by_characters():
    splitter = ReasoningSplitter(TAGS)
    assert splitter.feed("<think>ab</think>\n\n", tokens=4) == ("ab", "")
    assert splitter.reasoning_tokens == 4
    splitter = ReasoningSplitter(TAGS)
    # 19 characters of reasoning (tags and blank line included) of 38: half of the 10 tokens
    assert splitter.feed("<think>ab</think>\n\n" + "x" * 19, tokens=10) == ("ab", "x" * 19)
    assert splitter.reasoning_tokens == 5
    splitter = ReasoningSplitter(TAGS)  # the tokens' own texts make it exact
    assert splitter.feed("<think>ab</think>\n\nxy", 6, ["<think>", "ab", "</think>", "\n\n", "x", "y"])[1] == "xy"
    assert splitter.reasoning_tokens == 4
    splitter = ReasoningSplitter(TAGS)
    splitter.feed("  ", tokens=1)
    assert splitter.undecided and splitter.reasoning_tokens == 0


# ---- through the runtime ----------------------------------------------------------------------

THINKER = {"backend": "stub", "stub_reply": "alpha beta gamma", "stub_reasoning": "I weigh it up",
           "thinking_modes": ["default", "enabled", "disabled"]}


async def generate(service, model: str, **fields) -> tuple[dict, list[dict]]:
    """(result less its timings, every event the generate operation emitted)."""
    events: list[dict] = []

    async def emit(event: dict) -> None:
        events.append(event)

    payload = {"request_id": f"req-{model}-{len(fields)}", "model": model, "messages": user_input("hi"), **fields}
    return without_timings(await service.handle("generate", payload, emit)), events


def streamed(events: list[dict]) -> list[tuple[str, str]]:
    return [(event["event"], event["text"]) for event in events if event["event"] in ("delta", "reasoning")]


async def test_the_stub_s_reasoning_is_split_off_streamed_and_counted(runtime_service):
    service, _ = await runtime_service({"m": THINKER})
    await load(service, "m")
    result, events = await generate(service, "m", stream=True)
    assert result == {
        "text": "alpha beta gamma",
        "reasoning": "I weigh it up",
        "finish_reason": "stop",
        # <think>, 4 words, </think> and the "\n\n" after it: 7 reasoning tokens; 3 of answer
        "usage": {"input_tokens": 1, "output_tokens": 10, "reasoning_tokens": 7},
    }
    assert streamed(events) == [
        ("reasoning", "I"), ("reasoning", " weigh"), ("reasoning", " it"), ("reasoning", " up"),
        ("delta", "alpha"), ("delta", " beta"), ("delta", " gamma"),
    ]


async def test_a_model_without_reasoning_tags_keeps_the_tags_in_its_answer(runtime_service):
    service, _ = await runtime_service({"m": {**THINKER, "reasoning_tags": []}})
    await load(service, "m")
    result, _ = await generate(service, "m")
    assert result["text"] == "<think>I weigh it up</think>\n\nalpha beta gamma"
    assert "reasoning" not in result and "reasoning_tokens" not in result["usage"]


async def test_a_definition_s_own_tags_are_the_ones_split(runtime_service):
    service, _ = await runtime_service({"m": {**THINKER, "reasoning_tags": ["[[", "]]"]}})
    await load(service, "m")
    result, _ = await generate(service, "m")
    assert (result["reasoning"], result["text"]) == ("I weigh it up", "alpha beta gamma")


async def test_stop_sequences_and_logprobs_are_the_answer_s_only(runtime_service):
    service, _ = await runtime_service({"m": THINKER})
    await load(service, "m")
    stopped, _ = await generate(service, "m", stop=["weigh", "gamma"])  # "weigh" is in the reasoning only
    assert (stopped["reasoning"], stopped["text"], stopped["finish_reason"]) == ("I weigh it up", "alpha beta ", "stop")
    result, events = await generate(service, "m", stream=True, logprobs=1)
    assert [entry["token"] for entry in result["logprobs"]] == ["alpha", " beta", " gamma"]
    assert [event.get("logprobs") for event in events if event["event"] == "delta"] == [
        [entry] for entry in result["logprobs"]
    ]
    assert result["logprobs"][1] == {
        "token": " beta", "logprob": 0.0, "bytes": list(b" beta"),
        "top_logprobs": [{"token": " beta", "logprob": 0.0, "bytes": list(b" beta")}],
    }


@pytest.mark.parametrize(
    ("fields", "reasons"),
    [
        ({"reasoning_effort": "high"}, True),
        ({"reasoning_effort": "low"}, True),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "minimal"}, False),
        ({"reasoning_effort": "none", "thinking": "enabled"}, True),  # an explicit thinking wins
    ],
)
async def test_reasoning_effort_chooses_the_thinking_mode(runtime_service, fields, reasons):
    service, _ = await runtime_service({"m": THINKER})
    await load(service, "m")
    result, _ = await generate(service, "m", **fields)
    assert ("reasoning" in result) is reasons
    assert result["text"] == "alpha beta gamma"


async def test_a_model_with_only_the_default_thinking_mode_ignores_reasoning_effort(runtime_service):
    service, _ = await runtime_service({"m": {**THINKER, "thinking_modes": ["default"]}})
    await load(service, "m")
    result, _ = await generate(service, "m", reasoning_effort="none")
    assert result["reasoning"] == "I weigh it up"  # not disabled: the model has no such mode


async def test_reasoning_efforts_are_listed_where_the_thinking_modes_have_them(runtime_service):
    service, _ = await runtime_service({
        "all": THINKER, "on": {**THINKER, "thinking_modes": ["default", "enabled"]}, "plain": {"backend": "stub"},
    })
    listed = {entry["name"]: entry["capabilities"] for entry in (await service.handle("list_models", {}, None))["models"]}
    assert listed["all"]["reasoning_efforts"] == ["none", "minimal", "low", "medium", "high", "xhigh", "max"]
    assert listed["on"]["reasoning_efforts"] == ["low", "medium", "high", "xhigh", "max"]
    assert listed["plain"]["reasoning_efforts"] == []
    assert listed["plain"]["sampling_options"] == ["seed", "logprobs"]


@pytest.mark.parametrize("option", ["seed", "logprobs", "presence_penalty", "frequency_penalty"])
async def test_a_sampling_option_the_engine_does_not_honour_is_400_naming_it(runtime_service, option):
    service, _ = await runtime_service({"m": {"backend": "stub", "sampling_options": []}})
    await load(service, "m")
    with pytest.raises(InvalidRequest) as refused:
        await generate(service, "m", **{option: 1})
    assert refused.value.param == option


async def test_the_split_crosses_an_engine_process(runtime_service, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPOOL_STATE_DIR", str(tmp_path / "state"))
    service, _ = await runtime_service({"m": {**THINKER, "isolation": "process"}})
    await load(service, "m")
    result, _ = await generate(service, "m", logprobs=0)
    assert (result["reasoning"], result["text"]) == ("I weigh it up", "alpha beta gamma")
    # exact however the engine process joined the deltas: their logprobs entries name the tokens
    assert result["usage"]["reasoning_tokens"] == 7
    assert [(entry["token"], entry["top_logprobs"]) for entry in result["logprobs"]] == [
        ("alpha", []), (" beta", []), (" gamma", [])
    ]
    plain, _ = await generate(service, "m")
    assert (plain["reasoning"], plain["text"]) == ("I weigh it up", "alpha beta gamma")


def test_reasoning_tags_must_be_a_pair_or_empty():
    with pytest.raises(InvalidSettings) as refused:
        validate_settings({"models": {"m": {"backend": "stub", "reasoning_tags": ["<think>"]}}})
    assert "reasoning_tags must be [] or [start, end]" in str(refused.value)
