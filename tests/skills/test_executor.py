"""execute_skill: one row per call, idempotent replay, refusals, failures, timeouts, nesting."""

from __future__ import annotations

import json
import logging
import time

import pytest

from orchestration.models import SkillExecution
from skills.base import Skill, SkillError
from skills.executor import MAX_TOOL_CONTENT_CHARS, execute_skill
from skills.models import Task

NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}
TEXT_PARAM = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 50}},
    "required": ["text"],
    "additionalProperties": False,
}


def skill(name, handler, *, parameters=NO_PARAMS, **options):
    return Skill(
        name=name,
        description=f"Test skill {name}.",
        parameters=parameters,
        handler=handler,
        **options,
    )


@pytest.fixture
def runs():
    """Every handler run, in order, so a test can tell whether a handler ran again."""
    return []


@pytest.fixture
def echo(register, runs):
    def handler(user, *, text):
        runs.append(text)
        Task.objects.create(owner=user, title=text)
        return {"echo": text}

    register(skill("testing.echo", handler, parameters=TEXT_PARAM))


class TestCompletedCall:
    def test_result_and_row(self, call, echo, dispatch):
        outcome = call("testing.echo", {"text": "hi"}, tool_call_id="call_a")
        assert (outcome.ok, outcome.status, outcome.data) == (True, "completed", {"echo": "hi"})
        row = SkillExecution.objects.get(pk=outcome.execution_id)
        assert (row.dispatch, row.tool_call_id, row.skill) == (dispatch, "call_a", "testing.echo")
        assert (row.status, row.arguments, row.result) == (
            "completed",
            {"text": "hi"},
            {"echo": "hi"},
        )
        assert row.finished_at is not None and row.duration_ms == outcome.duration_ms
        assert json.loads(outcome.as_tool_content()) == {"ok": True, "result": {"echo": "hi"}}

    def test_replay_returns_the_stored_result_without_running_again(self, call, echo, runs):
        first = call("testing.echo", {"text": "hi"}, tool_call_id="call_a")
        again = call("testing.echo", {"text": "hi"}, tool_call_id="call_a")
        assert again.replayed and not first.replayed
        assert (again.execution_id, again.data) == (first.execution_id, first.data)
        assert runs == ["hi"]
        assert Task.objects.count() == SkillExecution.objects.count() == 1

    def test_another_tool_call_id_runs_again(self, call, echo, runs):
        call("testing.echo", {"text": "one"}, tool_call_id="call_a")
        call("testing.echo", {"text": "two"}, tool_call_id="call_b")
        assert runs == ["one", "two"]

    def test_a_running_row_left_behind_is_run_again(self, call, echo, dispatch, runs):
        stale = SkillExecution.objects.create(
            dispatch=dispatch, tool_call_id="call_a", skill="testing.echo", arguments={"text": "hi"},
            status="running",
        )
        outcome = call("testing.echo", {"text": "hi"}, tool_call_id="call_a")
        assert outcome.ok and not outcome.replayed and runs == ["hi"]
        assert outcome.execution_id == stale.pk
        assert SkillExecution.objects.get().status == "completed"


class TestReusedToolCallIds:
    """Some providers number tool calls per response (`call_0` every time). A stored
    execution answers only the same skill with the same arguments; any other call under
    a used id is a new call, and its own replays find it again."""

    def test_same_id_other_arguments_is_a_new_call(self, call, echo, runs):
        first = call("testing.echo", {"text": "one"}, tool_call_id="call_0")
        second = call("testing.echo", {"text": "two"}, tool_call_id="call_0")
        assert (first.replayed, second.replayed) == (False, False)
        assert runs == ["one", "two"] and Task.objects.count() == 2
        assert second.data == {"echo": "two"}
        again = call("testing.echo", {"text": "two"}, tool_call_id="call_0")
        assert (again.replayed, again.execution_id, runs) == (True, second.execution_id, ["one", "two"])

    def test_same_id_other_skill_is_a_new_call(self, call, echo, runs):
        call("testing.echo", {"text": "one"}, tool_call_id="call_0")
        other = call("tasks.create", {"title": "two"}, tool_call_id="call_0")
        assert other.ok and not other.replayed
        assert sorted(Task.objects.values_list("title", flat=True)) == ["one", "two"]
        keys = sorted(SkillExecution.objects.values_list("tool_call_id", flat=True))
        assert keys[0] == "call_0" and keys[1].startswith("call_0#")

    def test_same_id_same_call_is_a_replay(self, call, echo, runs):
        call("testing.echo", {"text": "one"}, tool_call_id="call_0")
        assert call("testing.echo", {"text": "one"}, tool_call_id="call_0").replayed
        assert runs == ["one"]

    def test_a_dead_run_of_the_second_call_resumes_on_its_own_row(self, call, register, dispatch):
        runs = []

        class WorkerDied(BaseException):
            pass

        def handler(user, *, text):
            runs.append(text)
            if len(runs) == 2:
                raise WorkerDied()
            return {"text": text}

        register(skill("testing.dies", handler, parameters=TEXT_PARAM))
        call("testing.dies", {"text": "one"}, tool_call_id="call_0")
        with pytest.raises(WorkerDied):
            call("testing.dies", {"text": "two"}, tool_call_id="call_0")
        outcome = call("testing.dies", {"text": "two"}, tool_call_id="call_0")
        assert (outcome.ok, outcome.replayed, outcome.data) == (True, False, {"text": "two"})
        assert runs == ["one", "two", "two"] and SkillExecution.objects.count() == 2


class TestRefusals:
    """Refused calls never reach a handler, and are recorded as failed rows."""

    def test_skill_outside_the_grant(self, call, echo, runs):
        outcome = call("tasks.create", {"title": "x"}, granted=["testing.echo", "tasks.search"])
        assert (outcome.ok, outcome.error_kind) == (False, "not_granted")
        assert "granted skills: tasks.search, testing.echo" in outcome.error
        assert not Task.objects.exists()
        row = SkillExecution.objects.get(pk=outcome.execution_id)
        assert (row.skill, row.status, row.result["error_kind"]) == (
            "tasks.create",
            "failed",
            "not_granted",
        )

    def test_unknown_skill_names_the_domain_skills(self, call):
        outcome = call("tasks.serch", {})
        assert outcome.error_kind == "unknown_skill"
        assert outcome.error == (
            "unknown skill 'tasks.serch'; tasks skills: "
            "tasks.complete, tasks.create, tasks.search, tasks.update"
        )

    def test_unknown_skill_name_that_is_not_even_a_string(self, call):
        outcome = call(["tasks.search"], {})
        assert outcome.error_kind == "unknown_skill" and "valid skills: calendar." in outcome.error
        assert SkillExecution.objects.get().skill == "['tasks.search']"

    def test_invalid_arguments(self, call, echo, runs):
        outcome = call("testing.echo", {"text": 5, "loud": True})
        assert outcome.error_kind == "invalid_arguments" and runs == []
        assert outcome.problems == (
            "unexpected field 'loud' (allowed: text)",
            "'text' must be a string",
        )
        content = json.loads(outcome.as_tool_content())
        assert content == {
            "ok": False,
            "error": "invalid arguments for testing.echo; correct them and call again",
            "kind": "invalid_arguments",
            "problems": list(outcome.problems),
        }

    def test_a_refusal_replays_as_refused(self, call, echo, runs):
        first = call("testing.echo", {}, tool_call_id="call_a")
        again = call("testing.echo", {}, tool_call_id="call_a")
        assert again.replayed and runs == []
        assert (again.error_kind, again.problems) == ("invalid_arguments", first.problems)
        # The corrected call under the same id is a new call, not the refusal replayed.
        corrected = call("testing.echo", {"text": "now valid"}, tool_call_id="call_a")
        assert corrected.ok and not corrected.replayed and runs == ["now valid"]

    @pytest.mark.parametrize("text", ["nul\x00", "surrogate\ud800"], ids=["NUL", "surrogate"])
    def test_text_no_database_can_hold_is_refused_and_recorded_escaped(self, call, text):
        outcome = call("tasks.create", {"title": text})
        assert outcome.error_kind == "invalid_arguments"
        assert SkillExecution.objects.get().arguments == {"unstorable": ascii({"title": text})}

    def test_an_unknown_name_no_database_can_hold_is_recorded_escaped(self, call):
        assert call("tasks.\x00\udc80", {}).error_kind == "unknown_skill"
        assert SkillExecution.objects.get().skill == "tasks.\\x00\\udc80"

    # 33: just past the cap; 900 and 5000: deep enough that walking them recursively (size,
    # text checks, a preview for the row) raised RecursionError and failed the whole agent
    @pytest.mark.parametrize("depth", [33, 900, 5000])
    def test_deeply_nested_arguments_are_refused_and_recorded(self, call, echo, runs, depth):
        value = "x"
        for _ in range(depth):
            value = [value]
        outcome = call("testing.echo", {"text": value})
        assert (outcome.error_kind, outcome.problems) == (
            "invalid_arguments", ("arguments nest more than 32 levels deep",),
        )
        assert runs == []
        assert SkillExecution.objects.get().arguments == {"unstorable": "nested more than 32 levels deep"}

    def test_oversized_arguments_are_stored_as_a_preview(self, call, echo, settings):
        settings.SKILLS_MAX_ARGUMENT_BYTES = 100
        outcome = call("testing.echo", {"text": "x" * 5000})
        assert outcome.problems == ("arguments are 5011 bytes of JSON; the limit is 100",)
        stored = SkillExecution.objects.get().arguments
        assert stored["oversized_bytes"] == 5011 and len(stored["preview"]) == 2000


class TestFailures:
    def test_skill_error_is_a_readable_failure(self, call, register):
        def handler(user):
            Task.objects.create(owner=user, title="half done")
            raise SkillError("task 12 not found")

        register(skill("testing.refuses", handler))
        outcome = call("testing.refuses", {})
        assert (outcome.status, outcome.error_kind, outcome.error) == (
            "failed",
            "failed",
            "task 12 not found",
        )
        assert not outcome.retryable
        assert not Task.objects.exists()  # the handler's writes were rolled back
        assert SkillExecution.objects.get().error == "task 12 not found"

    def test_transient_skill_error_is_retryable(self, call, register):
        def handler(user):
            raise SkillError("mail server down", permanent=False)

        register(skill("testing.flaky", handler))
        outcome = call("testing.flaky", {})
        assert outcome.retryable
        assert json.loads(outcome.as_tool_content())["retryable"] is True

    def test_unexpected_exception_is_logged_and_answered(self, call, register, caplog):
        def handler(user):
            raise RuntimeError("boom")

        register(skill("testing.broken", handler))
        with caplog.at_level(logging.ERROR, logger="skills.executor"):
            outcome = call("testing.broken", {})
        assert outcome.error == "testing.broken failed unexpectedly: RuntimeError: boom"
        assert "Traceback" in caplog.text or caplog.records[0].exc_info

    @pytest.mark.parametrize("result", [["a list"], {"when": time}])
    def test_a_result_that_is_not_a_json_object_fails(self, call, register, result):
        def handler(user):
            Task.objects.create(owner=user, title="written")
            return result

        register(skill("testing.bad_result", handler))
        outcome = call("testing.bad_result", {})
        assert outcome.status == "failed" and "unexpectedly" in outcome.error
        assert not Task.objects.exists()


class TestTimeout:
    @pytest.fixture
    def sleeper(self, register):
        def handler(user, *, text):
            Task.objects.create(owner=user, title=text)
            time.sleep(5)
            return {"woke": True}

        def stubborn(user):
            try:
                time.sleep(5)
            except Exception:  # noqa: BLE001 - the point: it must not help
                return {"swallowed": True}

        register(
            skill("testing.sleeper", handler, parameters=TEXT_PARAM, timeout=0.1),
            skill("testing.stubborn", stubborn, timeout=0.1),
        )

    def test_timeout_leaves_nothing_half_written(self, call, sleeper):
        started = time.monotonic()
        outcome = call("testing.sleeper", {"text": "half"})
        assert time.monotonic() - started < 2
        assert (outcome.status, outcome.error_kind, outcome.retryable) == (
            "timeout",
            "timeout",
            True,
        )
        assert outcome.error == "testing.sleeper did not finish within 0.1 s"
        assert not Task.objects.exists()
        row = SkillExecution.objects.get()
        assert (row.status, row.error) == ("timeout", outcome.error)

    def test_a_handler_cannot_swallow_its_timeout(self, call, sleeper):
        assert call("testing.stubborn", {}).status == "timeout"

    def test_default_timeout_comes_from_the_limits(self, register, settings):
        settings.ASSISTANT_LIMITS = {**settings.ASSISTANT_LIMITS, "skill_timeout_seconds": 7.5}
        assert skill("testing.x", lambda user: {}).effective_timeout == 7.5


class TestBeforeRun:
    def test_runs_once_with_the_row_in_place(self, call, echo, dispatch):
        seen = []

        def before_run(name, arguments):
            seen.append((name, arguments, SkillExecution.objects.get(dispatch=dispatch).status))

        call("testing.echo", {"text": "hi"}, tool_call_id="call_a", before_run=before_run)
        call("testing.echo", {"text": "hi"}, tool_call_id="call_a", before_run=before_run)
        assert seen == [("testing.echo", {"text": "hi"}, "running")]

    def test_its_exception_propagates_and_leaves_no_row(self, call, echo, runs):
        class LimitReached(Exception):
            pass

        def before_run(name, arguments):
            raise LimitReached("turn_max_skill_calls")

        with pytest.raises(LimitReached):
            call("testing.echo", {"text": "hi"}, before_run=before_run)
        assert runs == [] and not SkillExecution.objects.exists()

    def test_not_called_for_refused_calls(self, call, echo):
        called = []
        call("testing.echo", {}, before_run=lambda *_: called.append(1))
        assert called == []

    def test_not_called_again_when_a_dead_run_is_replayed(self, call, register, dispatch):
        """The running row commits with what `before_run` reserved, before the handler
        runs. A worker that dies in the handler leaves that row: the replay runs the
        handler on it and does not reserve a second time."""
        reserved, runs = [], []

        class WorkerDied(BaseException):  # as SIGKILL would: nothing after it runs
            pass

        def handler(user):
            runs.append(len(runs) + 1)
            if len(runs) == 1:
                raise WorkerDied()
            return {"run": len(runs)}

        register(skill("testing.dies_once", handler))
        with pytest.raises(WorkerDied):
            call("testing.dies_once", {}, tool_call_id="call_a", before_run=lambda *_: reserved.append("first"))
        assert SkillExecution.objects.get().status == "running" and reserved == ["first"]
        outcome = call("testing.dies_once", {}, tool_call_id="call_a", before_run=lambda *_: reserved.append("again"))
        assert (outcome.ok, outcome.replayed, outcome.data) == (True, False, {"run": 2})
        assert reserved == ["first"] and SkillExecution.objects.get().status == "completed"


def test_a_call_made_inside_a_handler_is_its_child(call, register, dispatch, alice):
    def outer(user):
        inner = execute_skill(
            name="testing.leaf",
            arguments={},
            user=user,
            tool_call_id="call_a/1",
            scope={"dispatch": dispatch},
        )
        return {"inner": inner.data}

    register(skill("testing.outer", outer), skill("testing.leaf", lambda user: {"leaf": True}))
    outcome = call("testing.outer", {}, tool_call_id="call_a")
    assert outcome.data == {"inner": {"leaf": True}}
    parent = SkillExecution.objects.get(tool_call_id="call_a")
    child = SkillExecution.objects.get(tool_call_id="call_a/1")
    assert child.parent == parent and parent.parent is None
    # Outside any handler there is no implicit parent.
    assert SkillExecution.objects.get(pk=call("testing.leaf", {}).execution_id).parent is None


class TestNestedCalls:
    """A skill called from inside a handler inherits the running call's grant and its
    before_run / after_run: the engine's budgets count it like any call."""

    @pytest.fixture
    def outer(self, register):
        def handler(user):
            inner = execute_skill(name="testing.leaf", arguments={}, user=user, tool_call_id="call_a/1")
            return {"inner_ok": inner.ok, "inner_error": inner.error}

        register(skill("testing.outer", handler), skill("testing.leaf", lambda user: {"leaf": True}))

    def test_inherits_the_scope_and_the_hooks(self, call, outer, dispatch):
        seen = []
        outcome = call("testing.outer", {}, tool_call_id="call_a", granted=["testing.outer", "testing.leaf"],
                       before_run=lambda name, arguments: seen.append(("before", name)),
                       after_run=lambda name, outcome: seen.append(("after", name, outcome.ok)))
        assert outcome.data == {"inner_ok": True, "inner_error": ""}
        assert seen == [("before", "testing.outer"), ("before", "testing.leaf"), ("after", "testing.leaf", True),
                        ("after", "testing.outer", True)]
        child = SkillExecution.objects.get(tool_call_id="call_a/1")
        assert child.dispatch == dispatch and child.parent.tool_call_id == "call_a"

    def test_inherits_the_outside_content_that_had_reached_the_caller(self, call, register):
        """What rows a nested call writes were written from (skills/provenance.py)."""
        from skills.context import current_outside

        def outer(user):
            inner = execute_skill(name="testing.leaf", arguments={}, user=user, tool_call_id="call_a/1",
                                  outside=["email 3"])
            return {"outer": list(current_outside()), "inner": inner.data["leaf"]}

        register(skill("testing.outer", outer), skill("testing.leaf", lambda user: {"leaf": list(current_outside())}))
        outcome = call("testing.outer", {}, tool_call_id="call_a", outside=["file notes.txt"])
        assert outcome.data == {"outer": ["file notes.txt"], "inner": ["file notes.txt", "email 3"]}
        assert call("testing.leaf", {}).data == {"leaf": []}  # nothing had reached this caller

    def test_cannot_use_a_skill_outside_the_callers_grant(self, call, outer):
        outcome = call("testing.outer", {}, tool_call_id="call_a", granted=["testing.outer"])
        assert outcome.data["inner_ok"] is False and "not granted" in outcome.data["inner_error"]
        child = SkillExecution.objects.get(tool_call_id="call_a/1")
        assert (child.status, child.result["error_kind"]) == ("failed", "not_granted")

    def test_a_refused_reservation_propagates_through_the_handler(self, call, register, runs):
        class BudgetSpent(Exception):
            pass

        def swallowing(user):
            try:
                execute_skill(name="testing.echo", arguments={"text": "inner"}, user=user, tool_call_id="x/1")
            except BudgetSpent:
                pass  # a handler cannot hide a spent budget from the engine
            return {"done": True}

        def echo(user, *, text):
            runs.append(text)
            return {"echo": text}

        register(skill("testing.swallowing", swallowing), skill("testing.echo", echo, parameters=TEXT_PARAM))

        def before_run(name, arguments):
            if name == "testing.echo":
                raise BudgetSpent(name)

        with pytest.raises(BudgetSpent):
            call("testing.swallowing", {}, tool_call_id="x", before_run=before_run)
        assert runs == []
        # The outer call stays open with its reservation: it runs again once allowed.
        assert list(SkillExecution.objects.values_list("tool_call_id", "status")) == [("x", "running")]
        outcome = call("testing.swallowing", {}, tool_call_id="x", before_run=lambda *_: None)
        assert outcome.ok and runs == ["inner"]


def test_tool_content_is_bounded_and_still_json(call, register):
    register(skill("testing.big", lambda user: {"blob": '"' * (3 * MAX_TOOL_CONTENT_CHARS)}))
    content = call("testing.big", {}).as_tool_content()
    assert len(content) <= MAX_TOOL_CONTENT_CHARS
    parsed = json.loads(content)
    assert parsed["ok"] is True and parsed["truncated"] is True
    assert parsed["partial"].startswith('{"ok":true,"result":{"blob":"\\"')
