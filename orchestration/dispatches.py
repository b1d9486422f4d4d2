"""Sub-agent lifecycle and the DAG scheduler (DESIGN.md §4).

`created → running → waiting_for_merge → completed | failed → closed`, and
`skipped` / `cancelled` straight to `closed`. Every transition is a conditional UPDATE
and writes its event in the same transaction. Whenever a dispatch reaches a terminal
state, `dispatch_settle` runs with the turn row locked: it skips the dependents of a
failure, starts dependents that became ready, and wakes the waiting orchestrator once
everything it waits for is terminal — under the lock, so no wake-up is ever lost.
"""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from orchestration.events import event_record
from orchestration.models import AgentDispatch, DispatchOutcome, DispatchState, Turn, TurnStatus
from orchestration.tasks import enqueue_orchestrator_step, enqueue_subagents

# Terminal from the orchestrator's point of view: the agent will not work any more.
TERMINAL_STATES = frozenset(
    {
        DispatchState.WAITING_FOR_MERGE,
        DispatchState.COMPLETED,
        DispatchState.FAILED,
        DispatchState.SKIPPED,
        DispatchState.CANCELLED,
        DispatchState.CLOSED,
    }
)
SUCCESS_OUTCOMES = frozenset({DispatchOutcome.COMPLETED, DispatchOutcome.BUDGET_EXCEEDED})


def is_terminal(dispatch: AgentDispatch) -> bool:
    return dispatch.state in TERMINAL_STATES


def succeeded(dispatch: AgentDispatch) -> bool:
    return is_terminal(dispatch) and dispatch.outcome in SUCCESS_OUTCOMES


def result_status(dispatch: AgentDispatch) -> str:
    """The status get_agent_results reports (budget_exceeded counts as completed)."""
    if dispatch.outcome in SUCCESS_OUTCOMES:
        return "completed"
    return dispatch.outcome or dispatch.state


def lock_turn(turn_id: int) -> Turn:
    """Serialise the turn's scheduling decisions on its row.

    FOR NO KEY UPDATE of the turn row only: inserting an Event (or any row pointing at the
    turn or the conversation) takes a KEY SHARE lock on them, which a plain FOR UPDATE —
    or locking the joined conversation too — would conflict with, in the opposite order:
    a deadlock on PostgreSQL.
    """
    return (
        Turn.objects.select_for_update(no_key=True, of=("self",))
        .select_related("conversation")
        .get(pk=turn_id)
    )


def dispatch_start_ready(turn: Turn) -> list[AgentDispatch]:
    """Enqueue every created dispatch whose dependencies all succeeded and, for a
    delegating agent waiting on its own agents, whose awaited agents are all terminal.

    A dispatch already queued and not yet claimed (`queued_at`) is not queued again: with
    fewer workers than agents, every agent that finished used to queue all its waiting
    siblings once more — duplicate tasks that cost a worker a claim each, O(agents²) per
    turn. A task lost with its cluster is the reaper's (reaper._requeue_unclaimed)."""
    if turn.status not in (TurnStatus.RUNNING, TurnStatus.WAITING):
        return []
    dispatches = list(turn.dispatches.all())
    by_id = {d.agent_id: d for d in dispatches}

    def ready(d: AgentDispatch) -> bool:
        awaited = (d.awaiting or {}).get("agent_ids") or []
        return (
            d.state == DispatchState.CREATED
            and d.queued_at is None
            and all(dep in by_id and succeeded(by_id[dep]) for dep in d.depends_on)
            and all(name not in by_id or is_terminal(by_id[name]) for name in awaited)
        )

    started = [d for d in dispatches if ready(d)]
    if started:
        enqueue_subagents([d.pk for d in started])
    return started


def _transitive_dependents(dispatches: list[AgentDispatch], failed_id: str) -> list[AgentDispatch]:
    found: list[AgentDispatch] = []
    frontier = {failed_id}
    while frontier:
        layer = [d for d in dispatches if frontier & set(d.depends_on) and d not in found]
        found.extend(layer)
        frontier = {d.agent_id for d in layer}
    return found


def dispatch_close(dispatch: AgentDispatch, *, outcome: str, reason: str) -> bool:
    """Move a never-started dispatch straight to closed (skipped or cancelled)."""
    now = timezone.now()
    state = DispatchState.SKIPPED if outcome == DispatchOutcome.SKIPPED else DispatchState.CANCELLED
    updated = AgentDispatch.objects.filter(
        pk=dispatch.pk, state__in=[DispatchState.CREATED, DispatchState.RUNNING]
    ).update(
        state=DispatchState.CLOSED, outcome=outcome, close_reason=reason[:300],
        result=reason, finished_at=now, closed_at=now, lease_token="",
    )
    if updated:
        _closed_event(dispatch, summary=f"{dispatch.agent_id} {state}: {reason}", final="failed",
                      close_reason=str(state), detail=reason)
    return bool(updated)


def _closed_event(dispatch: AgentDispatch, *, summary: str, final: str, close_reason: str, **extra) -> None:
    """`agent.subagent_closed`, the last event of every sub-agent (DESIGN.md §4)."""
    event_record(
        type="agent.subagent_closed",
        dispatch=dispatch,
        summary=summary,
        payload={
            "sub_agent_id": dispatch.agent_id,
            "step_idx": dispatch.contract.get("parent", {}).get("step_idx", 0),
            "final_status": final,
            "close_reason": close_reason,
            **extra,
        },
    )


def dispatch_settle(*, turn_id: int, dispatch_id: int) -> None:
    """After a dispatch became terminal: skip, start, wake (call inside a transaction)."""
    turn = lock_turn(turn_id)
    dispatch = AgentDispatch.objects.get(pk=dispatch_id)
    if is_terminal(dispatch):
        # A nested agent reports to its parent only: once the parent is done, nobody
        # will read what its still-open agents produce.
        for child in _open_descendants(dispatch):
            dispatch_close(child, outcome=DispatchOutcome.CANCELLED,
                           reason=f"cancelled: its parent {dispatch.agent_id} finished first")
    dispatches = list(turn.dispatches.all())
    if is_terminal(dispatch) and not succeeded(dispatch):
        for dependent in _transitive_dependents(dispatches, dispatch.agent_id):
            if dependent.state == DispatchState.CREATED:
                dispatch_close(
                    dependent,
                    outcome=DispatchOutcome.SKIPPED,
                    reason=f"dependency {dispatch.agent_id} {result_status(dispatch)}",
                )
    dispatch_start_ready(turn)
    orchestrator_wake_if_ready(turn)


def _open_descendants(dispatch: AgentDispatch) -> list[AgentDispatch]:
    found: list[AgentDispatch] = []
    layer = [dispatch.pk]
    while layer:
        children = list(AgentDispatch.objects.filter(parent_id__in=layer))
        found.extend(c for c in children if c.state in (DispatchState.CREATED, DispatchState.RUNNING))
        layer = [c.pk for c in children]
    return found


def orchestrator_wake_if_ready(turn: Turn) -> bool:
    """If the orchestrator waits and every awaited agent is terminal, wake it once."""
    if turn.status != TurnStatus.WAITING:
        return False
    awaited = set(turn.awaiting.get("agent_ids") or [])
    pending = turn.dispatches.filter(agent_id__in=awaited).exclude(state__in=TERMINAL_STATES)
    if pending.exists():
        return False
    if Turn.objects.filter(pk=turn.pk, status=TurnStatus.WAITING).update(status=TurnStatus.RUNNING):
        enqueue_orchestrator_step(turn.pk)
        return True
    return False


def dispatch_merge(dispatch: AgentDispatch) -> None:
    """The orchestrator consumed the result: waiting_for_merge/failed → closed."""
    if dispatch.state not in (DispatchState.WAITING_FOR_MERGE, DispatchState.FAILED):
        return
    now = timezone.now()
    final = "completed" if dispatch.state == DispatchState.WAITING_FOR_MERGE else "failed"
    reason = "merged" if final == "completed" else (dispatch.outcome or "failed")
    updated = AgentDispatch.objects.filter(pk=dispatch.pk, state=dispatch.state).update(
        state=DispatchState.CLOSED, close_reason=reason, closed_at=now
    )
    if updated:
        _closed_event(dispatch, summary=f"{dispatch.agent_id} closed ({final})", final=final, close_reason=reason)


def dispatch_results_collect(names: list[str], found: dict[str, AgentDispatch]) -> dict:
    """get_agent_results' answer for terminal agents (DESIGN.md §3); reading a result
    merges it (waiting_for_merge/failed → closed). Call with the turn locked."""
    agents = []
    for name in names:
        dispatch = found.get(name)
        if dispatch is None:
            agents.append({"agent_id": name, "status": "not_found"})
            continue
        agents.append(
            {
                "agent_id": name,
                "status": result_status(dispatch),
                "result": dispatch.result,
                "tool_calls_used": dispatch.tool_calls_used,
                "duration_ms": dispatch.duration_ms,
            }
        )
        dispatch_merge(dispatch)
    return {"agents": agents}


def dispatch_cancel_open(turn: Turn, *, reason: str) -> int:
    """Cancel every dispatch of the turn that has not finished (stop, or turn over)."""
    cancelled = 0
    for dispatch in turn.dispatches.filter(state__in=[DispatchState.CREATED, DispatchState.RUNNING]):
        cancelled += dispatch_close(dispatch, outcome=DispatchOutcome.CANCELLED, reason=reason)
    return cancelled


def turn_counter_add(turn_id: int, **amounts: int) -> None:
    Turn.objects.filter(pk=turn_id).update(**{k: F(k) + v for k, v in amounts.items() if v})
