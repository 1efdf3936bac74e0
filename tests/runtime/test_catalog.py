"""The one rule a model's name is resolved by (runtime.pool.catalog): a model's name is itself, an alias
is its model, any other name no model."""
from runtime.pool.catalog import adapter_bases, base_of, canonical_model, model_names

NAMES = model_names({"qwen": ["gpt-4o-mini", "qwen-latest"], "echo": []})


def test_a_models_name_means_itself_and_each_alias_its_model():
    assert [canonical_model(n, NAMES) for n in ("qwen", "gpt-4o-mini", "qwen-latest", "echo")] == [
        "qwen", "qwen", "qwen", "echo",
    ]


def test_any_other_name_means_no_model():
    assert canonical_model("nope", NAMES) is None
    assert canonical_model("QWEN", NAMES) is None  # names are exact
    assert canonical_model("", NAMES) is None
    assert canonical_model("qwen", {}) is None


def test_a_models_name_wins_over_an_alias_and_the_first_model_keeps_an_alias():
    """What the settings never allow, two nodes' records read a moment apart may say."""
    names = model_names({"a": ["b", "x"], "b": [], "c": ["x"]})
    assert (canonical_model("b", names), canonical_model("x", names)) == ("b", "a")


def test_a_pattern_alias_means_its_model_for_every_name_it_matches():
    """Claude Code asks for dated claude-* names: patterns land them on configured models."""
    names = model_names({"big": ["claude-*sonnet*", "claude-opus-*"], "small": ["claude-*haiku*"], "claude-x": []})
    assert canonical_model("claude-sonnet-4-5-20250929", names) == "big"
    assert canonical_model("claude-3-5-haiku-20241022", names) == "small"
    assert canonical_model("claude-opus-4-1", names) == "big"
    assert canonical_model("claude-x", names) == "claude-x"  # a model's own name before any pattern
    assert canonical_model("gpt-4o", names) is None
    assert canonical_model("Claude-3-haiku", names) is None  # patterns are exact about case too


def test_the_first_matching_pattern_in_the_settings_order_wins():
    names = model_names({"a": ["claude-*"], "b": ["claude-*haiku*"]})
    assert canonical_model("claude-3-haiku", names) == "a"


def test_an_adapters_id_and_its_aliases_mean_the_adapter_on_its_base():
    adapters = {"qwen": {"sql": ["qwen-sql"], "poet": []}, "echo": {}}
    names = model_names({"qwen": ["gpt-4o-mini"], "echo": []}, adapters)
    bases = adapter_bases({"qwen": ["sql", "poet"], "echo": []})
    assert [canonical_model(n, names) for n in ("qwen:sql", "qwen-sql", "qwen:poet", "qwen")] == [
        "qwen:sql", "qwen:sql", "qwen:poet", "qwen",
    ]
    assert canonical_model("echo:sql", names) is None  # another model's adapter is no model
    assert [base_of(m, bases) for m in ("qwen:sql", "qwen:poet", "qwen", "gpt-4o-mini")] == [
        ("qwen", "sql"), ("qwen", "poet"), ("qwen", None), ("gpt-4o-mini", None),
    ]
