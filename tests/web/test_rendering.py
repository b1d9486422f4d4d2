"""Model output becomes HTML only through markdown + nh3: nothing executable survives."""

from html.parser import HTMLParser

import pytest
from django.urls import reverse

from assistant.rendering import ALLOWED_TAGS, render_markdown

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[click](javascript:alert(1))",
    "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    '<a href="#" hx-get="/admin/" hx-trigger="load">x</a>',
    "<svg onload=alert(1)>",
    '<iframe src="https://evil.example"></iframe>',
    "![x](https://evil.example/track.png)",
    '<div style="background:url(javascript:alert(1))">x</div>',
    "<<script>script>alert(1)<</script>/script>",
    "[x](JaVaScRiPt:alert(1))",
    "[x](&#106;avascript:alert(1))",
    "<a href='vbscript:msgbox(1)'>x</a>",
    "[x](https://example.com \"title\" onclick=alert(1))",
    # autolinks, reference links, entity/percent/escape tricks, other schemes
    "<javascript:alert(1)>",
    "[x][r]\n\n[r]: javascript:alert(1)",
    "[x](<javascript:alert(1)>)",
    "[x](javascript&colon;alert(1))",
    "[x](&#x6A;avascript:alert(1))",
    "[x](java%0Ascript:alert(1))",
    "[x](%6Aavascript:alert(1))",
    "[x](\\u006aavascript:alert(1))",
    "[x](file:///etc/passwd)",
    "![x](javascript:alert(1))",
    "[![x](https://evil.example/i.png)](javascript:alert(1))",
    # relative links: inert in a browser, but links must name their site outright
    "[x](/admin/auth/user/)",
    "[x](//evil.example/phish)",
    # breaking out of attributes and blocks
    '[x](https://example.com "a\\" onmouseover=\\"alert(1)")',
    '[x](https://example.com/"onmouseover="alert(1))',
    "```html\n<script>alert(1)</script>\n```",
    "| a | b |\n|---|---|\n| <script>alert(1)</script> | [x](javascript:alert(1)) |",
    "<!--<script>alert(1)</script>-->",
    '<noscript><p title="</noscript><img src=x onerror=alert(1)>">',
    '<math><mi xlink:href="javascript:alert(1)">x</mi></math>',
    '<a href="https://example.com" target="_blank" rel="opener">x</a>',
]


class Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict]]:
    parser = Elements()
    parser.feed(html)
    return parser.found


@pytest.mark.parametrize("text", HOSTILE)
def test_nothing_executable_survives(text):
    for tag, attrs in elements(render_markdown(text)):
        assert tag in ALLOWED_TAGS
        assert set(attrs) <= {"href", "title", "rel"}
        href = (attrs.get("href") or "").strip().lower()
        assert not href or href.startswith(("http://", "https://", "mailto:")), href


def test_links_keep_their_text_when_their_href_goes():
    html = render_markdown("[the audit](/conversations/1/audit/)")
    assert "the audit" in html and "href" not in html
    assert render_markdown("[mail me](mailto:alice@example.com)") == (
        '<p><a href="mailto:alice@example.com" rel="noopener noreferrer nofollow">mail me</a></p>\n'
    )


def test_formatting_survives():
    html = render_markdown("**bold** and [a link](https://example.com)\n\n- one\n- two")
    assert "<strong>bold</strong>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">a link</a>' in html
    assert "<li>one</li>" in html


# --- hostile text stored anywhere renders inert on every page that shows it ----------------

# Breaks out of text and of both attribute quotings, opens tags with handlers, an htmx
# attribute that would act on load, and a script; every active part says "alert".
STORED = ("\"'><img src=x onerror=alert(1)><script>alert(2)</script>"
          "<a hx-post=\"/logout/\" hx-trigger=\"load\">alert(3)</a><svg onload=alert(4)>")
ONLY_IN_ATTACKS = {"img", "svg", "iframe", "object", "embed", "math", "style", "frame", "audio",
                   "video", "template", "base"}


class Markup(HTMLParser):
    """What an HTML page would run: tags, attributes, and inline script text."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.inline_script = ""
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.inline_script += data


URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href", "data", "srcdoc", "poster"}


def live_parts(html: str, *, own_markup_only: bool = True) -> list[str]:
    """Everything in `html` that would be live markup from the attack; [] when inert.

    Escaped text inside an inert attribute (aria-label, title, value) is harmless and
    allowed. `own_markup_only`: the page itself uses none of ONLY_IN_ATTACKS (the admin
    has svg and img icons, so there the attributes decide).
    """
    assert STORED not in html  # escaped (or sanitised) everywhere, never verbatim
    markup = Markup()
    markup.feed(html)
    found = [f"inline script {markup.inline_script.strip()[:60]!r}"] if markup.inline_script.strip() else []
    for tag, attrs in markup.tags:
        # The waterfall's tracks and arrowhead are the pages' own svg (wf-track, wf-defs); an attack's is not.
        if own_markup_only and tag in ONLY_IN_ATTACKS and not (tag == "svg" and attrs.get("class") in ("wf-track", "wf-defs")):
            found.append(tag)
        for name, value in attrs.items():
            value = value or ""
            if (
                name.startswith("on")
                or (name in URL_ATTRIBUTES and ("alert" in value or "script:" in value.lower()))
                or (name.startswith(("hx-", "data-hx-", "ws-")) and ("alert" in value or "/logout/" in value))
            ):
                found.append(f"{tag}[{name}={value!r}]")
    return found


@pytest.fixture
def stored(alice):
    """A conversation whose every stored text field — the user's words, the model's,
    agents', skills', the engine's — holds the attack."""
    from orchestration.models import AgentDispatch, Event, Message, SkillExecution, Turn, TurnPause
    from tests.factories import conversation_for

    conversation = conversation_for(alice, title=STORED)
    failed = Turn.objects.create(conversation=conversation, number=1, status="failed", error=STORED)
    turn = Turn.objects.create(conversation=conversation, number=2, status="paused")
    TurnPause.objects.create(turn=turn, limit="turn_max_agents",
                             detail={"message": STORED, "completed": [STORED], "not_started": [STORED]})
    for seq, role in enumerate(["user", "assistant", "notice"], start=1):
        Message.objects.create(conversation=conversation, turn=failed, seq=seq, role=role, content=STORED)
    dispatch = AgentDispatch.objects.create(
        turn=turn, agent_id=STORED[:64], mission=STORED, context=STORED, result=STORED, error=STORED,
        close_reason=STORED, depends_on=[STORED], skills=[STORED], state="failed", outcome="failed",
    )
    SkillExecution.objects.create(dispatch=dispatch, skill=STORED[:100], tool_call_id="c1", status="failed",
                                  arguments={"text": STORED}, result={"html": STORED}, error=STORED)
    SkillExecution.objects.create(dispatch=dispatch, skill="tasks.search", tool_call_id="c2",
                                  status="completed", arguments={STORED: STORED}, result={"html": STORED})
    for event_type, event_turn, event_dispatch in [
        ("turn.started", failed, None), ("turn.failed", failed, None), ("turn.started", turn, None),
        ("agent.subagent_created", turn, dispatch), ("skill.finished", turn, dispatch),
        ("turn.paused", turn, None),
    ]:
        Event.objects.create(conversation=conversation, turn=event_turn, dispatch=event_dispatch,
                             type=event_type, summary=STORED[:300], payload={"text": STORED, STORED: [STORED]})
    return conversation


def test_stored_attacks_render_inert_on_the_users_pages(alice_client, stored):
    pages = {
        "list": reverse("conversation_list"),
        "conversation": stored.get_absolute_url(),
        "audit": reverse("conversation_audit", args=[stored.pk]),
    }
    for name, url in pages.items():
        response = alice_client.get(url)
        assert response.status_code == 200, name
        html = response.content.decode()
        assert live_parts(html) == [], name
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html, name  # still shown, as text


def test_stored_attacks_render_inert_in_live_pushes(stored):
    from assistant.live import render_events
    from orchestration.models import Event

    html = render_events(stored, list(Event.objects.filter(conversation=stored)))
    assert 'hx-swap-oob="beforeend:#timeline"' in html  # the real fragments were rendered
    assert live_parts(html) == []


def test_the_audit_export_is_json_to_download_not_a_page(alice_client, stored):
    response = alice_client.get(reverse("conversation_export", args=[stored.pk]))
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith("attachment;")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert STORED not in response.content.decode()  # JSON-escaped: no raw < or quotes


def test_stored_attacks_render_inert_in_the_admin(client, superuser, stored):
    from orchestration.models import AgentDispatch, Event, SkillExecution, Turn

    client.force_login(superuser)
    objects = [stored, Turn.objects.get(number=2), AgentDispatch.objects.get(), SkillExecution.objects.first(),
               Event.objects.first()]
    urls = [reverse("admin:orchestration_conversation_changelist"), reverse("admin:orchestration_event_changelist")]
    urls += [reverse(f"admin:{o._meta.app_label}_{o._meta.model_name}_change", args=[o.pk]) for o in objects]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        assert live_parts(response.content.decode(), own_markup_only=False) == [], url
