"""The model page's live block shows speculative decoding's figures from the entry's ``stats``,
and nothing of them for a model that drafted nothing in the window."""
from __future__ import annotations

from django.template.loader import render_to_string


def live_block(stats: dict) -> str:
    entry = {"name": "m", "runtime_state": "loaded", "definition": {"replicas": 1}, "stats": stats}
    return render_to_string("llmpool_admin/_model_live.html", {"entry": entry})


def test_the_live_block_shows_drafted_and_accepted_tokens_with_their_rate():
    html = live_block({"window_seconds": 300.0, "draft_tokens": 120, "accepted_draft_tokens": 90,
                       "draft_acceptance_rate": 0.75})
    assert 'data-field="speculative"' in html
    assert '<span data-field="accepted_draft_tokens">90</span> of <span data-field="draft_tokens">120</span>' in html
    assert '<span data-field="draft_acceptance_rate">0.75</span>' in html


def test_a_model_without_drafts_shows_no_speculative_row():
    assert 'data-field="speculative"' not in live_block({"window_seconds": 300.0, "draft_tokens": 0,
                                                         "accepted_draft_tokens": 0, "draft_acceptance_rate": None})
