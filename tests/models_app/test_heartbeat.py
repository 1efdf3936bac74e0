"""The runtime consumer's heartbeat: a beat every interval, none after stop, an in-flight send awaited."""
from __future__ import annotations

import asyncio

from models_app.host.consumer import _Heartbeat
from models_app.transport.messages import REPLY_HEARTBEAT


def recorder():
    """A ``send`` that records what it sends, and the list it records into."""
    sent = []

    async def send(kind):
        sent.append(kind)

    return sent, send


async def test_beats_every_interval_until_stopped():
    sent, send = recorder()
    beat = _Heartbeat(send, 0.02)
    beat.start()
    await asyncio.sleep(0.11)
    await beat.stop()
    count = len(sent)
    assert 3 <= count <= 6 and set(sent) == {REPLY_HEARTBEAT}
    await asyncio.sleep(0.06)
    assert len(sent) == count  # nothing after stop


async def test_stop_waits_for_a_beat_being_sent_and_none_follows():
    events = []
    release = asyncio.Event()

    async def send(kind):
        events.append("sending")
        await release.wait()
        events.append("sent")

    beat = _Heartbeat(send, 0.01)
    beat.start()
    await asyncio.sleep(0.03)
    assert events == ["sending"]
    stopping = asyncio.create_task(beat.stop())
    await asyncio.sleep(0.02)
    assert not stopping.done()  # the send is waited for, not cancelled
    release.set()
    await stopping
    await asyncio.sleep(0.03)
    assert events == ["sending", "sent"]


async def test_a_request_shorter_than_the_interval_sends_nothing():
    sent, send = recorder()
    beat = _Heartbeat(send, 0.05)
    beat.start()
    await beat.stop()
    await asyncio.sleep(0.08)
    assert sent == []
