"""The engine-process frames: encoding, errors with their codes, coalesced deltas, a real child."""
from __future__ import annotations

import asyncio
import socket
import sys

import msgpack
import pytest

from runtime.backends.base import GenerationRequest
from runtime.engine_process import protocol as p
from runtime.errors import BackendError, ContextLengthExceeded, InvalidRequest, LLMPoolError
from runtime.supervisor import ManagedProcess, ServerCommand
from runtime.supervisor.pidfiles import group_members

MESSAGES = [
    {"op": "load", "backend": "stub", "model_name": "m", "replica_index": 0,
     "config": {"stub_reply": "a b", "replicas": 1, "modalities": ["text"], "stub_vram_mib": None},
     "context": {"base_dir": "/x", "model_name": "m", "state_dir": "/s"}},
    {"op": "generate", "id": 7, "request": GenerationRequest("r1", [{"role": "user", "content": []}]).to_wire()},
    {"op": "cancel", "id": 7},
    {"op": "delta", "id": 7, "text": "héllo"},
    {"op": "finished", "id": 7, "input_tokens": 3, "output_tokens": 2, "finish_reason": "length"},
    {"op": "error", "id": None, "reply_to": "load", "code": "internal_error", "message": "boom"},
    {"op": "stats", "rss_bytes": 123456789},
]


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_every_message_round_trips_through_a_frame():
    reader = reader_with(b"".join(p.encode(message) for message in MESSAGES))
    assert [await p.read_frame(reader) for _ in MESSAGES] == MESSAGES
    assert await p.read_frame(reader) is None


def test_a_generation_request_survives_the_trip():
    request = GenerationRequest("r1", [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                instructions="be brief", max_output_tokens=9, stream=True, extra={"k": 1})
    frame = p.encode({"op": "generate", "id": 1, "request": request.to_wire()})
    assert GenerationRequest.from_wire(p.decode(frame[p.HEADER.size:])["request"]) == request


async def test_a_stream_cut_mid_frame_reads_as_closed():
    frame = p.encode(MESSAGES[3])
    assert await p.read_frame(reader_with(frame[:-2])) is None
    assert await p.read_frame(reader_with(frame[:2])) is None


async def test_an_undecodable_frame_is_reported_and_the_next_one_still_reads():
    garbage = b"\xc1\xc1"  # 0xc1 is never used in msgpack
    not_a_map = p.HEADER.pack(1) + b"\x01"
    reader = reader_with(p.HEADER.pack(len(garbage)) + garbage + not_a_map + p.encode(MESSAGES[2]))
    with pytest.raises(p.UndecodableFrame):
        await p.read_frame(reader)
    with pytest.raises(p.UndecodableFrame, match="a map with a string 'op'"):
        await p.read_frame(reader)
    assert await p.read_frame(reader) == MESSAGES[2]


@pytest.mark.parametrize("error", [
    BackendError("engine broke"),
    ContextLengthExceeded("prompt too long"),
    InvalidRequest("target_lang_code is required", param="target_lang_code", details=[{"at": 1}]),
])
def test_an_error_frame_carries_the_code_param_and_details_of_the_error(error):
    frame = p.error_message(error, reply_to="generate", id=3)
    assert frame == {"op": "error", "id": 3, "reply_to": "generate", "code": error.code, "message": error.message,
                     "param": error.param, "details": error.details}
    rebuilt = p.error_from_message(p.decode(p.encode(frame)[4:]))
    assert type(rebuilt) is type(error)
    assert (rebuilt.message, rebuilt.param, rebuilt.details) == (error.message, error.param, error.details)


def test_any_other_exception_is_an_internal_error():
    frame = p.error_message(RuntimeError(), reply_to="load")
    assert (frame["code"], frame["message"]) == ("internal_error", "RuntimeError")
    assert type(p.error_from_message(frame)) is LLMPoolError


async def test_deltas_coalesce_while_the_reader_lags():
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    reader, other_writer = await asyncio.open_unix_connection(sock=theirs)
    outbox = p.Outbox(writer)
    outbox.send({"op": "stats", "blob": b"x" * (8 * 1024 * 1024)})  # more than the socket holds: drain waits
    await asyncio.sleep(0.05)  # the sender wrote it and waits in drain
    for index in range(100):
        outbox.send({"op": "delta", "id": 1, "text": f"{index} "})
        outbox.send({"op": "delta", "id": 2, "text": "b"})
        await asyncio.sleep(0)
    outbox.send({"op": "finished", "id": 1, "input_tokens": 1, "output_tokens": 100, "finish_reason": "stop"})
    received = [message for _ in range(3) for message in p.unbatched(await p.read_frame(reader))]
    assert [m["op"] for m in received] == ["stats", "delta", "delta", "finished"]
    # joined text, their tokens added up (a delta without a count is one token)
    assert received[1] == {"op": "delta", "id": 1, "text": "".join(f"{i} " for i in range(100)), "tokens": 100}
    assert received[2] == {"op": "delta", "id": 2, "text": "b" * 100, "tokens": 100}
    await outbox.close()
    other_writer.close()


async def outbox_pair() -> tuple[p.Outbox, asyncio.StreamReader, asyncio.StreamWriter]:
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    reader, other_writer = await asyncio.open_unix_connection(sock=theirs)
    return p.Outbox(writer), reader, other_writer


async def test_the_deltas_of_several_generations_sent_together_go_out_in_one_frame_in_order():
    outbox, reader, other_writer = await outbox_pair()
    for request_id in (1, 2, 3):  # one batch step's deltas
        outbox.send({"op": "delta", "id": request_id, "text": f"t{request_id}", "tokens": 1})
    outbox.send({"op": "finished", "id": 2, "input_tokens": 1, "output_tokens": 1, "finish_reason": "stop"})
    outbox.send({"op": "delta", "id": 4, "text": "alone", "tokens": 1})
    frames = [await p.read_frame(reader) for _ in range(3)]
    assert [frame["op"] for frame in frames] == ["deltas", "finished", "delta"]
    assert p.unbatched(frames[0]) == [{"op": "delta", "id": i, "text": f"t{i}", "tokens": 1} for i in (1, 2, 3)]
    assert p.unbatched(frames[2]) == [frames[2]]
    await outbox.close()
    other_writer.close()


async def test_a_delta_that_cannot_be_encoded_among_others_fails_alone():
    outbox, reader, other_writer = await outbox_pair()
    outbox.send({"op": "delta", "id": 1, "text": "fine"})
    outbox.send({"op": "delta", "id": 2, "text": "bad", "logprobs": [object()]})
    outbox.send({"op": "delta", "id": 3, "text": "fine too"})
    received = [await p.read_frame(reader) for _ in range(3)]
    assert [(m["op"], m["id"]) for m in received] == [("delta", 1), ("error", 2), ("delta", 3)]
    await outbox.close()
    other_writer.close()


@pytest.mark.parametrize("deltas", [None, "text", [{"op": "finished", "id": 1}], [["delta"]]])
async def test_a_deltas_frame_without_a_list_of_deltas_is_undecodable_and_the_next_frame_reads(deltas):
    bad = msgpack.packb({"op": "deltas", "deltas": deltas})
    reader = reader_with(p.HEADER.pack(len(bad)) + bad + p.encode({"op": "delta", "id": 1, "text": "x"}))
    with pytest.raises(p.UndecodableFrame):
        await p.read_frame(reader)
    assert await p.read_frame(reader) == {"op": "delta", "id": 1, "text": "x"}


async def test_a_message_that_cannot_be_encoded_goes_out_as_an_error_for_its_id():
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    reader, other_writer = await asyncio.open_unix_connection(sock=theirs)
    outbox = p.Outbox(writer)
    outbox.send({"op": "finished", "id": 4, "input_tokens": object()})
    reply = await p.read_frame(reader)
    assert (reply["op"], reply["id"], reply["reply_to"], reply["code"]) == ("error", 4, "finished", "internal_error")
    await outbox.close()
    other_writer.close()


async def test_a_child_answers_an_unknown_op_with_an_error_and_goes_on(state_dir):
    """The child, started through the supervisor with its socket as an inherited fd: unknown
    ops and undecodable frames are answered, stats still work, and it exits once the socket closes."""
    ours, theirs = socket.socketpair()
    command = ServerCommand(
        label="engine process for model m, replica 1",
        argv=[sys.executable, "-m", "runtime.engine_process.child", "--fd", str(theirs.fileno())],
        env=None,
        log_path=state_dir / "logs" / "m.r0.log",
        pass_fds=(theirs.fileno(),),
    )
    process = ManagedProcess(command, state_dir)
    await process.start()
    theirs.close()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    try:
        writer.write(p.encode({"op": "load_mmproj", "id": 5, "path": "x"}))
        writer.write(p.HEADER.pack(2) + b"\xc1\xc1")
        writer.write(p.encode({"op": "stats"}))
        unknown, undecodable, stats = [await asyncio.wait_for(p.read_frame(reader), 30) for _ in range(3)]
        assert unknown == {"op": "error", "id": 5, "reply_to": "load_mmproj", "code": "unknown_operation",
                           "message": "unknown engine process operation 'load_mmproj'", "param": None,
                           "details": None}
        assert (undecodable["op"], undecodable["code"]) == ("error", "internal_error")
        assert stats["op"] == "stats" and 10 * 2**20 < stats["rss_bytes"] < 2 * 2**30
    finally:
        writer.close()
    assert await process.wait_exit(10)
    assert process.returncode == 0
    await process.stop()
    assert not group_members(process.pid)
