"""Skills whose effect lies outside the database, replayed after a crash (skills/journal.py).

A worker that dies between a handler's outside effect and the commit of its call leaves
the execution row `running`; the engine replays the call and the handler runs again on
that row. Here the crash is a test skill that runs the real handler, then raises a
BaseException (as SIGKILL would: nothing after it runs, the call's transaction rolls
back), and the replay is the same call again (same tool_call_id).
"""

from __future__ import annotations

import pytest
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend

from orchestration.models import SkillExecution
from skills import journal
from skills.base import Skill
from skills.domains.email.skills import email_send
from skills.domains.files import skills as files_skills
from skills.domains.files.skills import files_append
from skills.models import OutboxEmail
from skills.registry import get_skill

MESSAGE = {"to": ["sam@example.com"], "subject": "Minutes", "body": "Attached below."}


class WorkerDied(BaseException):
    """As SIGKILL would: nothing after it runs, not even the commit."""


@pytest.fixture
def root(workspace, alice):
    folder = workspace / str(alice.pk)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def crashing(register):
    """`crashing("files.append")`: a test skill (its name is returned) that runs that
    skill's handler and, the first time, dies right after it, before the call commits.
    `crashing.results` holds what the handler returned on each run."""
    results = []

    def crashing(name):
        real = get_skill(name)

        def handler(user, **arguments):
            results.append(real.handler(user, **arguments))
            if len(results) == 1:
                raise WorkerDied()
            return results[-1]

        twin = f"testing.{name.replace('.', '_')}"
        register(Skill(name=twin, description=f"{name}, then a crash.", parameters=real.parameters,
                       handler=handler))
        return twin

    crashing.results = results
    return crashing


@pytest.fixture
def writes(monkeypatch):
    """Every file replacement files.* makes (the real write, counted)."""
    done = []
    real = files_skills.write_atomic

    def write_atomic(target, data, *, shown):
        done.append(shown)
        real(target, data, shown=shown)

    monkeypatch.setattr(files_skills, "write_atomic", write_atomic)
    return done


def entries(journal_root):
    return sorted(journal_root.iterdir()) if journal_root.exists() else []


def crash(call, name, arguments):
    with pytest.raises(WorkerDied):
        call(name, arguments, tool_call_id="call_a")
    assert SkillExecution.objects.get(tool_call_id="call_a").status == "running"


class TestFiles:
    def test_an_append_replayed_after_a_crash_appends_once(
            self, call, crashing, root, writes, journal_root, django_capture_on_commit_callbacks):
        (root / "log.txt").write_text("a\n")
        name = crashing("files.append")
        crash(call, name, {"path": "log.txt", "content": "b\n"})
        assert (root / "log.txt").read_text() == "a\nb\n"

        with django_capture_on_commit_callbacks(execute=True):
            outcome = call(name, {"path": "log.txt", "content": "b\n"}, tool_call_id="call_a")
        assert entries(journal_root) == []  # the replay committed: its row answers from now on
        assert (outcome.ok, outcome.replayed) == (True, False)
        assert outcome.data == crashing.results[0] == {"path": "log.txt", "size_bytes": 4, "created": False}
        assert (root / "log.txt").read_text() == "a\nb\n" and writes == ["log.txt"]
        assert SkillExecution.objects.get(tool_call_id="call_a").status == "completed"

    def test_a_write_replayed_after_a_crash_writes_once_and_answers_as_the_first_run(
            self, call, crashing, root, writes):
        name = crashing("files.write")
        crash(call, name, {"path": "new.txt", "content": "hello"})

        outcome = call(name, {"path": "new.txt", "content": "hello"}, tool_call_id="call_a")
        assert outcome.data == {"path": "new.txt", "size_bytes": 5, "created": True}
        assert (root / "new.txt").read_text() == "hello" and writes == ["new.txt"]

    @pytest.mark.parametrize(("skill", "after_crash"), [("files.append", "a\nb\nc\n"), ("files.write", "theirs")])
    def test_a_file_changed_since_the_crash_is_not_written_again(self, call, crashing, root, skill, after_crash):
        (root / "log.txt").write_text("a\n")
        name = crashing(skill)
        crash(call, name, {"path": "log.txt", "content": "b\n"})
        (root / "log.txt").write_text(after_crash)  # someone else, before the replay

        outcome = call(name, {"path": "log.txt", "content": "b\n"}, tool_call_id="call_a")
        assert outcome.ok and outcome.data == crashing.results[0]
        assert (root / "log.txt").read_text() == after_crash

    def test_a_crash_before_the_file_was_replaced_writes_on_replay(self, call, root, monkeypatch, journal_root):
        """The intent was journaled, the file not replaced: the replay does the write."""
        (root / "log.txt").write_text("a\n")
        real = files_skills.write_atomic

        def dies(target, data, *, shown):
            monkeypatch.setattr(files_skills, "write_atomic", real)
            raise WorkerDied()

        monkeypatch.setattr(files_skills, "write_atomic", dies)
        crash(call, "files.append", {"path": "log.txt", "content": "b\n"})
        assert (root / "log.txt").read_text() == "a\n" and len(entries(journal_root)) == 1

        outcome = call("files.append", {"path": "log.txt", "content": "b\n"}, tool_call_id="call_a")
        assert outcome.data == {"path": "log.txt", "size_bytes": 4, "created": False}
        assert (root / "log.txt").read_text() == "a\nb\n"

    def test_without_a_call_the_handlers_write_every_time(self, alice, root, journal_root):
        files_append(alice, path="log.txt", content="b\n")
        files_append(alice, path="log.txt", content="b\n")
        assert (root / "log.txt").read_text() == "b\nb\n"
        assert entries(journal_root) == []

    def test_a_failed_write_leaves_no_entry(self, call, root, journal_root):
        (root / "folder").mkdir()
        assert call("files.write", {"path": "folder", "content": "x"}).error.startswith("cannot write 'folder': ")
        assert entries(journal_root) == []


class TestEmail:
    def test_a_send_replayed_after_a_crash_sends_once(
            self, call, crashing, alice, journal_root, django_capture_on_commit_callbacks):
        name = crashing("email.send")
        crash(call, name, MESSAGE)
        (sent,) = mail.outbox
        assert OutboxEmail.objects.count() == 0  # rolled back with the call

        with django_capture_on_commit_callbacks(execute=True):
            outcome = call(name, MESSAGE, tool_call_id="call_a")
        assert entries(journal_root) == []
        assert (outcome.ok, outcome.replayed) == (True, False)
        assert len(mail.outbox) == 1
        record = OutboxEmail.objects.get()
        assert record.message_id == sent.extra_headers["Message-ID"]
        assert (record.owner, record.to, record.subject, record.body) == (alice, *MESSAGE.values())
        first = crashing.results[0]
        assert outcome.data == {"email": {**first["email"], "id": record.pk}, "sent": True}

    def test_a_crash_during_the_send_sends_again_with_the_same_message_id(self, call, crashing, settings):
        """Before send() returns nothing is journaled: the replay sends again (at least
        once), and the mail carries the same Message-ID as the first."""
        settings.EMAIL_BACKEND = f"{__name__}.DiesAfterDelivering"
        with pytest.raises(WorkerDied):
            call("email.send", MESSAGE, tool_call_id="call_a")
        outcome = call("email.send", MESSAGE, tool_call_id="call_a")
        first, second = mail.outbox
        assert first.extra_headers["Message-ID"] == second.extra_headers["Message-ID"]
        assert outcome.data["email"]["message_id"] == OutboxEmail.objects.get().message_id == first.extra_headers["Message-ID"]

    def test_different_calls_get_different_message_ids(self, ok):
        ids = {ok("email.send", MESSAGE)["email"]["message_id"] for _ in range(2)}
        assert len(ids) == 2

    def test_without_a_call_the_handler_sends_every_time(self, alice, journal_root):
        email_send(alice, **MESSAGE)
        email_send(alice, **MESSAGE)
        assert len(mail.outbox) == 2 and OutboxEmail.objects.count() == 2
        assert len({message.extra_headers["Message-ID"] for message in mail.outbox}) == 2
        assert entries(journal_root) == []


class DiesAfterDelivering(EmailBackend):
    """Delivers, then the worker dies before send() returns: the first time in a test."""

    def send_messages(self, messages):
        sent = super().send_messages(messages)
        if len(mail.outbox) == 1:
            raise WorkerDied()
        return sent


class TestEntries:
    @pytest.mark.parametrize(("skill", "arguments"), [
        ("files.append", {"path": "log.txt", "content": "b\n"}),
        ("email.send", MESSAGE),
    ])
    def test_an_entry_is_removed_once_the_call_commits(
            self, call, root, journal_root, skill, arguments, django_capture_on_commit_callbacks):
        with django_capture_on_commit_callbacks(execute=True):
            assert call(skill, arguments).ok
            assert len(entries(journal_root)) == 1
        assert entries(journal_root) == []

    def test_an_entry_left_after_the_commit_does_nothing(self, call, root, journal_root):
        """The worker died after the commit, before removing the entry (here: a test
        transaction never commits). A finished call never runs its handler again, and
        other calls have their own keys."""
        first = call("files.append", {"path": "log.txt", "content": "b\n"}, tool_call_id="call_a")
        mailed = call("email.send", MESSAGE, tool_call_id="call_m")
        assert len(entries(journal_root)) == 2

        assert call("files.append", {"path": "log.txt", "content": "b\n"}, tool_call_id="call_a").replayed
        assert call("email.send", MESSAGE, tool_call_id="call_m").replayed
        assert (root / "log.txt").read_text() == "b\n" and len(mail.outbox) == 1

        second = call("files.append", {"path": "log.txt", "content": "b\n"}, tool_call_id="call_b")
        assert (first.data["size_bytes"], second.data["size_bytes"]) == (2, 4)
        assert call("email.send", MESSAGE, tool_call_id="call_n").ok and len(mail.outbox) == 2
        assert (root / "log.txt").read_text() == "b\nb\n" and OutboxEmail.objects.count() == 2
        assert len({email.message_id for email in OutboxEmail.objects.all()}) == 2

    def test_record_recall_forget(self, db, journal_root):
        assert journal.recall("a key") is None
        journal.record("a key", {"sent": ["<1@example.net>"]})
        assert journal.recall("a key") == {"sent": ["<1@example.net>"]}
        assert [path.suffix for path in journal_root.iterdir()] == [".json"]  # no temporary file left
        journal.forget("a key")
        journal.forget("a key")
        assert journal.recall("a key") is None and entries(journal_root) == []


def test_a_nested_append_replayed_after_a_crash_appends_once(call, register, root, writes):
    """A skill called from inside a handler: its row rolls back with the call around it,
    yet its replay finds its journal entry (its key is the outer call's and its own id)."""
    runs = []

    def notes(user):
        from skills.executor import execute_skill

        inner = execute_skill(name="files.append", arguments={"path": "log.txt", "content": "b\n"}, user=user,
                              tool_call_id="call_a/append")
        runs.append(inner.ok)
        if len(runs) == 1:
            raise WorkerDied()
        return {"appended": inner.ok}

    register(Skill(name="testing.notes", description="Append to the log.",
                   parameters={"type": "object", "properties": {}, "additionalProperties": False}, handler=notes))
    (root / "log.txt").write_text("a\n")
    with pytest.raises(WorkerDied):
        call("testing.notes", {}, tool_call_id="call_a", granted=["testing.notes", "files.append"])
    outcome = call("testing.notes", {}, tool_call_id="call_a", granted=["testing.notes", "files.append"])
    assert outcome.ok and outcome.data == {"appended": True}
    assert (root / "log.txt").read_text() == "a\nb\n"
    assert writes == ["log.txt"]
