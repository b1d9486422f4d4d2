"""What every LLM provider returns, in a form that can be stored and replayed."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field


class LLMError(Exception):
    """The model could not be asked. `transient` says whether trying again may help."""

    def __init__(self, message: str, *, transient: bool, rate_limited: bool = False,
                 retry_after: float | None = None, headers: dict | None = None):
        super().__init__(message)
        self.transient = transient
        self.refused_streaming = False  # a streamed request refused: ask plainly instead
        # A 429 that says "too fast" (not "out of quota"): the provider's limiter speaks,
        # and every worker waits `retry_after` seconds (None: it did not say how long).
        self.rate_limited = rate_limited
        self.retry_after = retry_after
        self.headers = headers or {}  # the response's headers, if there was a response


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON text the model sent: untrusted until parsed


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
                     self.cached_tokens + other.cached_tokens)


@dataclass(frozen=True)
class LLMResponse:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> LLMResponse:
        return cls(
            content=data.get("content") or "",
            tool_calls=[ToolCall(**call) for call in data.get("tool_calls") or []],
            finish_reason=data.get("finish_reason") or "stop",
            usage=Usage(**(data.get("usage") or {})),
            model=data.get("model") or "",
        )

    def as_message(self) -> dict:
        """The assistant message to put back into the history (Chat Completions shape)."""
        message: dict = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [tool_call_message(call) for call in self.tool_calls]
        return message


def tool_call_message(call: ToolCall) -> dict:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


# Event loops that live as long as their process (a worker's runner): a provider may keep
# a connection pool on them that needs closing, which a temporary loop would leak.
_long_lived_loops: weakref.WeakSet = weakref.WeakSet()


def pool_connections_on(loop) -> None:
    _long_lived_loops.add(loop)


def pools_connections(loop) -> bool:
    return loop in _long_lived_loops


# How each provider closes the pools it keeps on a long-lived loop: a runner closes them
# when it has drained (`pools_close`), and aiohttp's sessions then end without warnings.
_pool_closers: list[Callable[[asyncio.AbstractEventLoop], Awaitable[None]]] = []


def pool_closer(close: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    _pool_closers.append(close)


async def pools_close() -> None:
    """Close the connection pools kept on the running loop, which no work uses any more."""
    loop = asyncio.get_running_loop()
    for close in _pool_closers:
        await close(loop)
