"""memory.*: save and ranked search (full-text on PostgreSQL, word matching elsewhere)."""

from __future__ import annotations

import pytest
from django.db import connection

from skills.models import Memory


@pytest.fixture
def memories(alice, bob):
    def remember(owner, text, tags=()):
        return Memory.objects.create(owner=owner, text=text, tags=list(tags))

    return {
        "dentist": remember(alice, "My dentist is Dr. Rivera on Elm Street.", ["health"]),
        "birthday": remember(
            alice, "Sam's birthday is in June; Sam likes jazz records.", ["people"]
        ),
        "both": remember(
            alice, "Book the dentist before Sam's birthday party.", ["health", "people"]
        ),
        "bobs": remember(bob, "Bob's dentist is Dr. Who.", ["health"]),
    }


def texts(result: dict) -> list[str]:
    return [memory["text"] for memory in result["memories"]]


class TestSave:
    def test_saves_with_normalised_tags(self, ok, alice):
        result = ok("memory.save", {"text": "Prefers tea", "tags": ["Food", "food", "drinks"]})
        memory = Memory.objects.get(owner=alice)
        assert memory.tags == ["food", "drinks"]
        assert result["memory"] == {
            "id": memory.pk,
            "text": "Prefers tea",
            "tags": ["food", "drinks"],
            "typed_by_user": False,  # an agent saved it: outside content when found again
            "created_at": result["memory"]["created_at"],
        }

    def test_replay_saves_once(self, call):
        first = call("memory.save", {"text": "Prefers tea"}, tool_call_id="m1")
        assert call("memory.save", {"text": "Prefers tea"}, tool_call_id="m1").data == first.data
        assert Memory.objects.count() == 1


class TestSearch:
    def test_more_matching_words_rank_higher(self, ok, memories):
        result = ok("memory.search", {"query": "dentist birthday"})
        assert texts(result)[0] == memories["both"].text
        assert set(texts(result)[1:]) == {memories["dentist"].text, memories["birthday"].text}
        scores = [memory["score"] for memory in result["memories"]]
        assert scores == sorted(scores, reverse=True) and scores[0] > scores[1] > 0

    @pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL stems instead")
    def test_without_full_text_a_word_finds_longer_words(self, ok, memories):
        assert texts(ok("memory.search", {"query": "birth"})) == [
            memories["both"].text,
            memories["birthday"].text,
        ]

    def test_tags_are_searched_and_filter(self, ok, memories):
        assert set(texts(ok("memory.search", {"query": "people"}))) == {
            memories["birthday"].text,
            memories["both"].text,
        }
        assert texts(ok("memory.search", {"query": "dentist", "tag": "PEOPLE"})) == [
            memories["both"].text
        ]

    def test_limit(self, ok, memories):
        assert len(ok("memory.search", {"query": "dentist sam", "limit": 2})["memories"]) == 2

    def test_no_match(self, ok, memories):
        assert ok("memory.search", {"query": "volcano"})["memories"] == []

    def test_a_query_without_words(self, call, memories):
        assert (
            call("memory.search", {"query": "?!"}).error == "the query has no words to search for"
        )

    def test_replay_answers_as_the_first_time(self, call, memories, alice):
        first = call("memory.search", {"query": "jazz"}, tool_call_id="s1")
        Memory.objects.create(owner=alice, text="More jazz, saved since")
        again = call("memory.search", {"query": "jazz"}, tool_call_id="s1")
        assert again.replayed and again.data == first.data and len(again.data["memories"]) == 1

    def test_bob_finds_only_his_own(self, ok, memories, bob):
        assert texts(ok("memory.search", {"query": "dentist"}, user=bob)) == [memories["bobs"].text]


@pytest.mark.postgres
def test_postgres_full_text_ranks_by_relevance(ok, alice):
    """Stemming ("running" finds "runs"), stop words ignored, denser matches first."""
    texts_saved = [
        "Marathon training: long runs on Sunday, running shoes need replacing.",
        "Went running once in the park.",
        "The quarterly report is due on the first of the month.",
    ]
    for text in texts_saved:
        Memory.objects.create(owner=alice, text=text)
    result = ok("memory.search", {"query": "the running shoes"})
    assert texts(result) == texts_saved[:2]
    assert result["memories"][0]["score"] > result["memories"][1]["score"] > 0
