"""Planning without discovery (issue 15): the orchestrator's system prompt carries a
byte-stable skill catalogue, so a model that plans from it needs 3 calls for the seed
example (dispatch, results, answer) and the default limits leave room to spare."""

from __future__ import annotations

import pytest

from orchestration.budgets.limits import Limits
from orchestration.models import AgentDispatch, TurnPause
from skills import registry
from skills.base import Domain, Skill
from tests.support.llm_server import Agent, Plan

pytestmark = pytest.mark.django_db(transaction=True)

SEED = "find my overdue tasks, email them to bob@example.com and book a review meeting tomorrow at 2pm"
NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}


def orchestrator_requests(llm) -> list[dict]:
    return [r for r in llm.requests if "use_skill" not in {t["function"]["name"] for t in r.get("tools", [])}]


def test_the_catalogue_lists_every_skill_once_without_schemas():
    catalogue = registry.catalogue()
    for skill in registry.all_skills():
        kind = "reads" if skill.read_only else "writes"
        assert catalogue.count(f"- {skill.name} ({kind}): ") == 1
    assert "properties" not in catalogue and "\n\n" not in catalogue
    assert len(catalogue) < 2500  # a few hundred tokens


def test_the_catalogue_is_byte_stable_and_changes_only_with_the_skill_set(monkeypatch):
    assert registry.catalogue() == registry.catalogue()
    before = registry.catalogue()
    extra = Domain(name="zoo", description="Animals. More text here.", skills=(Skill(
        name="zoo.feed", description="Feed an animal. Twice a day.", parameters=NO_PARAMS,
        handler=lambda user: {}),))
    monkeypatch.setitem(registry.DOMAINS, "zoo", extra)
    after = registry.catalogue()
    assert after.startswith(before) and after[len(before):] == "\nzoo: Animals.\n- zoo.feed (writes): Feed an animal."


def test_the_seed_example_takes_three_orchestrator_calls_planned_from_the_catalogue(llm, run_turn):
    search = ("tasks.search", {"status": "open", "due_before": "2026-11-24"})
    mail = ("email.send", {"to": ["bob@example.com"], "subject": "Overdue tasks", "body": "None overdue."})
    meeting = ("calendar.create_event", {"title": "Review meeting", "start": "2026-11-25T14:00:00",
                                         "end": "2026-11-25T15:00:00"})
    llm.respond = Plan([
        Agent("overdue", ["tasks.search"], [search], report="No overdue tasks."),
        Agent("mailer", ["email.send"], [mail], depends_on=["overdue"], report="Mailed Bob."),
        Agent("meeting", ["calendar.create_event"], [meeting], report="Booked."),
    ], answer="Done: Bob has the list and the review is booked.", discover=False)

    turn = run_turn(SEED)

    assert turn.status == "completed", turn.error
    assert turn.llm_iterations == 3 and not TurnPause.objects.exists()
    assert Limits.from_json(turn.limits).turn_max_llm_iterations >= 2 * turn.llm_iterations  # room to spare
    assert set(AgentDispatch.objects.filter(turn=turn).values_list("outcome", flat=True)) == {"completed"}
    prompts = [r["messages"][0]["content"] for r in orchestrator_requests(llm)]
    assert len(prompts) == 3 and len(set(prompts)) == 1  # the same system prompt on every call
    assert registry.catalogue() in prompts[0]
