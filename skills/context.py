"""The skill call whose handler is running in this context (a contextvar): the executor
sets it, nested calls inherit from it, handlers whose effect lies outside the database
read its key (skills/journal.py), and handlers that write rows read the outside content
that had reached its caller (skills/provenance.py). Its own module, so that the journal
and provenance, which handlers import, need not import the executor, which imports
every handler."""

from __future__ import annotations

from contextvars import ContextVar

running_call: ContextVar = ContextVar("skills_running_call", default=None)


def current_call_key() -> str | None:
    """A key for the call whose handler is running, the same on every run of that call,
    else None. Handlers whose effect lies outside the database (files, mail) use it to
    recognise their own earlier, interrupted run (skills/journal.py).

    A replay after a crash runs the handler again on the same committed row, so a call's
    key is its row's. A nested call's row rolls back with the call around it, so its key
    is that call's key and its own tool_call_id, which the handler passes again."""
    running = running_call.get()
    return running.key if running is not None else None


def current_outside() -> tuple[str, ...]:
    """The outside content that had reached the caller of the running call (a nested
    call's includes its outer call's), or () outside a call: what a row the handler
    writes was written from."""
    running = running_call.get()
    return running.outside if running is not None else ()
