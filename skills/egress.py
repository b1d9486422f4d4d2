"""Where the owner's messages may go, and how many a day (settings.ASSISTANT_EGRESS).

An address is familiar when it is at the owner's own domain (webmail domains are
nobody's own), a contact (the owner's email went there before) or on their allow list
(EgressAllow: an address or a domain). A message to an unfamiliar address asks the owner
first, whatever the skill's policy (orchestration/approvals.py). The daily caps refuse
a send outright, counted in the sending transaction with the owner's row locked, so two
workers cannot both take the last one.
"""

from __future__ import annotations

from datetime import datetime, time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from skills.base import SkillError
from skills.domains.email.models import OutboxEmail
from skills.models import EgressAllow
from skills.policy import domain_of

RECENT_CONTACTS = 2000  # outbox rows read for contacts


def own_domain(user) -> str:
    domain = domain_of(user.email or "")
    return "" if domain in settings.ASSISTANT_EGRESS["shared_domains"] else domain


def contacts(user) -> set[str]:
    rows = OutboxEmail.objects.filter(owner=user).order_by("-id").values_list("to", flat=True)[:RECENT_CONTACTS]
    return {address.lower() for to in rows for address in to or []}


def unfamiliar(user, recipients: list[str]) -> list[str]:
    """The recipients a message may not go to unasked, in the order given."""
    if not settings.ASSISTANT_EGRESS["ask_new_recipients"]:
        return []
    mine = own_domain(user)
    allowed = set(EgressAllow.objects.filter(owner=user).values_list("entry", flat=True))
    known = None
    new = []
    for address in recipients:
        address = address.strip().lower()
        if (mine and domain_of(address) == mine) or address in allowed or domain_of(address) in allowed:
            continue
        known = contacts(user) if known is None else known
        if address not in known:
            new.append(address)
    return new


def reserve_daily(user, recipients: list[str]) -> None:
    """Refuse a send beyond the owner's daily caps; call inside the sending transaction."""
    caps = settings.ASSISTANT_EGRESS
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()  # one send at a time per owner
    today = timezone.make_aware(datetime.combine(timezone.localdate(), time.min))
    sent = list(OutboxEmail.objects.filter(owner=user, sent_at__gte=today).values_list("to", flat=True))
    if len(sent) + 1 > caps["daily_messages"]:
        raise SkillError(f"the daily cap of {caps['daily_messages']} messages is reached; it resets at midnight")
    if sum(len(to) for to in sent) + len(recipients) > caps["daily_recipients"]:
        raise SkillError(f"the daily cap of {caps['daily_recipients']} recipients would be passed; "
                         f"it resets at midnight")
