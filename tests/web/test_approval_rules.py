"""The Approvals page: the owner's rules and allow list, as a user makes and ends them
(plain forms and htmx), what a bad entry gets back, and that what the page stores is what
the engine reads (skills/policy.py, skills/egress.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from skills.egress import unfamiliar
from skills.models import EgressAllow, Policy, SkillRule
from skills.policy import policy_for
from skills.registry import get_skill

pytestmark = pytest.mark.usefixtures("approvals_on")

PAGE = reverse("approval_rules")
ADD_RULE = reverse("approval_rule_add")
ADD_ALLOWED = reverse("egress_allow_add")


def htmx_post(client, url, data=None):
    return client.post(url, data or {}, HTTP_HX_REQUEST="true")


def email_verdict(user, to: str):
    return policy_for(user, get_skill("email.send"), {"to": [to], "subject": "s", "body": "b"})


def test_the_page_lists_each_acting_skill_with_its_default(alice_client):
    page = alice_client.get(PAGE).content.decode()
    assert 'id="policy-email.send"' in page and ">ask first<" in page.split('id="policy-email.send"')[1][:200]
    assert 'id="policy-tasks.create"' in page
    assert 'id="policy-files.read"' not in page  # read-only: it never asks, a rule would mean nothing
    assert "No rules: every skill follows its default." in page
    assert "Nobody on your allow list." in page


def test_a_rule_made_on_the_page_is_the_one_the_engine_follows(alice_client, alice):
    assert email_verdict(alice, "bob@example.com").policy == Policy.ASK
    response = alice_client.post(ADD_RULE, {"skill": "email.send", "policy": "allow",
                                            "recipient_domain": "Example.COM", "days": "30"})
    assert response.status_code == 302 and response["Location"] == PAGE
    rule = SkillRule.objects.get(owner=alice)
    assert (rule.skill, rule.policy, rule.recipient_domain) == ("email.send", "allow", "example.com")
    assert timedelta(days=29) < rule.expires_at - timezone.now() <= timedelta(days=30)
    verdict = email_verdict(alice, "bob@example.com")
    assert (verdict.policy, verdict.rule_id) == (Policy.ALLOW, rule.pk)
    assert email_verdict(alice, "eve@elsewhere.test").policy == Policy.ASK  # outside the rule's scope
    page = alice_client.get(PAGE).content.decode()
    assert f'id="rule-{rule.pk}"' in page and "Rule added: allow email.send to addresses at example.com until" in page


def test_htmx_gets_the_rules_section_back(alice_client, alice):
    response = htmx_post(alice_client, ADD_RULE, {"skill": "tasks.update", "policy": "deny"})
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="approval-rules">') and "<html" not in body
    rule = SkillRule.objects.get(owner=alice)
    assert rule.expires_at is None and f'id="rule-{rule.pk}"' in body and "until you revoke it" in body


@pytest.mark.parametrize("data, field, error", [
    ({"skill": "files.read", "policy": "allow"}, "skill", "Select a valid choice"),
    ({"skill": "no.such", "policy": "allow"}, "skill", "Select a valid choice"),
    ({"skill": "email.send", "policy": "sometimes"}, "policy", "Select a valid choice"),
    ({"skill": "tasks.create", "policy": "allow", "recipient_domain": "example.com"}, "recipient_domain",
     "tasks.create sends nothing"),
    ({"skill": "email.send", "policy": "allow", "recipient_domain": "bob@example.com"}, "recipient_domain",
     "without an address"),
    ({"skill": "email.send", "policy": "allow", "recipient_domain": "example.com\r\nBcc: x"}, "recipient_domain",
     "Enter a domain"),
    ({"skill": "email.send", "policy": "allow", "recipient_domain": "example.com."}, "recipient_domain",
     "Enter a domain"),
    ({"skill": "email.send", "policy": "allow", "days": "0"}, "days", "greater than or equal to 1"),
    ({"skill": "email.send", "policy": "allow", "days": "366"}, "days", "less than or equal to 365"),
], ids=["read-only", "unknown", "policy", "domain-for-non-sender", "address", "header-injection",
        "trailing-dot", "zero-days", "too-long"])
@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_a_bad_rule_is_refused_next_to_its_field_and_nothing_is_stored(alice_client, data, field, error, htmx):
    response = htmx_post(alice_client, ADD_RULE, data) if htmx else alice_client.post(ADD_RULE, data)
    assert response.status_code == (200 if htmx else 400)
    body = response.content.decode()
    assert f'id="id_{field}"' in body and error in body.split(f'id="id_{field}"')[1].split('class="field"')[0]
    assert not SkillRule.objects.exists()


def test_revoking_ends_a_rule_once_and_keeps_it_as_history(alice_client, alice):
    rule = SkillRule.objects.create(owner=alice, skill="email.send", policy="allow")
    assert email_verdict(alice, "bob@example.com").policy == Policy.ALLOW
    url = reverse("approval_rule_revoke", args=[rule.pk])
    assert alice_client.post(url).status_code == 302
    assert alice_client.post(url).status_code == 302  # a second click (another tab) changes nothing
    rule.refresh_from_db()
    assert rule.revoked_at is not None
    assert email_verdict(alice, "bob@example.com").policy == Policy.ASK
    page = alice_client.get(PAGE).content.decode()
    ended = page.split('id="ended-rules"')[1]
    assert f'id="rule-{rule.pk}"' in ended and "revoked" in ended


def test_an_expired_rule_shows_as_ended_and_no_longer_applies(alice_client, alice):
    rule = SkillRule.objects.create(owner=alice, skill="email.send", policy="allow",
                                    expires_at=timezone.now() - timedelta(minutes=1))
    assert email_verdict(alice, "bob@example.com").policy == Policy.ASK
    page = alice_client.get(PAGE).content.decode()
    assert f'id="rule-{rule.pk}"' in page.split('id="ended-rules"')[1] and "expired" in page


def test_another_users_rules_are_neither_shown_nor_revocable(alice_client, bob):
    rule = SkillRule.objects.create(owner=bob, skill="email.send", policy="allow", recipient_domain="bob.test")
    assert "bob.test" not in alice_client.get(PAGE).content.decode()
    assert alice_client.post(reverse("approval_rule_revoke", args=[rule.pk])).status_code == 404
    rule.refresh_from_db()
    assert rule.revoked_at is None


def test_the_allow_list_makes_an_address_familiar(alice_client, alice):
    assert unfamiliar(alice, ["Carol@Partner.test"]) == ["carol@partner.test"]
    response = alice_client.post(ADD_ALLOWED, {"entry": "  Partner.TEST "})
    assert response.status_code == 302
    assert list(EgressAllow.objects.filter(owner=alice).values_list("entry", flat=True)) == ["partner.test"]
    assert unfamiliar(alice, ["Carol@Partner.test"]) == []
    assert alice_client.post(ADD_ALLOWED, {"entry": "partner.test"}).status_code == 302  # already there
    assert EgressAllow.objects.filter(owner=alice).count() == 1
    allowed = EgressAllow.objects.get(owner=alice)
    body = htmx_post(alice_client, reverse("egress_allow_remove", args=[allowed.pk])).content.decode()
    assert body.lstrip().startswith('<section id="egress">') and "Nobody on your allow list." in body
    assert unfamiliar(alice, ["carol@partner.test"]) == ["carol@partner.test"]


@pytest.mark.parametrize("entry, error", [
    ("", "This field is required"),
    ("bob@", "Enter a valid email address"),
    ("a@b@example.com", "Enter a valid email address"),
    ('"a b"@example.com', "without spaces or control characters"),
    ("bob@example.com\nBcc: eve@evil.test", "without spaces or control characters"),
    ("bob\u2028@example.com", "without spaces or control characters"),
    ("exa mple.com", "without spaces or control characters"),
    ("-bad-.com", "Enter a domain"),
    ("x" * 300, "at most 254 characters"),
])
def test_a_bad_allow_list_entry_is_refused_and_nothing_is_stored(alice_client, entry, error):
    response = alice_client.post(ADD_ALLOWED, {"entry": entry})
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not EgressAllow.objects.exists()


def test_the_daily_caps_show_todays_use(alice_client, alice, settings):
    from skills.domains.email.models import OutboxEmail

    settings.ASSISTANT_EGRESS = {**settings.ASSISTANT_EGRESS, "daily_messages": 7, "daily_recipients": 9}
    OutboxEmail.objects.create(owner=alice, to=["a@example.com", "b@example.com"], subject="s", body="b",
                               sent_at=timezone.now())
    page = alice_client.get(PAGE).content.decode()
    assert "At most 7 messages a day (1 sent today)" in page and "9 recipients a day (2 today)" in page
