"""The one rule a model's name is resolved by (runtime.pool.catalog): a model's name is itself, an alias
is its model, any other name no model."""
from runtime.pool.catalog import canonical_model, model_names

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
