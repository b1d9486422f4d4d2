"""An approved call runs exactly once, on a real qcluster, though the worker running it
is SIGKILLed: in the middle of the send (the replay sends, once) or after the mail went
out, before the call committed (the replay finds the journal entry and does not send).

The approval is used in the transaction that opens the call's row; a replay of that
row runs the handler again without asking again (skills/executor.py), so the owner
answers once and the mail goes out once.
"""

from __future__ import annotations

import os
import signal

import pytest

from orchestration.models import AgentDispatch, SkillApproval, SkillExecution
from orchestration.questions.approvals import approval_answer
from orchestration.lifecycle.turns import turn_start
from skills.domains.email.models import OutboxEmail
from tests.conftest import APPROVALS_ON_ENV
from tests.factories import conversation_for
from tests.live.conftest import wait_for
from tests.live.test_faults import assert_settled, mail_env, wait_turn_reaping
from tests.live.test_qcluster import EMAIL, turn_done
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals_on")]


@pytest.fixture
def mail(tmp_path):
    directory = tmp_path / "mail" / "sent"
    directory.mkdir(parents=True)
    return directory


@pytest.mark.parametrize("hold", ["hold", "hold-after"], ids=["mid-send", "after-the-send"])
def test_an_approved_email_goes_out_once_though_the_worker_dies_running_it(llm, qcluster, alice, mail, hold):
    llm.latency = 0.05
    llm.respond = Plan([Agent("mailer", ["email.send"], [EMAIL], report="Mailed Bob.")], answer="Mail sent.")
    cluster = qcluster(workers=3, env={**mail_env(mail), **APPROVALS_ON_ENV})
    turn = turn_start(conversation=conversation_for(alice), text="Mail Bob")
    wait_for(lambda: turn_done(turn), timeout=60, what="the turn to ask", cluster=cluster)
    assert turn.status == "paused", turn.error
    approval = SkillApproval.objects.get(turn=turn)
    assert list(mail.iterdir()) == [] and not SkillExecution.objects.filter(skill="email.send").exists()

    flag, holding = mail.parent / hold, mail.parent / "holding"
    flag.touch()
    approval_answer(turn=turn, user=alice, approval_id=approval.pk, digest=approval.digest, approve=True)
    wait_for(holding.exists, timeout=60, what="the approved send to start", cluster=cluster)
    worker = int(holding.read_text())
    assert worker in cluster.descendants()
    os.kill(worker, signal.SIGKILL)
    flag.unlink()

    approval.refresh_from_db()
    (execution,) = SkillExecution.objects.filter(skill="email.send")
    assert (approval.decision, approval.execution_id, execution.status) == ("approved", execution.pk, "running")
    assert len(list(mail.iterdir())) == (1 if hold == "hold-after" else 0)

    wait_turn_reaping(turn, cluster)

    assert_settled(turn, mail)
    assert turn.status == "completed", turn.error
    assert len(list(mail.iterdir())) == 1 and OutboxEmail.objects.count() == 1
    assert SkillApproval.objects.filter(turn=turn).count() == 1  # the replay did not ask again
    execution.refresh_from_db()
    assert execution.status == "completed" and execution.clearance["approval_id"] == approval.pk
    mailer = AgentDispatch.objects.get(turn=turn, agent_id="mailer")
    # Up to the question; resumed by the answer and killed; run again by the reaper.
    assert mailer.outcome == "completed" and mailer.crashes == 1  # the kill; not the pause nor the answer
    assert llm.errors == []
