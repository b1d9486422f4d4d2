"""The waterfall of a turn (orchestration/reports/waterfall.py), from stored events and dispatches.

The diamond: a, then b and c (both after a), then d (after b and c); c is slow and has
a nested helper e that fails; one of b's skill calls is refused. Every row is written at
a known instant, so bar positions can be checked against the stored timings.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime, timedelta, timezone as dt_timezone
from decimal import Decimal
from unittest import mock

import pytest
from django.urls import reverse

from orchestration.models import Event, LLMCall
from orchestration.reports.waterfall import turn_waterfall
from tests.factories import conversation_for, dispatch_for, turn_for

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 24, 14, 0, 0, tzinfo=dt_timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@contextmanager
def clock(seconds: float):
    """auto_now_add fields take this instant."""
    with mock.patch("django.utils.timezone.now", return_value=at(seconds)):
        yield


def event(turn, seconds, type_, dispatch=None, **payload):
    with clock(seconds):
        return Event.objects.create(conversation_id=turn.conversation_id, turn=turn, dispatch=dispatch,
                                    type=type_, summary=type_, payload=payload)


def model_call(turn, seconds, duration_ms, dispatch=None, **payload):
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 0}
    with clock(seconds):
        LLMCall.objects.create(turn=turn, dispatch=dispatch, key=f"k{turn.pk}:{dispatch and dispatch.pk}:{seconds}",
                               model="gpt-test", prompt_tokens=100, completion_tokens=10,
                               cost_usd=Decimal("0.001"), duration_ms=duration_ms)
    type_ = "orchestrator.llm_call" if dispatch is None else "agent.llm_call"
    return event(turn, seconds, type_, dispatch, duration_ms=duration_ms, usage=usage, model="gpt-test", **payload)


def agent(turn, agent_id, start, end, *, depends_on=(), parent=None, outcome="completed", error=""):
    with clock(start - 0.05):
        d = dispatch_for(turn, agent_id, depends_on=list(depends_on), parent=parent,
                         depth=(parent.depth + 1) if parent else 1, state="closed", outcome=outcome, error=error,
                         started_at=at(start), finished_at=at(end), duration_ms=round((end - start) * 1000))
    event(turn, start, "agent.subagent_started", d)
    return d


def skill(turn, dispatch, start, end, name, *, ok=True, error=""):
    event(turn, start, "skill.started", dispatch, skill=name, arguments={"to": "bob@example.com", "n": 1})
    event(turn, end, "skill.finished", dispatch, skill=name, ok=ok, status="completed" if ok else "failed",
          error=error, error_kind="" if ok else "refused", duration_ms=round((end - start) * 1000))


@pytest.fixture
def diamond(alice):
    conversation = conversation_for(alice)
    with clock(0):
        turn = turn_for(conversation, status="completed", finished_at=at(10))
    model_call(turn, 0.5, 400, iteration=1, tool_calls=[{"name": "dispatch_agent", "arguments": '{"agent_id": "a"}'}])
    a = agent(turn, "a", 1, 2)
    model_call(turn, 1.5, 400, a, step=1, tool_calls=["search"])
    skill(turn, a, 1.5, 1.9, "search")
    b = agent(turn, "b", 2.2, 3.5, depends_on=["a"])
    model_call(turn, 2.6, 300, b, step=1, tool_calls=["send_email"])
    skill(turn, b, 2.6, 3.0, "send_email", ok=False, error="send_email is not granted to <b>")
    c = agent(turn, "c", 2.2, 8, depends_on=["a"])
    model_call(turn, 3, 700, c, step=1, tool_calls=["delegate"])
    e = agent(turn, "e", 3.2, 5, parent=c, outcome="failed", error="the model gave up")
    model_call(turn, 4, 500, e, step=1)
    model_call(turn, 7.5, 2000, c, step=2)
    d = agent(turn, "d", 8.2, 9.5, depends_on=["b", "c"])
    model_call(turn, 9.4, 1000, d, step=1)
    model_call(turn, 10, 300, iteration=2, content="All done & <ok>")
    return turn


def by_label(waterfall):
    return {row.label: row for row in waterfall.rows}


def test_rows_one_per_agent_nested_under_their_parent(diamond):
    waterfall = turn_waterfall(diamond)
    assert [(r.label, r.depth) for r in waterfall.rows] == [
        ("orchestrator", 0), ("a", 1), ("b", 1), ("c", 1), ("e", 2), ("d", 1)]
    rows = by_label(waterfall)
    assert rows["d"].after == ["b", "c"]
    assert rows["c"].state == "completed" and rows["e"].state == "failed"


def test_bars_are_placed_on_one_axis_in_proportion_to_the_stored_timings(diamond):
    waterfall = turn_waterfall(diamond)
    assert waterfall.start == at(0) and waterfall.end == at(10)
    rows = by_label(waterfall)
    step, search = rows["a"].bars
    assert (step.kind, step.left, step.width) == ("model", 11.0, 4.0)  # 1.1 s .. 1.5 s of 10 s
    assert (search.kind, search.left, search.width) == ("skill", 15.0, 4.0)
    assert rows["a"].left == 10.0 and rows["a"].width == 10.0
    # c's slow second step: 5.5 s .. 7.5 s
    assert [(b.left, b.width) for b in rows["c"].bars] == [(23.0, 7.0), (55.0, 20.0)]
    orchestrator = rows["orchestrator"]
    assert [(b.left, b.width) for b in orchestrator.bars] == [(1.0, 4.0), (97.0, 3.0)]
    starts = [row.left for row in waterfall.rows[1:]]
    assert starts == [10.0, 22.0, 22.0, 32.0, 82.0]
    # an arrow from where each of its dependencies ended: b at 3.5 s, c at 8 s; d began at 8.2 s
    assert rows["d"].arrows == [rows["b"].left + rows["b"].width, 80.0] == [35.0, 80.0]
    assert rows["c"].duration == "5.8 s" and waterfall.duration == "10.0 s"


def test_the_critical_path_is_the_slowest_chain_of_dependencies(diamond):
    waterfall = turn_waterfall(diamond)
    assert waterfall.critical_path == ["a", "c", "d"]
    rows = by_label(waterfall)
    assert [r.label for r in waterfall.rows if r.critical] == ["a", "c", "d"]
    assert all(bar.critical for bar in rows["c"].bars) and not any(bar.critical for bar in rows["b"].bars)


def test_failures_are_red_with_their_reason_and_counted_on_the_parent_and_the_turn(diamond):
    waterfall = turn_waterfall(diamond)
    rows = by_label(waterfall)
    refused = rows["b"].bars[1]
    assert refused.failed and refused.reason == "send_email is not granted to <b>"
    assert "failed (refused)" in refused.result
    assert (rows["b"].failures, rows["b"].failures_with_children) == (1, 1)
    assert rows["e"].failed and rows["e"].reason == "the model gave up" and rows["e"].failures == 1
    assert (rows["c"].failures, rows["c"].failures_with_children) == (0, 1)
    assert not rows["a"].failed and rows["a"].failures_with_children == 0
    assert waterfall.failures == 2


def test_each_row_has_its_tokens_and_cost_with_its_agents(diamond):
    rows = by_label(turn_waterfall(diamond))
    assert rows["c"].spend.llm_calls == 3  # its two calls and e's
    assert rows["c"].spend.summary() == "330 tokens · $0.0030"
    assert rows["orchestrator"].spend.llm_calls == 2


def test_a_running_skill_runs_to_now_and_a_refused_one_without_start_still_shows(alice):
    conversation = conversation_for(alice)
    with clock(0):
        turn = turn_for(conversation, status="running")
    with clock(0.5):
        d = dispatch_for(turn, "solo", state="running", started_at=at(1))
    event(turn, 2, "skill.finished", d, skill="nope", ok=False, status="failed", error="unknown skill",
          duration_ms=0)
    event(turn, 3, "skill.started", d, skill="search", arguments={})
    waterfall = turn_waterfall(turn, now=at(5))
    assert waterfall.end == at(5)
    refused, running = by_label(waterfall)["solo"].bars
    assert refused.failed and refused.left == 40.0 and refused.width == 0.0
    assert running.running and (running.left, running.width) == (60.0, 40.0)
    assert waterfall.failures == 1


def test_the_audit_page_shows_each_turns_waterfall(client, alice, diamond):
    client.force_login(alice)
    page = client.get(reverse("conversation_audit", args=[diamond.conversation_id])).content.decode()
    assert f'id="waterfall-{diamond.pk}"' in page
    assert "critical path: a → c → d" in page and "2 failures" in page
    assert 'x="11.0%"' in page  # a's model call
    assert "send_email is not granted to &lt;b&gt;" in page  # escaped, in red
    assert "All done &amp; &lt;ok&gt;" in page
    assert "<b>" not in page.split('id="waterfall-')[1]
    assert 'style="' not in page.split('id="waterfall-')[1].split("</section>")[0]  # the CSP allows none


def test_the_live_page_has_a_waterfall_panel_that_pushes_refresh(client, alice, diamond):
    from assistant.live import panel_context, panels_for

    client.force_login(alice)
    page = client.get(diamond.conversation.get_absolute_url()).content.decode()
    assert 'id="live-waterfall"' in page and f'id="waterfall-{diamond.pk}"' in page
    skill_event = Event.objects.filter(type="skill.finished").first()
    assert "waterfall" in panels_for([skill_event])
    assert "waterfall" in panels_for(list(Event.objects.filter(type="orchestrator.llm_call")))
    assert panel_context(diamond.conversation, frozenset({"waterfall"}))["waterfall"].failures == 2


def test_a_failed_model_call_that_was_retried_is_red_and_counted(diamond):
    a = diamond.dispatches.get(agent_id="a")
    event(diamond, 1.2, "agent.subagent_attempt", a, sub_agent_id="a", retry=1, step=0, reason="HTTP 503",
          backoff_seconds=0.5)
    event(diamond, 1.3, "agent.subagent_attempt", a, sub_agent_id="a", attempt=2, reason="worker lost")  # no call
    event(diamond, 0.05, "orchestrator.llm_retry", iteration=1, retry=1, reason="timed out", backoff_seconds=1)
    waterfall = turn_waterfall(diamond)
    rows = by_label(waterfall)
    retried = [b for b in rows["a"].bars if b.failed]
    assert [(b.label, b.reason, b.left) for b in retried] == [("step 1 (failed, retried)", "HTTP 503", 12.0)]
    assert rows["orchestrator"].bars[0].label == "call 1 (failed, retried)"
    assert waterfall.failures == 4
