"""The login throttle (django-axes; assistant/logins.py): the site's login and the admin's.

The abuse: 40 wrong passwords in 16 s met no throttle. Now, after LOGIN_FAILURE_LIMIT (5)
failures for one username from one address, or LOGIN_ADDRESS_FAILURE_LIMIT (well above it)
from one address for any usernames, the next attempts from there get a 429 page with
Retry-After, even with the right password, until the cool-off has passed; other users
elsewhere log in as before, and so do colleagues behind the same office address.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.test import Client
from django.urls import reverse

from tests.conftest import PASSWORD

ATTACKER = "10.0.0.66"
ELSEWHERE = "10.0.0.7"


@pytest.fixture(autouse=True)
def throttle_on(settings):
    settings.AXES_ENABLED = True
    settings.AXES_FAILURE_LIMIT = 5
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 12
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)


def log_in(username, password, *, ip, url=None, client=None):
    client = client or Client(REMOTE_ADDR=ip)
    response = client.post(url or reverse("login"), {"username": username, "password": password})
    return client, response


def logged_in(client) -> bool:
    return client.get(reverse("conversation_list")).status_code == 200


def pass_the_cool_off():
    """As if the cool-off had passed since the last attempt (no waiting in tests)."""
    for attempt in AccessAttempt.objects.all():
        AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=attempt.attempt_time - timedelta(minutes=16))


def test_forty_wrong_passwords_are_throttled_and_then_even_the_right_one_waits(alice, bob):
    client = Client(REMOTE_ADDR=ATTACKER)
    started = time.perf_counter()
    statuses = [log_in("alice", f"guess-{i}", ip=ATTACKER, client=client)[1].status_code for i in range(40)]
    elapsed = time.perf_counter() - started
    print(f"\n40 wrong passwords took {elapsed:.2f} s; answers: {statuses.count(200)} x 200, "
          f"{statuses.count(429)} x 429")
    assert statuses == [200] * 4 + [429] * 36  # the 5th failure already locks

    _, right = log_in("alice", PASSWORD, ip=ATTACKER, client=client)
    assert right.status_code == 429
    assert right["Retry-After"] == str(15 * 60)
    page = right.content.decode()
    assert "Logins paused" in page and "try again in 15 minutes" in page
    assert 'href="/login/"' in page
    assert not logged_in(client)

    # another user from another address is unaffected; so is alice herself, elsewhere
    bob_client, bobs = log_in("bob", PASSWORD, ip=ELSEWHERE)
    assert bobs.status_code == 302 and logged_in(bob_client)
    alice_elsewhere, hers = log_in("alice", PASSWORD, ip=ELSEWHERE)
    assert hers.status_code == 302 and logged_in(alice_elsewhere)

    pass_the_cool_off()
    _, after = log_in("alice", PASSWORD, ip=ATTACKER, client=client)
    assert after.status_code == 302 and logged_in(client)


def test_guessing_across_usernames_from_one_address_is_throttled_at_the_address_limit(alice, bob):
    for i in range(11):  # one short of LOGIN_ADDRESS_FAILURE_LIMIT, one guess per name
        log_in(f"user{i}", f"guess-{i}", ip=ATTACKER)
    bob_client, bobs = log_in("bob", PASSWORD, ip=ATTACKER)
    assert bobs.status_code == 302 and logged_in(bob_client)
    log_in("user11", "guess-11", ip=ATTACKER)
    _, bobs = log_in("bob", PASSWORD, ip=ATTACKER)
    assert bobs.status_code == 429
    _, bobs_elsewhere = log_in("bob", PASSWORD, ip=ELSEWHERE)
    assert bobs_elsewhere.status_code == 302


OFFICE = "203.0.113.10"


def test_colleagues_behind_one_office_address_do_not_lock_each_other_out(alice, bob):
    """Alice mistypes five times and is paused there; bob, at the next desk, is not."""
    for i in range(5):
        log_in("alice", f"typo-{i}", ip=OFFICE)
    _, hers = log_in("alice", PASSWORD, ip=OFFICE)
    assert hers.status_code == 429
    for i in range(4):  # bob mistypes too, short of his own limit
        log_in("bob", f"typo-{i}", ip=OFFICE)
    bob_client, bobs = log_in("bob", PASSWORD, ip=OFFICE)
    assert bobs.status_code == 302 and logged_in(bob_client)


def test_the_admin_login_is_throttled(staff):
    url = reverse("admin:login")
    client = Client(REMOTE_ADDR=ATTACKER)
    statuses = [log_in("staff", "wrong", ip=ATTACKER, url=url, client=client)[1].status_code for _ in range(8)]
    assert statuses == [200] * 4 + [429] * 4
    _, right = log_in("staff", PASSWORD, ip=ATTACKER, url=url, client=client)
    assert right.status_code == 429 and "Logins paused" in right.content.decode()
    assert client.get(reverse("admin:index")).status_code == 302  # still not in
    other, elsewhere = log_in("staff", PASSWORD, ip=ELSEWHERE, url=url)
    assert elsewhere.status_code == 302 and other.get(reverse("admin:index")).status_code == 200


def test_a_forged_forwarded_for_does_not_dodge_the_throttle(alice):
    """Without TRUSTED_PROXY the header is the client's own words: ignored."""
    client = Client(REMOTE_ADDR=ATTACKER)
    for i in range(5):
        client.post(reverse("login"), {"username": "alice", "password": "x"}, HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD},
                           HTTP_X_FORWARDED_FOR="192.0.2.99")
    assert response.status_code == 429


def test_behind_a_trusted_proxy_the_address_it_saw_counts(settings, alice, bob):
    """The proxy appends the address it saw: the right-most entry, whatever the client sent."""
    settings.TRUSTED_PROXY = True
    proxy = "127.0.0.1"
    for i in range(5):
        Client(REMOTE_ADDR=proxy).post(reverse("login"), {"username": "alice", "password": "x"},
                                       HTTP_X_FORWARDED_FOR=f"192.0.2.{i}, {ATTACKER}")
    locked = Client(REMOTE_ADDR=proxy).post(reverse("login"), {"username": "alice", "password": PASSWORD},
                                            HTTP_X_FORWARDED_FOR=ATTACKER)
    assert locked.status_code == 429
    fine = Client(REMOTE_ADDR=proxy).post(reverse("login"), {"username": "bob", "password": PASSWORD},
                                          HTTP_X_FORWARDED_FOR=ELSEWHERE)
    assert fine.status_code == 302  # the proxy's own address is not what was locked


def test_staff_see_the_failed_attempts_in_the_admin(alice, superuser):
    for _ in range(5):
        log_in("alice", "wrong", ip=ATTACKER)
    admin = Client()
    admin.force_login(superuser)
    page = admin.get(reverse("admin:axes_accessattempt_changelist"))
    assert page.status_code == 200
    assert ATTACKER in page.content.decode() and "alice" in page.content.decode()
