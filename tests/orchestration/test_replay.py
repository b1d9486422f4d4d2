"""Replay of stored turns through the current engine, from their records only (inline
tasks, the scripted model server for the stored run and nothing for the replay): a
diamond, an approval, a paused-and-continued turn, a nested delegation and a retried
agent replay without divergence; a changed engine decision is reported."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from orchestration.budgets.limits import Limits
from orchestration.models import Conversation, SkillApproval, TurnPause
from orchestration.questions.approvals import approval_answer
from orchestration.questions.pauses import turn_continue
from orchestration.replay.replaying import compare, replay
from skills.domains.email.models import OutboxEmail
from tests.support.llm_server import Agent, Plan, Recorded, with_burst

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals_on")]

SEARCH = ("tasks.search", {"status": "open"})
ADD = ("tasks.create", {"title": "Call the plumber"})
EMAIL = ("email.send", {"to": ["bob@example.com"], "subject": "Tasks", "body": "Your open tasks."})
DIAMOND = Plan([Agent("a", ["tasks.search", "tasks.create"], [SEARCH, ADD]),
                Agent("b", ["tasks.search"], [SEARCH], depends_on=["a"]),
                Agent("c", ["tasks.search"], [SEARCH], depends_on=["a"]),
                Agent("d", ["tasks.search"], [SEARCH], depends_on=["b", "c"], report="d done")],
               answer="Done.")


def test_a_diamond_replays_with_no_divergence_and_no_side_effect(llm, run_turn, alice):
    llm.respond = DIAMOND
    turn = run_turn("Sort out my tasks")
    assert turn.status == "completed", turn.error
    requests, tasks = len(llm.requests), alice.tasks.count()
    result = replay(turn)
    assert result.divergences == []
    assert result.model_calls == requests and result.skill_calls == 5
    assert len(llm.requests) == requests, "the replay called the model"
    assert alice.tasks.count() == tasks, "the replay ran a skill's handler"
    assert Conversation.objects.filter(owner=alice).count() == 1, "the replay's conversation was left behind"


def test_an_approved_email_replays_its_answer_and_sends_nothing(llm, run_turn, alice):
    llm.respond = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed.")])
    turn = run_turn("Mail Bob")
    asked = SkillApproval.objects.get(turn=turn)
    approval_answer(turn=turn, user=alice, approval_id=asked.pk, digest=asked.digest, approve=True)
    turn.refresh_from_db()
    assert turn.status == "completed" and OutboxEmail.objects.count() == 1
    result = replay(turn)
    assert result.divergences == []
    assert OutboxEmail.objects.count() == 1


def test_a_paused_and_continued_turn_replays(llm, run_turn, alice, settings):
    settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "turn_max_agents": 1}
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH]), Agent("b", ["tasks.search"], [SEARCH])])
    turn = run_turn("Two searches")
    assert turn.status == "paused" and TurnPause.objects.filter(turn=turn).exists()
    turn_continue(turn=turn, user=alice)
    turn.refresh_from_db()
    assert turn.status == "completed", turn.error
    assert replay(turn).divergences == []


def test_a_retried_agent_replays(llm, run_turn, alice, settings):
    settings.ASSISTANT_LLM_MAX_RETRIES = 0
    llm.respond = with_burst(Plan([Agent("a", ["tasks.search"], [SEARCH])]), count=1, status=503)
    turn = run_turn("Search once")
    assert turn.status == "completed", turn.error
    assert replay(turn).divergences == []


def test_a_changed_engine_decision_is_reported(llm, run_turn, alice, monkeypatch):
    llm.respond = DIAMOND
    turn = run_turn("Sort out my tasks")
    monkeypatch.setattr(Limits, "agent_tool_budget", lambda self, requested: 1)  # the engine now allows one call
    result = replay(turn)
    assert result.diverged
    assert any(line.startswith("agent a ended budget_exceeded; stored: completed") for line in result.divergences), \
        result.divergences


def test_manage_py_replay_says_so_and_fails_on_divergence(llm, run_turn, alice, monkeypatch):
    llm.respond = DIAMOND
    turn = run_turn("Sort out my tasks")
    out = StringIO()
    call_command("replay", str(turn.pk), stdout=out)
    assert "no divergence" in out.getvalue()
    monkeypatch.setattr(Limits, "agent_tool_budget", lambda self, requested: 1)
    with pytest.raises(CommandError, match="1 of 1 turns diverged"):
        call_command("replay", str(turn.pk), stdout=StringIO())
    with pytest.raises(CommandError, match="No turn 999999"):
        call_command("replay", "999999")


def test_an_exported_turn_runs_again_as_a_test_and_replays_green(llm, run_turn, alice, bob, tmp_path):
    llm.respond = DIAMOND
    turn = run_turn("Sort out my tasks")
    path = tmp_path / "turn.json"
    call_command("replay", str(turn.pk), "--as-fixture", str(path), stdout=StringIO())

    recorded = Recorded(path)
    assert recorded.text == "Sort out my tasks"
    llm.respond = recorded  # the scripted model server now answers as the stored turn's model did
    again = run_turn(recorded.text, user=bob)  # records as fresh as the stored turn found them
    assert again.status == "completed" and recorded.missed == []
    assert compare(turn, again, results=False) == []  # the same calls, in the same order; results are live


def test_a_fork_reuses_the_stored_answers_takes_the_edit_then_runs_live(llm, run_turn, alice, tmp_path, client):
    llm.respond = Plan([Agent("a", ["tasks.create", "tasks.search"], [ADD, SEARCH], report="a: plumber added")],
                       answer="Added.")
    turn = run_turn("Add the plumber")
    assert turn.status == "completed" and alice.tasks.count() == 1
    stored_requests = len(llm.requests)
    edited = tmp_path / "answer.json"
    edited.write_text('{"content": "a: forked report", "tool_calls": []}')
    out = StringIO()
    call_command("replay", str(turn.pk), "--fork", "a:3", "--response", str(edited), stdout=out)

    forked = turn.forks.get()
    assert forked.status == "completed" and forked.forked_at == "a:3"
    assert f"turn {turn.pk} forked at a:3: turn {forked.pk} (completed)" in out.getvalue()
    assert alice.tasks.count() == 1, "a stored side effect before the fork was done again"
    agent = forked.dispatches.get(agent_id="a")
    assert agent.result == "a: forked report"
    # Before the fork nothing asked the model; after it, the orchestrator asked it for real.
    live = llm.requests[stored_requests:]
    assert live and all("use_skill" not in str(r.get("tools")) for r in live)
    assert "a: forked report" in str(live[-1]["messages"])  # its results call read the edited report
    client.force_login(alice)
    page = client.get(f"/conversations/{forked.conversation_id}/audit/").content.decode()
    assert f"A fork of turn id {turn.pk}: its stored answers up to a:3" in page


@pytest.mark.parametrize("at, problem", [("a:9", "a has 3 stored answers"), ("zed:1", "has no agent 'zed'"),
                                         ("orchestrator", "name a role and an answer")])
def test_a_fork_at_a_step_the_turn_does_not_have_is_refused(llm, run_turn, alice, tmp_path, at, problem):
    llm.respond = Plan([Agent("a", ["tasks.create", "tasks.search"], [ADD, SEARCH])])
    turn = run_turn("Add the plumber")
    edited = tmp_path / "answer.json"
    edited.write_text('{"content": "x"}')
    with pytest.raises(CommandError, match=problem):
        call_command("replay", str(turn.pk), "--fork", at, "--response", str(edited), stdout=StringIO())
    assert not turn.forks.exists()


@pytest.mark.parametrize("answer, problem", [("not json", "Expecting value"),
                                             ('{"content": "x", "tool_calls": [{"name": "get_skill"}]}', "Cannot fork")])
def test_a_fork_with_an_answer_that_is_not_one_is_refused(llm, run_turn, alice, tmp_path, answer, problem):
    llm.respond = Plan([Agent("a", ["tasks.search"], [SEARCH])])
    turn = run_turn("Search")
    edited = tmp_path / "answer.json"
    edited.write_text(answer)
    with pytest.raises(CommandError, match=problem):
        call_command("replay", str(turn.pk), "--fork", "a:1", "--response", str(edited), stdout=StringIO())
    assert not turn.forks.exists() and Conversation.objects.filter(owner=alice).count() == 1


# --- a fork from the audit page ------------------------------------------------------------


@pytest.fixture
def plumber_turn(llm, run_turn):
    llm.respond = Plan([Agent("a", ["tasks.create", "tasks.search"], [ADD, SEARCH], report="a: plumber added")],
                       answer="Added.")
    turn = run_turn("Add the plumber")
    assert turn.status == "completed"
    return turn


def fork_url(turn) -> str:
    return f"/conversations/{turn.conversation_id}/turns/{turn.pk}/fork/"


def test_the_audit_forks_a_turn_in_a_process_of_its_own(plumber_turn, llm, alice, client, monkeypatch):
    from tests.support.processes import database_url

    turn = plumber_turn
    client.force_login(alice)
    assert fork_url(turn) in client.get(f"/conversations/{turn.conversation_id}/audit/").content.decode()
    page = client.get(fork_url(turn) + "?at=a:3")
    assert page.status_code == 200 and "a: plumber added" in page.content.decode()  # the stored answer, to edit
    # The fork's own process reaches this test's database and scripted model server.
    for name, value in {"DATABASE_URL": database_url(), "ASSISTANT_LLM_PROVIDER": "openai", "OPENAI_BASE_URL": llm.url,
                        "OPENAI_API_KEY": "test", "ASSISTANT_LLM_MAX_RETRIES": "0"}.items():
        monkeypatch.setenv(name, value)
    stored_requests = len(llm.requests)
    response = client.post(fork_url(turn), {"at": "a:3", "answer": '{"content": "a: forked report", "tool_calls": []}'})
    forked = turn.forks.get()
    assert response.status_code == 302 and response.url == f"/conversations/{forked.conversation_id}/"
    assert forked.status == "completed" and forked.forked_at == "a:3"
    assert forked.dispatches.get(agent_id="a").result == "a: forked report"
    assert alice.tasks.count() == 1, "a stored side effect before the fork was done again"
    assert len(llm.requests) > stored_requests, "after the fork, the model is asked for real"


@pytest.mark.parametrize(("at", "answer", "problem"), [
    ("a:3", "{not json", "Not a model answer"),
    ("a:3", '{"content": "x", "tool_calls": [{"name": "get_skill"}]}', "Not a model answer"),
    ("a:3", '"just text"', "Not a model answer"),
    ("a:3", '{"content": "' + "x" * 70_000 + '"}', "at most 64000"),
    ("zz:1", '{"content": "x"}', "has no agent"),
    ("a:9", '{"content": "x"}', "stored answers"),
])
def test_a_bad_fork_is_refused_with_its_reason_and_makes_nothing(plumber_turn, alice, client, at, answer, problem):
    client.force_login(alice)
    response = client.post(fork_url(plumber_turn), {"at": at, "answer": answer})
    assert response.status_code == 400 and problem in response.content.decode()
    assert not plumber_turn.forks.exists() and Conversation.objects.filter(owner=alice).count() == 1


def test_only_the_owner_may_fork_and_the_form_needs_its_token(plumber_turn, alice, bob, staff, client):
    """Staff read any audit trail but act on none: a fork runs the owner's skills."""
    from django.test import Client

    for other in (bob, staff):
        client.force_login(other)
        assert client.get(fork_url(plumber_turn)).status_code == 404
        assert client.post(fork_url(plumber_turn), {"at": "a:3", "answer": '{"content": "x"}'}).status_code == 404
    assert fork_url(plumber_turn) not in client.get(f"/conversations/{plumber_turn.conversation_id}/audit/").content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(fork_url(plumber_turn), {"at": "a:3", "answer": '{"content": "x"}'}).status_code == 403
    assert not plumber_turn.forks.exists() and Conversation.objects.filter(owner=alice).count() == 1


def test_a_fork_that_cannot_run_says_why_in_its_conversation(plumber_turn, llm, alice, client, monkeypatch):
    """Checked when asked, the fork's own process may still refuse (here: the turn was
    resumed meanwhile): the owner, looking at the new conversation, reads why."""
    from orchestration.replay import forking
    from tests.support.processes import database_url

    queued = []
    monkeypatch.setattr(forking, "async_task", lambda *args: queued.append(args))
    monkeypatch.setenv("DATABASE_URL", database_url())
    client.force_login(alice)
    response = client.post(fork_url(plumber_turn), {"at": "a:3", "answer": '{"content": "x", "tool_calls": []}'})
    fork = Conversation.objects.get(owner=alice, title__startswith="Fork of")
    assert response.url == f"/conversations/{fork.pk}/"
    type(plumber_turn).objects.filter(pk=plumber_turn.pk).update(status="running")
    (task,) = queued
    with pytest.raises(forking.ForkFailed, match="has not ended"):
        forking.fork_task(*task[1:])
    fork.refresh_from_db()
    assert fork.title == (f"Fork of turn {plumber_turn.pk} at a:3: could not run "
                          f"(CommandError: Turn {plumber_turn.pk} has not ended (running): replay an ended turn.)")
    assert not fork.turns.exists()
