"""Times a skill stored as ISO text read as words where people see them: the side-effects
line under an answer and the offline answer (issue 28 item 8), in the zone the skill ran
in, not converted to the server's."""

from __future__ import annotations

from orchestration.llm.offline import _one_line
from skills.domains.common import when_words
from skills.registry import get_skill


def test_an_iso_time_reads_as_words_in_its_own_offset():
    assert when_words("2026-11-27T14:00:00+09:00") == "Fri 27 Nov 2026, 14:00"  # Tokyo's 2pm, not UTC's 5am
    assert when_words("2026-11-27") == "Fri 27 Nov 2026"
    assert when_words("tomorrow") == "tomorrow"


def test_the_side_effects_line_and_the_offline_answer_say_the_time_in_words():
    event = {"id": 3, "title": "Review", "start": "2026-11-27T14:00:00+09:00"}
    line = get_skill("calendar.create_event").effect_line({}, {"event": event})
    assert line == "created event “Review” for Fri 27 Nov 2026, 14:00"
    assert _one_line(event) == "Review (start: Fri 27 Nov 2026, 14:00)"
    assert _one_line({"title": "Pay rent", "due": "2026-11-30", "status": "open"}) == (
        "Pay rent (due: Mon 30 Nov 2026; status: open)")
