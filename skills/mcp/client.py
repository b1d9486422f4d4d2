"""The worker's connections to MCP servers, through the official SDK's `Client`.

Skill handlers are plain functions on the runner's skill threads; the SDK is async. One
event loop per process, on its own daemon thread, holds every open session: a handler
hands it a coroutine and waits for the answer (`call`, `tools`). A session is opened by
the first use in the process and reused by every later one; a stdio server is a child
process of this worker, and ends when its stdin closes (with the worker). A session that
fails is dropped, and the next use opens a new one.

Tool lists are cached per server for ASSISTANT_MCP_TOOLS_SECONDS, and dropped at once
when the server announces a change (notifications/tools/list_changed). A server that
cannot be reached is remembered as down for ASSISTANT_MCP_RETRY_SECONDS, so a prompt
being built does not wait for its connect timeout again and again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from django.conf import settings

from skills.mcp.config import ServerConfig

logger = logging.getLogger(__name__)

LIST_CHANGED = "notifications/tools/list_changed"
REQUEST_TIMEOUT = -32001  # mcp_types.REQUEST_TIMEOUT: the SDK's read timeout


class ServerDown(Exception):
    """The server could not be reached or its session broke: a transient failure."""


class CallTimedOut(Exception):
    def __init__(self, seconds: float):
        super().__init__(f"no answer within {seconds:g} s")
        self.seconds = seconds


@dataclass
class _Session:
    client: object  # mcp.Client, entered
    closed: asyncio.Event
    tools: list | None = None
    tools_at: float = 0.0


class Hub:
    """The process's sessions, keyed by `ServerConfig.key`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-sessions", daemon=True)
        self._thread.start()
        self._sessions: dict[str, _Session] = {}
        self._opening: dict[str, asyncio.Future] = {}
        self._down: dict[str, tuple[float, str]] = {}  # key → (until, why)
        self._holding: set[asyncio.Task] = set()  # one per session, open or opening

    # -- what handlers and the registry call, from any thread ---------------------------

    def tools(self, config: ServerConfig) -> list:
        """The server's tools (mcp_types.Tool), cached; ServerDown if it cannot be reached."""
        return self._run(self._tools(config), timeout=config.timeout_seconds + 5)

    def call(self, config: ServerConfig, tool: str, arguments: dict):
        """The CallToolResult of `tool`; CallTimedOut after the server's timeout,
        ServerDown when the session fails."""
        # The SDK's own read timeout (timeout_seconds) answers first; this is its backstop.
        return self._run(self._call(config, tool, arguments), timeout=config.timeout_seconds + 1)

    def close(self, wait: float = 5.0) -> None:
        """Close every session (a stdio server's process ends with it), then the loop."""
        try:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=wait)
        except (FutureTimeout, RuntimeError):
            logger.warning("MCP sessions: not all closed within %.0f s", wait)
        self._loop.call_soon_threadsafe(self._loop.stop)

    # -- on the loop ----------------------------------------------------------------------

    def _down_reason(self, config: ServerConfig) -> str | None:
        until, why = self._down.get(config.key, (0.0, ""))
        return why if time.monotonic() < until else None

    def _mark_down(self, config: ServerConfig, why: str) -> None:
        self._down[config.key] = (time.monotonic() + settings.ASSISTANT_MCP_RETRY_SECONDS, why)

    async def _close(self) -> None:
        for session in self._sessions.values():
            session.closed.set()
        self._sessions.clear()
        if self._holding:
            await asyncio.wait(self._holding)

    def _run(self, coroutine, *, timeout: float):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            raise CallTimedOut(timeout) from None

    async def _tools(self, config: ServerConfig) -> list:
        session = await self._session(config)
        if session.tools is None or time.monotonic() - session.tools_at > settings.ASSISTANT_MCP_TOOLS_SECONDS:
            try:
                listed, cursor = [], None
                for _ in range(20):  # pages; a server that never ends its list is cut here
                    page = await session.client.list_tools(cursor=cursor, cache_mode="refresh")
                    listed += page.tools
                    if not (cursor := page.next_cursor):
                        break
            except Exception as exc:
                why = f"MCP server {config.name} could not list its tools: {_words(exc)}"
                self._mark_down(config, why)  # reachable but not answering: not asked again at once
                self._drop(config, session, exc)
                raise ServerDown(why) from exc
            session.tools, session.tools_at = listed, time.monotonic()
        return session.tools

    async def _call(self, config: ServerConfig, tool: str, arguments: dict):
        session = await self._session(config)
        try:
            return await session.client.call_tool(tool, arguments, read_timeout_seconds=config.timeout_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if getattr(exc, "code", None) == REQUEST_TIMEOUT:  # the SDK gave up waiting: the session is fine
                raise CallTimedOut(config.timeout_seconds) from exc
            # A broken connection and a JSON-RPC error look alike here (the SDK reports a
            # lost connection as an MCPError too): drop the session either way; the next
            # use opens a new one, or finds the server down.
            self._drop(config, session, exc)
            raise ServerDown(_words(exc)) from exc

    async def _session(self, config: ServerConfig) -> _Session:
        if (session := self._sessions.get(config.key)) is not None and not session.closed.is_set():
            return session
        if why := self._down_reason(config):
            raise ServerDown(why)
        opening = self._opening.get(config.key)
        if opening is None:
            opening = self._opening[config.key] = self._loop.create_future()
            holding = self._loop.create_task(self._hold(config, opening))
            self._holding.add(holding)
            holding.add_done_callback(self._holding.discard)
        try:
            return await asyncio.shield(opening)
        except ServerDown:
            raise
        except Exception as exc:
            raise ServerDown(_words(exc)) from exc

    async def _hold(self, config: ServerConfig, opened: asyncio.Future) -> None:
        """Open the session and keep it open in this one task (the SDK's context must be
        left by the task that entered it) until it is closed or breaks."""
        from mcp import Client, StdioServerParameters

        session: _Session | None = None

        async def on_message(message) -> None:
            method = getattr(getattr(message, "root", message), "method", None)
            if method == LIST_CHANGED and session is not None:
                session.tools = None
            elif isinstance(message, Exception):
                logger.info("MCP server %s: %s", config.name, message)

        if config.transport == "stdio":
            target = StdioServerParameters(command=config.command, args=list(config.args), env=config.environment())
        else:
            target = _http_transport(config)
        try:
            async with asyncio.timeout(settings.ASSISTANT_MCP_CONNECT_SECONDS):
                client = Client(target, message_handler=on_message, read_timeout_seconds=config.timeout_seconds,
                                cache=None)
                await client.__aenter__()
        except BaseException as exc:  # noqa: BLE001 - whatever stops the connect marks the server down
            why = f"cannot reach MCP server {config.name}: {_words(exc)}"
            self._mark_down(config, why)
            self._opening.pop(config.key, None)
            opened.set_exception(ServerDown(why))
            opened.exception()  # retrieved: no "never retrieved" warning when nobody waits
            logger.warning("%s", why)
            return
        session = self._sessions[config.key] = _Session(client=client, closed=asyncio.Event())
        self._down.pop(config.key, None)
        self._opening.pop(config.key, None)
        opened.set_result(session)
        listening = asyncio.create_task(self._listen(config, session))
        try:
            await session.closed.wait()
        finally:
            listening.cancel()
            try:
                await client.__aexit__(None, None, None)
            except BaseException as exc:  # noqa: BLE001 - a broken session's close may fail too
                logger.info("MCP server %s: closing its session: %s", config.name, _words(exc))

    async def _listen(self, config: ServerConfig, session: _Session) -> None:
        """Forget the cached tool list whenever the server says it changed: through a
        `subscriptions/listen` stream on a 2026-07-28 connection (an older one sends the
        notification unasked, to `on_message`)."""
        from mcp.client.subscriptions import ListenNotSupportedError

        try:
            async with session.client.listen(tools_list_changed=True) as events:
                async for _event in events:
                    session.tools = None
        except (ListenNotSupportedError, asyncio.CancelledError):
            return
        except Exception as exc:  # noqa: BLE001 - a lost stream leaves the list to its time limit
            logger.info("MCP server %s: tool-list changes no longer heard: %s", config.name, _words(exc))

    def _drop(self, config: ServerConfig, session: _Session, exc: BaseException) -> None:
        logger.warning("MCP server %s: session dropped after %s", config.name, _words(exc))
        if self._sessions.get(config.key) is session:
            del self._sessions[config.key]
        session.closed.set()


def _http_transport(config: ServerConfig):
    """The streamable HTTP transport with the configured headers (values from the
    environment), or the bare URL when there are none."""
    headers = config.headers()
    if not headers:
        return config.url
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    return streamable_http_client(config.url, http_client=httpx2.AsyncClient(headers=headers, follow_redirects=True))


def _words(exc: BaseException) -> str:
    """An exception in one line; a group (anyio's task groups) by its first member."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300] if text != type(exc).__name__ else text


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub


def reset() -> None:
    """Close every session (tests; a worker that recycles)."""
    global _hub
    with _hub_lock:
        if _hub is not None:
            _hub.close()
        _hub = None
