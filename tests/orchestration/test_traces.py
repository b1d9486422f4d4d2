"""A turn as an OpenTelemetry trace (GenAI conventions), built from its records: the tree,
its attributes and links, sent through the SDK (in memory) and once through the real
OTLP/HTTP exporter into a receiver on 127.0.0.1; `manage.py traces` prints it."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import \
    InMemorySpanExporter

from orchestration.models import LLMCall, SkillApproval
from orchestration.questions.approvals import approval_answer
from orchestration.reports import otel
from orchestration.reports.traces import run_ended_by, turn_trace
from tests.support.llm_server import Agent, Plan, with_burst
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals_on")]

SEARCH = ("tasks.search", {"status": "open"})
EMAIL = ("email.send", {"to": ["bob@example.com"], "subject": "Tasks", "body": "Your open tasks."})
DIAMOND = Plan([Agent("a", ["tasks.search"], [SEARCH]), Agent("b", ["tasks.search"], [SEARCH], depends_on=["a"]),
                Agent("c", ["tasks.search"], [SEARCH], depends_on=["a"]),
                Agent("mailer", ["email.send"], [EMAIL], depends_on=["b", "c"], report="Mailed.")],
               answer="Done.")


@pytest.fixture
def answered_turn(llm, run_turn, alice):
    """A diamond of four agents whose last one's email the owner approves."""
    llm.respond = DIAMOND
    turn = run_turn("Find my open tasks and mail them to Bob")
    asked = SkillApproval.objects.get(turn=turn)
    approval_answer(turn=turn, user=alice, approval_id=asked.pk, digest=asked.digest, approve=True)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    return turn


def by_name(root) -> dict[str, list]:
    found: dict[str, list] = {}
    for _depth, span in root.walk():
        found.setdefault(span.name, []).append(span)
    return found


def test_the_tree_nests_every_agent_model_call_skill_call_and_approval(answered_turn):
    runs = turn_trace(answered_turn)
    # The approval paused the turn: one run up to the question, one after the answer.
    assert [run_ended_by(run) for run in runs] == ["paused", "completed"]
    root = runs[0]
    assert root.name == "invoke_workflow" and root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    (orchestrator,) = root.children
    assert orchestrator.attributes["gen_ai.agent.name"] == "orchestrator"
    spans = by_name(root)
    chats = [s for run in runs for s in run.children[0].children if s.name.startswith("chat ")]
    assert len(chats) == LLMCall.objects.filter(turn=answered_turn, dispatch=None).count()
    chat = chats[0]
    assert chat.kind == "CLIENT" and chat.attributes["gen_ai.operation.name"] == "chat"
    assert {"gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.finish_reasons",
            "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
            "gen_ai.usage.cache_read.input_tokens"} <= set(chat.attributes)
    # Each agent is the child of the dispatch_agent call that created it.
    dispatches = [s for s in orchestrator.children if s.name == "execute_tool dispatch_agent"]
    agents = {child.attributes["gen_ai.agent.name"]: (tool, child) for tool in dispatches for child in tool.children}
    assert set(agents) == {"a", "b", "c", "mailer"}
    for name, (tool, agent) in agents.items():
        assert agent.attributes["gen_ai.agent.id"].startswith("dispatch-")
        assert tool.attributes["gen_ai.tool.call.id"]
        steps = [s.name for s in agent.children]
        assert steps[0].startswith("chat "), (name, steps)
        if name != "mailer":  # the mailer's email runs after the owner's answer, in the next run
            assert any(s.startswith("execute_tool ") for s in steps), (name, steps)
    (search,) = [s for s in agents["a"][1].children if s.name == "execute_tool tasks.search"]
    assert (search.attributes["gen_ai.tool.name"], search.attributes["gen_ai.tool.type"]) == ("tasks.search", "function")
    (send,) = by_name(runs[1])["execute_tool email.send"]
    # The owner's verdict: a gen_ai.guardrail.result event on the call it cleared (the
    # conventions' form for a dedicated in-process guardrail), not a span: their wait is in none.
    (verdict,) = send.events
    assert verdict.name == "gen_ai.guardrail.result"
    assert (verdict.attributes["gen_ai.guardrail.result.type"], verdict.attributes["gen_ai.guardrail.result.value"],
            verdict.attributes["gen_ai.guardrail.source"]) == ("decision", "approved", "tool_input")
    assert "gen_ai.guardrail.result.reason" not in verdict.attributes, "it names a recipient: content capture only"
    assert verdict.at <= send.start, "the verdict comes before the call it cleared"
    assert not any(s.name.startswith(("run_guardrail", "apply_guardrail")) for run in runs for _, s in run.walk())
    every = [span for run in runs for _, span in run.walk()]
    assert all(s.attributes["gen_ai.conversation.id"] == str(answered_turn.conversation_id) for s in every)
    assert not any(s.error for s in every)


def test_a_pause_ends_the_run_and_the_next_links_back(answered_turn):
    first, second = turn_trace(answered_turn)
    assert first.end <= second.start, "nothing spans the owner's wait"
    assert second.links == [first.key] and second.children[0].links == [first.children[0].key]
    # the mailer, asked to approve in the first run, goes on in the second: a new piece
    (mailer,) = [s for _, s in first.walk() if s.name == "invoke_agent mailer"]
    (going_on,) = [s for s in second.children[0].children if s.name == "invoke_agent mailer"]
    assert going_on.links == [mailer.key] and going_on.attributes["gen_ai.agent.id"] == mailer.attributes[
        "gen_ai.agent.id"]
    assert mailer.end <= first.end


def test_the_sdk_gets_one_trace_with_the_same_parent_links(answered_turn):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.turn_export(answered_turn.pk, provider)
    exported = exporter.get_finished_spans()
    assert len(exported) == sum(1 for root in turn_trace(answered_turn) for _ in root.walk())
    assert len({s.context.trace_id for s in exported}) == 1, "one turn, one trace"
    by_id = {s.context.span_id: s for s in exported}
    for span in exported:
        if span.name.startswith("invoke_agent ") and span.attributes["gen_ai.agent.name"] != "orchestrator" \
                and not span.links:
            assert by_id[span.parent.span_id].name == "execute_tool dispatch_agent"
        if span.name.startswith("chat "):
            assert span.kind.name == "CLIENT" and span.start_time <= span.end_time
        for link in span.links:  # every link resolves to a span of the same trace
            assert by_id[link.context.span_id].name == span.name
    assert [s.name for s in exported if s.parent is None] == ["invoke_workflow", "invoke_workflow"]
    # Exported again (another worker, another run), the ids are the same: links hold.
    again = InMemorySpanExporter()
    other = TracerProvider()
    other.add_span_processor(SimpleSpanProcessor(again))
    otel.turn_export(answered_turn.pk, other)
    assert {s.context.span_id for s in again.get_finished_spans()} == set(by_id)


def test_each_run_is_exported_when_it_ends(llm, run_turn, alice, settings, monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel, "tracer_provider", lambda: provider)
    settings.ASSISTANT_OTEL_TRACES = True
    settings.ASSISTANT_SKILL_POLICIES = dict(settings.SKILLS_DEFAULT_POLICIES)
    llm.respond = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed.")], answer="Done.")
    turn = run_turn("Mail Bob my tasks")
    assert turn.status == "paused"
    at_pause = exporter.get_finished_spans()
    assert [s.attributes["assistant.turn.run"] for s in at_pause if s.name == "invoke_workflow"] == [0]
    asked = SkillApproval.objects.get(turn=turn)
    approval_answer(turn=turn, user=alice, approval_id=asked.pk, digest=asked.digest, approve=True)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    later = exporter.get_finished_spans()[len(at_pause):]
    (resumed,) = [s for s in later if s.name == "invoke_workflow"]
    (paused,) = [s for s in at_pause if s.name == "invoke_workflow"]
    assert resumed.attributes["assistant.turn.run"] == 1 and resumed.context.trace_id == paused.context.trace_id
    assert [link.context.span_id for link in resumed.links] == [paused.context.span_id]
    assert not {s.context.span_id for s in later} & {s.context.span_id for s in at_pause}, "no run sent twice"


def test_a_retried_model_call_is_a_failed_attempt_the_next_links_to(llm, run_turn, settings):
    settings.ASSISTANT_LLM_MAX_RETRIES = 0
    plan = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    llm.respond = with_burst(plan, count=1, status=503,
                             when=lambda r: any(t["function"]["name"] == "use_skill" for t in r.get("tools", [])))
    turn = run_turn("Find my open tasks")
    assert turn.status == "completed", turn.error
    (agent,) = [s for root in turn_trace(turn) for _, s in root.walk() if s.name == "invoke_agent a"]
    failed, answered = agent.children[0], agent.children[1]
    assert failed.kind == "CLIENT" and failed.error == "503" and failed.start <= failed.end <= answered.start
    assert answered.links == [failed.key] and not answered.error


def test_an_agent_redelivered_after_a_crash_is_a_new_piece_linked_to_the_last(alice):
    from datetime import timedelta

    from orchestration.models import Event
    from orchestration.records.catalogue import AGENT_ATTEMPT
    from tests.factories import conversation_for, dispatch_for, turn_for

    turn = turn_for(conversation_for(alice), status="completed")
    dispatch = dispatch_for(turn, "a", state="closed", outcome="completed", crashes=1)
    at = Event.objects.create(conversation=turn.conversation, turn=turn, dispatch=dispatch, type=AGENT_ATTEMPT,
                              summary="a resumed (redelivered)",
                              payload={"reason": "redelivered", "crashes": 1}).created_at  # events are append-only
    type(turn).objects.filter(pk=turn.pk).update(started_at=at - timedelta(seconds=9),
                                                 finished_at=at + timedelta(seconds=11))
    type(dispatch).objects.filter(pk=dispatch.pk).update(started_at=at - timedelta(seconds=8),
                                                         finished_at=at + timedelta(seconds=6))
    turn.refresh_from_db()
    (root,) = turn_trace(turn)
    first, second = [s for s in root.children[0].children if s.name == "invoke_agent a"]
    assert (first.start, first.end, second.start, second.end) == (
        at - timedelta(seconds=8), at, at, at + timedelta(seconds=6))
    assert second.links == [first.key] and first.attributes["assistant.agent.piece"] == 0


def test_a_turn_ends_its_trace_to_the_exporter_when_otel_is_asked_for(llm, run_turn, settings, monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(otel, "tracer_provider", lambda: provider)
    settings.ASSISTANT_OTEL_TRACES = True
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    turn = run_turn("Find my open tasks")
    assert turn.status == "completed"
    assert {s.name for s in exporter.get_finished_spans()} >= {"invoke_workflow", "invoke_agent a"}


def test_the_genai_client_metrics_count_every_model_call_and_token(answered_turn):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    otel.turn_export(answered_turn.pk, meters=MeterProvider(metric_readers=[reader]))
    points = {metric.name: metric.data.data_points for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for metric in sm.metrics}
    calls = LLMCall.objects.filter(turn=answered_turn)
    assert sum(p.count for p in points["gen_ai.client.operation.duration"]) == calls.count()
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert tokens == {"input": sum(c.prompt_tokens for c in calls), "output": sum(c.completion_tokens for c in calls)}
    (duration,) = points["gen_ai.client.operation.duration"]
    assert duration.attributes["gen_ai.operation.name"] == "chat" and duration.attributes["gen_ai.request.model"]


def test_off_by_default_nothing_is_built(llm, run_turn, monkeypatch):
    monkeypatch.setattr(otel, "turn_export", lambda *a, **k: pytest.fail("exported with OTEL_* unset"))
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    assert run_turn("Find my open tasks").status == "completed"


def test_the_otlp_http_exporter_delivers_the_trace_to_a_receiver(answered_turn, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import \
        OTLPSpanExporter

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    try:
        otel.turn_export(answered_turn.pk, provider)
    finally:
        receiver.close()
    assert receiver.paths() == {"/v1/traces"}
    spans = receiver.spans()
    assert {"invoke_workflow", "invoke_agent orchestrator", "invoke_agent mailer",
            "execute_tool email.send"} <= {span.name for span in spans}
    (send,) = [span for span in spans if span.name == "execute_tool email.send"]
    assert [event.name for event in send.events] == ["gen_ai.guardrail.result"]


def test_manage_py_traces_prints_the_tree(answered_turn):
    out = StringIO()
    call_command("traces", str(answered_turn.pk), stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("invoke_workflow  ")
    assert lines[1].startswith("  invoke_agent orchestrator  ")
    assert any(line.startswith("      invoke_agent mailer  ") for line in lines)
    assert any("· gen_ai.guardrail.result: approved (owner approval)" in line for line in lines)
    with pytest.raises(CommandError, match="No turn 999999"):
        call_command("traces", "999999")


def test_manage_py_traces_draws_the_tree_with_the_wait_outside_every_bar(answered_turn, tmp_path):
    from xml.etree import ElementTree

    picture = tmp_path / "trace.svg"
    call_command("traces", str(answered_turn.pk), "--svg", str(picture), stdout=StringIO())
    svg = ElementTree.parse(picture).getroot()  # well-formed
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("invoke_workflow") == 1 and "invoke_workflow  ↪" in texts  # the run after the answer
    titles = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert sum(title.startswith("paused ") for title in titles) == 1

