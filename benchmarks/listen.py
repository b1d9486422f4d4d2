"""Event latency as the dashboard sees it: one WebSocket per conversation on daphne,
opened as the page opens it (session cookie, the page's Origin), noting when each event
row arrives. `latency` is that arrival minus the event's `created_at`, which the worker
takes just before its INSERT: commit → browser, plus the rest of the worker's transaction.
"""

from __future__ import annotations

import asyncio
import threading
import time

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from benchmarks.load import EVENT_ROW

OPEN_TIMEOUT = 30.0


def session_cookie(user) -> str:
    """A logged-in session for `user`, as the login view would store it."""
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


class SocketListener:
    """Sockets on their own asyncio loop in a daemon thread; the caller stays synchronous."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.arrivals: dict[int, dict[int, float]] = {}  # conversation → event id → epoch s
        self.duplicates = 0
        self.errors: list[str] = []
        self._sockets = []
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="bench-sockets", daemon=True).start()

    def watch(self, conversation_id: int, user) -> None:
        """Open the conversation's socket; returns once it is connected."""
        cookie = session_cookie(user)
        self.arrivals[conversation_id] = {}
        future = asyncio.run_coroutine_threadsafe(self._open(conversation_id, cookie), self._loop)
        self._sockets.append(future.result(timeout=OPEN_TIMEOUT))

    async def _open(self, conversation_id: int, cookie: str):
        from websockets.asyncio.client import connect

        url = f"ws{self.base_url.removeprefix('http')}/ws/conversations/{conversation_id}/?last=0"
        socket = await connect(url, origin=self.base_url, additional_headers={"Cookie": cookie}, proxy=None,
                               ping_interval=None, open_timeout=OPEN_TIMEOUT, max_size=2**24, max_queue=None)
        asyncio.get_running_loop().create_task(self._read(conversation_id, socket))
        return socket

    async def _read(self, conversation_id: int, socket) -> None:
        from websockets.exceptions import ConnectionClosed

        arrivals = self.arrivals[conversation_id]
        try:
            async for message in socket:
                now = time.time()
                for match in EVENT_ROW.finditer(message if isinstance(message, str) else message.decode()):
                    event_id = int(match.group(1))
                    if event_id in arrivals:
                        self.duplicates += 1
                    else:
                        arrivals[event_id] = now
        except ConnectionClosed as exc:
            if exc.rcvd is None or exc.rcvd.code != 1000:
                self.errors.append(f"conversation {conversation_id}: socket closed: {exc}")

    def wait_for(self, expected: dict[int, set[int]], timeout: float) -> bool:
        """Until every conversation's socket has received `expected[conversation]`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(ids <= self.arrivals.get(cid, {}).keys() for cid, ids in expected.items()):
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        async def close_all():
            await asyncio.gather(*(socket.close() for socket in self._sockets), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout=OPEN_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
