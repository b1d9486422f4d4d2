"""The audit tree of a turn or a conversation, as plain JSON-ready dicts (selectors)."""

from __future__ import annotations

import json

from django.utils import timezone

from orchestration.budgets.limits import Limits
from orchestration.budgets.usage import TurnSpend, conversation_spend, turn_spend
from orchestration.models import AgentDispatch, Conversation, Turn
from orchestration.questions.pauses import pause_answer, pause_label


def _iso(value):
    """In the active time zone (the viewer's on a page, the owner's in `manage.py ask`),
    with its offset: the same instant, on the reader's clock."""
    return timezone.localtime(value).isoformat() if value else None


def execution_tree(executions: list, parent_id=None) -> list[dict]:
    return [
        {
            "id": e.pk, "skill": e.skill, "status": e.status, "tool_call_id": e.tool_call_id,
            "arguments": e.arguments, "result": e.result, "error": e.error, "duration_ms": e.duration_ms,
            "clearance": e.clearance, "outside": e.outside,
            "started_at": _iso(e.started_at), "finished_at": _iso(e.finished_at),
            "sent_at": _iso(e.sent_at),  # a call to another system (MCP): when it was sent
            "children": execution_tree(executions, e.pk),
        }
        for e in executions
        if e.parent_id == parent_id
    ]


def dispatch_tree(dispatches: list[AgentDispatch], spend: TurnSpend, parent_id=None) -> list[dict]:
    """Each dispatch with its own usage and cost, and (`usage_with_children`) with those of
    the agents it delegated to, theirs included."""
    return [
        {
            "id": d.pk, "agent_id": d.agent_id, "state": d.state, "outcome": d.outcome,
            "profile": d.profile_name, "profile_version": d.profile_version, "model": d.model,
            "mission": d.mission, "skills": d.skills, "depends_on": d.depends_on,
            "close_reason": d.close_reason, "result": d.result, "error": d.error,
            "tool_calls_used": d.tool_calls_used, "max_tool_calls": d.max_tool_calls,
            "crashes": d.crashes, "retries": d.retries, "contract": d.contract,
            "usage": spend.agent(d.pk).to_json(), "usage_with_children": spend.agent_total(d.pk).to_json(),
            "created_at": _iso(d.created_at), "started_at": _iso(d.started_at),
            "finished_at": _iso(d.finished_at), "closed_at": _iso(d.closed_at), "duration_ms": d.duration_ms,
            "skill_executions": execution_tree(list(d.skill_executions.all())),
            "children": dispatch_tree(dispatches, spend, d.pk),
        }
        for d in dispatches
        if d.parent_id == parent_id
    ]


# A request planned from the catalogue in the orchestrator's prompt: dispatch, results,
# answer (one more when it looks a domain's schemas up, or answers without agents: fewer).
TYPICAL_ORCHESTRATOR_CALLS = 3


def turn_audit(turn: Turn) -> dict:
    """The turn's tree; `usage` is the whole turn's (the orchestrator's and every agent's
    model calls), costs as exact decimal strings, null where no call had a price."""
    dispatches = list(turn.dispatches.prefetch_related("skill_executions"))
    spend = turn_spend(turn, dispatches)
    return {
        "id": turn.pk, "number": turn.number, "status": turn.status, "error": turn.error,
        "started_at": _iso(turn.started_at), "finished_at": _iso(turn.finished_at),
        "limits": turn.limits, "continuations": turn.continuations,
        "forked_from": {"turn": turn.forked_from_id, "at": turn.forked_at} if turn.forked_from_id else None,
        # Past the retention window (manage.py prune): what the turn held, its transcript gone.
        "pruned_at": _iso(turn.pruned_at), "tombstone": turn.tombstone or None,
        "counters": {"agents": turn.agents_dispatched, "skill_calls": turn.skill_calls,
                     "llm_iterations": turn.llm_iterations,
                     "llm_iterations_allowed": Limits.from_json(turn.limits).turn_max_llm_iterations,
                     "llm_iterations_typical": TYPICAL_ORCHESTRATOR_CALLS},
        "usage": spend.total.to_json(), "orchestrator_usage": spend.orchestrator.to_json(),
        "pauses": [
            {"limit": p.limit, "label": pause_label(p), "tripped_at": _iso(p.tripped_at), "detail": p.detail,
             "decision": p.decision, "answer": pause_answer(p),
             "decided_by": p.decided_by.get_username() if p.decided_by else None, "decided_at": _iso(p.decided_at)}
            for p in turn.pauses.select_related("decided_by", "approval")
        ],
        "dispatches": dispatch_tree(dispatches, spend),
        "events": [
            {"id": e.pk, "type": e.type, "summary": e.summary, "dispatch": e.dispatch_id,
             "created_at": _iso(e.created_at), "payload": e.payload}
            for e in turn.events.all()
        ],
    }


def conversation_audit(conversation: Conversation) -> dict:
    return {
        "id": conversation.pk, "title": conversation.title, "owner": conversation.owner.get_username(),
        "created_at": _iso(conversation.created_at),
        "usage": conversation_spend(conversation).to_json(),
        "messages": [
            {"seq": m.seq, "role": m.role, "content": m.content, "tool_calls": m.tool_calls,
             "tool_call_id": m.tool_call_id, "turn": m.turn_id, "created_at": _iso(m.created_at)}
            for m in conversation.messages.all()
        ],
        "turns": [turn_audit(turn) for turn in conversation.turns.all()],
    }


def conversation_audit_json(conversation: Conversation) -> str:
    """The export `manage.py audit --json` prints (and `manage.py prune --export` writes)."""
    return json.dumps(conversation_audit(conversation), indent=2, default=str)
