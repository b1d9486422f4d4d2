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
            execute_tool {skill}                (a skill call, nested calls inside; the owner's
                                                 verdict on it, as a gen_ai.guardrail.result event)

A human wait is never inside a span: a turn that paused is one `invoke_workflow` root per
run (from its start or a Continue to a pause or its end), all in the turn's one trace,
each linked to the run before; an agent still at work across a pause, or redelivered
after its worker died, is one `invoke_agent` span per piece, linked to the piece before;
a model call that failed and was retried is a failed `chat` span the next attempt links
to. Every span has a key, stable across processes (`workflow-1`, `agent-12-0`), from
which the exporter derives its id: a run exported at its pause and the next, exported
by another worker, link up.

`manage.py traces TURN` prints it; orchestration/reports/otel.py sends it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from orchestration.models import (AgentDispatch, Event, LLMCall, SkillApproval,
                                  SkillExecution, Turn)
from orchestration.records.catalogue import (AGENT_ATTEMPT,
                                             ORCHESTRATOR_LLM_RETRY,
                                             TURN_PAUSED, TURN_RESUMED)

INTERNAL, CLIENT = "INTERNAL", "CLIENT"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
PAUSED = "paused"  # how a run ended that a Continue or an approval may follow


@dataclass
class SpanEvent:
    name: str
    at: datetime
    attributes: dict


@dataclass
class Span:
    key: str  # unique in the turn, the same in every process (the exporter's span id)
    name: str
    start: datetime
    end: datetime
    attributes: dict
    kind: str = INTERNAL
    error: str = ""  # error.type, when it failed
    children: list[Span] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # keys of the spans this one follows
    events: list[SpanEvent] = field(default_factory=list)

    def walk(self, depth: int = 0):
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)


def capture_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() in ("1", "true", "yes")


def turn_trace(turn: Turn) -> list[Span]:
    """The turn's runs, each an `invoke_workflow` root (six queries, whatever its size).
    A paused turn's last run ended at the pause; a running turn's runs up to now."""
    records = _Records(turn)
    runs = records.runs
    return [records.run(number, start, end, ended_by, last=number == len(runs) - 1)
            for number, (start, end, ended_by) in enumerate(runs)]


def run_ended_by(root: Span) -> str:
    """"paused", or the turn's status if the run ended with the turn."""
    return root.attributes["assistant.turn.run.ended_by"]


class _Records:
    def __init__(self, turn: Turn):
        self.turn = turn
        self.common = {"gen_ai.conversation.id": str(turn.conversation_id)}
        self.dispatches = list(AgentDispatch.objects.filter(turn=turn).order_by("id"))
        self.calls = list(LLMCall.objects.filter(turn=turn).order_by("id"))
        self.executions = list(SkillExecution.objects.filter(dispatch__turn=turn).order_by("id"))
        self.approvals = {a.pk: a for a in SkillApproval.objects.filter(turn=turn).order_by("id")}
        self.marks = list(Event.objects.filter(turn=turn, type__in=(
            TURN_PAUSED, TURN_RESUMED, AGENT_ATTEMPT, ORCHESTRATOR_LLM_RETRY)).order_by("id").values_list(
            "pk", "type", "created_at", "dispatch_id", "payload"))
        self.end = turn.finished_at or timezone.now()
        # (the caller, a tool call's id) → when the model call that made it was asked
        self.tool_calls = {(call.dispatch_id, str(tool_call.get("id") or "")): _asked(call) for call in self.calls
                           for tool_call in (call.response or {}).get("tool_calls") or []}
        self._pieces: dict[int, list[tuple[datetime, datetime]]] = {}
        self.runs = self._runs()  # (start, end, how it ended), read by every agent's pieces

    # --- runs: the turn between its start or a resume and a pause or its end ----------------

    def _runs(self) -> list[tuple[datetime, datetime, str]]:
        runs, started = [], self.turn.started_at
        for _, type_, at, _, _ in self.marks:
            if type_ == TURN_PAUSED and started is not None:
                runs.append((started, at, PAUSED))
                started = None
            elif type_ == TURN_RESUMED and started is None:
                started = at
        if started is not None:
            runs.append((started, self.end, self.turn.status))
        return runs

    def run(self, number: int, start: datetime, end: datetime, ended_by: str, *, last: bool) -> Span:
        failed = "turn_failed" if last and self.turn.status == "failed" else ""
        back = [number - 1] if number else []
        orchestrator = Span(
            key=f"orchestrator-{number}", name="invoke_agent orchestrator", start=start, end=end,
            attributes=self.common | {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "orchestrator",
                                      "gen_ai.agent.id": f"turn-{self.turn.pk}-orchestrator"},
            error=failed, links=[f"orchestrator-{n}" for n in back],
        )
        orchestrator.children = self.steps(None, start, end) + self.continuing(None, start, end)
        return Span(
            key=f"workflow-{number}", name="invoke_workflow", start=start, end=end,
            attributes=self.common | {"gen_ai.operation.name": "invoke_workflow", "assistant.turn.id": self.turn.pk,
                                      "assistant.turn.number": self.turn.number,
                                      "assistant.turn.status": self.turn.status, "assistant.turn.run": number,
                                      "assistant.turn.run.ended_by": ended_by},
            error=failed, children=[orchestrator], links=[f"workflow-{n}" for n in back],
        )

    # --- a role's steps: model calls (and the failed attempts before them), then tools -------

    def steps(self, dispatch: AgentDispatch | None, start: datetime, end: datetime) -> list[Span]:
        """The model calls of the orchestrator (None) or of an agent begun in [start, end),
        each after its failed attempts and followed by the tools its answer called; a
        tool returns when the next call is made."""
        owner = dispatch.pk if dispatch else None
        mine = [c for c in self.calls if c.dispatch_id == owner]
        spans: list[Span] = []
        for i, call in enumerate(mine):
            asked = _asked(call)
            if not start <= asked < end:
                continue
            previous = mine[i - 1].created_at if i else start
            failed = self.failed_attempts(dispatch, previous, asked, call.model)
            spans += failed
            chat = self.chat(call, asked, call.created_at)
            chat.links = [failed[-1].key] if failed else []
            spans.append(chat)
            following = _asked(mine[i + 1]) if i + 1 < len(mine) else end
            for tool_call in (call.response or {}).get("tool_calls") or []:
                if (tool := self.tool(dispatch, tool_call, call.created_at,
                                      max(min(following, end), call.created_at), until=end)) is not None:
                    spans.append(tool)
        return spans + self.late_executions(dispatch, start, end)

    def late_executions(self, dispatch: AgentDispatch | None, start: datetime, end: datetime) -> list[Span]:
        """Skill calls asked for before `start` that ran in [start, end): an approved call
        runs in the run after the owner's answer, not in the one that asked."""
        if dispatch is None:
            return []
        spans = []
        for row in self.executions:
            call_id = row.tool_call_id.split("#", 1)[0]
            asked = self.tool_calls.get((dispatch.pk, call_id))
            if row.dispatch_id == dispatch.pk and row.parent_id is None and asked is not None and asked < start \
                    and start <= row.started_at < end:
                spans.append(self.execution(row, self.common | {"gen_ai.operation.name": "execute_tool",
                                                                "gen_ai.tool.call.id": call_id,
                                                                "gen_ai.tool.type": "function"}))
        return spans

    def failed_attempts(self, dispatch: AgentDispatch | None, after: datetime, before: datetime,
                        model: str) -> list[Span]:
        """The model calls that failed and were retried between two of the role's calls
        (the model of the call that then succeeded)."""
        spans: list[Span] = []
        for pk, type_, at, dispatch_id, payload in self.marks:
            mine = (type_ == ORCHESTRATOR_LLM_RETRY and dispatch is None) or (
                type_ == AGENT_ATTEMPT and dispatch is not None and dispatch_id == dispatch.pk and "retry" in payload)
            if not mine or not after <= at <= before:
                continue
            took = timedelta(milliseconds=payload.get("duration_ms") or 0)
            spans.append(Span(
                key=f"attempt-{pk}", name=f"chat {model}".strip(),
                kind=CLIENT, start=at - took, end=at, error=_error_type(payload.get("reason", "")),
                attributes=self.common | {"gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(),
                                          "gen_ai.request.model": model,
                                          "assistant.retry": payload.get("retry")},
                links=[spans[-1].key] if spans else [],
            ))
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
        return Span(key=f"chat-{call.pk}", name=f"chat {model}".strip(), kind=CLIENT, start=start, end=end,
                    attributes=attributes)

    def tool(self, dispatch: AgentDispatch | None, tool_call: dict, start: datetime, end: datetime, *,
             until: datetime) -> Span | None:
        """A tool call; `dispatch_agent`'s holds the pieces of the agents it created that
        began before `until` (the end of its run or of its caller's piece). None for a
        skill call that ran after `until` (late_executions places it)."""
        call_id, name = str(tool_call.get("id") or ""), str(tool_call.get("name") or "")
        attributes = self.common | {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": call_id,
                                    "gen_ai.tool.type": "function"}
        owner = dispatch.pk if dispatch else None
        if name == "use_skill" and dispatch is not None:
            row = next((e for e in self.executions if e.dispatch_id == dispatch.pk and e.parent_id is None
                        and (e.tool_call_id == call_id or e.tool_call_id.startswith(f"{call_id}#"))), None)
            if row is not None:
                return self.execution(row, attributes) if row.started_at < until else None
        span = Span(key=f"tool-{owner or 0}-{call_id}", name=f"execute_tool {name}", start=start, end=end,
                    attributes=attributes | {"gen_ai.tool.name": name})
        if name == "dispatch_agent":
            for created in self.dispatches:
                if created.tool_call_id == call_id and created.parent_id == owner:
                    span.children += self.agent_pieces(created, start, until)
        return span

    def execution(self, row: SkillExecution, attributes: dict) -> Span:
        started = row.started_at
        ended = row.finished_at or self.turn.finished_at or timezone.now()
        failed = row.status != "completed" and row.status != "running"
        kind = (row.result or {}).get("error_kind", row.status) if isinstance(row.result, dict) else row.status
        span = Span(key=f"execution-{row.pk}", name=f"execute_tool {row.skill}", start=started,
                    end=max(ended, started),
                    attributes=attributes | {"gen_ai.tool.name": row.skill, "gen_ai.tool.call.id": row.tool_call_id,
                                             "assistant.skill.status": row.status},
                    error=str(kind) if failed else "")
        span.events = [self.guardrail(a) for a in self._approvals_of(row)]
        span.children = [self.execution(child, self.common | {"gen_ai.operation.name": "execute_tool",
                                                               "gen_ai.tool.type": "function"})
                          for child in self.executions if child.parent_id == row.pk]
        return span

    def _approvals_of(self, row: SkillExecution) -> list[SkillApproval]:
        clearance = row.clearance or {}
        ids = {clearance.get("approval_id"), (clearance.get("in_doubt") or {}).get("approval_id")}
        return [a for a in self.approvals.values() if a.pk in ids or (a.in_doubt and a.execution_id == row.pk)]

    def guardrail(self, approval: SkillApproval) -> SpanEvent:
        """The owner's verdict on the call, as the conventions' `gen_ai.guardrail.result`
        event of a dedicated in-process guardrail, at the moment it was given (still
        pending: when it was asked): the wait for it is the pause between two runs, in no
        span, and the call it cleared runs after it, in the next run. Why it asked (the
        policy's words name recipients) only with content capture on."""
        attributes = {
            "gen_ai.guardrail.component.name": "owner approval" if not approval.in_doubt else "owner, call in doubt",
            # what made it ask: outside content had reached the call, or the skill's policy
            "gen_ai.guardrail.policy.id": "outside-content" if approval.outside else "skill-policy",
            "gen_ai.guardrail.source": "tool_input",
            "gen_ai.guardrail.result.type": "decision",
            "gen_ai.guardrail.result.value": approval.decision or "pending",
            "gen_ai.tool.name": approval.skill,
            "assistant.approval.id": approval.pk,
            "assistant.approval.asked_at": approval.created_at.isoformat(),
        }
        if capture_content():
            attributes["gen_ai.guardrail.result.reason"] = "; ".join(approval.reasons or [])
        return SpanEvent(name="gen_ai.guardrail.result", at=approval.decided_at or approval.created_at,
                         attributes=attributes)

    # --- agents: one span per piece (cut by the turn's pauses and by redeliveries) -----------

    def continuing(self, parent: AgentDispatch | None, start: datetime, end: datetime) -> list[Span]:
        """The pieces in [start, end) of agents created earlier (before a pause, or by an
        earlier piece of their parent), whose parent's tool span is in another run, or
        by a call the records do not hold."""
        owner = parent.pk if parent else None
        spans = []
        for created in self.dispatches:
            made_by = (owner, created.tool_call_id)
            if created.parent_id != owner or (created.created_at >= start and made_by in self.tool_calls):
                continue
            for span in self.agent_pieces(created, start, end):
                if span.attributes["assistant.agent.piece"] == 0 and made_by in self.tool_calls:
                    span.links = [f"tool-{owner or 0}-{created.tool_call_id}"]  # created before a pause
                spans.append(span)
        return spans

    def agent_pieces(self, dispatch: AgentDispatch, start: datetime, end: datetime) -> list[Span]:
        return [self.agent(dispatch, n, lo, hi) for n, (lo, hi) in enumerate(self.pieces(dispatch))
                if start <= lo < end]

    def pieces(self, dispatch: AgentDispatch) -> list[tuple[datetime, datetime]]:
        """The agent's life cut at the turn's pauses and where it was redelivered after a
        crash (its worker died or lost its lease mid-step)."""
        if dispatch.pk not in self._pieces:
            born = dispatch.started_at or dispatch.created_at
            died = max(dispatch.finished_at or dispatch.closed_at or self.end, born)
            cuts, crashes = [], 0  # a resume after a pause is not a crash: the run's edge cuts it
            for _, type_, at, dispatch_id, payload in self.marks:
                if type_ == AGENT_ATTEMPT and dispatch_id == dispatch.pk and payload.get("crashes", 0) > crashes:
                    crashes = payload["crashes"]
                    if born < at < died:
                        cuts.append(at)
            pieces = []
            for lo, hi, _ in self.runs:
                edges = [max(lo, born)] + [c for c in cuts if lo < c < hi] + [min(hi, died)]
                pieces += [(a, b) for a, b in zip(edges, edges[1:]) if a < b or (a == b == born)]
            self._pieces[dispatch.pk] = pieces or [(born, died)]
        return self._pieces[dispatch.pk]

    def agent(self, dispatch: AgentDispatch, number: int, start: datetime, end: datetime) -> Span:
        last = number == len(self.pieces(dispatch)) - 1
        span = Span(
            key=f"agent-{dispatch.pk}-{number}", name=f"invoke_agent {dispatch.agent_id}", start=start, end=end,
            attributes=self.common | {
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": dispatch.agent_id,
                "gen_ai.agent.id": f"dispatch-{dispatch.pk}", "gen_ai.request.model": dispatch.model,
                "assistant.agent.outcome": dispatch.outcome or dispatch.state, "assistant.agent.piece": number,
                "assistant.agent.crashes": dispatch.crashes, "assistant.agent.retries": dispatch.retries,
            },
            error=dispatch.outcome if last and dispatch.outcome not in ("", "completed", "budget_exceeded") else "",
            links=[f"agent-{dispatch.pk}-{number - 1}"] if number else [],
        )
        span.children = self.steps(dispatch, start, end) + self.continuing(dispatch, start, end)
        return span


def _asked(call: LLMCall) -> datetime:
    return call.created_at - timedelta(milliseconds=call.duration_ms)


def _error_type(reason: str) -> str:
    """A failed call's error.type: the provider's status ("503"), or what the client saw."""
    words = reason.split()
    status = next((w.strip(":,") for w in words if w.strip(":,").isdigit() and len(w.strip(":,")) == 3), "")
    return status or "llm_error"


def _provider() -> str:
    return "openai" if settings.ASSISTANT_LLM_PROVIDER == "openai" else str(settings.ASSISTANT_LLM_PROVIDER)


def span_lines(roots: list[Span]) -> list[str]:
    """The trees as text, one span a line: what `manage.py traces` prints."""
    lines = []
    for depth, span in (pair for root in roots for pair in root.walk()):
        took = (span.end - span.start).total_seconds()
        extra = [span.kind] if span.kind != INTERNAL else []
        attributes = span.attributes
        if "gen_ai.usage.input_tokens" in attributes:
            extra.append(f"in {attributes['gen_ai.usage.input_tokens']} out {attributes['gen_ai.usage.output_tokens']}")
        if attributes.get("gen_ai.tool.call.id"):
            extra.append(f"call {attributes['gen_ai.tool.call.id']}")
        if span.error:
            extra.append(f"error.type={span.error}")
        if span.links:
            extra.append(f"follows {', '.join(span.links)}")
        lines.append(f"{'  ' * depth}{span.name}  {took:.3f} s" + (f"  ({', '.join(extra)})" if extra else ""))
        for event in span.events:
            lines.append(f"{'  ' * (depth + 1)}· {event.name}: {event.attributes.get('gen_ai.guardrail.result.value')}"
                         f" ({event.attributes.get('gen_ai.guardrail.component.name')})")
    return lines
