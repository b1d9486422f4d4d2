"""The live dashboard in chromium: a turn seen as it happens, a continue? prompt, a reload,
a reconnect.

alice logs in through the form, opens a conversation and sends a message; daphne starts
the turn and the cluster's workers run it against the scripted model. The page is never
reloaded unless the test says so: `window.__sameDocument` is set once and must survive.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import expect

from orchestration.models import AgentDispatch, Conversation, TurnPause, TurnStatus
from skills.domains.tasks.models import Task
from tests.browser.conftest import assert_timeline_complete, record_events, wait_turn
from tests.factories import turn_for
from tests.support.llm_server import Agent, Plan

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WEEK = [
    Agent("calendar", ["calendar.list_events"], [("calendar.list_events", {})], report="No events this week.",
          extra={"mission": "List this week's events. mission:calendar"}),
    Agent("tasks", ["tasks.search"], [("tasks.search", {"status": "open"})], report="No open tasks.",
          extra={"mission": "Find my open tasks. mission:tasks"}),
    Agent("notes", ["memory.save"], [("memory.save", {"text": "Weekly review done", "tags": ["review"]})],
          depends_on=["calendar", "tasks"], report="Saved a note.",
          extra={"mission": "Save a note about the review. mission:notes"}),
]
WEEK_ANSWER = "**Your week** is clear: no events and no open tasks.\n\n- I saved a note for the review."


def slowed(plan: Plan, seconds: float):
    """The plan, with every sub-agent answer `seconds` late: agents stay visibly running."""

    def respond(request):
        reply = plan(request)
        if any(tool["function"]["name"] == "use_skill" for tool in request.get("tools", [])):
            reply.delay = seconds
        return reply

    return respond


def node(page, agent_id: str):
    return page.locator("#agent-graph li.node", has=page.locator(f'xpath=./span[@class="agent" and text()="{agent_id}"]'))


def test_a_turn_is_seen_live_without_a_reload(servers, visit, alice, llm, request):
    llm.respond = slowed(Plan(WEEK, answer=WEEK_ANSWER), 1.0)
    site = servers()
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page
    page.evaluate("window.__sameDocument = true")

    alice_tab.send("Review my week, then save a note")

    expect(page.locator("#composer textarea")).to_be_disabled()
    expect(page.locator("#composer-note")).to_contain_text("you can send the next message when it has finished")
    calendar = node(page, "calendar")
    expect(calendar.locator("> .state")).to_have_text("running")
    expect(calendar.locator("> .progress")).to_contain_text(re.compile(r"step \d: (asking the model|running)"))
    expect(node(page, "notes").locator("> .state")).to_have_text("queued")  # waits for calendar and tasks
    expect(node(page, "notes")).to_contain_text("after calendar, tasks")
    rows_while_running = len(alice_tab.event_ids())
    assert rows_while_running > 0
    alice_tab.screenshot(request.node, "graph-running", "#agent-graph")
    alice_tab.screenshot(request.node, "dashboard-running")

    # finished agents wait until the orchestrator reads their results, after the last one
    expect(calendar.locator("> .state")).to_have_text("reported, not read yet")
    expect(node(page, "notes").locator("> .state")).to_have_text("running")
    expect(page.locator("#messages .message.assistant strong")).to_have_text("Your week")
    for agent_id in ("calendar", "tasks", "notes"):
        expect(node(page, agent_id).locator("> .state")).to_have_text("completed")
        expect(node(page, agent_id).locator("> .progress")).to_contain_text("2 steps; last")
    expect(page.locator("#send-button")).to_be_visible()
    expect(page.locator("#composer textarea")).to_be_enabled()
    expect(page.locator("#counters")).to_contain_text(re.compile(r"\b[1-9]\d* tokens"))
    # what each agent and the turn cost, pushed live (gpt-4o-mini is priced)
    expect(page.locator("#counters")).to_contain_text(re.compile(r"<?\$0\.\d{4}"))
    expect(node(page, "calendar").locator("> .spend")).to_have_text(re.compile(r"^· [1-9]\d* tokens · <?\$0\.\d{4}$"))
    expect(page.locator("#turn-spend")).to_have_text(re.compile(r"^[1-9]\d* tokens · <?\$0\.\d{4}$"))

    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert llm.errors == []
    shown = assert_timeline_complete(alice_tab, conversation_id)
    assert len(shown) > rows_while_running
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    # one flat list in event-id order (assert_timeline_complete), each row naming its agent
    expect(page.locator("#timeline .event.type-turnstarted")).to_have_count(1)
    who = page.eval_on_selector_all("#timeline .event .who", "els => els.map(e => e.textContent.trim())")
    assert {"orchestrator", "calendar", "tasks", "notes"} <= set(who), who

    alice_tab.screenshot(request.node, "dashboard")
    alice_tab.screenshot(request.node, "chat", ".chat")
    alice_tab.screenshot(request.node, "timeline", "#timeline")
    alice_tab.screenshot(request.node, "graph", "#agent-graph")
    assert alice_tab.dialogs == [] and alice_tab.outside_requests() == []


def test_a_tripped_limit_asks_and_continue_finishes_the_turn(servers, visit, alice, llm, request):
    maker = Agent("maker", ["tasks.create"], [("tasks.create", {"title": t}) for t in ("one", "two", "three")])
    llm.respond = Plan([maker], answer="Created three tasks.")
    site = servers(limits={"turn_max_skill_calls": 2})
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page
    page.evaluate("window.__sameDocument = true")

    alice_tab.send("Create three tasks")

    prompt = page.locator("#pause-prompt .pause")
    expect(prompt).to_contain_text("Continue?")
    expect(prompt).to_contain_text("This turn has made 2 skill calls, the most one turn may make.")
    expect(prompt).to_contain_text("Waiting to start: maker")
    expect(prompt).to_contain_text("Continue allows 2 more skill calls for this turn.")
    # One prompt per pause, in words: the chat keeps a one-line record, no second question.
    expect(page.locator(".pause")).to_have_count(1)
    expect(page.locator("#messages .notice")).to_contain_text("Turn 1 paused on skill calls per turn: waiting for your answer")
    expect(page.locator("#messages")).not_to_contain_text("continue", ignore_case=True)
    expect(page.locator(".chat")).not_to_contain_text("turn_max_skill_calls")
    # The first request named the conversation, and the heading shows it without a reload.
    expect(page.locator("#conversation-title")).to_have_text("Create three tasks")
    expect(page.locator("#continue-button")).to_be_visible()
    expect(page.locator("#stop-button")).to_be_visible()
    expect(page.locator("#counters")).to_contain_text("paused")
    pause = TurnPause.objects.get(turn__conversation_id=conversation_id)
    assert pause.limit == "turn_max_skill_calls" and pause.decision == ""
    assert Task.objects.count() == 2
    alice_tab.screenshot(request.node, "prompt", "#pause-prompt")
    alice_tab.screenshot(request.node, "paused")

    with page.expect_response(lambda r: r.url.endswith("/continue/")) as answered:
        page.click("#continue-button")
    assert answered.value.status == 204

    expect(page.locator("#messages .message.assistant", has_text="Created three tasks.")).to_be_visible()
    expect(page.locator("#pause-prompt .pause")).to_have_count(0)
    expect(page.locator("#messages .notice .content", has_text="Turn 1 paused")).to_have_text(
        "Turn 1 paused on skill calls per turn: alice continued it.")
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert turn.continuations == 1
    assert sorted(Task.objects.values_list("title", flat=True)) == ["one", "three", "two"]
    assert_timeline_complete(alice_tab, conversation_id)
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    alice_tab.screenshot(request.node, "continued")


def test_a_reload_mid_turn_misses_and_doubles_nothing(servers, visit, alice, llm, request):
    search = ("tasks.search", {"status": "open"})
    agents = [Agent(f"s{i}", ["tasks.search"], [search, search]) for i in range(3)]
    agents.append(Agent("last", ["tasks.search"], [search], depends_on=[a.agent_id for a in agents]))
    llm.respond = slowed(Plan(agents, answer="Searched four times."), 1.0)  # outlasts two reloads
    site = servers()
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page

    alice_tab.send("Search in parallel, then once more")
    page.wait_for_function("() => document.querySelectorAll('#timeline [id^=\"event-\"]').length >= 3")
    for _ in range(2):  # once while the first agents run, once after more events came
        seen = len(alice_tab.event_ids())
        page.reload()
        alice_tab.wait_connected()
        expect(page.locator("#composer textarea")).to_be_disabled()  # the turn still runs
        page.wait_for_function(
            "n => document.querySelectorAll('#timeline [id^=\"event-\"]').length > n", arg=seen)

    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    expect(page.locator("#messages .message.assistant .content")).to_have_text("Searched four times.")
    assert_timeline_complete(alice_tab, conversation_id)
    expect(page.locator("#timeline .event.type-turnstarted")).to_have_count(1)
    who = page.eval_on_selector_all("#timeline .event .who", "els => els.map(e => e.textContent.trim())")
    assert set(who) == {"orchestrator"} | set(AgentDispatch.objects.filter(turn=turn).values_list("agent_id", flat=True))
    expect(page.locator("#messages .message.assistant")).to_have_count(1)
    alice_tab.screenshot(request.node, "after-reloads")


def test_a_reconnect_replays_from_the_last_event_the_page_holds(servers, visit, alice):
    """daphne restarts under an open page: every new socket asks for the events after the
    largest id in the page (static/js/live.js), not after the id rendered at load, and the
    page then shows each event once, those committed while its socket was down too."""
    site = servers(workers=0)
    alice_tab = visit(site, "alice")
    page = alice_tab.page
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))

    def last(url: str) -> int:
        return int(parse_qs(urlsplit(url).query)["last"][0])

    conversation_id = alice_tab.new_conversation()
    page.evaluate("window.__sameDocument = true")
    assert [last(url) for url in sockets] == [0]  # rendered with no events: the fallback
    finished = turn_for(Conversation.objects.get(pk=conversation_id), status=TurnStatus.COMPLETED)
    pushed = record_events(finished, 3)
    page.wait_for_selector(f"#event-{max(pushed)}", state="attached")

    # daphne is down on purpose: the extension's reconnect attempts fail until it is back
    alice_tab.expect_failure(r"^WebSocket connection to 'ws://[^']+/ws/conversations/\d+/\?last=\d+' failed")
    alice_tab.expect_failure(r"^\[object Event\]$")  # htmx's ws extension logs each failed attempt
    site.stop_web()
    page.wait_for_function("() => window.__socketOpen === false")
    held = max(alice_tab.event_ids())
    assert held == max(pushed)
    while_down = record_events(finished, 2)
    site.start_web()
    alice_tab.wait_connected()

    reconnects = sockets[1:]
    assert reconnects and [last(url) for url in reconnects] == [held] * len(reconnects), sockets
    shown = assert_timeline_complete(alice_tab, conversation_id)
    assert set(while_down) <= set(shown)
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"


def test_a_push_keeps_the_message_being_typed(servers, visit, alice):
    """Every push replaces the composer; what the user was typing survives it."""
    alice_tab = visit(servers(workers=0), "alice")
    conversation_id = alice_tab.new_conversation()
    box = alice_tab.page.locator("#composer textarea")
    box.fill("Half a thought")

    finished = turn_for(Conversation.objects.get(pk=conversation_id), status=TurnStatus.COMPLETED)
    [event_id] = record_events(finished, 1)
    alice_tab.page.wait_for_selector(f"#event-{event_id}", state="attached")

    expect(box).to_be_enabled()
    expect(box).to_have_value("Half a thought")


def test_a_hidden_tab_is_brought_up_to_date_when_it_shows(servers, visit, alice):
    """The page tells its socket when the tab hides and shows (static/js/live.js): a
    hidden tab is sent nothing; shown again, it gets every row it missed, then the
    counters and the graph."""
    alice_tab = visit(servers(workers=0), "alice")
    page = alice_tab.page
    sent, received = [], []
    page.on("websocket", lambda socket: (socket.on("framesent", lambda frame: sent.append(frame)),
                                         socket.on("framereceived", lambda frame: received.append(frame))))
    conversation_id = alice_tab.new_conversation()
    alice_tab.wait_connected()
    running = turn_for(Conversation.objects.get(pk=conversation_id))

    def show(state: str) -> None:
        page.evaluate("""state => {
            Object.defineProperty(document, "visibilityState", {value: state, configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
        }""", state)

    def soon(check) -> bool:
        for _ in range(50):
            if check():
                return True
            page.wait_for_timeout(100)
        return check()

    show("hidden")
    assert soon(lambda: sent == ['{"visible":false}'])
    page.wait_for_timeout(200)  # the frame is in daphne before the events commit
    received.clear()
    pushed = record_events(running, 3)  # a turn starting: its rows, and the busy panels due
    page.wait_for_timeout(700)
    assert received == [] and alice_tab.event_ids() == []

    show("visible")
    page.wait_for_selector(f"#event-{max(pushed)}", state="attached")
    assert soon(lambda: any('id="agent-graph"' in frame for frame in received))
    assert sorted(alice_tab.event_ids()) == sorted(pushed)
    assert sent == ['{"visible":false}', '{"visible":true}']
