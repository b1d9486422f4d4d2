"""Checks that must hold after any engine run, whatever the test did to it."""

from __future__ import annotations

from orchestration.models import ACTIVE_TURN_STATUSES, AgentDispatch, DispatchState


def assert_ended_turns_closed() -> None:
    """A turn that ended, in any way, has closed every dispatch (DESIGN.md §4)."""
    open_ = AgentDispatch.objects.exclude(turn__status__in=ACTIVE_TURN_STATUSES).exclude(state=DispatchState.CLOSED)
    assert not open_.exists(), [(d.agent_id, d.state, d.turn.status) for d in open_.select_related("turn")]
