"""Leases: who is working on a turn or a dispatch, and until when.

A claim is a conditional UPDATE; a heartbeat extends the lease only while the token is
still ours. Losing it means the reaper gave the work to someone else: stop quietly.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone


# Work whose lease was found ours this recently (claimed, held, or its answer stored) goes
# on to its next model call without asking again whether it may (a Stop or pause in that
# moment is found when the next answer is stored): both roles' steps skip that check.
VERIFIED_SECONDS = 2.0


class LeaseLost(Exception):
    """Another worker owns this work now; the current one must stop without writing."""


def new_token() -> str:
    return uuid.uuid4().hex


def lease_until() -> datetime:
    return timezone.now() + timedelta(seconds=settings.ASSISTANT_LEASE_SECONDS)


def heartbeat(model, pk: int, token: str, **extra) -> None:
    now = timezone.now()
    fields = {"lease_expires_at": lease_until(), **extra}
    if model.__name__ == "AgentDispatch":
        fields["heartbeat_at"] = now
    if not model.objects.filter(pk=pk, lease_token=token).update(**fields):
        raise LeaseLost(f"{model.__name__} {pk}: lease lost")
