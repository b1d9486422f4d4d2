"""Where the owner's messages may go, and how many a day (settings.ASSISTANT_EGRESS).

An address is familiar when it is at the owner's own domain (webmail domains are
nobody's own), a contact (the owner's email went there before) or on their allow list
(EgressAllow: an address or a domain). A message to an unfamiliar address asks the owner
first, whatever the skill's policy (orchestration/questions/approvals.py). The daily caps refuse
a send outright, counted in the sending transaction holding the owner's capped-write
lock (skills/quotas.py `owner_lock`), so two workers cannot both take the last one.

The owner edits the allow list on the Approvals page (assistant/views.py): entries are
normalised here, the way `unfamiliar` compares them, so an entry that is stored matches.
"""

from __future__ import annotations

from datetime import datetime, time

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import DomainNameValidator, validate_email
from django.utils import timezone

from skills.base import SkillError
from skills.domains.email.models import OutboxEmail
from skills.models import EgressAllow
from skills.policy import domain_of
from skills.quotas import owner_lock

RECENT_CONTACTS = 2000  # outbox rows read for contacts
ENTRY_MAX = EgressAllow._meta.get_field("entry").max_length
DOMAIN_MAX = 253  # the longest name DNS allows, and SkillRule.recipient_domain's length

_domain_name = DomainNameValidator(message="Enter a domain such as example.com: letters, digits, hyphens and dots.")


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


def daily_use(user) -> tuple[int, int]:
    """Today's messages and recipients (since midnight in the active time zone)."""
    today = timezone.make_aware(datetime.combine(timezone.localdate(), time.min))
    sent = list(OutboxEmail.objects.filter(owner=user, sent_at__gte=today).values_list("to", flat=True))
    return len(sent), sum(len(to or []) for to in sent)


def reserve_daily(user, recipients: list[str]) -> None:
    """Refuse a send beyond the owner's daily caps; call inside the sending transaction."""
    caps = settings.ASSISTANT_EGRESS
    owner_lock(user)  # one send at a time per owner
    messages, recipients_sent = daily_use(user)
    if messages + 1 > caps["daily_messages"]:
        raise SkillError(f"the daily cap of {caps['daily_messages']} messages is reached; it resets at midnight")
    if recipients_sent + len(recipients) > caps["daily_recipients"]:
        raise SkillError(f"the daily cap of {caps['daily_recipients']} recipients would be passed; "
                         f"it resets at midnight")


def plain_domain(text: str) -> str:
    """A recipient domain as `domain_of` gives it (lower case, no trailing dot), or
    ValidationError: anything else could never match an address, or could smuggle text."""
    domain = text.strip().lower()
    if "@" in domain:
        raise ValidationError("Enter the domain alone, without an address: example.com.")
    if len(domain) > DOMAIN_MAX or domain.endswith("."):
        raise ValidationError(f"Enter a domain such as example.com, at most {DOMAIN_MAX} characters.")
    _domain_name(domain)
    return domain


def allow_entry(text: str) -> str:
    """An allow-list entry — an address or a whole domain — checked as the email skill
    checks a recipient (validate_email), lower case, as `unfamiliar` compares it."""
    entry = text.strip().lower()
    if any(char.isspace() or not char.isprintable() for char in entry):
        # validate_email lets both through in a quoted local part ("a b"@example.com)
        raise ValidationError("Enter an address or a domain without spaces or control characters.")
    if "@" not in entry:
        return plain_domain(entry)
    if len(entry) > ENTRY_MAX:
        raise ValidationError(f"An address has at most {ENTRY_MAX} characters.")
    validate_email(entry)
    return entry


def egress_allow_add(*, owner, entry: str) -> EgressAllow:
    """Let messages go to `entry` unasked; adding one already there changes nothing."""
    allowed, _ = EgressAllow.objects.get_or_create(owner=owner, entry=allow_entry(entry))
    return allowed


def egress_allow_remove(*, allowed: EgressAllow) -> None:
    """Deleted, not marked revoked like a rule: no clearance names an entry (a rule's id
    is kept in the clearance of each call it allowed)."""
    allowed.delete()


def egress_overview(user) -> dict:
    """The allow list, the owner's own domain and the daily caps with today's use, for the
    Approvals page."""
    caps = settings.ASSISTANT_EGRESS
    messages, recipients = daily_use(user)
    return {
        "allowed": list(EgressAllow.objects.filter(owner=user)),
        "own_domain": own_domain(user),
        "ask_new_recipients": caps["ask_new_recipients"],
        "daily_messages": caps["daily_messages"], "messages_today": messages,
        "daily_recipients": caps["daily_recipients"], "recipients_today": recipients,
    }
