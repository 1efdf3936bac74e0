"""GET /metrics from two API processes of the production split: the same runtime figures."""
import sys
import time

import httpx
import pytest

from tests.api.test_metrics_endpoint import FAST, runtime_figures, scrape, value
from tests.conftest import api_command, free_port, wait_until


@pytest.fixture(scope="module", autouse=True)
def api_shape():
    """This test names its shape itself: run it once."""
    return "split"


def test_two_api_processes_report_the_same_runtime_figures(live_service):
    service = live_service({"f": dict(FAST, enabled=True)}, mode="split")
    port = free_port()
    second = service._spawn(*api_command(port))
    other = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _healthy(other), timeout=30), service.log()
        assert wait_until(lambda: value(scrape(service.url), "llmpool_model_state", model="f", state="loaded"), 10)
        for url in (service.url, other):
            assert httpx.post(url + "/v1/responses", json={"model": "f", "input": "x"}).status_code == 200
        first, again = runtime_figures(scrape(service.url)), runtime_figures(scrape(other))
        assert first == again
        assert value(first, "llmpool_requests_total", model="f", endpoint="responses", status="200") == 2
    finally:
        second.terminate()
        second.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        time.sleep(0.1)
        return False
