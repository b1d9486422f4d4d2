"""A turn as the span tree the OpenTelemetry GenAI conventions describe, from its records.

The spans are built from what the engine stored (the turn, its dispatches, every model
response, every skill execution, every approval), not from timers running beside the
engine: they agree with the audit by construction, cost nothing while the turn runs,
and come out the same whichever workers and machines did the work. Across the queue
hop, a sub-agent is the child of the `dispatch_agent` tool call that created it (its
dispatch keeps that call's id), a nested agent of its parent's.

    invoke_workflow turn                        (INTERNAL)
      invoke_agent orchestrator                 (INTERNAL)
        chat {model}                            (CLIENT, one per model response)
        execute_tool dispatch_agent             (INTERNAL)
          invoke_agent {agent_id}               (INTERNAL)
            chat {model}
            execute_tool {skill}                (a skill call, nested calls inside)
              run_guardrail approval            (the owner's approval or a call in doubt)

`manage.py traces TURN` prints it; orchestration/reports/otel.py sends it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from orchestration.models import (AgentDispatch, LLMCall, SkillApproval,
                                  SkillExecution, Turn)

INTERNAL, CLIENT = "INTERNAL", "CLIENT"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@dataclass
class Span:
    name: str
    start: datetime
    end: datetime
    attributes: dict
    kind: str = INTERNAL
    error: str = ""  # error.type, when it failed
    children: list[Span] = field(default_factory=list)

    def walk(self, depth: int = 0):
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)


def capture_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() in ("1", "true", "yes")


def turn_trace(turn: Turn) -> Span:
    """The turn's span tree (five queries, whatever its size)."""
    records = _Records(turn)
    end = turn.finished_at or timezone.now()
    common = {"gen_ai.conversation.id": str(turn.conversation_id)}
    orchestrator = Span(
        name="invoke_agent orchestrator", start=turn.started_at, end=end,
        attributes=common | {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "orchestrator",
                             "gen_ai.agent.id": f"turn-{turn.pk}-orchestrator"},
        error="turn_failed" if turn.status == "failed" else "",
    )
    orchestrator.children = records.steps(None, end)
    return Span(
        name="invoke_workflow", start=turn.started_at, end=end,
        attributes=common | {"gen_ai.operation.name": "invoke_workflow", "assistant.turn.id": turn.pk,
                             "assistant.turn.number": turn.number, "assistant.turn.status": turn.status},
        error=orchestrator.error, children=[orchestrator],
    )


class _Records:
    def __init__(self, turn: Turn):
        self.turn = turn
        self.common = {"gen_ai.conversation.id": str(turn.conversation_id)}
        self.dispatches = list(AgentDispatch.objects.filter(turn=turn).order_by("id"))
        self.calls = list(LLMCall.objects.filter(turn=turn).order_by("id"))
        self.executions = list(SkillExecution.objects.filter(dispatch__turn=turn).order_by("id"))
        self.approvals = {a.pk: a for a in SkillApproval.objects.filter(turn=turn).order_by("id")}

    def steps(self, dispatch: AgentDispatch | None, end: datetime) -> list[Span]:
        """The model calls of the orchestrator (None) or of an agent, each followed by the
        tools its answer called; a tool returns when the next call is made."""
        mine = [c for c in self.calls if c.dispatch_id == (dispatch.pk if dispatch else None)]
        spans: list[Span] = []
        for i, call in enumerate(mine):
            answered = call.created_at
            started = answered - timedelta(milliseconds=call.duration_ms)
            spans.append(self.chat(call, started, answered))
            following = mine[i + 1].created_at - timedelta(milliseconds=mine[i + 1].duration_ms) \
                if i + 1 < len(mine) else end
            for tool_call in (call.response or {}).get("tool_calls") or []:
                spans.append(self.tool(dispatch, tool_call, answered, max(following, answered)))
        return spans

    def chat(self, call: LLMCall, start: datetime, end: datetime) -> Span:
        response = call.response or {}
        model = call.model or response.get("model") or ""
        attributes = self.common | {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(),
            "gen_ai.request.model": model, "gen_ai.response.model": response.get("model") or model,
            "gen_ai.response.finish_reasons": [response.get("finish_reason") or "stop"],
            "gen_ai.usage.input_tokens": call.prompt_tokens, "gen_ai.usage.output_tokens": call.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": call.cached_tokens,
        }
        if capture_content():
            attributes["gen_ai.output.messages"] = json.dumps([{
                "role": "assistant", "parts": [{"type": "text", "content": response.get("content") or ""}] + [
                    {"type": "tool_call", "id": t.get("id"), "name": t.get("name"), "arguments": t.get("arguments")}
                    for t in response.get("tool_calls") or []],
                "finish_reason": response.get("finish_reason") or "stop"}])
        return Span(name=f"chat {model}".strip(), kind=CLIENT, start=start, end=end, attributes=attributes)

    def tool(self, dispatch: AgentDispatch | None, tool_call: dict, start: datetime, end: datetime) -> Span:
        call_id, name = str(tool_call.get("id") or ""), str(tool_call.get("name") or "")
        attributes = self.common | {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": call_id,
                                    "gen_ai.tool.type": "function"}
        if name == "use_skill" and dispatch is not None:
            row = next((e for e in self.executions if e.dispatch_id == dispatch.pk and e.parent_id is None
                        and (e.tool_call_id == call_id or e.tool_call_id.startswith(f"{call_id}#"))), None)
            if row is not None:
                return self.execution(row, attributes)
        span = Span(name=f"execute_tool {name}", start=start, end=end,
                    attributes=attributes | {"gen_ai.tool.name": name})
        if name == "dispatch_agent":
            span.children = [self.agent(d) for d in self.dispatches if d.tool_call_id == call_id
                             and d.parent_id == (dispatch.pk if dispatch else None)]
        return span

    def execution(self, row: SkillExecution, attributes: dict) -> Span:
        started = row.started_at
        ended = row.finished_at or self.turn.finished_at or timezone.now()
        failed = row.status != "completed" and row.status != "running"
        kind = (row.result or {}).get("error_kind", row.status) if isinstance(row.result, dict) else row.status
        span = Span(name=f"execute_tool {row.skill}", start=started, end=max(ended, started),
                    attributes=attributes | {"gen_ai.tool.name": row.skill, "gen_ai.tool.call.id": row.tool_call_id,
                                             "assistant.skill.status": row.status},
                    error=str(kind) if failed else "")
        span.children = [self.guardrail(a, row) for a in self._approvals_of(row)]
        span.children += [self.execution(child, self.common | {"gen_ai.operation.name": "execute_tool",
                                                               "gen_ai.tool.type": "function"})
                          for child in self.executions if child.parent_id == row.pk]
        return span

    def _approvals_of(self, row: SkillExecution) -> list[SkillApproval]:
        clearance = row.clearance or {}
        ids = {clearance.get("approval_id"), (clearance.get("in_doubt") or {}).get("approval_id")}
        return [a for a in self.approvals.values() if a.pk in ids or (a.in_doubt and a.execution_id == row.pk)]

    def guardrail(self, approval: SkillApproval, row: SkillExecution) -> Span:
        asked = approval.created_at
        answered = approval.decided_at or asked
        return Span(
            name="run_guardrail approval" if not approval.in_doubt else "run_guardrail in_doubt",
            start=asked, end=max(answered, asked),
            attributes=self.common | {
                "gen_ai.operation.name": "run_guardrail", "gen_ai.guardrail.name": f"owner {approval.kind}",
                "gen_ai.guardrail.decision": approval.decision or "pending", "gen_ai.tool.name": approval.skill,
                "assistant.approval.reasons": list(approval.reasons or []),
            },
        )

    def agent(self, dispatch: AgentDispatch) -> Span:
        start = dispatch.started_at or dispatch.created_at
        end = dispatch.finished_at or dispatch.closed_at or self.turn.finished_at or timezone.now()
        span = Span(
            name=f"invoke_agent {dispatch.agent_id}", start=start, end=max(end, start),
            attributes=self.common | {
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": dispatch.agent_id,
                "gen_ai.agent.id": f"dispatch-{dispatch.pk}", "gen_ai.request.model": dispatch.model,
                "assistant.agent.outcome": dispatch.outcome or dispatch.state,
                "assistant.agent.crashes": dispatch.crashes, "assistant.agent.retries": dispatch.retries,
            },
            error=dispatch.outcome if dispatch.outcome not in ("", "completed", "budget_exceeded") else "",
        )
        span.children = self.steps(dispatch, span.end)
        return span


def _provider() -> str:
    return "openai" if settings.ASSISTANT_LLM_PROVIDER == "openai" else str(settings.ASSISTANT_LLM_PROVIDER)


def span_lines(root: Span) -> list[str]:
    """The tree as text, one span a line: what `manage.py traces` prints."""
    lines = []
    for depth, span in root.walk():
        took = (span.end - span.start).total_seconds()
        extra = [span.kind] if span.kind != INTERNAL else []
        attributes = span.attributes
        if "gen_ai.usage.input_tokens" in attributes:
            extra.append(f"in {attributes['gen_ai.usage.input_tokens']} out {attributes['gen_ai.usage.output_tokens']}")
        if attributes.get("gen_ai.tool.call.id"):
            extra.append(f"call {attributes['gen_ai.tool.call.id']}")
        if attributes.get("gen_ai.guardrail.decision"):
            extra.append(attributes["gen_ai.guardrail.decision"])
        if span.error:
            extra.append(f"error.type={span.error}")
        lines.append(f"{'  ' * depth}{span.name}  {took:.3f} s" + (f"  ({', '.join(extra)})" if extra else ""))
    return lines
