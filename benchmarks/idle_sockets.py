"""What idle sockets cost daphne (issue 18: "600 idle sockets from one user held daphne
at 80–90 % of a core"): N sockets of one user, open and idle, spread over a few
conversations; daphne's CPU (utime + stime from /proc) over a quiet window, as a share of
one core.

Without Redis (the embedded default), where each socket used to poll the event log
every 0.25 s itself and now one poller per conversation does (assistant/watch.py).
`--code DIR` runs daphne from another checkout (e.g. `git archive` of the commit
before), so both figures come from the same machine in the same run.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.load import Daphne, cpu_seconds

USERNAME = "idle-sockets"


@dataclass
class IdleFigure:
    code: str
    sockets: int
    opened: int  # of `sockets`, open through the window
    conversations: int
    cpu_percent: float  # of one core, over the window
    window_seconds: float


def prepare(conversations: int) -> tuple[list[int], str]:
    """The user, their conversations (one event each) and a session cookie."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from orchestration.models import Conversation, Turn
    from orchestration.records.catalogue import TURN_STARTED
    from orchestration.records.events import event_record

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    ids = []
    for i in range(conversations):
        conversation, created = Conversation.objects.get_or_create(owner=user, title=f"Idle {i}")
        if created:
            turn = Turn.objects.create(conversation=conversation, number=1, status="completed")
            event_record(type=TURN_STARTED, turn=turn, summary="Turn 1 started")
        ids.append(conversation.pk)
    client = Client()
    client.force_login(user)
    return ids, f"sessionid={client.cookies['sessionid'].value}"


async def _open(url: str, origin: str, cookie: str, count: int, conversation_ids: list[int]) -> list:
    from websockets.asyncio.client import connect
    from websockets.exceptions import WebSocketException

    async def one(i: int):
        path = f"/ws/conversations/{conversation_ids[i % len(conversation_ids)]}/?last=0"
        for _ in range(3):  # a busy daphne drops handshakes it could not finish in 5 s
            try:
                socket = await connect(url + path, origin=origin, additional_headers={"Cookie": cookie},
                                       proxy=None, ping_interval=None, open_timeout=30, max_size=2**24)
                await asyncio.wait_for(socket.recv(), timeout=30)  # the catch-up: it is served
                return socket
            except (OSError, TimeoutError, WebSocketException):
                await asyncio.sleep(1.0)
        return None

    sockets = []
    for start in range(0, count, 25):  # in batches: daphne's handshakes time out after 5 s
        sockets += await asyncio.gather(*(one(i) for i in range(start, min(count, start + 25))))
    return [s for s in sockets if s is not None]


async def _hold(url: str, origin: str, cookie: str, count: int, conversation_ids: list[int], web: Daphne,
                settle: float, window: float) -> tuple[int, float]:
    sockets = await _open(url, origin, cookie, count, conversation_ids)
    try:
        await asyncio.sleep(settle)  # the handshakes' and catch-ups' work is done
        before, started = cpu_seconds(web), time.monotonic()
        await asyncio.sleep(window)
        return len(sockets), (cpu_seconds(web) - before) / (time.monotonic() - started) * 100
    finally:
        await asyncio.gather(*(s.close() for s in sockets), return_exceptions=True)


def measure(*, counts: list[int], conversations: int, window: float = 10.0, settle: float = 3.0,
            code: Path | None = None, env: dict[str, str] | None = None) -> list[IdleFigure]:
    """One daphne per count (a fresh process: no leftovers from the last count)."""
    conversation_ids, cookie = prepare(conversations)
    log_dir = Path(tempfile.mkdtemp(prefix="idle-sockets-"))
    figures = []
    for count in counts:
        environment = {
            "ASSISTANT_SOCKETS_PER_USER": str(count), "ASSISTANT_SOCKETS_PER_CONVERSATION": str(count),
            "REDIS_URL": "", "DJANGO_ALLOW_ASYNC_UNSAFE": "", "LOG_LEVEL": "WARNING",
            **({"PYTHONPATH": str(code)} if code else {}), **(env or {}),
        }
        web = Daphne.start(env=environment, log_path=log_dir / f"daphne-{count}.log", code=code)
        try:
            web.wait_ready()
            ws_url = web.url.replace("http://", "ws://")
            opened, cpu = asyncio.run(_hold(ws_url, web.url, cookie, count, conversation_ids, web, settle, window))
        finally:
            web.stop()
        figures.append(IdleFigure(code=str(code or "this checkout"), sockets=count, opened=opened,
                                  conversations=conversations,
                                  cpu_percent=round(cpu, 1), window_seconds=window))
    return figures


def table(rows: list[IdleFigure]) -> str:
    lines = ["| code | idle sockets (open) | conversations | daphne CPU (% of a core) |", "|---|---:|---:|---:|"]
    lines += [f"| {r.code} | {r.sockets} ({r.opened}) | {r.conversations} | {r.cpu_percent} |" for r in rows]
    return "\n".join(lines) + f"\n\n(CPU over {rows[0].window_seconds:.0f} s of quiet, {os.cpu_count()} cores)"
