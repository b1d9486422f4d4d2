"""email.*: send through Django's configured mail backend, and search what was sent."""

from __future__ import annotations

import datetime as dt
import logging
import smtplib
from email.errors import MessageError
from email.utils import make_msgid, parseaddr

from django.conf import settings
from django.core.mail import EmailMessage
from django.db.models import Q
from django.utils.crypto import salted_hmac

from skills import egress, journal
from skills.base import Domain, Skill, SkillError
from skills.domains import schema
from skills.domains.common import iso
from skills.domains.email.models import BODY_MAX, SUBJECT_MAX, OutboxEmail
from skills.quotas import rows_reserve

logger = logging.getLogger(__name__)

MAX_RECIPIENTS = 20
PREVIEW_CHARS = 200


def email_send(user, *, to: list[str], subject: str, body: str) -> dict:
    """Send the mail and record it in the outbox, once per call even if the call is replayed.

    The outbox row is written before sending so that a failed send rolls both back. A
    send cannot be taken back, so once it returns the call journals that it sent
    (skills/journal.py): a replay after the worker died before the call committed finds
    that entry and records the outbox row again instead of sending again. A worker that
    dies during the send itself, before the entry, leaves no trace of it: the replay sends
    again. That mail carries the same Message-ID, by which receiving systems can tell it
    is the same message."""
    key = journal.call_key()
    sent = journal.recall(key) if key else None
    if sent is None:
        egress.reserve_daily(user, to)
        rows_reserve(user=user, domain="email")
    if sent is not None:
        email = OutboxEmail.objects.create(
            owner=user, to=to, subject=subject, body=body,
            message_id=sent["message_id"], sent_at=dt.datetime.fromisoformat(sent["sent_at"]),
        )
        return {"email": _data(email), "sent": True}
    message_id = _message_id(key)
    message = EmailMessage(
        subject=subject,
        body=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=to,
        reply_to=[user.email] if user.email else None,
        headers={"Message-ID": message_id},
    )
    _check_writable(message)
    email = OutboxEmail.objects.create(
        owner=user, to=to, subject=subject, body=body, message_id=message_id
    )
    _send(message)
    if key:
        _journal_sent(key, email)
    return {"email": _data(email), "sent": True}


def _check_writable(message: EmailMessage) -> None:
    """Write the message out before anything is stored or sent: an address or header that
    cannot be written as mail is the caller's mistake, said plainly, not a crash."""
    try:
        message.message().as_bytes()
    except (ValueError, UnicodeError, MessageError) as exc:  # BadHeaderError is a ValueError
        raise SkillError(f"the message cannot be written as an email: {exc}"[:500]) from None


def _send(message: EmailMessage) -> None:
    """Send; a refusal of what the caller sent (every recipient refused for good, an
    address the server cannot take) is permanent, anything else from the server or the
    network may pass and counts as the mail service's outage (skills/breaker.py)."""
    try:
        message.send()
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        refused = ", ".join(exc.recipients)
        raise SkillError(f"the mail server refused the recipients: {refused}"[:500],
                         permanent=all(500 <= code < 600 for code in codes)) from exc
    except (smtplib.SMTPNotSupportedError, UnicodeError) as exc:
        raise SkillError(f"the mail server cannot take this message: {exc}"[:500]) from exc
    except OSError as exc:  # smtplib's errors are OSErrors too
        raise SkillError(f"the mail server failed: {exc}", permanent=False) from exc


def email_search_sent(user, *, text: str = "", recipient: str = "", limit: int = 20) -> dict:
    emails = OutboxEmail.objects.filter(owner=user)
    if text:
        emails = emails.filter(Q(subject__icontains=text) | Q(body__icontains=text))
    if recipient:
        emails = emails.filter(to__icontains=recipient)
    return {"emails": [_data(email) for email in emails[:limit]], "total": emails.count()}


def _journal_sent(key: str, email: OutboxEmail) -> None:
    """Journal that call `key` sent `email`. A journal that cannot be written must not
    turn a sent mail into a failed call, which the agent might well try again: it costs
    only the protection against a crash before the call commits."""
    try:
        journal.record(key, {"message_id": email.message_id, "sent_at": email.sent_at.isoformat()})
    except OSError:
        logger.exception("Could not journal the sending of %s", email.message_id)


def _message_id(key: str | None) -> str:
    """A unique Message-ID, the same on every run of call `key` (a resend after a crash
    mid-send is then recognisably the same message), and revealing nothing of the key."""
    if key is None:
        return make_msgid(domain=_sender_domain())
    token = salted_hmac("skills.email.message_id", key, algorithm="sha256").hexdigest()[:40]
    return f"<{token}@{_sender_domain()}>"


def _sender_domain() -> str:
    address = parseaddr(settings.DEFAULT_FROM_EMAIL)[1]
    return address.rpartition("@")[2] or "localhost"


def _data(email: OutboxEmail) -> dict:
    preview = email.body[:PREVIEW_CHARS] + ("…" if len(email.body) > PREVIEW_CHARS else "")
    return {
        "id": email.pk,
        "to": email.to,
        "subject": email.subject,
        "body_preview": preview,
        "message_id": email.message_id,
        "sent_at": iso(email.sent_at),
    }


DOMAIN = Domain(
    name="email",
    description="Email on the user's behalf: send messages and search the ones sent.",
    skills=(
        Skill(
            name="email.send",
            description="Send a plain-text email now. It cannot be unsent.",
            parameters=schema.params(
                {
                    "to": schema.emails("Recipients.", max_items=MAX_RECIPIENTS, min_items=1),
                    "subject": schema.text(
                        "One-line subject.", max_length=SUBJECT_MAX, min_length=1, one_line=True
                    ),
                    "body": schema.text("Plain-text body.", max_length=BODY_MAX, min_length=1),
                },
                required=("to", "subject", "body"),
            ),
            handler=email_send,
            recipients=lambda arguments: list(arguments.get("to") or []),
            effect=lambda arguments, result: (
                f"sent email “{arguments['subject']}” to {', '.join(arguments['to'])}"),
        ),
        Skill(
            name="email.search_sent",
            description="Find emails the assistant sent for the user, newest first.",
            parameters=schema.params(
                {
                    "text": schema.text("Words in the subject or body.", max_length=200),
                    "recipient": schema.text(
                        "All or part of a recipient's address.", max_length=254, one_line=True
                    ),
                    "limit": schema.integer(
                        "At most this many emails.", minimum=1, maximum=50, default=20
                    ),
                }
            ),
            handler=email_search_sent,
            read_only=True,
            # A sent email's body may quote anything (a forwarded newsletter, a reply).
            outside=lambda arguments, result: [
                f"email “{email['subject'][:80]}” (id {email['id']})" for email in result.get("emails", [])],
        ),
    ),
)
