"""A turn's trace as a backend gets it from a real qcluster (issue 30): the workers send
each run of the turn through the OTLP/HTTP exporter to a receiver on 127.0.0.1, the run
up to an approval's question when it pauses, the rest once the owner answers. Agents
run in other worker processes than the orchestrator step that dispatched them, and
each is still the child of its `dispatch_agent` span; the runs are one trace, the
second linked to the first; the GenAI client metrics count every model call."""

from __future__ import annotations

import pytest

from orchestration.lifecycle.turns import turn_start
from orchestration.models import LLMCall, SkillApproval
from orchestration.questions.approvals import approval_answer
from tests.conftest import APPROVALS_ON_ENV
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.test_qcluster import EMAIL, wait_turn
from tests.support.llm_server import Agent, Plan
from tests.support.otlp_receiver import OtlpReceiver, attributes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals_on")]

SEARCH = ("tasks.search", {"status": "open"})


@pytest.fixture
def receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


def test_a_turn_paused_for_approval_reaches_the_backend_as_one_linked_trace(llm, qcluster, alice, receiver):
    llm.latency = 0.05
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH]), Agent("b", ["tasks.search"], [SEARCH]),
                        Agent("mailer", ["email.send"], [EMAIL], depends_on=["a", "b"], report="Mailed.")],
                       answer="Done.")
    cluster = qcluster(workers=3, env={**APPROVALS_ON_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                                       "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_METRIC_EXPORT_INTERVAL": "200",
                                       # each worker sends what it counted since its last send
                                       "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"})
    turn = turn_start(conversation=conversation_for(alice), text="Find my tasks and mail them to Bob")
    wait_turn(turn, cluster)
    assert turn.status == "paused", turn.error

    def roots():
        return [s for s in receiver.spans() if s.name == "invoke_workflow"]

    # The run up to the question is sent at the pause: the owner may answer in a week.
    wait_for(lambda: len(roots()) == 1, timeout=30, what="the first run's spans", cluster=cluster)
    asked = SkillApproval.objects.get(turn=turn)
    approval_answer(turn=turn, user=alice, approval_id=asked.pk, digest=asked.digest, approve=True)
    wait_turn(turn, cluster)
    assert turn.status == "completed", turn.error
    wait_for(lambda: len(roots()) == 2, timeout=30, what="the second run's spans", cluster=cluster)
    calls = LLMCall.objects.filter(turn=turn)
    wait_for(lambda: len([s for s in receiver.spans() if s.name.startswith("chat ")]) >= calls.count(),
             timeout=30, what="every model call's span", cluster=cluster)

    spans = receiver.spans()
    by_id = {span.span_id: span for span in spans}
    assert len(by_id) == len(spans), "no span sent twice"
    assert len({span.trace_id for span in spans}) == 1, "one turn, one trace"
    first, second = sorted(roots(), key=lambda s: attributes(s)["assistant.turn.run"])
    assert [link.span_id for link in second.links] == [first.span_id]
    assert first.end_time_unix_nano <= second.start_time_unix_nano, "the owner's wait is in no span"
    # Across the queue hop: each agent's first piece is the child of its dispatch_agent call.
    agents = [s for s in spans if s.name.startswith("invoke_agent ") and s.name != "invoke_agent orchestrator"]
    firsts = [s for s in agents if attributes(s)["assistant.agent.piece"] == 0]
    assert {s.name for s in firsts} == {"invoke_agent a", "invoke_agent b", "invoke_agent mailer"}
    for agent in firsts:
        assert by_id[agent.parent_span_id].name == "execute_tool dispatch_agent"
    for agent in [s for s in agents if s not in firsts]:  # the mailer after the answer
        assert [by_id[link.span_id].name for link in agent.links] == [agent.name]
    assert len([s for s in spans if s.name.startswith("chat ")]) == calls.count()
    assert all(attributes(s)["gen_ai.conversation.id"] == str(turn.conversation_id) for s in spans)

    def tokens() -> int:
        return sum(p.sum for p in receiver.metrics().get("gen_ai.client.token.usage", []))

    wait_for(lambda: tokens() == sum(c.prompt_tokens + c.completion_tokens for c in calls), timeout=30,
             what="the token usage metric to count every call", cluster=cluster)
