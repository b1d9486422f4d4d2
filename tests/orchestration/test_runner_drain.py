"""A worker process that ends (issue 25): what is in flight finishes its model call, or is
cut short once a call with its retries could have ended, and never waits out a lease."""

from __future__ import annotations

import asyncio
import threading
import time

from orchestration.delivery import runner as runner_module
from orchestration.delivery.runner import Runner
from orchestration.llm import openai_provider
from tests.support.llm_server import text


def test_work_that_finishes_within_the_call_window_is_not_cut_short():
    runner = Runner(capacity=4, db_threads=1, skill_threads=1)
    ended = []

    async def job(item_id: int) -> None:
        await asyncio.sleep(0.3)  # a model call answered during the drain
        ended.append((item_id, runner.handing_back))

    assert runner.start(job, 1, wait=0)
    runner.drain(finish_within=0, call_within=5)
    assert ended == [(1, True)]  # answered, then it sees it must hand back at its next step
    assert runner.in_flight == 0


def test_a_call_that_outlasts_the_window_is_cut_short_and_hands_back_at_once(monkeypatch):
    runner = Runner(capacity=4, db_threads=1, skill_threads=1)
    monkeypatch.setattr(runner_module, "_runner", runner)
    handed_back, started = [], threading.Event()

    async def job(item_id: int) -> None:
        try:
            started.set()
            await asyncio.sleep(60)  # a model call that will not answer in time
        except asyncio.CancelledError:
            handed_back.append((item_id, runner_module.handing_back()))  # the loop's HAND_BACK
            raise

    for item in (1, 2):
        assert runner.start(job, item, wait=0)
    assert started.wait(2)
    began = time.monotonic()
    runner.drain(finish_within=0, call_within=0.2)
    assert time.monotonic() - began < 5
    assert sorted(handed_back) == [(1, True), (2, True)]
    assert runner.in_flight == 0
    assert not runner.start(job, 3, wait=0)  # and it takes no new work


def test_work_claimed_for_a_full_runner_begins_all_the_same_and_frees_no_slot_it_did_not_take():
    """Work claimed for a runner by the transaction that made it ready (delivery/queue.py
    `begin_here`) holds its lease: left waiting for a slot taken meanwhile, it would only
    wait for the reaper. So it begins over the capacity, and the slots stay as many."""
    runner = Runner(capacity=1, db_threads=1, skill_threads=1)
    release, ran = threading.Event(), []

    async def holding(item_id: int) -> None:
        await asyncio.to_thread(release.wait, 5)

    async def claimed(item) -> None:
        ran.append(item)

    assert runner.start(holding, 1, wait=0) and runner.room() == 0
    runner.start_claimed(claimed, [("a", "token")])
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [("a", "token")]
    release.set()
    runner.drain(finish_within=5, call_within=1)
    assert runner.in_flight == 0
    assert runner._slots.acquire(blocking=False) and not runner._slots.acquire(blocking=False)  # still one


def test_a_drained_runner_closes_the_connection_pool_its_model_calls_used(llm):
    """A runner's model client keeps its connections (aiohttp's pool) on the runner's
    loop, which lives as long as the worker: drained, the runner closes it and forgets
    it, so the worker ends without an unclosed session."""
    runner = Runner(capacity=2, db_threads=1, skill_threads=1)
    llm.respond = lambda request: text("hello")
    clients = []

    async def job(item_id: int) -> None:
        await openai_provider.OpenAIProvider().acomplete(model="m", messages=[{"role": "user", "content": "hi"}],
                                                        tools=[])
        clients.append(openai_provider._async_client())

    assert runner.start(job, 1, wait=0)
    runner.drain(finish_within=5, call_within=1)
    assert len(clients) == 1 and clients[0].is_closed()
    assert runner.loop not in openai_provider._async_clients
