import pytest

from runtime.model.state import TRANSITIONS, IllegalTransition, RuntimeState, StateMachine

S = RuntimeState


def test_every_state_has_an_entry_in_the_table():
    assert set(TRANSITIONS) == set(RuntimeState)


@pytest.mark.parametrize(
    "old,new",
    [(S.UNLOADED, S.LOADED), (S.UNLOADED, S.UNLOADING), (S.LOADING, S.UNLOADING), (S.FAILED, S.LOADED),
     (S.UNLOADING, S.LOADED), (S.LOADED, S.LOADING)],
)
def test_illegal_moves_raise_and_change_nothing(old, new):
    machine = StateMachine("m")
    machine.state = old
    with pytest.raises(IllegalTransition):
        machine.transition(old, new)
    assert machine.state is old


def test_expected_state_must_match_the_current_one():
    machine = StateMachine("m")
    with pytest.raises(IllegalTransition):
        machine.transition(S.FAILED, S.LOADING)
    assert machine.state is S.UNLOADED


def test_legal_moves_emit_one_event_each():
    seen = []
    machine = StateMachine("m", [seen.append])
    machine.transition(S.UNLOADED, S.LOADING)
    machine.transition(S.LOADING, S.LOADED)
    machine.transition(S.LOADED, S.UNLOADING)
    machine.transition(S.UNLOADING, S.UNLOADED)
    assert [(e.old, e.new) for e in seen] == [
        (S.UNLOADED, S.LOADING), (S.LOADING, S.LOADED), (S.LOADED, S.UNLOADING), (S.UNLOADING, S.UNLOADED)
    ]
