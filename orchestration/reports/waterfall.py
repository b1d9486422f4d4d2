"""A turn as a waterfall: one row per agent on a shared time axis (selectors).

Built from the same stored events the timeline shows — an `orchestrator.llm_call` or
`agent.llm_call` event is written when its response arrives, with the call's
`duration_ms`, so its bar spans `created_at - duration_ms .. created_at`; a skill call
spans its `skill.started` to the matching `skill.finished` — plus the dispatches (nesting,
`depends_on`, state, error) and the usage roll-ups (tokens, cost). Positions are percents
of the axis, so the template lays bars out with `left`/`width` and needs no script.

Each dependency is an arrow drawn in the dependent row: down from the row's top edge at
the moment what it waited for finished (where that agent's bar, a row or more above, ends),
then along to the row's own start, labelled "after …". Rows wrap to different heights on a
phone, so an arrow spanning rows would need the browser's geometry; this one needs none.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from orchestration.budgets.usage import Spend
from orchestration.models import ACTIVE_TURN_STATUSES, AgentDispatch, DispatchOutcome, Event, SkillExecution, Turn
from orchestration.records.catalogue import (
    AGENT_ATTEMPT,
    AGENT_LLM_CALL,
    LLM_WAITING,
    ORCHESTRATOR_LLM_CALL,
    ORCHESTRATOR_LLM_RETRY,
    SKILL_FINISHED,
    SKILL_STARTED,
)
from orchestration.records.compiled import CompiledRead
from orchestration.records.output import json_unwrapped
from orchestration.reports.selectors import TurnAgents, awaiting_approval, display_state, turn_agents, turn_events
from skills.executor import ErrorKind

# A model call that failed and is retried: its retry's event (when the call began is not stored).
FAILED_MODEL_CALLS = (ORCHESTRATOR_LLM_RETRY, AGENT_ATTEMPT)
FAILED_AGENT_STATES = {DispatchOutcome.FAILED, DispatchOutcome.TIMEOUT}
MAX_TEXT = 4000  # of a request or result shown under a bar
MIN_SHOWN_WIDTH = 0.8  # percent of the axis


@dataclass
class Bar:
    """One call: a model call ("model"), a skill call ("skill"), or a model call's wait
    for the provider's rate limit ("wait", drawn on the model calls' line)."""

    kind: str
    label: str
    start: datetime
    end: datetime
    running: bool = False
    failed: bool = False
    declined: bool = False  # the owner said Deny: their word, not a failure
    reason: str = ""
    request: str = ""  # formatted: "key: value" lines or pretty JSON
    result: str = ""
    event_id: int = 0  # of the event that opened it: a stable id for the page
    left: float = 0.0  # percent of the axis
    width: float = 0.0
    critical: bool = False

    @property
    def duration_ms(self) -> int:
        return _ms(self.end - self.start)

    @property
    def duration(self) -> str:
        return duration_text(self.duration_ms)

    @property
    def shown_width(self) -> float:
        """Wide enough to see and to click: a refused call takes no time at all."""
        return max(self.width, MIN_SHOWN_WIDTH)

    @property
    def shown_left(self) -> float:
        return min(self.left, 100.0 - self.shown_width)


@dataclass
class Row:
    """The orchestrator (`dispatch` None) or one agent, indented by `depth`."""

    key: str
    label: str
    depth: int
    state: str
    start: datetime | None
    end: datetime | None
    spend: Spend
    dispatch: AgentDispatch | None = None
    bars: list[Bar] = field(default_factory=list)
    after: list[str] = field(default_factory=list)  # agent ids it depended on
    arrows: list[float] = field(default_factory=list)  # where each dependency finished (percent)
    failed: bool = False
    reason: str = ""
    failures: int = 0  # its own failed calls, and itself if it failed
    failures_with_children: int = 0
    critical: bool = False
    left: float = 0.0  # its span, from its start to its finish (or now)
    width: float = 0.0

    @property
    def duration_ms(self) -> int | None:
        if self.dispatch is not None and self.dispatch.duration_ms is not None:
            return self.dispatch.duration_ms
        return _ms(self.end - self.start) if self.start and self.end else None

    @property
    def duration(self) -> str:
        return duration_text(self.duration_ms)


@dataclass
class Waterfall:
    turn: Turn
    start: datetime
    end: datetime
    rows: list[Row]
    failures: int
    declined: int  # calls the owner denied
    critical_path: list[str]  # agent ids, first to last
    spend: Spend
    ticks: list[tuple[float, str]]  # (percent, label)

    @property
    def duration_ms(self) -> int:
        return _ms(self.end - self.start)

    @property
    def duration(self) -> str:
        return duration_text(self.duration_ms)


def duration_text(ms: int | None) -> str:
    """"350 ms", "4.2 s", "2 min 05 s"."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms // 1000 % 60:02d} s"


def _ms(delta: timedelta) -> int:
    return max(0, round(delta.total_seconds() * 1000))


def _text(value) -> str:
    """A payload value as people read it: strings as they are, the rest as pretty JSON."""
    if value in (None, "", [], {}):
        return ""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def _lines(*pairs: tuple[str, object]) -> str:
    return "\n".join(f"{key}: {_text(value)}" for key, value in pairs if _text(value))


def _tokens(usage: dict) -> str:
    usage = usage or {}
    return f"{usage.get('prompt_tokens', 0)} in, {usage.get('completion_tokens', 0)} out"


def _model_bar(event: Event) -> Bar:
    payload = event.payload or {}
    end = event.created_at
    start = end - timedelta(milliseconds=payload.get("duration_ms") or 0)
    if event.type == ORCHESTRATOR_LLM_CALL:
        label = f"call {payload.get('iteration', '')}".strip()
        calls = payload.get("tool_calls") or []
        result = "\n\n".join(filter(None, [
            _text(payload.get("content")),
            "\n\n".join(f"{c.get('name')} {_text(json_unwrapped(c.get('arguments')))}"
                         for c in calls if isinstance(c, dict)),
        ]))
    else:
        label = f"step {payload.get('step', '')}".strip()
        result = _lines(("skills", ", ".join(payload.get("tool_calls") or [])))
    request = _lines(("model", payload.get("model")), ("tokens", _tokens(payload.get("usage"))),
                     ("finish", payload.get("finish_reason")))
    return Bar(kind="model", label=label, start=start, end=end, request=request,
               result=result or _text(payload.get("finish_reason")), event_id=event.pk)


def _failed_model_bar(event: Event) -> Bar | None:
    payload = event.payload or {}
    if "retry" not in payload:  # an agent's redelivery after a lost worker, not a failed call
        return None
    where = f"call {payload['iteration']}" if "iteration" in payload else f"step {payload.get('step', 0) + 1}"
    reason = str(payload.get("reason") or "")
    return Bar(kind="model", label=f"{where} (failed, retried)", start=event.created_at, end=event.created_at,
               failed=True, reason=reason, event_id=event.pk,
               request=_lines(("retry", payload.get("retry")), ("backoff", f"{payload.get('backoff_seconds', 0)} s")),
               result=reason)


def _wait_bar(event: Event) -> Bar:
    payload = event.payload or {}
    waited = payload.get("waited_ms") or 0
    where = f"call {payload['iteration']}" if "iteration" in payload else f"step {payload.get('step', 0) + 1}"
    return Bar(kind="wait", label=f"{where}: waiting for the provider's rate limit",
               start=event.created_at - timedelta(milliseconds=waited), end=event.created_at, event_id=event.pk,
               request=_lines(("model", payload.get("model"))), result=f"waited {duration_text(waited)}")


def _model_bars(events: list[Event], kind: str) -> list[Bar]:
    bars = [_model_bar(e) for e in events if e.type == kind]
    bars += [_wait_bar(e) for e in events if e.type == LLM_WAITING]
    bars += [bar for e in events if e.type in FAILED_MODEL_CALLS if (bar := _failed_model_bar(e))]
    return sorted(bars, key=lambda b: (b.start, b.event_id))


def _skill_bars(events: list[Event], now: datetime, executions: dict[int, tuple]) -> list[Bar]:
    """Each skill.finished closes the oldest open skill.started of the same skill; a call
    refused before it started (no skill.started) spans its own duration, if any."""
    open_: dict[str, deque] = defaultdict(deque)
    bars: list[Bar] = []
    for event in events:
        payload = event.payload or {}
        skill = str(payload.get("skill", ""))
        if event.type == SKILL_STARTED:
            bar = Bar(kind="skill", label=skill, start=event.created_at, end=now, running=True,
                      request=_text(payload.get("arguments")) or "(no arguments)", event_id=event.pk)
            open_[skill].append(bar)
            bars.append(bar)
        elif event.type == SKILL_FINISHED:
            # By its duration: a read-only call run ahead records both its events when its
            # step is stored, after it ran (orchestration/engine/agent.py).
            began = event.created_at - timedelta(milliseconds=payload.get("duration_ms") or 0)
            if open_[skill]:
                bar = open_[skill].popleft()
                bar.start = min(bar.start, began)
            else:
                bar = Bar(kind="skill", label=skill, start=began, end=event.created_at, event_id=event.pk)
                bars.append(bar)
            bar.end, bar.running = event.created_at, False
            bar.declined = payload.get("error_kind") == ErrorKind.DENIED
            bar.failed = not payload.get("ok", True) and not bar.declined
            bar.reason = "" if bar.declined else str(payload.get("error") or "")
            status = payload.get("status", "")
            if bar.failed and payload.get("error_kind"):
                status = f"{status} ({payload['error_kind']})"
            arguments, result = executions.get(payload.get("execution_id"), (None, None))
            bar.request = bar.request or _text(arguments) or "(no arguments)"
            bar.result = "\n".join(filter(None, [f"status: {status}", bar.reason, _text(result)]))
    return bars


def _percent(value: datetime, start: datetime, span: float) -> float:
    return round(min(100.0, max(0.0, (value - start).total_seconds() / span * 100)), 3)


def _place(item, start: datetime, span: float) -> None:
    item.left = _percent(item.start, start, span)
    item.width = round(max(0.0, _percent(item.end, start, span) - item.left), 3)


def _critical_path(dispatches: list[AgentDispatch], ends: dict[int, datetime]) -> list[AgentDispatch]:
    """From the agent that finished last, back through the dependency that finished last
    at each step: the chain that decided how long the turn's agents took."""
    by_agent = {d.agent_id: d for d in dispatches}
    finished = [d for d in dispatches if ends.get(d.pk)]
    if not finished:
        return []
    node = max(finished, key=lambda d: (ends[d.pk], d.pk))
    path = [node]
    while True:
        deps = [by_agent[a] for a in node.depends_on or [] if a in by_agent and ends.get(by_agent[a].pk)]
        deps = [d for d in deps if d not in path]
        if not deps:
            break
        node = max(deps, key=lambda d: (ends[d.pk], d.pk))
        path.append(node)
    return path[::-1]


def _axis_ticks(span_seconds: float, count: int = 4) -> list[tuple[float, str]]:
    return [(round(100 * i / count, 3), duration_text(round(span_seconds * 1000 * i / count))) for i in range(count + 1)]


# The skill calls' arguments and results, which the bars show: read with every render of
# a running turn's waterfall, so compiled once (orchestration/records/compiled.py).
_turn_executions = CompiledRead(lambda turn_id: SkillExecution.objects.filter(dispatch__turn_id=turn_id)
                                .order_by().values_list("id", "arguments", "result"))


def turn_waterfall(turn: Turn, *, agents: TurnAgents | None = None, events: list[Event] | None = None,
                   now: datetime | None = None) -> Waterfall:
    """The turn's waterfall: two reads (events, skill results) and the agents' (dispatches,
    spend), less what the caller passes (`agents` from `turn_agents`, `events` from
    `turn_events`)."""
    now = now or timezone.now()
    events = turn_events(turn) if events is None else events
    agents = agents or turn_agents(turn)
    dispatches, spend = agents.dispatches, agents.spend
    finished = any(e.type == SKILL_FINISHED for e in events)
    executions = {pk: (arguments, result) for pk, arguments, result in _turn_executions(turn.pk)} if finished else {}

    by_dispatch: dict = defaultdict(list)
    for event in events:
        by_dispatch[event.dispatch_id].append(event)

    active = turn.status in ACTIVE_TURN_STATUSES
    turn_end = turn.finished_at or (now if active else (events[-1].created_at if events else turn.started_at))

    orchestrator = Row(key="orchestrator", label="orchestrator", depth=0, state=turn.status,
                       start=turn.started_at, end=turn_end, spend=spend.orchestrator,
                       bars=_model_bars(by_dispatch[None], ORCHESTRATOR_LLM_CALL),
                       failed=turn.status == "failed", reason=turn.error)
    rows, agent_rows = [orchestrator], {}
    asking = awaiting_approval(turn)

    def add(parent_id, depth):
        for d in dispatches:
            if d.parent_id != parent_id:
                continue
            own = by_dispatch[d.pk]
            state = "awaiting_approval" if d.pk in asking else display_state(d)
            bars = _model_bars(own, AGENT_LLM_CALL)
            bars += _skill_bars([e for e in own if e.type in (SKILL_STARTED, SKILL_FINISHED)], now, executions)
            bars.sort(key=lambda b: (b.start, b.event_id))
            end = d.finished_at or (now if d.state in ("created", "running") and active else None)
            if end is None:
                end = max([b.end for b in bars] + [d.started_at or d.created_at])
            failed = state in FAILED_AGENT_STATES
            row = Row(key=f"agent-{d.pk}", label=d.agent_id, depth=depth, state=state,
                      start=d.started_at or (bars[0].start if bars else None), end=end,
                      spend=spend.agent_total(d.pk), dispatch=d, bars=bars, after=list(d.depends_on or []),
                      failed=failed, reason=d.error if failed else "")
            row.failures = sum(b.failed for b in bars) + int(failed)
            rows.append(row)
            agent_rows[d.pk] = row
            add(d.pk, depth + 1)

    add(None, 1)

    # Failures counted on every ancestor, and on the turn.
    for row in agent_rows.values():
        row.failures_with_children += row.failures
        node = row.dispatch
        while node.parent_id in agent_rows:
            agent_rows[node.parent_id].failures_with_children += row.failures
            node = agent_rows[node.parent_id].dispatch
    orchestrator.failures = sum(b.failed for b in orchestrator.bars) + int(orchestrator.failed)
    failures = orchestrator.failures + sum(r.failures for r in agent_rows.values())
    orchestrator.failures_with_children = failures

    # One axis for all: from the turn's start to its end, widened to hold every bar.
    times = [t for r in rows for t in (r.start, r.end) if t] + [t for r in rows for b in r.bars for t in (b.start, b.end)]
    start, end = min(times + [turn.started_at]), max(times + [turn_end])
    span = max((end - start).total_seconds(), 0.001)
    ends = {pk: r.end for pk, r in agent_rows.items() if r.end}
    path = _critical_path([r.dispatch for r in agent_rows.values()], ends)
    for d in path:
        agent_rows[d.pk].critical = True
    by_agent_id = {r.dispatch.agent_id: r for r in agent_rows.values()}
    for row in rows:
        if row.start and row.end:
            _place(row, start, span)
        for bar in row.bars:
            _place(bar, start, span)
            bar.critical = row.critical
        if row.start:
            row.arrows = [min(_percent(by_agent_id[a].end, start, span), row.left)
                          for a in row.after if a in by_agent_id and by_agent_id[a].end]

    declined = sum(bar.declined for row in rows for bar in row.bars)
    return Waterfall(turn=turn, start=start, end=end, rows=rows, failures=failures, declined=declined,
                     critical_path=[d.agent_id for d in path], spend=spend.total, ticks=_axis_ticks(span))
