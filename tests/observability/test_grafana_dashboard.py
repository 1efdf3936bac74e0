"""docs/grafana/llmpool-dashboard.json cannot rot: every metric and every grouping label its panels'
PromQL uses is one a live service's GET /metrics really exposes, and it is a dashboard Grafana imports."""
from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "llmpool-dashboard.json"
METRIC = re.compile(r"\b(llmpool_[A-Za-z0-9_]+)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
SELECTOR_LABELS = re.compile(r"\{([^}]*)\}")
# Labels the scrape adds (Prometheus's target labels) and the histograms' own.
SCRAPE_LABELS = {"instance", "job", "le"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("", "_count", "_sum", "_created"), "info": ("_info",)}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(board: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, rows' nested panels included, and the variables' queries."""
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                found.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(board["panels"])
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append((f"${variable['name']}", query["query"] if isinstance(query, dict) else query))
    return found


def exposed(text: str) -> dict[str, set[str] | None]:
    """Every sample name a family of this exposition can have -> its label names, or None when the
    family has no samples in this scrape (its names come from its type, so a family with no samples
    yet still counts, by its TYPE line)."""
    names: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        labels = {label for sample in family.samples for label in sample.labels} if family.samples else None
        for suffix in SUFFIXES.get(family.type, ("",)):
            if names.get(family.name + suffix) is None:
                names[family.name + suffix] = labels
            elif labels is not None:
                names[family.name + suffix] |= labels
    return names


def used_metrics(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def grouping_labels(expr: str) -> set[str]:
    labels = set()
    for group in GROUPING.findall(expr):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    for selector in SELECTOR_LABELS.findall(expr):
        labels.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", selector))
    return labels


@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> dict[str, set[str] | None]:
    """A live embedded service's /metrics after a load, requests, a refusal and an unload, so that
    every labelled family has samples (their label names are checked) as far as a stub can make them."""
    from tests.conftest import LiveService, write_settings

    folder = tmp_path_factory.mktemp("grafana")
    # "m" runs in an engine process, so the per-replica process figures have samples too.
    models = {"m": {"backend": "stub", "stub_reply": "a b c", "isolation": "process", "stub_vram_mib": 64},
              "u": {"backend": "stub"}}
    service = LiveService(write_settings(folder, models), folder / "db.sqlite3").start()
    try:
        with service.client() as http:
            assert http.post("/v1/admin/models/m/load").json()["runtime_state"] == "loaded"
            assert http.post("/v1/responses", json={"model": "m", "input": "x"}).status_code == 200
            assert http.post("/v1/responses", json={"model": "u", "input": "x"}).status_code == 409
            assert http.post("/v1/admin/models/u/load").json()["runtime_state"] == "loaded"
            assert http.post("/v1/admin/models/u/unload").json()["runtime_state"] == "unloaded"
            answer = http.get("/metrics")
            assert answer.status_code == 200
            return exposed(answer.text)
    finally:
        assert service.stop() == 0


def test_the_dashboard_is_a_grafana_dashboard_model():
    board = dashboard()
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    ids = []

    def walk(panels):
        for panel in panels:
            ids.append(panel["id"])
            assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
            assert 0 <= panel["gridPos"]["x"] and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
                assert panel["targets"], panel["title"]
                refs = [target["refId"] for target in panel["targets"]]
                assert len(refs) == len(set(refs)), panel["title"]
            walk(panel.get("panels", []))

    walk(board["panels"])
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert {"datasource", "model"} <= {variable["name"] for variable in board["templating"]["list"]}


def test_every_metric_the_dashboard_queries_is_exposed(scraped):
    missing = []
    for title, expr in expressions(dashboard()):
        metrics = used_metrics(expr)
        assert metrics, f"{title!r} queries no llmpool_ metric: {expr}"
        missing += [f"{title!r}: {name}" for name in sorted(metrics) if name not in scraped]
    assert not missing, "the dashboard queries metrics /metrics does not expose:\n" + "\n".join(missing)


def test_every_label_the_dashboard_groups_or_filters_by_exists(scraped):
    """Checked against the labels of the scrape's samples; a family with none in this scrape (the
    GPU and managed-server gauges on a stub) is checked by name only."""
    wrong = []
    for title, expr in expressions(dashboard()):
        sampled = [scraped[name] for name in used_metrics(expr) if scraped.get(name) is not None]
        if not sampled:
            continue
        known = SCRAPE_LABELS.union(*sampled)
        wrong += [f"{title!r}: {label}" for label in sorted(grouping_labels(expr) - known)]
    assert not wrong, "labels none of the expression's metrics carries:\n" + "\n".join(wrong)


def test_the_checks_catch_a_renamed_metric_and_label(scraped):
    """The two checks above would fail on a dashboard that drifted from /metrics."""
    assert "llmpool_requests_total" in scraped and "llmpool_request_total" not in scraped
    assert "llmpool_model_queue_depth" in scraped
    expr = 'sum by (modle) (rate(llmpool_output_token_total{model=~"$model"}[5m]))'
    assert used_metrics(expr) - set(scraped) == {"llmpool_output_token_total"}
    assert grouping_labels(expr) - SCRAPE_LABELS.union(scraped["llmpool_output_tokens_total"]) == {"modle"}


def test_observability_doc_links_the_dashboard():
    text = (ROOT / "docs" / "observability.md").read_text()
    assert "grafana/llmpool-dashboard.json" in text
