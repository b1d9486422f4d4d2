"""The approval prompt's answer names its question (issue 24, finding 1): the approval's id
and the digest of the call shown. An answer to any other question — answered already (a
second click, a second tab still showing it), or a call other than the one shown — is
refused with 409 and the question waiting now, and is applied to nothing."""

from __future__ import annotations

import threading

import pytest
from django.core import mail
from django.db import connection
from django.test import Client
from django.urls import reverse

from orchestration.models import Event, SkillApproval, Turn, TurnPause
from orchestration.engine.profiles import install_default_profiles
from orchestration.questions.approvals import call_digest
from skills.models import SkillRule
from tests.factories import conversation_for, dispatch_for, turn_for
from tests.orchestration.conftest import inline_tasks, llm, run_turn  # noqa: F401 - fixtures
from tests.support.llm_server import Agent, Plan

X = ("email.send", {"to": ["carol@example.com"], "subject": "Agenda", "body": "Tuesday's agenda."})
Y = ("email.send", {"to": ["drop@evil.test"], "subject": "Agenda", "body": "Tuesday's agenda."})
HOW = {"plain": {}, "htmx": {"HTTP_HX_REQUEST": "true"}}


def ask(turn, dispatch, call: tuple[str, dict], *, answered: bool = False) -> SkillApproval:
    """A question of `turn` about `call`, as the engine stores it (open unless `answered`)."""
    skill, arguments = call
    pause = TurnPause.objects.create(turn=turn, limit="approval", detail={"agent": dispatch.agent_id},
                                     decision="continue" if answered else "")
    return SkillApproval.objects.create(turn=turn, dispatch=dispatch, pause=pause, skill=skill, arguments=arguments,
                                        digest=call_digest(skill, arguments), reasons=["email.send asks first"],
                                        decision="approved" if answered else "")


@pytest.fixture
def x_answered(alice):
    """X was approved; the turn now waits on Y."""
    turn = turn_for(conversation_for(alice), status="paused")
    mailer = dispatch_for(turn, "mailer")
    return ask(turn, mailer, X, answered=True), ask(turn, mailer, Y)


def post(client, asked: SkillApproval, how: str = "htmx", answer: str = "approve", **fields):
    """`answer` to `asked` as its prompt posts it; `fields` change or (None) leave out what it sends."""
    url = reverse("approval_answer", args=[asked.turn.conversation_id, asked.turn_id])
    data = {"answer": answer, "approval": asked.pk, "digest": asked.digest, **fields}
    return client.post(url, {key: value for key, value in data.items() if value is not None}, **HOW[how])


def assert_still_waiting(approval: SkillApproval) -> None:
    approval.refresh_from_db()
    assert approval.decision == "" and approval.pause.decision == ""
    assert not SkillRule.objects.exists() and not Event.objects.filter(type="approval.decided").exists()


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("answer", ["approve", "always"])
def test_an_answer_to_the_question_answered_already_gets_409_and_the_question_waiting(alice_client, x_answered,
                                                                                     how, answer):
    x, y = x_answered
    response = post(alice_client, x, how, answer)
    assert response.status_code == 409
    page = response.content.decode()
    assert f"Approval {x.pk} was answered already: nothing was done with this answer." in page
    assert f'id="approval-{y.pk}"' in page and "drop@evil.test" in page  # the question waiting now
    assert f'name="approval" value="{y.pk}"' in page and f'name="digest" value="{y.digest}"' in page
    if how == "htmx":  # the panel, over the prompt the answer came from
        assert page.strip().startswith('<div id="pause-prompt">') and "<html" not in page
    else:
        assert "<html" in page and 'id="composer"' in page
    assert_still_waiting(y)


@pytest.mark.parametrize("how", HOW)
def test_an_answer_to_another_call_than_the_one_shown_gets_409(alice_client, x_answered, how):
    x, y = x_answered
    response = post(alice_client, y, how, digest=x.digest)
    assert response.status_code == 409
    assert f"The call answered is not the call approval {y.pk} asks about" in response.content.decode()
    assert_still_waiting(y)


@pytest.mark.parametrize("how", HOW)
def test_an_answer_when_nothing_waits_gets_409_saying_so(alice_client, x_answered, how):
    x, y = x_answered
    TurnPause.objects.filter(pk=y.pause_id).update(decision="stop")
    Turn.objects.filter(pk=x.turn_id).update(status="stopped")
    response = post(alice_client, y, how)
    assert response.status_code == 409
    page = response.content.decode()
    assert "no approval is waiting now" in page and 'id="approval-' not in page


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("missing", [{"approval": None}, {"approval": "X"}, {"digest": None}, {"answer": "maybe"}],
                         ids=["no id", "no number", "no digest", "no answer"])
def test_an_answer_that_names_no_question_is_400(alice_client, x_answered, how, missing):
    x, y = x_answered
    assert post(alice_client, y, how, **missing).status_code == 400
    assert_still_waiting(y)


def test_another_users_turn_stays_404(client, bob, x_answered):
    x, y = x_answered
    client.force_login(bob)
    for how in HOW:
        assert post(client, y, how).status_code == 404
    assert_still_waiting(y)


@pytest.mark.parametrize("how", HOW)
def test_the_answer_to_the_question_waiting_is_applied(alice_client, x_answered, how):
    x, y = x_answered
    response = post(alice_client, y, how, "deny")
    assert response.status_code == (204 if how == "htmx" else 302)
    y.refresh_from_db()
    assert y.decision == "denied" and y.pause.decision == "continue"


def race(alice, asked: SkillApproval, *, posts: int = 8) -> list[int]:
    """`posts` clients, each its own connection, post "always allow" for `asked` at once."""
    start, statuses = threading.Barrier(posts), []

    def answer():
        client = Client()
        client.force_login(alice)
        start.wait()
        try:
            statuses.append(post(client, asked, answer="always").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=answer) for _ in range(posts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(statuses)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("approvals_on")
def test_racing_posts_of_one_answer_apply_it_once_and_never_to_the_next_call(llm, run_turn, alice):
    """Eight posts of "always allow X" at once: one is applied (and the turn runs on, in
    that request, to Y's question), the others refused. Eight more of the same answer,
    stale now, race while Y waits: none is applied, no rule for Y's domain."""
    install_default_profiles()  # a transactional test's flush took the migration's rows
    llm.respond = Plan([Agent("mailer", ["email.send"], [X, Y], per_call=2)])
    turn = run_turn()
    x = SkillApproval.objects.get(turn=turn)

    assert race(alice, x) == [204] + [409] * 7
    y = SkillApproval.objects.get(turn=turn, decision="")
    assert y.arguments["to"] == ["drop@evil.test"]
    assert race(alice, x) == [409] * 8

    y.refresh_from_db()
    x.refresh_from_db()
    assert (x.decision, y.decision) == ("approved", "")
    assert [message.to for message in mail.outbox] == [["carol@example.com"]]
    assert list(SkillRule.objects.values_list("recipient_domain", flat=True)) == ["example.com"]
    assert Event.objects.filter(turn=turn, type="approval.decided").count() == 1
