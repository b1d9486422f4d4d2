"""Staff see each user's model use against their allowance, each period in its own zone,
and set a user's own."""

from __future__ import annotations

import pytest
from django.urls import reverse

from assistant.preferences import preferences_time_zone_set
from orchestration.budgets.spending import caps_for, spend_reserve, spend_settle
from orchestration.llm.base import Usage
from orchestration.models import SpendAllowance
from tests.factories import spent

pytestmark = pytest.mark.django_db

LIST = "admin:orchestration_userspend_changelist"


@pytest.fixture
def alice_spent(alice, settings):
    settings.ASSISTANT_SPEND = {**settings.ASSISTANT_SPEND, "tokens_per_day": 10_000, "tokens_per_month": 0}
    spent(alice, day=1234, month=56_789)
    return alice


def test_staff_see_each_users_use_against_the_allowance(client, staff, alice_spent, bob):
    client.force_login(staff)
    page = client.get(reverse(LIST)).content.decode()
    assert "1,234 of 10,000 tokens · $0.00" in page  # today, against the site default
    assert "56,789 tokens · $0.00" in page  # this month: no monthly cap
    assert "bob" in page


def test_staff_set_a_users_own_allowance(client, staff, alice_spent):
    client.force_login(staff)
    url = reverse("admin:orchestration_userspend_change", args=[alice_spent.pk])
    assert client.get(url).status_code == 200
    form = {
        "spend_allowance-TOTAL_FORMS": "1", "spend_allowance-INITIAL_FORMS": "0",
        "spend_allowance-MIN_NUM_FORMS": "0", "spend_allowance-MAX_NUM_FORMS": "1",
        "spend_allowance-0-user": str(alice_spent.pk),
        "spend_allowance-0-tokens_per_day": "50000", "spend_allowance-0-tokens_per_month": "",
        "spend_allowance-0-usd_per_day": "", "spend_allowance-0-usd_per_month": "2.5",
    }
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    allowance = SpendAllowance.objects.get(user=alice_spent)
    assert allowance.tokens_per_day == 50_000 and allowance.tokens_per_month is None
    caps = caps_for(alice_spent)
    assert caps.tokens_per_day == 50_000 and caps.tokens_per_month == 0 and str(caps.usd_per_month) == "2.5000"
    assert "1,234 of 50,000 tokens" in client.get(reverse(LIST)).content.decode()


def test_others_cannot_see_or_set_allowances(client, alice_spent, bob):
    client.force_login(bob)
    assert client.get(reverse(LIST)).status_code == 302  # to the admin's login
    url = reverse("admin:orchestration_userspend_change", args=[alice_spent.pk])
    client.post(url, {"spend_allowance-0-tokens_per_day": "0"})
    assert not SpendAllowance.objects.exists()


def test_each_period_shows_its_own_zone_and_end(client, staff, alice, settings, clock):
    """A zone change applies from the next period (issue 24): the list shows alice's day
    and month as they were counted, in UTC, after she moved to Kiritimati."""
    clock("2026-11-25T21:47:00+00:00")
    settings.ASSISTANT_SPEND = {**settings.ASSISTANT_SPEND, "tokens_per_day": 20_000, "tokens_per_month": 0}
    reservation = spend_reserve(user=alice, model="unpriced", messages=[{"role": "user", "content": "hi"}], tools=[])
    spend_settle(reservation=reservation, usage=Usage(prompt_tokens=4000, completion_tokens=1000), cost=None)
    preferences_time_zone_set(user=alice, time_zone="Pacific/Kiritimati")  # the 26th there already
    client.force_login(staff)
    page = client.get(reverse(LIST)).content.decode()
    assert "5,000 of 20,000 tokens · $0.00 (renews Thu 26 Nov, 00:00, UTC)" in page
    assert "5,000 tokens · $0.00 (renews Tue 1 Dec, 00:00, UTC)" in page
