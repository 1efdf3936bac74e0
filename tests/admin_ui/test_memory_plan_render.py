"""The device bars and the load plan rendered from the runtime's answers (shapes of docs/api.md)."""
from __future__ import annotations

from django.template.loader import render_to_string

from models_app.workbench.memory_bars import device_bars, load_plan_context

DEVICES = [{"device": "cpu", "total_mib": 64000, "budget_mib": 1000, "used_mib": 300, "reserved_mib": 500,
            "free_mib": 200, "models": {"a": 300, "b": 500},
            "charges": [{"name": "b", "mib": 500, "kind": "reserved"}, {"name": "a", "mib": 300, "kind": "measured"}]}]


def test_a_loading_model_is_drawn_reserved_after_the_measured_ones():
    [bar] = device_bars(DEVICES)
    assert [(s["name"], s["kind"], s["percent"]) for s in bar["segments"]] == [
        ("a", "measured", 30.0), ("b", "reserved", 50.0)]
    assert bar["free_percent"] == 20.0 and "needed_mib" not in bar
    html = render_to_string("llmpool_admin/_device_bars.html", {"bars": [bar]})
    assert 'data-charge="b" data-kind="reserved"' in html and "b 500 MiB (reserved, loading)" in html
    assert 'aria-valuenow="800"' in html


def test_a_plan_that_does_not_fit_says_needed_vs_free_and_what_unloading_would_free():
    plan = {"model": "c", "runtime_state": "unloaded", "fits": False, "action": "refuse", "placement": ["cpu"],
            "device": "cpu", "needed_mib": 900, "free_mib": 200, "evictable": [{"name": "a", "charge_mib": 300}],
            "blocking": [], "evict": [], "estimate_source": "estimate"}
    context = load_plan_context(plan, DEVICES)
    assert context["verdict"] == "no_fit"
    [bar] = context["plan_bars"]
    assert bar["needed_mib"] == 900 and bar["fits"] is False and bar["needed_percent"] == 90.0
    html = render_to_string("llmpool_admin/_load_plan.html", {"plan": plan, "entry": {"name": "c"}, **context})
    assert 'data-verdict="no_fit"' in html and "device-needed-over" in html
    assert "Does not fit: needs 900 MiB, 200 MiB free." in html
    assert "Unloading a (300 MiB) would make room (eviction is off)." in html


def test_a_loaded_model_plans_nothing():
    plan = {"model": "a", "runtime_state": "loaded", "fits": True, "action": "none", "placement": ["cpu"],
            "charge_mib": {"cpu": 300}}
    context = load_plan_context(plan, DEVICES)
    html = render_to_string("llmpool_admin/_load_plan.html", {"plan": plan, "entry": {"name": "a"}, **context})
    assert context["verdict"] == "already"
    assert "a is already loaded on cpu (300 MiB on cpu): a load changes nothing." in html
