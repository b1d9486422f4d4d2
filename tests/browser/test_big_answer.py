"""A 1 MB model answer (issue 18: "made its page take 15 s to render and slowed everyone
else's"), through the real openai SDK, a qcluster and daphne: the chat keeps a bounded
copy with a note (the whole response stays in the stored LLM call), its page renders
the message once and then from the cache, and another user's page and turn go on.

Times are printed, not asserted: the figures beside them come from the same run (the
old renderer over the whole megabyte, in this process; bob's page and turn before
alice's answer and while her page is being read).
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request

import pytest
from django.test import Client
from playwright.sync_api import expect

from assistant import rendering
from orchestration.models import Event, LLMCall, Message
from tests.browser.conftest import wait_turn
from tests.support.llm_server import text, user_text

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MEGABYTE = ("## A heading\n\nSome **bold** words and a [link](https://example.com).\n\n- one\n- two\n\n" * 14_000)[:1_000_000]
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def page_load(url: str, cookie: str) -> tuple[float, int]:
    """Seconds to the page's last byte, and its size."""
    started = time.perf_counter()
    with DIRECT.open(urllib.request.Request(url, headers={"Cookie": cookie}), timeout=60) as response:
        assert response.status == 200
        body = response.read()
    return time.perf_counter() - started, len(body)


def turn_seconds(conversation_id: int) -> float:
    """The latest turn's request → answered, by the database's own clock."""
    asked = Message.objects.filter(conversation_id=conversation_id, role="user").latest("seq").created_at
    answered = Event.objects.filter(conversation_id=conversation_id, type="turn.completed").latest("id").created_at
    return (answered - asked).total_seconds()


def ms(seconds: list[float] | float) -> str:
    values = seconds if isinstance(seconds, list) else [seconds]
    return f"{statistics.median(values) * 1000:8.1f} ms" + (f" (max {max(values) * 1000:.1f}, n={len(values)})"
                                                          if len(values) > 1 else "")


def test_a_megabyte_answer_is_kept_bounded_and_slows_nobody(servers, visit, alice, bob, llm, capsys):
    llm.respond = lambda request: text(MEGABYTE if "megabyte" in user_text(request) else "Hello, bob.")
    site = servers(workers=2, env={"ASSISTANT_LLM_STREAM": "0"})  # whole, not 250,000 chunks of 4 characters
    alice_cookie, bob_cookie = session_cookie(alice), session_cookie(bob)

    bob_tab = visit(site, "bob")
    bobs = bob_tab.new_conversation()
    bob_tab.send("Hello")
    assert wait_turn(bobs, site).status == "completed"
    bob_url = f"{site.url}/conversations/{bobs}/"
    bob_page_before = [page_load(bob_url, bob_cookie)[0] for _ in range(5)]
    bob_turn_before = turn_seconds(bobs)

    alice_tab = visit(site, "alice")
    alices = alice_tab.new_conversation()
    alice_tab.send("Write me a megabyte")
    assert wait_turn(alices, site, timeout=120).status == "completed"
    alice_turn = turn_seconds(alices)

    # The chat keeps a bounded copy; the stored LLM call keeps the model's whole answer.
    answer = Message.objects.filter(conversation_id=alices, role="assistant").latest("seq").content
    assert len(answer) <= 100_000 and answer.endswith(" characters)") and "…(truncated, " in answer
    stored = LLMCall.objects.get(turn__conversation_id=alices).response
    assert stored["content"] == MEGABYTE
    # the live push brought it to the open page
    expect(alice_tab.page.locator("#messages")).to_contain_text("…(truncated, ")

    # alice's page read over and over while bob reads his page and runs a turn
    alice_url = f"{site.url}/conversations/{alices}/"
    alice_pages: list[tuple[float, int]] = []
    stop = threading.Event()

    def read_alices_page():
        while not stop.is_set():
            alice_pages.append(page_load(alice_url, alice_cookie))

    reader = threading.Thread(target=read_alices_page)
    reader.start()
    try:
        bob_page_during = [page_load(bob_url, bob_cookie)[0] for _ in range(5)]
        bob_tab.send("Hello again")
        assert wait_turn(bobs, site).status == "completed"
        bob_turn_during = turn_seconds(bobs)
        while len(alice_pages) < 3:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join()
    assert max(size for _, size in alice_pages) < 300_000

    started = time.perf_counter()
    alice_tab.goto(f"/conversations/{alices}/")
    expect(alice_tab.page.locator("#messages")).to_contain_text("…(truncated, ")
    alice_browser = time.perf_counter() - started

    started = time.perf_counter()
    rendering._clean(MEGABYTE)
    old_render = time.perf_counter() - started
    started = time.perf_counter()
    rendering._clean(answer)
    capped_render = time.perf_counter() - started

    with capsys.disabled():
        print(f"\n1 MB model answer ({site.url}, SQLite or DATABASE_URL as set):")
        print(f"  markdown+nh3 over the whole 1 MB (the old per-view cost) {ms(old_render)}")
        print(f"  markdown+nh3 over the stored {len(answer):,} characters (once) {ms(capped_render)}")
        print(f"  alice's turn, request → answered                        {ms(alice_turn)}")
        print(f"  alice's page, HTTP (from the cache), {alice_pages[0][1]:,} bytes   {ms([s for s, _ in alice_pages])}")
        print(f"  alice's page in chromium, to the truncation note        {ms(alice_browser)}")
        print(f"  bob's page before alice's answer                        {ms(bob_page_before)}")
        print(f"  bob's page while alice's page is read in a loop         {ms(bob_page_during)}")
        print(f"  bob's turn before / during                              {ms(bob_turn_before)} / {ms(bob_turn_during)}")
