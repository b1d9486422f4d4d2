"""The answer stored as the chat message is bounded (issue 18); the model's whole answer
stays in the turn's stored LLM call. Through the real SDK, streamed as by default."""

from __future__ import annotations

import pytest

from orchestration.models import LLMCall
from tests.support.llm_server import text

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_huge_answer_is_stored_bounded_with_a_note_and_whole_in_the_llm_call(llm, run_turn, settings):
    settings.ASSISTANT_OUTPUT_LIMITS = {**settings.ASSISTANT_OUTPUT_LIMITS, "answer_chars": 1_000}
    huge = "All of it. " * 2_000  # 22,000 characters
    llm.respond = lambda request: text(huge)
    turn = run_turn()
    assert turn.status == "completed"
    answer = turn.messages.get(role="assistant").content
    assert len(answer) <= 1_000 and huge.startswith(answer.split("\n\n")[0])
    assert answer.endswith(f"…(truncated, {len(huge) - len(answer.split(chr(10) * 2)[0]):,} characters)")
    assert LLMCall.objects.get(turn=turn).response["content"] == huge


def test_an_answer_within_the_cap_is_stored_as_it_came(llm, run_turn):
    llm.respond = lambda request: text("Short and sweet.")
    assert run_turn().messages.get(role="assistant").content == "Short and sweet."
