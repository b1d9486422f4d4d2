"""The live socket as tests open it: through the project's routing, without daphne, with
the user already in the scope (the auth middleware is daphne's part, tested with it)."""

from __future__ import annotations

import re

from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from assistant.routing import websocket_urlpatterns

application = URLRouter(websocket_urlpatterns)
EVENT_ID = re.compile(r'id="event-(\d+)"')


def communicator(conversation_id: int, user=None, last: int | None = None) -> WebsocketCommunicator:
    """A socket on the conversation's timeline; `last`: the last event id the page had."""
    path = f"/ws/conversations/{conversation_id}/" + (f"?last={last}" if last is not None else "")
    comm = WebsocketCommunicator(application, path)
    comm.scope["user"] = user
    comm.scope["url_route"] = {"kwargs": {"conversation_id": conversation_id}}
    return comm


def only_busy_panels(html: str) -> bool:
    """A message of the busy panels' own lane (assistant/consumers.py `owe_busy`): no
    event row, no chat, no draft."""
    return not any(mark in html for mark in ('id="event-', 'id="messages"', 'id="answer-draft"'))


async def nothing_but_busy_panels(comm: WebsocketCommunicator, timeout: float = 0.5) -> bool:
    """The socket sends nothing within `timeout` but the busy panels that follow a push.
    (A `receive_from` that times out would cancel the socket: ask `receive_nothing` first.)"""
    while not await comm.receive_nothing(timeout=timeout):
        if not only_busy_panels(await comm.receive_from()):
            return False
    return True


async def next_rows(comm: WebsocketCommunicator, timeout: float) -> str:
    """The socket's next message but the busy panels' (which follow each push)."""
    while only_busy_panels(html := await comm.receive_from(timeout=timeout)):
        pass
    return html
