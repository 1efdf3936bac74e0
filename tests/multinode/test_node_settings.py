"""A model's ``node`` field: which node's runtime serves it, and its validation (with codes)."""
from __future__ import annotations

import pytest

from runtime.config import load_settings
from runtime.errors import InvalidSettings
from tests.conftest import write_settings

MODELS = {
    "everywhere": {"backend": "stub"},
    "alpha-only": {"backend": "stub", "node": "alpha"},
    "alpha-or-beta": {"backend": "stub", "node": ["alpha", "beta"]},
    "beta-only": {"backend": "stub", "node": ["beta"]},
}


def test_each_node_gets_the_models_whose_node_includes_it(tmp_path):
    path = str(write_settings(tmp_path, MODELS))
    assert set(load_settings(path, "alpha").settings.models) == {"everywhere", "alpha-only", "alpha-or-beta"}
    assert set(load_settings(path, "beta").settings.models) == {"everywhere", "alpha-or-beta", "beta-only"}
    assert set(load_settings(path, "gamma").settings.models) == {"everywhere"}
    loaded = load_settings(path)  # no node named (the embedded shape): every model
    assert set(loaded.settings.models) == set(MODELS)
    assert loaded.model_nodes == {"everywhere": None, "alpha-only": ["alpha"], "alpha-or-beta": ["alpha", "beta"],
                                  "beta-only": ["beta"]}


def test_a_swap_group_is_kept_with_its_node(tmp_path):
    models = {"g1": {"backend": "stub", "node": "alpha"}, "g2": {"backend": "stub", "node": "alpha"}}
    path = str(write_settings(tmp_path, models))
    (tmp_path / "local.json").write_text('{"groups": {"pair": {"members": ["g1", "g2"]}}}')
    assert set(load_settings(path, "alpha").settings.groups) == {"pair"}
    assert load_settings(path, "beta").settings.groups == {}


@pytest.mark.parametrize("value, where", [
    ("", "$.models.m.node"),
    ([], "$.models.m.node"),
    ("has space", "$.models.m.node"),
    (["alpha", 3], "$.models.m.node[1]"),
    (["alpha", "alpha"], "$.models.m.node"),
    (7, "$.models.m.node"),
])
def test_a_bad_node_is_refused_with_its_path_and_code(tmp_path, value, where):
    path = str(write_settings(tmp_path, {"m": {"backend": "stub", "node": value}}))
    with pytest.raises(InvalidSettings) as raised:
        load_settings(path, "alpha")
    assert raised.value.details == [{"path": where, "code": "node_invalid", "message": raised.value.details[0]["message"]}]
    assert where in raised.value.message


def test_a_swap_group_over_two_nodes_is_refused(tmp_path):
    models = {"g1": {"backend": "stub", "node": "alpha"}, "g2": {"backend": "stub", "node": "beta"}}
    path = str(write_settings(tmp_path, models))
    (tmp_path / "local.json").write_text('{"groups": {"pair": {"members": ["g1", "g2"]}}}')
    with pytest.raises(InvalidSettings) as raised:
        load_settings(path)
    assert [(p["path"], p["code"]) for p in raised.value.details] == [("$.groups.pair.members[1]", "node_group_split")]


def test_a_node_set_in_local_json_wins(tmp_path):
    path = str(write_settings(tmp_path, {"m": {"backend": "stub", "node": "alpha"}}, local={"models": {"m": {"node": "beta"}}}))
    assert set(load_settings(path, "beta").settings.models) == {"m"}
    assert load_settings(path, "alpha").settings.models == {}
