"""calendar.*: list, create (reporting overlaps) and cancel the user's events.

An event an agent writes carries the outside content that had reached it, and every
result that shows such an event names it as outside content (skills/provenance.py)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from skills.base import Domain, Skill, SkillError
from skills.domains import schema
from skills.domains.calendar.models import TITLE_MAX, CalendarEvent
from skills.domains.common import iso, owned, parse_datetime, shifted, when_words
from skills.provenance import provenance_data, provenance_stamp, rows_outside
from skills.quotas import rows_reserve

DEFAULT_RANGE = timedelta(days=14)
MAX_RANGE = timedelta(days=366)
MAX_DURATION_MINUTES = 7 * 24 * 60
MAX_INVITEES = 50


def event_list(
    user,
    *,
    start: str | None = None,
    end: str | None = None,
    include_cancelled: bool = False,
    limit: int = 50,
) -> dict:
    since = parse_datetime(start, field="start") if start else timezone.now()
    if end:
        until = parse_datetime(end, field="end")
    else:
        until = shifted(since, DEFAULT_RANGE, what="the default 'end'")
    if until <= since:
        raise SkillError("'end' must be after 'start'")
    if until - since > MAX_RANGE:
        raise SkillError(f"the range may span at most {MAX_RANGE.days} days")
    events = CalendarEvent.objects.filter(owner=user, start__lt=until, end__gt=since)
    if not include_cancelled:
        events = events.filter(status=CalendarEvent.Status.ACTIVE)
    return {
        "start": iso(since),
        "end": iso(until),
        "events": [_data(event) for event in events[:limit]],
        "total": events.count(),
    }


def event_create(
    user, *, title: str, start: str, duration_minutes: int = 60, invitees: list[str] = ()
) -> dict:
    begins = parse_datetime(start, field="start")
    ends = shifted(begins, timedelta(minutes=duration_minutes), what="the event's end")
    rows_reserve(user=user, domain="calendar")
    event = CalendarEvent(
        owner=user,
        title=title,
        start=begins,
        duration_minutes=duration_minutes,
        end=ends,
        invitees=list(invitees),
    )
    provenance_stamp(event)
    event.save()
    overlaps = CalendarEvent.objects.filter(
        owner=user, status=CalendarEvent.Status.ACTIVE, start__lt=event.end, end__gt=event.start
    ).exclude(pk=event.pk)
    return {"event": _data(event), "overlaps": [_data(other) for other in overlaps]}


def event_cancel(user, *, event_id: int) -> dict:
    event = owned(CalendarEvent, user=user, pk=event_id, noun="event")
    already_cancelled = event.status == CalendarEvent.Status.CANCELLED
    if not already_cancelled:
        event.status = CalendarEvent.Status.CANCELLED
        event.cancelled_at = timezone.now()
        provenance_stamp(event)
        event.save(update_fields=["status", "cancelled_at", "provenance"])
    return {"event": _data(event), "already_cancelled": already_cancelled}


def _data(event: CalendarEvent) -> dict:
    return {
        "id": event.pk,
        "title": event.title,
        "start": iso(event.start),
        "end": iso(event.end),
        "duration_minutes": event.duration_minutes,
        "invitees": event.invitees,
        "status": event.status,
        **provenance_data(event),
    }


def _outside(arguments: dict, result: dict) -> list[str]:
    """The events in a result that an agent wrote from outside content."""
    return rows_outside("calendar event", result, "event", "events", "overlaps")


DOMAIN = Domain(
    name="calendar",
    description="The user's calendar: list events in a range, create and cancel events.",
    skills=(
        Skill(
            name="calendar.list_events",
            description="Events that overlap a time range (default: the next 14 days), "
            "earliest first.",
            parameters=schema.params(
                {
                    "start": schema.datetime("Range start; default now"),
                    "end": schema.datetime("Range end; default start + 14 days"),
                    "include_cancelled": schema.boolean("Also list cancelled events."),
                    "limit": schema.integer(
                        "At most this many events.", minimum=1, maximum=100, default=50
                    ),
                }
            ),
            handler=event_list,
            outside=_outside,
            read_only=True,
        ),
        Skill(
            name="calendar.create_event",
            description="Create an event. The result lists the user's active events it "
            "overlaps, if any (the event is created anyway).",
            parameters=schema.params(
                {
                    "title": schema.text(
                        "What the event is.", max_length=TITLE_MAX, min_length=1, one_line=True
                    ),
                    "start": schema.datetime("When it starts"),
                    "duration_minutes": schema.integer(
                        "How long it lasts.", minimum=1, maximum=MAX_DURATION_MINUTES, default=60
                    ),
                    "invitees": schema.emails("Email addresses to invite.", max_items=MAX_INVITEES),
                },
                required=("title", "start"),
            ),
            handler=event_create,
            outside=_outside,
            effect=lambda arguments, result: (
                f"created event “{result['event']['title']}” for {when_words(result['event']['start'])}"),
        ),
        Skill(
            name="calendar.cancel_event",
            description="Cancel an event (doing it twice is harmless).",
            parameters=schema.params(
                {"event_id": schema.record_id("event")}, required=("event_id",)
            ),
            handler=event_cancel,
            outside=_outside,
            effect=lambda arguments, result: f"cancelled event “{result['event']['title']}”",
        ),
    ),
)
