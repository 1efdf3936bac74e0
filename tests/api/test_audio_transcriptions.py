"""POST /v1/audio/transcriptions and /v1/audio/translations on a live service (embedded and split)
with the real Whisper base model in an engine process, loaded by the first request: espeak-ng speaks a known sentence and its
words come back through the official openai client (plain, verbose_json with segments and words,
a stream of transcript.text events), as SubRip, and translated as WebVTT; a broken file is 400, a
chat model 400 transcription_unsupported, a generation asked of the Whisper model 400, an upload
over service.audio_max_upload_bytes 413, each in the error envelope.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.audio_helpers import SENTENCE, speak, whisper_base, words
from tests.conftest import model_entry, openai_client, service_with_loaded_models

MAX_UPLOAD = 512 * 1024


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_shape):
    models = {
        # Loaded by the module's first transcription (load on request).
        "whisper": {"backend": "whisper", "model_path": str(whisper_base()), "whisper_compute_type": "int8",
                    "whisper_cpu_threads": 2, "whisper_beam_size": 1, "load_on_request": True},
        "chat": {"backend": "stub"},
    }
    with service_with_loaded_models(tmp_path_factory.mktemp("audio"), models, unloaded=("whisper",),
                                    service={"audio_max_upload_bytes": MAX_UPLOAD}) as live:
        yield live


def test_the_openai_client_gets_the_spoken_words_back_and_the_key_is_charged(service, speech):
    with openai_client(service) as client, open(speech, "rb") as audio:
        transcript = client.audio.transcriptions.create(model="whisper", file=audio, language="en",
                                                        extra_headers={"X-LLMPool-Fairness-Key": "listener"})
    assert words(transcript.text) == words(SENTENCE)
    assert transcript.usage.type == "duration" and 2 <= transcript.usage.seconds <= 5
    with service.client() as http:
        record = http.get("/v1/admin/activity", params={"model": "whisper", "limit": 1}).json()["requests"][0]
    # Charged 50 tokens per second of audio (docs/scheduling.md) plus the transcript's tokens.
    assert (record["endpoint"], record["fairness_key"], record["status"]) == ("audio_transcriptions", "listener", 200)
    assert 50 * (transcript.usage.seconds - 1) < record["input_tokens"] <= 50 * transcript.usage.seconds
    assert len(words(SENTENCE)) <= record["output_tokens"] < 40


def test_verbose_json_has_segments_and_word_timings(service, speech):
    with openai_client(service) as client, open(speech, "rb") as audio:
        verbose = client.audio.transcriptions.create(
            model="whisper", file=audio, response_format="verbose_json", timestamp_granularities=["segment", "word"],
        )
    assert words(verbose.text) == words(SENTENCE)
    assert verbose.language == "en" and 2.0 < verbose.duration < 5.0
    assert [segment.id for segment in verbose.segments] == list(range(len(verbose.segments)))
    assert words(" ".join(segment.text for segment in verbose.segments)) == words(SENTENCE)
    for segment in verbose.segments:
        assert 0 <= segment.start < segment.end <= verbose.duration + 0.5 and segment.tokens
    assert words(" ".join(word.word for word in verbose.words)) == words(SENTENCE)
    starts = [word.start for word in verbose.words]
    assert starts == sorted(starts) and all(word.start <= word.end for word in verbose.words)


# One call per shape: a transcription as SubRip on the embedded default, a translation as WebVTT
# on the split (the shapes are the edge's; the runtime's path is the same for both tasks).
SUBTITLES = {"embedded": ("/v1/audio/transcriptions", "srt"), "split": ("/v1/audio/translations", "vtt")}


def test_srt_and_vtt_are_cues_of_the_segments(service, speech, api_shape):
    cue_time = r"\d\d:\d\d:\d\d[,.]\d\d\d"
    path, response_format = SUBTITLES[api_shape]
    with service.client() as http, open(speech, "rb") as audio:
        answer = http.post(path, files={"file": ("sentence.wav", audio, "audio/wav")},
                           data={"model": "whisper", "response_format": response_format, "language": "en"})
    assert answer.status_code == 200, answer.text
    lines = answer.text.splitlines()
    if response_format == "vtt":
        assert answer.headers["content-type"].startswith("text/vtt") and lines[:2] == ["WEBVTT", ""]
        cue, text = lines[2], lines[3:]
        assert re.fullmatch(f"{cue_time} --> {cue_time}", cue) and "." in cue
    else:
        assert answer.headers["content-type"].startswith("text/plain") and lines[0] == "1"
        cue, text = lines[1], lines[2:]
        assert re.fullmatch(f"{cue_time} --> {cue_time}", cue) and "," in cue
    assert words(" ".join(line for line in text if not re.fullmatch(r"\d+|" + cue_time + ".*", line))) == words(SENTENCE)


def test_a_stream_sends_text_deltas_then_the_whole_text(service, speech):
    with openai_client(service) as client, open(speech, "rb") as audio:
        events = list(client.audio.transcriptions.create(model="whisper", file=audio, stream=True, language="en"))
    assert [event.type for event in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1) and events[:-1]
    assert events[-1].type == "transcript.text.done"
    assert words(events[-1].text) == words(SENTENCE) == words("".join(event.delta for event in events[:-1]))


def test_a_broken_file_or_an_unknown_language_is_400_and_the_model_serves_on(service, speech):
    with service.client() as http:
        answer = http.post("/v1/audio/transcriptions", files={"file": ("broken.mp3", b"ID3 not an mp3 " * 64)},
                           data={"model": "whisper"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_request" and answer.json()["error"]["param"] == "file"
        # Streamed, the same refusal comes after the stream opened: its last event is the envelope.
        streamed = http.post("/v1/audio/transcriptions", files={"file": ("broken.mp3", b"ID3 not an mp3 " * 64)},
                             data={"model": "whisper", "stream": "true"})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        last = json.loads(streamed.text.strip().splitlines()[-1].removeprefix("data: "))
        assert (last["error"]["code"], last["error"]["param"]) == ("invalid_request", "file")
        unknown = http.post("/v1/audio/transcriptions", files={"file": ("s.wav", speech.read_bytes())},
                            data={"model": "whisper", "language": "xx"})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "language", unknown.text
        assert model_entry(http, "whisper")["runtime_state"] == "loaded"


@pytest.mark.parametrize(("data", "files", "status", "code", "param"), [
    ({"model": "chat"}, {"file": ("a.wav", b"RIFF")}, 400, "transcription_unsupported", "model"),
    ({"model": "whisper"}, {"audio": ("a.wav", b"RIFF")}, 400, "invalid_request", "file"),
    ({"model": "whisper", "response_format": "srt", "stream": "true"}, {"file": ("a.wav", b"RIFF")},
     400, "invalid_request", "stream"),
    ({"model": "whisper", "timestamp_granularities[]": "word"}, {"file": ("a.wav", b"RIFF")},
     400, "invalid_request", "timestamp_granularities"),
    ({"model": "whisper", "temperature": "2"}, {"file": ("a.wav", b"RIFF")}, 400, "invalid_request", "temperature"),
    ({"model": "whisper", "chunking_strategy": "auto"}, {"file": ("a.wav", b"RIFF")},
     400, "invalid_request", "chunking_strategy"),
    ({"model": "whisper"}, {"file": ("big.wav", b"\0" * (MAX_UPLOAD + 1))}, 413, "request_too_large", "file"),
])
def test_refusals_are_the_error_envelope(service, data, files, status, code, param):
    with service.client() as http:
        answer = http.post("/v1/audio/transcriptions", data=data, files=files)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code and answer.json()["error"]["param"] == param


def test_a_json_body_is_refused_and_the_whisper_model_does_not_chat(service):
    with service.client() as http:
        answer = http.post("/v1/audio/transcriptions", json={"model": "whisper", "file": "x"})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_request"
        chat = http.post("/v1/chat/completions", json={"model": "whisper", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "model", chat.text
        assert model_entry(http, "whisper")["capabilities"]["audio_transcription"] is True
        assert model_entry(http, "chat")["capabilities"]["audio_transcription"] is False
