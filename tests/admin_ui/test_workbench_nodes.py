"""The models page with several nodes (issue 22): a node that did not answer is shown as down,
and every known node with its state; with one node nothing is added."""
from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from models_app import selectors

ENTRY = {"name": "m", "resolved_backend": "stub", "runtime_state": "loaded", "node": "gpu-a"}


async def staff_client() -> AsyncClient:
    user = await sync_to_async(get_user_model().objects.create_user)(
        f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    client = AsyncClient()
    await sync_to_async(client.force_login)(user)
    return client


@pytest.mark.django_db
async def test_a_node_that_did_not_answer_is_shown_down(monkeypatch):
    async def answer():
        return {"models": [ENTRY], "nodes": [
            {"node": "gpu-a", "alive": True},
            {"node": "gpu-b", "alive": False, "error": {"code": "runtime_unavailable", "message": "no answer in 2 s"}},
        ]}

    monkeypatch.setattr(selectors, "models_answer", answer)
    page = await (await staff_client()).get("/admin/llm-pool/models/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-node-down="gpu-b"' in html and "Node gpu-b is down: runtime_unavailable: no answer in 2 s" in html
    assert 'data-node-down="gpu-a"' not in html
    assert "gpu-a (up)" in html and "gpu-b (down)" in html


@pytest.mark.django_db
async def test_one_node_adds_nothing(monkeypatch):
    async def answer():
        return {"models": [ENTRY]}

    monkeypatch.setattr(selectors, "models_answer", answer)
    html = (await (await staff_client()).get("/admin/llm-pool/models/")).content.decode()
    assert "data-nodes" not in html and "data-node-down" not in html and "data-node=" not in html


@pytest.mark.django_db
async def test_a_model_on_two_nodes_has_a_row_per_node_that_names_it(monkeypatch):
    async def answer():
        return {"models": [ENTRY, {**ENTRY, "node": "gpu-b"}],
                "nodes": [{"node": "gpu-a", "alive": True}, {"node": "gpu-b", "alive": True}]}

    monkeypatch.setattr(selectors, "models_answer", answer)
    html = (await (await staff_client()).get("/admin/llm-pool/models/")).content.decode()
    assert html.count('data-model="m"') == 2
    assert '<span class="quiet" data-node="gpu-a">on gpu-a</span>' in html
    assert '<span class="quiet" data-node="gpu-b">on gpu-b</span>' in html
