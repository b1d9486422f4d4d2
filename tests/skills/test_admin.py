"""Admin pages for the skills' records: staff can look, search and filter."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from skills.models import CalendarEvent, Memory, OutboxEmail, SkillCircuit, Task


@pytest.fixture
def records(alice):
    start = timezone.now()
    Task.objects.create(owner=alice, title="Renew passport")
    CalendarEvent.objects.create(
        owner=alice, title="Lunch", start=start, duration_minutes=60, end=start + timedelta(hours=1)
    )
    OutboxEmail.objects.create(
        owner=alice,
        to=["sam@example.com"],
        subject="Hello there",
        body="Hi",
        message_id="<1@localhost>",
    )
    Memory.objects.create(owner=alice, text="Sam likes jazz", tags=["people"])
    SkillCircuit.objects.create(skill="email.send", consecutive_failures=2)


MODELS = ["task", "calendarevent", "outboxemail", "memory", "skillcircuit"]
SHOWN = ["Renew passport", "Lunch", "Hello there", "Sam likes jazz", "email.send"]


@pytest.mark.parametrize(("model", "shown"), list(zip(MODELS, SHOWN, strict=True)), ids=MODELS)
def test_staff_see_the_list_and_can_search_it(client, staff, records, model, shown):
    client.force_login(staff)
    page = client.get(reverse(f"admin:skills_{model}_changelist"))
    assert page.status_code == 200 and shown in page.content.decode()
    searched = client.get(reverse(f"admin:skills_{model}_changelist"), {"q": shown.split()[0]})
    assert searched.status_code == 200 and shown in searched.content.decode()


@pytest.mark.parametrize("model", MODELS)
def test_users_who_are_not_staff_are_sent_to_the_login(client, alice, model):
    client.force_login(alice)
    assert client.get(reverse(f"admin:skills_{model}_changelist")).status_code == 302


def test_sent_mail_cannot_be_edited_even_by_a_superuser(client, superuser, records):
    client.force_login(superuser)
    email = OutboxEmail.objects.get()
    page = client.post(
        reverse("admin:skills_outboxemail_change", args=[email.pk]), {"subject": "rewritten"}
    )
    assert page.status_code == 403


def test_sent_mail_cannot_be_added_or_deleted_even_by_a_superuser(client, superuser, records):
    client.force_login(superuser)
    email = OutboxEmail.objects.get()
    assert client.get(reverse("admin:skills_outboxemail_add")).status_code == 403
    assert client.post(reverse("admin:skills_outboxemail_delete", args=[email.pk]), {"post": "yes"}).status_code == 403
    changelist = client.get(reverse("admin:skills_outboxemail_changelist")).content.decode()
    assert "delete_selected" not in changelist
    assert OutboxEmail.objects.filter(pk=email.pk).exists()
