"""The audio endpoints' edge, without a model: the multipart form (``api.audio.form``), its fields
(``api.audio.protocol``) and the answer shapes (``api.audio.shapes``: json, text, verbose_json,
SubRip, WebVTT, the stream's events)."""
from __future__ import annotations

import pytest

from models_app.api.audio import shapes
from models_app.api.audio.form import Form, UploadedFile, parse_form
from models_app.api.audio.protocol import FORM_SCHEMA, LIST_FIELDS, ONE_VALUE_FIELDS, parse_audio_form
from models_app.api.inference import PlainAnswer
from runtime.errors import InvalidRequest, RequestTooLarge

BOUNDARY = "b0undary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def multipart(fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> bytes:
    parts = [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields]
    parts += [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
              f'Content-Type: application/octet-stream\r\n\r\n'.encode() + data + b"\r\n"
              for name, filename, data in files]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def test_a_form_keeps_repeated_fields_in_order_and_the_file_bytes_as_sent():
    audio = b"RIFF\r\n--\x00\xff" * 10
    form = parse_form(multipart([("model", "w"), ("timestamp_granularities[]", "word"),
                                 ("timestamp_granularities[]", "segment")], [("file", "a b.wav", audio)]),
                      CONTENT_TYPE, 1024)
    assert form.fields == {"model": ["w"], "timestamp_granularities[]": ["word", "segment"]}
    assert form.files["file"].filename == "a b.wav" and form.files["file"].data == audio


@pytest.mark.parametrize(("body", "content_type", "error"), [
    (b'{"model": "w"}', "application/json", InvalidRequest),
    (b"not a form at all", CONTENT_TYPE, InvalidRequest),
    (multipart([], [("file", "a.wav", b"x" * 101)]), CONTENT_TYPE, RequestTooLarge),
    (multipart([("prompt", "NOT-UTF-8")], []).replace(b"NOT-UTF-8", b"\xff\xfe"), CONTENT_TYPE, InvalidRequest),
])
def test_a_body_that_is_not_a_good_form_is_refused(body, content_type, error):
    with pytest.raises(error):
        parse_form(body, content_type, 100)


def form(files=(("file", b"RIFF"),), **fields) -> Form:
    return Form({name: value if isinstance(value, list) else [value] for name, value in fields.items()},
                {name: UploadedFile("a.wav", None, data) for name, data in files})


def test_the_fields_make_the_runtimes_request():
    call = parse_audio_form(form(model="w", language="EN", prompt="Door", temperature="0.2", stream="true",
                                 user="u1"), "transcribe", None)
    request = call.transcription
    assert (request.model, request.audio, request.language, request.prompt, request.temperature, request.stream,
            request.fairness_key, request.task) == ("w", b"RIFF", "en", "Door", 0.2, True, "u1", "transcribe")
    assert call.response_format == "json" and call.granularities == ("segment",) and not request.word_timestamps
    words = parse_audio_form(form(model="w", response_format="verbose_json", **{"timestamp_granularities[]": ["word"]}),
                             "translate", "key-bucket")
    assert words.granularities == ("word",) and words.transcription.word_timestamps
    assert words.transcription.fairness_key == "key-bucket" and words.transcription.task == "translate"


@pytest.mark.parametrize(("fields", "files", "param"), [
    ({"model": "w"}, (), "file"),
    ({"model": "w"}, (("file", b""),), "file"),
    ({}, (("file", b"RIFF"),), "model"),
    ({"model": ["w", "v"]}, (("file", b"RIFF"),), "model"),
    ({"model": "w", "response_format": "xml"}, (("file", b"RIFF"),), "response_format"),
    ({"model": "w", "stream": "yes"}, (("file", b"RIFF"),), "stream"),
    ({"model": "w", "stream": "true", "response_format": "vtt"}, (("file", b"RIFF"),), "stream"),
    ({"model": "w", "temperature": "nan"}, (("file", b"RIFF"),), "temperature"),
    ({"model": "w", "language": "english"}, (("file", b"RIFF"),), "language"),
    ({"model": "w", "language": "en\n"}, (("file", b"RIFF"),), "language"),
    ({"model": "w", "timestamp_granularities[]": "char", "response_format": "verbose_json"}, (("file", b"RIFF"),),
     "timestamp_granularities"),
    ({"model": "w", "include[]": "logprobs"}, (("file", b"RIFF"),), "include[]"),
    ({"model": "w"}, (("file", b"RIFF"), ("image", b"x")), "image"),
])
def test_each_bad_field_is_refused_by_name(fields, files, param):
    with pytest.raises(InvalidRequest) as refused:
        parse_audio_form(form(files, **fields), "transcribe", None)
    assert refused.value.param == param


def test_the_form_schema_states_the_fields_the_parser_takes():
    """The OpenAPI document's form (``FORM_SCHEMA``) names each field the parser takes and no other."""
    assert set(FORM_SCHEMA["properties"]) == {"file", *ONE_VALUE_FIELDS, *LIST_FIELDS}
    assert (FORM_SCHEMA["required"], FORM_SCHEMA["additionalProperties"]) == (["file", "model"], False)
    file = FORM_SCHEMA["properties"]["file"]
    assert (file["type"], file["format"], file["minLength"]) == ("string", "binary", 1)  # an empty file is refused
    # The language pattern admits the empty string, which the parser takes as left out.
    assert parse_audio_form(form(model="w", language=""), "transcribe", None).transcription.language is None


RESULT = {
    "text": "Please open the door. And turn on the light.",
    "language": "en",
    "duration": 3661.5,
    "segments": [
        {"seek": 0, "start": 0.0, "end": 1.25, "text": " Please open the door.", "tokens": [1, 2], "temperature": 0.0,
         "avg_logprob": -0.2, "compression_ratio": 1.1, "no_speech_prob": 0.01,
         "words": [{"word": " Please", "start": 0.0, "end": 0.4}, {"word": " open", "start": 0.4, "end": 0.6}]},
        {"seek": 366000, "start": 3600.0, "end": 3661.5, "text": " And turn on the light.", "tokens": [3],
         "temperature": 0.2, "avg_logprob": -0.3, "compression_ratio": 1.2, "no_speech_prob": 0.02,
         "words": [{"word": " And", "start": 3600.0, "end": 3600.5}]},
    ],
    "usage": {"seconds": 3661.5, "input_tokens": 183075, "output_tokens": 3},
}


def call_for(response_format: str, granularities=()):
    fields = {"model": "w", "response_format": response_format}
    if granularities:
        fields["timestamp_granularities[]"] = list(granularities)
    return parse_audio_form(form(**fields), "transcribe", None)


def test_json_and_text_answers():
    assert shapes.answer(RESULT, call_for("json")) == {"text": RESULT["text"],
                                                       "usage": {"type": "duration", "seconds": 3662}}
    text = shapes.answer(RESULT, call_for("text"))
    assert isinstance(text, PlainAnswer) and text.body == (RESULT["text"] + "\n").encode()


def test_subrip_and_webvtt_cues():
    assert shapes.answer(RESULT, call_for("srt")).body.decode() == (
        "1\n00:00:00,000 --> 00:00:01,250\nPlease open the door.\n\n"
        "2\n01:00:00,000 --> 01:01:01,500\nAnd turn on the light.\n"
    )
    vtt = shapes.answer(RESULT, call_for("vtt"))
    assert vtt.content_type.startswith("text/vtt") and vtt.body.decode() == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nPlease open the door.\n\n"
        "01:00:00.000 --> 01:01:01.500\nAnd turn on the light.\n"
    )


def test_verbose_json_segments_and_words_as_asked():
    both = shapes.answer(RESULT, call_for("verbose_json", ("segment", "word")))
    assert (both["task"], both["language"], both["duration"], both["text"]) == ("transcribe", "en", 3661.5, RESULT["text"])
    assert [segment["id"] for segment in both["segments"]] == [0, 1] and both["segments"][1]["seek"] == 366000
    assert "words" not in both["segments"][0] and [word["word"] for word in both["words"]] == [" Please", " open", " And"]
    words_only = shapes.answer(RESULT, call_for("verbose_json", ("word",)))
    assert "segments" not in words_only and len(words_only["words"]) == 3
    assert "words" not in shapes.answer(RESULT, call_for("verbose_json"))


def test_stream_events():
    assert shapes.text_delta(RESULT["segments"][0], first=True) == {"type": "transcript.text.delta",
                                                                    "delta": "Please open the door."}
    assert shapes.text_delta(RESULT["segments"][1], first=False)["delta"] == " And turn on the light."
    assert shapes.text_done(RESULT) == {"type": "transcript.text.done", "text": RESULT["text"],
                                        "usage": {"type": "duration", "seconds": 3662}}
