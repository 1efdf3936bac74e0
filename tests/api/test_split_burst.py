"""A burst of concurrent requests in the split is served, not refused for want of Redis connections.

redis-py 8's asyncio pool holds at most 100 connections and raises "Too many connections" past
them; each send over the channel layer holds one while it runs, so a burst of a few hundred
requests to one API process answered 503 runtime_unavailable ("the channel layer (Redis) cannot
be reached") for some of them.  The layer's pool now waits for a free connection
(``models_app.transport.channel_layer``).
"""
from __future__ import annotations

import asyncio

import httpx
import pytest

BURST = 250


@pytest.fixture(scope="module", autouse=True)
def api_shape():
    """This test names its shape itself: run it once, not once per shape."""
    return "split"


async def _burst(url: str) -> list[tuple[int, str]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        async def one(index: int) -> tuple[int, str]:
            body = {"model": "m", "input": f"request {index}", "stream": index % 2 == 0}
            answer = await http.post("/v1/responses", json=body)
            return answer.status_code, "" if answer.status_code == 200 else answer.text[:300]

        return await asyncio.gather(*(one(index) for index in range(BURST)))


def test_a_burst_of_hundreds_of_requests_is_served_in_the_split(live_service):
    fairness = {"per_key_queue_limit": BURST, "executor_queue_limit": BURST}
    models = {"m": {"backend": "stub", "enabled": True, "replicas": 4, "stub_token_delay_ms": 20}}
    # The runtime takes the burst's requests off Redis one by one, with their replies going the
    # other way: on two cores the last one's first heartbeat may come after the default 2 s.
    service = live_service(models, engine={"fairness": fairness}, service={"runtime_reply_timeout_seconds": 10},
                           mode="split")
    with service.client() as http:
        assert http.post("/v1/admin/models/m/load").status_code == 200
    answers = asyncio.run(_burst(service.url))
    refused = [answer for answer in answers if answer[0] != 200]
    assert refused == [], f"{len(refused)} of {BURST} not served, the first: {refused[:3]}"
