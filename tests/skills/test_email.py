"""email.*: sent through Django's mail backend with a stored Message-ID; searchable."""

from __future__ import annotations

import socketserver
import threading

import pytest
from django.core import mail

from skills.models import OutboxEmail, SkillCircuit

MESSAGE = {
    "to": ["sam@example.com", "kim@example.org"],
    "subject": "Lunch on Friday?",
    "body": "Shall we try the new place?",
}


@pytest.fixture
def sent(alice, bob):
    def email(owner, subject, to, body="..."):
        return OutboxEmail.objects.create(
            owner=owner, to=to, subject=subject, body=body, message_id=f"<{subject}@localhost>"
        )

    return [
        email(alice, "Quarterly report", ["finance@example.com"], "Numbers attached."),
        email(alice, "Lunch", ["sam@example.com"], "Friday at noon?"),
        email(bob, "Bob's report", ["finance@example.com"]),
    ]


class TestSend:
    def test_sends_and_records_with_a_stable_message_id(self, ok, alice, settings):
        settings.DEFAULT_FROM_EMAIL = "Assistant <assistant@mail.example.net>"
        result = ok("email.send", MESSAGE)
        (message,) = mail.outbox
        record = OutboxEmail.objects.get(owner=alice)
        assert message.extra_headers["Message-ID"] == record.message_id
        assert message.message()["Message-ID"] == record.message_id
        assert record.message_id.endswith("@mail.example.net>")
        assert (message.to, message.subject, message.body) == (
            MESSAGE["to"],
            MESSAGE["subject"],
            MESSAGE["body"],
        )
        assert message.from_email == settings.DEFAULT_FROM_EMAIL
        assert message.reply_to == ["alice@example.com"]
        assert result["sent"] is True and result["email"]["message_id"] == record.message_id

    def test_replay_sends_once(self, call):
        first = call("email.send", MESSAGE, tool_call_id="call_mail")
        again = call("email.send", MESSAGE, tool_call_id="call_mail")
        assert again.replayed and again.data == first.data
        assert len(mail.outbox) == 1 and OutboxEmail.objects.count() == 1

    def test_a_failing_mail_server_is_a_retryable_error_and_records_nothing(self, call, settings):
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
        outcome = call("email.send", MESSAGE)
        assert (outcome.ok, outcome.retryable) == (False, True)
        assert outcome.error.startswith("the mail server failed: ")
        assert not OutboxEmail.objects.exists()

    @pytest.mark.parametrize(
        ("change", "problem"),
        [
            (
                {"to": ["sam@example.com", "not an address"]},
                "'to[1]' must be a valid email address",
            ),
            ({"to": [f"p{i}@example.com" for i in range(21)]}, "'to' must have at most 20 items"),
            ({"subject": "Hi\r\nBcc: everyone@example.com"}, "'subject' must be one line"),
        ],
        ids=["bad address", "too many", "header injection"],
    )
    def test_bad_recipients_and_subjects(self, call, change, problem):
        outcome = call("email.send", {**MESSAGE, **change})
        assert any(p.startswith(problem) for p in outcome.problems), outcome.problems
        assert mail.outbox == []


class TestSearchSent:
    def test_by_text_in_subject_or_body(self, ok, sent):
        assert [e["subject"] for e in ok("email.search_sent", {"text": "report"})["emails"]] == [
            "Quarterly report"
        ]
        assert [e["subject"] for e in ok("email.search_sent", {"text": "noon"})["emails"]] == [
            "Lunch"
        ]

    def test_by_recipient(self, ok, sent):
        result = ok("email.search_sent", {"recipient": "SAM@"})
        assert [e["subject"] for e in result["emails"]] == ["Lunch"]
        assert result["emails"][0]["body_preview"] == "Friday at noon?"

    def test_newest_first_and_limited(self, ok, sent):
        result = ok("email.search_sent", {"limit": 1})
        assert [e["subject"] for e in result["emails"]] == ["Lunch"] and result["total"] == 2

    def test_replay_answers_as_the_first_time(self, call, ok, sent):
        first = call("email.search_sent", {}, tool_call_id="s1")
        ok("email.send", {"to": ["sam@example.com"], "subject": "Sent since", "body": "x"})
        again = call("email.search_sent", {}, tool_call_id="s1")
        assert again.replayed and again.data == first.data and again.data["total"] == 2

    def test_bob_sees_only_his_own(self, ok, sent, bob):
        result = ok("email.search_sent", {"recipient": "finance"}, user=bob)
        assert [e["subject"] for e in result["emails"]] == ["Bob's report"]


class FakeSMTP(socketserver.StreamRequestHandler):
    """Just enough SMTP to send a message: it refuses recipients at refused.example for
    good (550) and those at later.example for now (450), and accepts the rest."""

    def handle(self):
        self.wfile.write(b"220 fake ESMTP\r\n")
        while line := self.rfile.readline():
            verb = line[:4].upper()
            if verb == b"DATA":
                self.wfile.write(b"354 go ahead\r\n")
                while self.rfile.readline() not in (b".\r\n", b""):
                    pass
                self.server.received += 1
                reply = b"250 queued"
            elif verb == b"RCPT":
                reply = (b"550 no such user" if b"@refused.example" in line
                         else b"450 try later" if b"@later.example" in line else b"250 ok")
            elif verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                reply = b"250 ok"
            self.wfile.write(reply + b"\r\n")


@pytest.fixture
def smtp(settings):
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), FakeSMTP)
    server.daemon_threads = True
    server.received = 0
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", server.server_address[1], 5
    yield server
    server.shutdown()
    server.server_close()


class TestRefusals:
    """What the caller sent, refused by the mail server or by the mail format, is a
    permanent SkillError: it opens no circuit breaker, for the sender or anyone else."""

    def test_a_recipient_refused_for_good_is_the_callers_mistake(self, call, smtp, alice, bob, settings):
        settings.SKILLS_BREAKER_THRESHOLD = 2
        for _ in range(5):
            outcome = call("email.send", {**MESSAGE, "to": ["nobody@refused.example"]}, user=alice)
            assert (outcome.error_kind, outcome.retryable) == ("failed", False)
            assert outcome.error == "the mail server refused the recipients: nobody@refused.example"
        assert not SkillCircuit.objects.exists() and not OutboxEmail.objects.exists()

        assert call("email.send", {**MESSAGE, "to": ["sam@example.com"]}, user=alice).ok
        assert call("email.send", MESSAGE, user=bob).ok
        assert smtp.received == 2

    def test_a_recipient_refused_for_now_may_be_retried(self, call, smtp):
        outcome = call("email.send", {**MESSAGE, "to": ["kim@later.example"]})
        assert (outcome.error_kind, outcome.retryable) == ("failed", True)

    def test_a_mail_server_down_opens_the_senders_circuit_only(self, call, alice, bob, settings):
        settings.SKILLS_BREAKER_THRESHOLD = 2
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
        for _ in range(2):
            assert call("email.send", MESSAGE, user=alice).retryable
        assert call("email.send", MESSAGE, user=alice).error_kind == "unavailable"
        assert call("email.send", MESSAGE, user=bob).error.startswith("the mail server failed: ")

    @pytest.mark.parametrize("address", ['"a\\"b c"@example.com', '"a\\\\b"@example.com', "é@example.com"])
    def test_addresses_the_validator_allows_are_sent_or_refused_plainly(self, call, smtp, caplog, address):
        outcome = call("email.send", {**MESSAGE, "to": [address]})
        assert outcome.ok or outcome.error_kind in ("invalid_arguments", "failed"), outcome
        assert "unexpectedly" not in outcome.error
        assert not SkillCircuit.objects.exists()
