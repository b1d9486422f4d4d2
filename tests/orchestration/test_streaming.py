"""The orchestrator's answer streams (issue 15): through the real SDK from a scripted
server that streams as providers do (SSE chunks, tool calls in fragments, usage in the
last chunk), or that cannot stream (answers whole, or refuses the request)."""

from __future__ import annotations

import pytest

from orchestration.engine import orchestrator
from orchestration.llm import openai_provider
from orchestration.models import Event, LLMCall, Message
from tests.support.llm_server import Agent, Plan, Reply

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = ("Bob has the **overdue list** and the review is booked for tomorrow at 14:00. "
          "Nothing failed; the three agents each reported what they did.")
SEARCH = ("tasks.search", {"status": "open"})


@pytest.fixture
def drafts(monkeypatch):
    """Every draft the orchestrator stores, in order (the real save runs too)."""
    saved: list[str] = []
    save = orchestrator.turn_draft_save

    def recorded(*, turn, token, text):
        saved.append(text)
        save(turn=turn, token=token, text=text)

    monkeypatch.setattr(orchestrator, "turn_draft_save", recorded)
    return saved


def plan(answer: str = ANSWER) -> Plan:
    return Plan([Agent("finder", ["tasks.search"], [SEARCH], report="2 open tasks.")], answer=answer, discover=False)


def orchestrator_requests(llm) -> list[dict]:
    return [r for r in llm.requests if "use_skill" not in {t["function"]["name"] for t in r.get("tools", [])}]


def final_answer(turn) -> str:
    return turn.messages.filter(role=Message.Role.ASSISTANT, tool_calls=[]).get().content


def test_the_answer_streams_and_the_stored_message_is_the_whole_text(llm, run_turn, drafts, settings):
    settings.ASSISTANT_STREAM_INTERVAL_SECONDS = 0  # store every chunk: the growth is exact
    llm.respond = plan()

    turn = run_turn()

    assert turn.status == "completed", turn.error
    assert all(r.get("stream") and r["stream_options"] == {"include_usage": True} for r in orchestrator_requests(llm))
    assert not any(r.get("stream") for r in llm.requests if r not in orchestrator_requests(llm))  # agents: plain
    assert len(drafts) == -(-len(ANSWER) // 4)  # one per chunk of text, none for tool calls
    assert all(ANSWER.startswith(draft) for draft in drafts) and drafts[-1] == ANSWER
    assert sorted(drafts, key=len) == drafts
    assert final_answer(turn) == ANSWER
    assert turn.answer_draft == ""  # the message holds it now


def test_the_page_is_not_flooded_the_drafts_are_throttled(llm, run_turn, drafts, settings):
    settings.ASSISTANT_STREAM_INTERVAL_SECONDS = 60
    llm.respond = plan()
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert drafts == [ANSWER[:4]]  # the first chunk shows at once; then nothing within the interval
    assert final_answer(turn) == ANSWER


def test_streamed_tool_calls_and_usage_are_put_back_together(llm, run_turn):
    """Dispatches arrive as id+name, then arguments in pieces; usage only in the last chunk."""
    agents = [Agent(f"a{i}", ["tasks.search"], [SEARCH], report=f"report {i}") for i in range(3)]
    script = Plan(agents, answer=ANSWER, discover=False)

    def respond(request):
        reply = script(request)
        if request.get("stream"):
            reply.usage = (2345, 67, 2048)
        return reply

    llm.respond = respond
    turn = run_turn()

    assert turn.status == "completed", turn.error
    assert sorted(turn.dispatches.values_list("agent_id", flat=True)) == ["a0", "a1", "a2"]
    assert set(turn.dispatches.values_list("outcome", flat=True)) == {"completed"}
    calls = LLMCall.objects.filter(turn=turn, dispatch=None)
    assert [(c.prompt_tokens, c.completion_tokens, c.cached_tokens) for c in calls] == [(2345, 67, 2048)] * 3
    assert turn.prompt_tokens >= 3 * 2345


def test_a_server_that_answers_a_streamed_request_whole_is_read_as_such(llm, run_turn, drafts):
    llm.streaming = "plain"
    llm.respond = plan()
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert final_answer(turn) == ANSWER and drafts == []
    assert all(r.get("stream") for r in orchestrator_requests(llm))  # asked, and it answered whole


def test_a_server_that_refuses_streaming_is_asked_plainly_from_then_on(llm, run_turn, drafts):
    llm.streaming = "refuse"
    llm.respond = plan()
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert final_answer(turn) == ANSWER
    streamed = [r for r in llm.requests if r.get("stream")]
    assert len(streamed) == 1  # refused once; the retry and every later call are plain
    assert len(orchestrator_requests(llm)) == 3 + 1
    assert not Event.objects.filter(turn=turn, type="orchestrator.llm_retry").exists()


def test_streaming_can_be_switched_off(llm, run_turn, settings):
    settings.ASSISTANT_LLM_STREAM = False
    llm.respond = plan()
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert not any(r.get("stream") for r in llm.requests)


def test_a_stream_that_stalls_is_retried_and_the_draft_starts_over(llm, run_turn, drafts, settings):
    settings.ASSISTANT_LLM_TIMEOUT_SECONDS = 1
    settings.ASSISTANT_STREAM_INTERVAL_SECONDS = 0
    script = plan()
    stalled = []

    def respond(request):
        reply = script(request)
        if request.get("stream") and reply.content and not stalled:
            stalled.append(request)
            reply.stall = 5  # the first chunk, then silence past the timeout
        return reply

    llm.respond = respond
    turn = run_turn()

    assert turn.status == "completed", turn.error
    retry = Event.objects.get(turn=turn, type="orchestrator.llm_retry")
    assert "stream" in retry.payload["reason"].lower() or "timed out" in retry.payload["reason"].lower()
    assert drafts[0] == ANSWER[:4] and drafts[-1] == ANSWER
    assert final_answer(turn) == ANSWER


def test_a_stream_that_breaks_off_is_an_error_not_a_truncated_answer(llm, run_turn, settings):
    """A chunk that is not JSON mid-stream: the call failed, it is not half an answer."""
    settings.ASSISTANT_LLM_TIMEOUT_SECONDS = 1
    script = plan()
    broken = []

    def respond(request):
        reply = script(request)
        if request.get("stream") and reply.content and not broken:
            broken.append(1)
            return Reply(status=200, body="data: {not json\n\n", headers={"Content-Type": "text/event-stream"})
        return reply

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert Event.objects.filter(turn=turn, type="orchestrator.llm_retry").count() == 1
    assert final_answer(turn) == ANSWER


def test_the_offline_planner_needs_no_stream(run_turn, settings):
    settings.ASSISTANT_LLM_PROVIDER = "offline"
    turn = run_turn("add a task: renew passport")
    assert turn.status == "completed", turn.error
    assert turn.answer_draft == ""


@pytest.fixture(autouse=True)
def forget_refusals():
    openai_provider._streaming_refused.clear()
    yield
    openai_provider._streaming_refused.clear()


def test_text_before_tool_calls_is_not_left_behind_as_a_draft(llm, run_turn, drafts, settings):
    """Some models say "Let me check" and then call tools: the draft shows it while it
    streams, and is cleared once the response is stored."""
    settings.ASSISTANT_STREAM_INTERVAL_SECONDS = 0
    script = plan()

    def respond(request):
        reply = script(request)
        if reply.tool_calls and reply.tool_calls[0][1] == "dispatch_agent":
            reply.content = "Let me check your tasks."
        return reply

    llm.respond = respond
    turn = run_turn()
    assert turn.status == "completed", turn.error
    assert drafts[0] == "Let "
    assert turn.answer_draft == "" and final_answer(turn) == ANSWER
