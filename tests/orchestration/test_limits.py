"""Limits that pause, continue? that resumes, stop, profiles (DESIGN.md §5–6)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from orchestration.models import AgentDispatch, Event, SkillExecution, TurnPause
from orchestration.questions.pauses import AlreadyAnswered, pause_question, pause_words_of, turn_continue
from orchestration.lifecycle.turns import TurnRefused, turn_start, turn_stop
from skills.domains.tasks.models import Task
from tests.factories import conversation_for
from tests.support.llm_server import Agent, Plan, calls, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.replayed]


@pytest.fixture
def limits(settings):
    def set_limits(**values):
        settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, **values}

    return set_limits


def create(title: str) -> tuple[str, dict]:
    return ("tasks.create", {"title": title})


def answer(turn) -> str:
    """The model's answer, or (none: stopped, failed) the engine's last notice; the engine's
    record of side effects follows an answer and is not it."""
    message = (turn.messages.filter(role="assistant", tool_calls=[]).order_by("-seq").first()
               or turn.messages.filter(role="notice").order_by("-seq").first())
    return message.content


class TestTurnSkillCallLimit:
    @pytest.fixture
    def paused(self, llm, run_turn, limits):
        limits(turn_max_skill_calls=2)
        llm.respond = Plan([Agent("maker", ["tasks.create"], [create("one"), create("two"), create("three")])])
        return run_turn()

    def test_trip_pauses_with_a_stored_question(self, paused):
        assert paused.status == "paused"
        pause = TurnPause.objects.get(turn=paused)
        assert pause.limit == "turn_max_skill_calls"
        assert pause.detail["budget_left"]["skill_calls"] == 0
        assert pause.detail["not_started"] == ["maker"]  # it goes back to created, to resume
        assert Task.objects.count() == 2
        types = list(Event.objects.filter(turn=paused).values_list("type", flat=True))
        assert "limit.tripped" in types and types[-1] == "turn.paused"
        # The chat keeps a one-line record; the question is the prompt panel's (one per pause).
        assert answer(paused) == "Turn 1 paused on skill calls per turn: waiting for your answer below."

    def test_the_question_reads_in_words(self, paused):
        words = pause_words_of(TurnPause.objects.get(turn=paused))
        assert words.label == "skill calls per turn"
        assert words.done == [] and words.waiting == ["maker"]
        assert words.grant == "Continue allows 2 more skill calls for this turn."  # one default's worth
        question = pause_question("turn_max_skill_calls", TurnPause.objects.get(turn=paused).detail)
        assert "turn_max_skill_calls" not in question
        assert "- Waiting to start: maker" in question and "Continue allows 2 more skill calls" in question

    def test_continue_resumes_where_it_stopped(self, paused, alice):
        turn_continue(turn=paused, user=alice)
        paused.refresh_from_db()
        assert paused.status == "completed", paused.error
        assert sorted(Task.objects.values_list("title", flat=True)) == ["one", "three", "two"]
        assert SkillExecution.objects.filter(status="completed").count() == 3
        pause = TurnPause.objects.get(turn=paused)
        assert pause.decision == "continue" and pause.decided_by == alice and pause.decided_at
        resumed = Event.objects.get(turn=paused, type="turn.resumed")
        assert resumed.payload["approved_by"] == "alice"
        assert paused.continuations == 1

    def test_second_continue_is_already_resumed(self, paused, alice):
        turn_continue(turn=paused, user=alice)
        with pytest.raises(AlreadyAnswered, match="already resumed"):
            turn_continue(turn=paused, user=alice)

    def test_only_the_owner_can_continue(self, paused, bob):
        with pytest.raises(TurnRefused, match="owner"):
            turn_continue(turn=paused, user=bob)
        paused.refresh_from_db()
        assert paused.status == "paused"

    def test_another_users_continue_post_is_404(self, paused, client, bob):
        client.force_login(bob)
        url = reverse("turn_continue", args=[paused.conversation_id, paused.pk])
        assert client.post(url).status_code == 404
        paused.refresh_from_db()
        assert paused.status == "paused"

    def test_owner_continue_post_resumes(self, paused, client, alice):
        client.force_login(alice)
        url = reverse("turn_continue", args=[paused.conversation_id, paused.pk])
        assert client.post(url).status_code == 302
        paused.refresh_from_db()
        assert paused.status == "completed"
        response = client.post(url)  # a second click
        assert response.status_code == 302
        page = client.get(paused.conversation.get_absolute_url()).content.decode()
        assert "already resumed" in page

    def test_stop_ends_the_turn_with_a_summary(self, paused, alice):
        turn_stop(turn=paused, user=alice)
        paused.refresh_from_db()
        assert paused.status == "stopped"
        maker = AgentDispatch.objects.get(turn=paused)
        assert maker.outcome == "cancelled" and maker.state == "closed"
        assert "Stopped at your request" in answer(paused)
        assert TurnPause.objects.get(turn=paused).decision == "stop"
        assert Task.objects.count() == 2


def test_turn_agent_limit_pauses_before_dispatch_and_resumes(llm, run_turn, limits, alice):
    limits(turn_max_agents=2)
    llm.respond = Plan([Agent(f"a{i}", ["tasks.search"], [("tasks.search", {})]) for i in range(3)])
    turn = run_turn()
    assert turn.status == "paused"
    pause = TurnPause.objects.get(turn=turn)
    assert pause.limit == "turn_max_agents"
    assert not AgentDispatch.objects.exists()  # the whole batch waits for the answer
    # No "3 more were asked for" beside "not started: none": the waiting agents by name.
    assert pause_words_of(pause).reached == "This turn may start 2 agents in all: it has started no agents and asked for another 3 agents."
    assert pause_words_of(pause).waiting == ["a0", "a1", "a2"]
    assert pause_words_of(pause).grant == "Continue allows 3 more agents for this turn."  # what was asked, above the default
    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    assert turn.status == "completed"
    assert AgentDispatch.objects.filter(turn=turn, outcome="completed").count() == 3


def test_llm_iteration_limit_pauses_and_resumes(llm, run_turn, limits, alice):
    limits(turn_max_llm_iterations=2)
    llm.respond = Plan([Agent("a", ["tasks.search"], [("tasks.search", {})])])
    turn = run_turn()
    assert turn.status == "paused"
    pause = TurnPause.objects.get(turn=turn)
    assert pause.limit == "turn_max_llm_iterations"
    assert pause_words_of(pause).reached.startswith("The assistant has taken 2 planning steps on this turn without reaching an answer")
    assert pause_words_of(pause).grant == "Continue allows 2 more planning steps for this turn."
    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    assert turn.status == "completed" and turn.llm_iterations == 4


def test_conversation_window_trips_across_turns(llm, limits, transactional_db, inline_tasks, alice):
    limits(conversation_max_skill_calls=2)
    llm.respond = Plan([Agent("maker", ["tasks.create"], [create("one"), create("two")])])
    conversation = conversation_for(alice)
    first = turn_start(conversation=conversation, text="make two")
    first.refresh_from_db()
    assert first.status == "completed"
    llm.respond = Plan([Agent("maker", ["tasks.create"], [create("three")])])
    second = turn_start(conversation=conversation, text="make one more")
    second.refresh_from_db()
    assert second.status == "paused"
    pause = TurnPause.objects.get(turn=second)
    assert pause.limit == "conversation_max_skill_calls"
    assert pause.detail["resumes_at"]
    assert pause_words_of(pause).reached.startswith("This conversation has made 2 skill calls in the last ")
    assert pause_words_of(pause).frees_at and "window frees up" in pause_question(pause.limit, pause.detail)
    turn_continue(turn=second, user=alice)
    second.refresh_from_db()
    assert second.status == "completed"
    assert Task.objects.count() == 3


class TestProfiles:
    def test_defaults_are_installed(self, db):
        from orchestration.models import AgentProfile

        profiles = {p.name: p for p in AgentProfile.objects.all()}
        assert set(profiles) >= {"researcher", "planner", "executor", "reviewer", "tester"}
        assert profiles["reviewer"].read_only and profiles["researcher"].read_only
        assert not profiles["executor"].read_only

    def test_dispatch_tool_offers_profiles(self, llm, run_turn):
        llm.respond = lambda request: text("hi")
        run_turn()
        tools = {t["function"]["name"]: t["function"] for t in llm.requests[0]["tools"]}
        enum = tools["dispatch_agent"]["parameters"]["properties"]["profile"]["enum"]
        assert enum == sorted(enum) and "reviewer" in enum
        assert "reviewer:" in llm.requests[0]["messages"][0]["content"]

    def test_no_profiles_no_profile_parameter(self, llm, run_turn):
        from orchestration.models import AgentProfile

        AgentProfile.objects.all().delete()
        llm.respond = lambda request: text("hi")
        run_turn()
        tools = {t["function"]["name"]: t["function"] for t in llm.requests[0]["tools"]}
        assert "profile" not in tools["dispatch_agent"]["parameters"]["properties"]
        assert "Agent profiles" not in llm.requests[0]["messages"][0]["content"]

    def run_first(self, llm, run_turn, first):
        def respond(request):
            if "use_skill" in json.dumps(request["tools"]):
                return text("report")
            results = [m for m in request["messages"] if m["role"] == "tool"]
            if not results:
                return first
            if len(results) == 1 and "dispatched" in results[0]["content"]:
                return calls(("get_agent_results", {}), prefix="r")
            return text("Saw: " + results[-1]["content"])

        llm.respond = respond
        turn = run_turn()
        return turn, answer(turn)

    def test_reviewer_cannot_get_email_send(self, llm, run_turn):
        spec = {"agent_id": "rev", "mission": "check", "skills": ["email.send"], "profile": "reviewer"}
        turn, reply = self.run_first(llm, run_turn, calls(("dispatch_agent", spec)))
        assert "profile 'reviewer' is read-only and may not use ['email.send']" in reply
        assert not AgentDispatch.objects.exists()

    def test_unknown_profile_is_an_error(self, llm, run_turn):
        spec = {"agent_id": "x", "mission": "m", "skills": ["tasks.search"], "profile": "wizard"}
        turn, reply = self.run_first(llm, run_turn, calls(("dispatch_agent", spec)))
        assert "'profile' must be one of" in reply

    def test_profile_and_version_are_recorded(self, llm, run_turn):
        from orchestration.models import AgentProfile

        reviewer = AgentProfile.objects.get(name="reviewer")
        reviewer.save()  # version 2
        spec = {"agent_id": "rev", "mission": "check", "skills": ["tasks.search"], "profile": "reviewer"}
        turn, reply = self.run_first(llm, run_turn, calls(("dispatch_agent", spec)))
        dispatch = AgentDispatch.objects.get(agent_id="rev")
        assert (dispatch.profile_name, dispatch.profile_version) == ("reviewer", 2)
        assert dispatch.max_tool_calls == reviewer.max_tool_calls
        agent_request = next(r for r in llm.requests if "use_skill" in json.dumps(r["tools"]))
        assert reviewer.system_prompt in agent_request["messages"][0]["content"]
