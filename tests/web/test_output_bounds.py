"""Bounded output (issue 18): every text rendered for a page has a size cap and says
what it left out, and a message's HTML is rendered once, not on every page view.

The 1 MB answer through the real SDK, daphne and a qcluster, with another user's
latency beside it: tests/browser/test_big_answer.py."""

from __future__ import annotations

import pytest
from django.urls import reverse

from assistant import rendering
from assistant.payloads import render_payload
from orchestration.models import Message
from orchestration.records.output import text_bounded, truncation_note
from tests.factories import conversation_for, turn_for

MEGABYTE = ("## A heading\n\nSome **bold** words and a [link](https://example.com).\n\n- one\n- two\n\n" * 14_000)[:1_000_000]


@pytest.fixture
def small_caps(settings):
    settings.ASSISTANT_OUTPUT_LIMITS = {"answer_chars": 5_000, "rendered_chars": 8_000, "payload_value_chars": 300}
    return settings.ASSISTANT_OUTPUT_LIMITS


@pytest.mark.parametrize("length", [0, 99, 100, 101, 1_000_000])
def test_a_bounded_text_keeps_within_its_limit_and_says_how_much_it_cut(length):
    text = "x" * length
    bounded = text_bounded(text, limit=100)
    assert len(bounded) <= 100
    if length <= 100:
        assert bounded == text
    else:
        kept = bounded.split("\n\n")[0]
        assert bounded.endswith(truncation_note(length - len(kept)))
        assert "…(truncated, " in bounded and text.startswith(kept)


def test_a_megabyte_of_markdown_renders_up_to_the_cap_with_a_note(small_caps):
    html = rendering.render_markdown(MEGABYTE)
    assert f"…(truncated, {1_000_000 - 8_000:,} characters)" in html
    assert html.rstrip().endswith("</p>") and len(html) < 20_000
    assert "<h2>A heading</h2>" in html  # still markdown up to the cut


def test_a_short_text_renders_whole(small_caps):
    assert rendering.render_markdown("**hi**") == "<p><strong>hi</strong></p>\n"


def test_a_payload_value_is_cut_with_a_note(small_caps):
    content = "y" * 10_000
    html = str(render_payload({"skill": "files.write", "arguments": {"path": "a.txt", "content": content},
                               "result": {"text": "z" * 5_000}}))
    assert "y" * 300 not in html and "z" * 300 not in html
    assert html.count("…(truncated, ") == 2
    assert "9.8\xa0KB" in html  # the size row still tells the whole size


@pytest.mark.django_db
def test_a_messages_html_is_rendered_once_not_on_every_page_view(alice, bob, client, monkeypatch):
    conversation = conversation_for(alice)
    turn = turn_for(conversation, status="completed")
    for seq, text in enumerate(["# First answer", "Second **answer**", MEGABYTE], start=1):
        Message.objects.create(conversation=conversation, turn=turn, seq=seq, role="assistant", content=text)
    rendered: list[int] = []
    clean = rendering._clean
    monkeypatch.setattr(rendering, "_clean", lambda text: rendered.append(len(text)) or clean(text))
    client.force_login(alice)
    url = reverse("conversation_detail", args=[conversation.pk])

    first = client.get(url)
    assert first.status_code == 200 and "…(truncated, " in first.content.decode()
    assert len(rendered) == 3 and max(rendered) == 100_000  # the megabyte, up to the default cap
    for _ in range(3):
        assert "…(truncated, " in client.get(url).content.decode()
    assert len(rendered) == 3  # from the cache since

    # bob's own page renders his own messages, and sees none of alice's
    client.force_login(bob)
    assert client.get(url).status_code == 404


def test_the_cache_is_bounded_by_the_size_of_what_it_holds(settings, monkeypatch):
    settings.ASSISTANT_RENDERED_CACHE_CHARS = 10_000
    texts = [f"answer {i} " + "w" * 3_000 for i in range(10)]
    for text in texts:
        rendering.render_markdown(text)
    cache = rendering._cache()
    assert cache.currsize <= 10_000 and len(cache) == 3  # the newest three fit
    rendered: list[str] = []
    clean = rendering._clean
    monkeypatch.setattr(rendering, "_clean", lambda text: rendered.append(text) or clean(text))
    rendering.render_markdown(texts[-1])
    assert rendered == []
    rendering.render_markdown(texts[0])  # pushed out: rendered again
    assert rendered == [texts[0]]


def test_a_draft_is_rendered_each_time_and_not_kept(settings):
    settings.ASSISTANT_RENDERED_CACHE_CHARS = 1_000_000
    before = len(rendering._cache())
    rendering.render_markdown("a draft being written", cached=False)
    assert len(rendering._cache()) == before


def test_the_caps_come_from_the_environment_and_nonsense_stops_the_start():
    from tests.test_settings import run_settings

    assert run_settings({"ASSISTANT_MAX_ANSWER_CHARS": "500", "ASSISTANT_MAX_RENDERED_CHARS": "600"}).returncode == 0
    refused = run_settings({"ASSISTANT_MAX_ANSWER_CHARS": "5000", "ASSISTANT_MAX_RENDERED_CHARS": "600"})
    assert refused.returncode != 0 and "at least ASSISTANT_MAX_ANSWER_CHARS" in refused.stderr
    assert "not an integer" in run_settings({"ASSISTANT_SOCKETS_PER_USER": "many"}).stderr
