"""One poller per conversation per daphne process, and the socket caps.

Without Redis a worker's events reach daphne only through the event log, so somebody
must read it often. Each socket used to poll it itself every 0.25 s: 600 idle sockets
from one user held daphne at 80–90 % of a core. Now the first socket on a conversation
starts one `Watch`; it reads the log every `ASSISTANT_SOCKET_POLL_SECONDS` with one light
query (`live.Probe`) and, only when something changed, wakes every socket on the
conversation; the last socket to leave stops it. While every socket on it is in a
background tab, it reads nothing: a tab that shows reads what it missed. Each socket
reads and sends from its own cursor (`live.Cursor`), so a socket replays from its own
last event id on connect and reconnect and nothing is missed or sent twice (DESIGN.md
§8). With Redis the group message brings the events to the sockets straight away and
the same watch is the slow safety net — per conversation, not per socket — which wakes
the sockets only for what no message brought them (`socket_carried`).

The same registry counts the sockets this process holds per user and per conversation,
so one more than `ASSISTANT_SOCKETS_PER_USER` / `_PER_CONVERSATION` is refused (the
consumer closes it with `TOO_MANY`). The counts are per process: daphne's cost is what
they bound, and a user's sockets spread over several processes cost each of them only
its share.

Everything here runs on the event loop's one thread: no locks. Each loop has its own
registry (tests open a loop per test; daphne has one).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.conf import settings

from assistant.live import Probe
from assistant.pooled import pooled

TOO_MANY = 4429  # an application close code: 4000 + HTTP's 429 Too Many Requests
logger = logging.getLogger(__name__)


def poll_interval() -> float:
    return settings.ASSISTANT_SOCKET_POLL_SECONDS


@dataclass(eq=False)
class Watch:
    """A conversation's poller and the sockets it wakes (each socket's `wake`: read the log)."""

    conversation_id: int
    sockets: set[Callable[[], None]] = field(default_factory=set)
    hidden: set[Callable[[], None]] = field(default_factory=set)  # those whose tab is in the background
    task: asyncio.Task | None = None
    # What group messages brought its sockets since the last read, for the probe: (event
    # id → type, draft). Appended on the loop's thread, taken on the read's (a deque is
    # safe for that), just before the read: whatever arrived while the read waited for
    # a thread is no news either.
    carried: deque[tuple[dict[int, str], str | None]] = field(default_factory=deque)

    async def run(self) -> None:
        probe = Probe(self.conversation_id)
        interval = poll_interval()
        while True:
            if self.sockets <= self.hidden:  # nobody looking: each socket reads the log when its tab shows
                await asyncio.sleep(interval)
                continue
            try:
                changed = await _probe_changed(probe, self.carried)
            except Exception:  # e.g. the database restarting: wake everyone next time round
                logger.warning("Could not poll conversation %s", self.conversation_id, exc_info=True)
                probe.first = True
                changed = False
            if changed:
                for wake in self.sockets:
                    wake()
            await asyncio.sleep(interval)


@dataclass(eq=False)
class Registry:
    watches: dict[int, Watch] = field(default_factory=dict)
    per_user: Counter = field(default_factory=Counter)


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Registry] = weakref.WeakKeyDictionary()


def registry() -> Registry:
    loop = asyncio.get_running_loop()
    if loop not in _registries:
        _registries[loop] = Registry()
    return _registries[loop]


def socket_join(*, user_id: int, conversation_id: int, wake: Callable[[], None]) -> str | None:
    """Count the socket in and have the conversation's watch wake it (starting the watch
    if it is the first); or, over a cap, count nothing and say which cap it hit."""
    reg = registry()
    watch = reg.watches.get(conversation_id)
    if reg.per_user[user_id] >= settings.ASSISTANT_SOCKETS_PER_USER:
        return f"more than {settings.ASSISTANT_SOCKETS_PER_USER} live pages open for this account"
    if watch is not None and len(watch.sockets) >= settings.ASSISTANT_SOCKETS_PER_CONVERSATION:
        return f"more than {settings.ASSISTANT_SOCKETS_PER_CONVERSATION} live pages open on this conversation"
    if watch is None:
        watch = reg.watches[conversation_id] = Watch(conversation_id)
        watch.task = asyncio.create_task(watch.run(), name=f"watch-conversation-{conversation_id}")
    watch.sockets.add(wake)
    reg.per_user[user_id] += 1
    return None


def socket_shown(*, conversation_id: int, wake: Callable[[], None], visible: bool) -> None:
    """The socket's tab came into view or went into the background: while every socket
    on the conversation is hidden, its watch reads nothing."""
    watch = registry().watches.get(conversation_id)
    if watch is not None and wake in watch.sockets:
        (watch.hidden.discard if visible else watch.hidden.add)(wake)


def socket_carried(*, conversation_id: int, events: Sequence[dict] = (), draft: str | None = None) -> None:
    """A group message brought a socket on the conversation these event rows (or this
    answer draft): its watch, the safety net, need not wake anyone for them."""
    watch = registry().watches.get(conversation_id)
    if watch is not None:
        watch.carried.append(({row["id"]: row["type"] for row in events}, draft))


def socket_leave(*, user_id: int, conversation_id: int, wake: Callable[[], None]) -> None:
    """Count the socket out; the last one out stops the conversation's watch."""
    reg = registry()
    watch = reg.watches.get(conversation_id)
    if watch is None or wake not in watch.sockets:
        return
    watch.sockets.discard(wake)
    watch.hidden.discard(wake)
    reg.per_user[user_id] -= 1
    if reg.per_user[user_id] <= 0:
        del reg.per_user[user_id]
    if not watch.sockets:
        del reg.watches[conversation_id]
        watch.task.cancel()


@pooled
def _probe_changed(probe: Probe, carried: deque) -> bool:
    while carried:
        probe.carried(*carried.popleft())
    return probe.changed()
