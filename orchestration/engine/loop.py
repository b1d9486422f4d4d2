"""The step machine: one loop for the orchestrator, a sub-agent and a nested sub-agent.

    claim → [ replay the stored answer, or: check → ask the model → ahead → store it ] → act → next

A delivery (orchestration/worker/tasks.py) claims the work; then each step either replays an
answer an earlier delivery stored or asks the model and stores the answer before
anything with an effect acts on it (read-only skill calls run ahead, and their rows are
stored with the answer, in the step's one transaction: engine/agent.py); acting on its
tool calls returns the next step (steps.py): ask again, done, wait for agents, pause,
hand back, or stop. `Work.end` writes how the
delivery ended, once, whatever it was. A role (engine/orchestrator.py, engine/agent.py)
provides the methods; this file is the only place that sequences them.

Only the model call is awaited here. Every database step runs on the runner's database
threads; acting on skill calls runs on its skill threads (orchestration/delivery/runner.py), so a
slow skill never holds up another agent's bookkeeping.

Work on those threads that runs past a third of the lease (a slow skill, an MCP server
starting while the prompt lists its tools) renews the lease meanwhile (`_kept`): a lease
lapses when its worker died, or in a model call longer than ASSISTANT_LEASE_SECONDS
allows for (`manage.py check` warns), not because a step waited on something slow.

Provider rate limits (orchestration/llm/capacity/): `_ask` asks the shared limiter for
each call (one request, the prompt's estimated tokens plus the answer's allowance), in
turn (the orchestrator before sub-agents, users in turn, parents before their nested
agents), and settles with the tokens the provider reported. A 429 holds every worker's
calls to that model until its Retry-After and the call is asked again then, without
spending one of the role's retries: waiting for capacity is not a failure. A wait longer
than WAIT_SHOWN_SECONDS is recorded (`record_wait`: an llm.waiting event; an agent's
wall clock moves on by it); Stop, a pause or the process's end cut a wait short
(the role's `check`, every second).

Transient database errors (a restarting server, a lost connection, a deadlock) retry:
a transaction (claim, store, end) is retried as it is; a failure while acting reloads
the work from the store and replays it, which is safe because every step is stored and
every skill call is keyed. After ASSISTANT_DB_RETRY_SECONDS the work is left to its
lease: the reaper gives it to another worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from itertools import count
from typing import Protocol

from django.conf import settings

from orchestration.budgets.limits import LimitTripped
from orchestration.budgets.spending import prompt_estimate
from orchestration.delivery import runner
from orchestration.delivery.dbretry import Retrying, is_transient
from orchestration.delivery.leases import LeaseLost
from orchestration.delivery.queue import Claimed
from orchestration.engine import steps
from orchestration.engine.retries import complete_retrying
from orchestration.engine.steps import Kind, Next
from orchestration.llm import LLMError, LLMResponse, capacity

logger = logging.getLogger(__name__)

MAX_STEPS = 100  # a hard stop beyond every budget
WAIT_SHOWN_SECONDS = 0.5  # a wait for the provider's rate limit this long is an event
MAX_HOLDS = 20  # 429s in a row for one call before it counts as a failure (the engine's retries)
MAX_HOLD_SECONDS = 60.0  # a 429 without Retry-After: 0.5 s, doubling up to this


class Work(Protocol):
    """A role's side of the loop (engine/orchestrator.py, engine/agent.py)."""

    label: str  # for the log: "turn 12", "agent researcher (dispatch 40)"
    first_step: int  # where replaying starts

    @classmethod
    def claim(cls, item_id: int) -> Work | None: ...  # one transaction

    @classmethod
    def adopt_many(cls, claimed: list[Claimed]) -> dict[int, Work]: ...  # claimed already: read, write nothing

    def load(self) -> None: ...  # (re)build the run from the store: messages, counters
    def replayed(self, step: int) -> LLMResponse | None: ...  # the answer stored for `step`
    def check(self) -> Next | None: ...  # still ours, and wanted? (renews the lease)
    def before_call(self) -> Next | None: ...  # check, then within limits? reserve the spend
    def request(self) -> dict: ...  # the call's model, messages, tools, max_tokens, on_text
    def retries(self) -> tuple[int, int]: ...  # (used, allowed) engine retries of model calls
    def record_retry(self, retry: int, exc: LLMError, delay: float, step: int, took_ms: int) -> Next | None: ...
    def priority(self) -> capacity.Priority: ...  # its place among calls waiting for the provider
    def record_wait(self, step: int, waited: float, model: str) -> None: ...  # an llm.waiting event
    def release_reservation(self) -> None: ...  # the call was not made, or failed
    def charge(self, response: LLMResponse) -> None: ...  # settle the spend (its own commit, if any)
    def settle_up(self) -> None: ...  # what the delivery owes the counters, however it ended
    def ahead(self, step: int, response: LLMResponse) -> LLMResponse: ...  # what may run before storing
    def store(self, step: int, response: LLMResponse, duration_ms: int) -> Next | None: ...
    def acts_on_skills(self, response: LLMResponse) -> bool: ...
    def act(self, step: int, response: LLMResponse) -> Next: ...
    def too_many_steps(self) -> Next: ...
    def end(self, next_step: Next) -> None: ...  # write how this delivery ended


async def run(role, item: int | Claimed) -> None:
    """One delivery: claim the work (a role's `claim` returns None when it is not ours to
    run), or take it up as claimed by the transaction that made it ready on this runner
    (delivery/queue.py `Claimed`), and run it until it ends, waits, pauses or goes
    elsewhere."""
    work: Work | None = await _claim(role, item)
    if work is None:
        return
    try:
        next_step = await _steps_retrying(work)
    except asyncio.CancelledError:
        if not runner.handing_back():
            raise
        next_step = steps.HAND_BACK  # the process is ending: cut the model call short
    try:
        if next_step.kind is not Kind.STOP:
            await _kept(work, db_retrying, work.end, next_step)  # a turn's end lists its MCP side effects
    except LeaseLost:
        logger.info("%s: lease lost before it could end; its new holder goes on", work.label)
    finally:
        await db_retrying(work.settle_up)  # the calls were made, whoever holds the work now


async def _claim(role, item: int | Claimed) -> Work | None:
    """`role.claim(item_id)`, or for work claimed already `role.adopt_many`; for a role
    that can claim several at once (`claim_many`), together with the other deliveries of
    it that begin in the same turn of the loop (the runner begins work that became ready
    together so: delivery/runner.py)."""
    claimed = isinstance(item, Claimed)
    if not hasattr(role, "claim_many"):
        return role.adopt_many([item]).get(item.item_id) if claimed else await db_retrying(role.claim, item)
    many = role.adopt_many if claimed else role.claim_many
    loop = asyncio.get_running_loop()
    batches = _claiming.setdefault(loop, {})
    if many not in batches:
        batches[many] = []
        loop.call_soon(lambda: loop.create_task(_claim_batch(many, batches.pop(many))))
    found = loop.create_future()
    batches[many].append((item, found))
    return await found


# loop → a role's claim_many or adopt_many → the (item, future) of the claims asked in this
# turn of the loop
_claiming: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def _claim_batch(many, waiting: list[tuple[int | Claimed, asyncio.Future]]) -> None:
    try:
        claimed = await db_retrying(many, [item for item, _ in waiting])
    except BaseException as exc:
        for _, future in waiting:
            if not future.done():
                future.set_exception(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    for item, future in waiting:
        if not future.done():
            future.set_result(claimed.get(item.item_id if isinstance(item, Claimed) else item))


async def _steps_retrying(work: Work) -> Next:
    """The steps, begun again from the store after a transient database error."""
    retrying = Retrying()
    while True:
        try:
            await _kept(work, runner.db, work.load)
            return await _steps(work)
        except steps.StoredElsewhere:
            logger.info("%s: a step was stored by another delivery; replaying it", work.label)
            continue
        except Exception as exc:
            if not retrying.may_retry(exc):
                return _as_next(work, exc)
            logger.warning("%s: %s; trying again on a fresh connection", work.label, exc)
        await retrying.pause()


async def _steps(work: Work) -> Next:
    for step in count(work.first_step):
        if step >= MAX_STEPS:
            return work.too_many_steps()
        response = work.replayed(step)
        if response is None:
            if (stop := await _kept(work, runner.db, work.before_call)) is not None:
                return stop
            try:
                response, duration_ms = await _ask(work, step)
            except BaseException:
                await db_retrying(work.release_reservation)
                raise
            await db_retrying(work.charge, response)
            if work.acts_on_skills(response):
                response = await _kept(work, runner.skills, work.ahead, step, response)
            else:
                response = work.ahead(step, response)
            if (stop := await db_retrying(work.store, step, response, duration_ms)) is not None:
                return stop
        on_pool = runner.skills if work.acts_on_skills(response) else runner.db
        next_step = await _kept(work, on_pool, work.act, step, response)
        if next_step.kind is not Kind.AGAIN:
            return next_step
    raise AssertionError("unreachable")


async def _kept(work: Work, on_pool, fn, /, *args):
    """`on_pool(fn, *args)`, the work's lease renewed while it runs past a third of the
    lease. The lease tells whether the worker lives, not whether a step is quick: a step
    that waits on an MCP server starting (its tools listed for the prompt) or on a slow
    skill is alive, and the reaper must not hand its work to another worker meanwhile.
    Each of those waits has a timeout of its own; a process that dies renews nothing.
    A timer, not a task beside the call: a step that is done sooner (every step, in the
    steady state) costs no statement and no turn of the loop."""
    loop = asyncio.get_running_loop()
    every = settings.ASSISTANT_LEASE_SECONDS / 3

    def due() -> None:
        nonlocal timer
        renewing = loop.create_task(_renew(work))
        _renewing.add(renewing)  # held until done: the loop keeps only a weak reference
        renewing.add_done_callback(_renewing.discard)
        timer = loop.call_later(every, due)

    timer = loop.call_later(every, due)
    try:
        return await on_pool(fn, *args)
    finally:
        timer.cancel()


_renewing: set[asyncio.Task] = set()


async def _renew(work: Work) -> None:
    """Renew the lease beside a step still running; what the check finds (a Stop, a
    pause, the lease lost) the step itself finds at its next write or check."""
    try:
        await runner.db(work.check)
    except Exception as exc:  # noqa: BLE001 - the step goes on; its own writes say what is wrong
        logger.warning("%s: the lease could not be renewed (%s)", work.label, exc)


async def _ask(work: Work, step: int) -> tuple[LLMResponse, int]:
    """The model's answer for this step, asked again (after a wait) while it fails
    transiently and the role's retries last (orchestration/engine/retries.py)."""

    attempt_began = time.monotonic()  # a failed attempt's duration goes in its event (its trace span)

    async def before_retry(retry: int, exc: LLMError, delay: float) -> None:
        nonlocal attempt_began
        took_ms = int((time.monotonic() - attempt_began) * 1000)
        if (stop := await db_retrying(work.record_retry, retry, exc, delay, step, took_ms)) is not None:
            raise _Stopped(stop)
        await asyncio.sleep(delay)
        if (stop := await runner.db(work.check)) is not None:  # stopped or paused meanwhile
            raise _Stopped(stop)
        attempt_began = time.monotonic()

    used, allowed = work.retries()
    request = work.request()
    provider = request.pop("provider")
    limiter = capacity.process_limiter(runner.db) if hasattr(provider, "endpoint") else None
    if limiter is None:  # the offline planner, or ASSISTANT_PROVIDER_LIMITER=0
        return await complete_retrying(lambda: provider.acomplete(**request), used=used, allowed=allowed,
                                       before_retry=before_retry)
    return await complete_retrying(lambda: _within_limits(work, step, limiter, provider, request), used=used,
                                   allowed=allowed, before_retry=before_retry)


async def _within_limits(work: Work, step: int, limiter: capacity.Limiter, provider, request: dict) -> LLMResponse:
    """One call, made when the shared limiter admits it and settled after. A 429 holds
    every worker's calls to the model until the provider's Retry-After, then asks again
    here: it is not one of the engine's retries."""
    endpoint, model = provider.endpoint(), request["model"]
    allowance = request.get("max_tokens") or int(settings.ASSISTANT_SPEND["completion_reserve_tokens"])
    tokens = prompt_estimate(messages=request["messages"], tools=request["tools"]) + allowance
    priority = work.priority()

    async def check():
        return await runner.db(work.check)

    for holds in count():
        try:
            grant = await limiter.acquire(endpoint, model, tokens=tokens, priority=priority, check=check)
        except capacity.Stopped as stopped:
            raise _Stopped(stopped.value) from None
        headers: list[dict] = []
        try:
            async with grant.kept():
                if grant.waited >= WAIT_SHOWN_SECONDS:
                    await db_retrying(work.record_wait, step, grant.waited, model)
                response = await provider.acomplete(**request, on_headers=headers.append)
        except LLMError as exc:
            await grant.settle(0)
            if exc.headers:
                await limiter.observe(endpoint, model, exc.headers)
            if not exc.rate_limited or holds >= MAX_HOLDS:
                raise
            wait = exc.retry_after if exc.retry_after is not None else min(0.5 * 2 ** holds, MAX_HOLD_SECONDS)
            logger.info("%s: the provider's rate limit (429); every call to %s waits %.1f s", work.label, model, wait)
            await limiter.hold(endpoint, model, time.time() + wait)
            continue
        except BaseException:
            await grant.settle(0)
            raise
        usage = response.usage
        await grant.settle(usage.prompt_tokens + usage.completion_tokens)
        if headers:
            await limiter.observe(endpoint, model, headers[-1])
        return response
    raise AssertionError("unreachable")


class _Stopped(Exception):
    """The work must not ask again (found during a retry's wait)."""

    def __init__(self, next_step: Next):
        super().__init__(next_step.kind.value)
        self.next_step = next_step


def _as_next(work: Work, exc: BaseException) -> Next:
    """An exception that ended the steps, as the step it means."""
    if isinstance(exc, _Stopped):
        return exc.next_step
    if isinstance(exc, LimitTripped):
        return steps.pause(exc)
    if isinstance(exc, LeaseLost):
        logger.info("%s: lease lost; another worker goes on", work.label)
        return steps.STOP
    if isinstance(exc, LLMError):
        return steps.done("failed", error=f"LLM error: {exc}")
    if is_transient(exc):  # past ASSISTANT_DB_RETRY_SECONDS: the lease brings it back
        logger.warning("%s: the database is still unavailable (%s); left to its lease", work.label, exc)
        return steps.STOP
    logger.exception("%s failed", work.label, exc_info=exc)
    return steps.done("failed", error=f"{type(exc).__name__}: {exc}")


async def db_retrying(fn, /, *args, **kwargs):
    """`runner.db(fn, ...)` for a function that is one transaction: begun again on a
    fresh connection after a transient error, for up to ASSISTANT_DB_RETRY_SECONDS."""
    retrying = Retrying()
    while True:
        try:
            return await runner.db(fn, *args, **kwargs)
        except Exception as exc:
            if not retrying.may_retry(exc):
                raise
            logger.warning("%s: %s; trying again", getattr(fn, "__qualname__", fn), exc)
        await retrying.pause()
