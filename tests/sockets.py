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
