"""The lifecycle tables the code checks are the ones docs/engine.md shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestration.lifecycle import dispatches as lifecycle
from orchestration.models import DispatchState, TurnStatus
from tests.factories import conversation_for, dispatch_for, turn_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
ROW = re.compile(r"^\| ([a-z_]+) \| ([a-z_]+) \|", re.M)


def documented(heading: str) -> set[tuple[str, str]]:
    section = DOC.read_text().split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    return set(ROW.findall(section)) - {("from", "to")}


def test_the_agent_table_is_the_documented_one():
    assert {(str(a), str(b)) for a, b in lifecycle.AGENT_TRANSITIONS} == documented("An agent")


def test_the_turn_table_is_the_documented_one():
    assert {(str(a), str(b)) for a, b in lifecycle.TURN_TRANSITIONS} == documented("A turn")


@pytest.mark.django_db
def test_a_move_outside_the_table_is_refused_before_it_is_written(alice):
    turn = turn_for(conversation_for(alice), status=TurnStatus.COMPLETED)
    dispatch = dispatch_for(turn, "a1", state=DispatchState.CLOSED)
    with pytest.raises(ValueError, match="not in the lifecycle table"):
        lifecycle.transition(dispatch.pk, source=DispatchState.CLOSED, target=DispatchState.RUNNING)
    with pytest.raises(ValueError, match="not in the lifecycle table"):
        lifecycle.turn_move(turn.pk, source=TurnStatus.COMPLETED, target=TurnStatus.RUNNING)
    dispatch.refresh_from_db()
    turn.refresh_from_db()
    assert (dispatch.state, turn.status) == (DispatchState.CLOSED, TurnStatus.COMPLETED)
