"""What a transcription is charged to its database key (``api.audio.endpoint``): the tokens the
scheduler counts it in (docs/scheduling.md), the audio's (50 a second) as input and the
transcript's as output, whether the answer is streamed or not.  The runtime is a fake here: its
answer's usage is what the edge reads."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from models_app.api import inference
from models_app.api.audio import endpoint
from models_app.api.audio.form import Form, UploadedFile
from models_app.api.keys import Caller
from models_app.quotas import admission, usage
from models_app.transport import nodes
from models_app.transport.messages import REPLY_CHUNK, REPLY_RESULT

RESULT = {"text": "open the door", "language": "en", "duration": 2.5,
          "segments": [{"start": 0.0, "end": 2.5, "text": "open the door", "tokens": [1, 2, 3]}],
          "usage": {"seconds": 2.5, "input_tokens": 125, "output_tokens": 3}}


@pytest.fixture
def grant(monkeypatch):
    async def names():
        return {}

    monkeypatch.setattr(nodes.REGISTRY, "model_names", names)
    usage.LEDGER.take()
    made = admission.Grant(key=7, limits=None)
    token = admission.CURRENT.set(made)
    yield made
    admission.CURRENT.reset(token)
    usage.LEDGER.take()


def form(**fields) -> Form:
    return Form(fields={"model": ["whisper"], **{name: [value] for name, value in fields.items()}},
                files={"file": UploadedFile("a.wav", "audio/wav", b"RIFF" * 100)})


def charged() -> dict:
    today = datetime.now(timezone.utc).date()
    return {slot: counts for slot, counts in usage.LEDGER.take().items() if slot[2] == today}


async def test_a_transcription_is_charged_its_audio_and_transcript_tokens(grant, monkeypatch):
    async def call(op, wire):
        return RESULT

    monkeypatch.setattr(endpoint.placement, "call", call)
    answer = await endpoint.create_transcription(form(), Caller(fairness_key=None))
    assert answer == {"text": "open the door", "usage": {"type": "duration", "seconds": 3}}  # OpenAI's: whole seconds
    assert grant.tokens == 128
    assert list(charged().values()) == [[125, 3, 1]]


async def test_a_streamed_transcription_is_charged_the_same(grant, monkeypatch):
    async def exchange(op, wire, on_cancelled=None):
        yield {"kind": REPLY_CHUNK, "data": {"event": "admitted"}}
        yield {"kind": REPLY_CHUNK, "data": {"event": "segment", "segment": RESULT["segments"][0]}}
        yield {"kind": REPLY_RESULT, "data": RESULT}

    monkeypatch.setattr(inference.placement, "exchange", exchange)
    events = await endpoint.create_transcription(form(stream="true"), Caller(fairness_key=None))
    assert len([event async for event in events]) == 2
    assert grant.tokens == 128
    assert list(charged().values()) == [[125, 3, 1]]
