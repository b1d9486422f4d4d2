"""A turn as an OpenTelemetry trace (GenAI conventions), built from its records: the tree,
its attributes and links, sent through the SDK (in memory) and once through the real
OTLP/HTTP exporter into a receiver on 127.0.0.1; `manage.py traces` prints it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
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
from orchestration.reports.traces import turn_trace
from tests.support.llm_server import Agent, Plan

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
    root = turn_trace(answered_turn)
    assert root.name == "invoke_workflow" and root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    (orchestrator,) = root.children
    assert orchestrator.attributes["gen_ai.agent.name"] == "orchestrator"
    spans = by_name(root)
    chats = [s for s in orchestrator.children if s.name.startswith("chat ")]
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
        assert steps[0].startswith("chat ") and any(s.startswith("execute_tool ") for s in steps), (name, steps)
    (search,) = [s for s in agents["a"][1].children if s.name == "execute_tool tasks.search"]
    assert (search.attributes["gen_ai.tool.name"], search.attributes["gen_ai.tool.type"]) == ("tasks.search", "function")
    (send,) = spans["execute_tool email.send"]
    (guardrail,) = send.children
    assert guardrail.name == "run_guardrail approval"
    assert guardrail.attributes["gen_ai.guardrail.decision"] == "approved"
    assert all(s.attributes["gen_ai.conversation.id"] == str(answered_turn.conversation_id) for _, s in root.walk())
    assert not any(s.error for _, s in root.walk())


def test_the_sdk_gets_one_trace_with_the_same_parent_links(answered_turn):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.turn_export(answered_turn.pk, provider)
    exported = exporter.get_finished_spans()
    root = turn_trace(answered_turn)
    assert len(exported) == sum(1 for _ in root.walk())
    assert len({s.context.trace_id for s in exported}) == 1, "one turn, one trace"
    by_id = {s.context.span_id: s for s in exported}
    for span in exported:
        if span.name.startswith("invoke_agent ") and span.attributes["gen_ai.agent.name"] != "orchestrator":
            assert by_id[span.parent.span_id].name == "execute_tool dispatch_agent"
        if span.name.startswith("chat "):
            assert span.kind.name == "CLIENT" and span.start_time <= span.end_time
    (top,) = [s for s in exported if s.parent is None]
    assert top.name == "invoke_workflow"


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


def test_off_by_default_nothing_is_built(llm, run_turn, monkeypatch):
    monkeypatch.setattr(otel, "turn_export", lambda *a, **k: pytest.fail("exported with OTEL_* unset"))
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    assert run_turn("Find my open tasks").status == "completed"


class _Receiver(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_otlp_http_exporter_delivers_the_trace_to_a_receiver(answered_turn, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import \
        OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import \
        ExportTraceServiceRequest

    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.bodies = []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    try:
        otel.turn_export(answered_turn.pk, provider)
    finally:
        server.shutdown()
    names = set()
    for path, body in _Receiver.bodies:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        names |= {span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans}
    assert {"invoke_workflow", "invoke_agent orchestrator", "invoke_agent mailer", "execute_tool email.send",
            "run_guardrail approval"} <= names


def test_manage_py_traces_prints_the_tree(answered_turn):
    out = StringIO()
    call_command("traces", str(answered_turn.pk), stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("invoke_workflow  ")
    assert lines[1].startswith("  invoke_agent orchestrator  ")
    assert any(line.startswith("      invoke_agent mailer  ") for line in lines)
    assert any("run_guardrail approval" in line and "approved" in line for line in lines)
    with pytest.raises(CommandError, match="No turn 999999"):
        call_command("traces", "999999")
