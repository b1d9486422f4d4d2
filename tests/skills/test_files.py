"""files.*: a private workspace per user, and every way out of it refused."""

from __future__ import annotations

import os
import re

import pytest

from skills.base import SkillError
from skills.domains.files.workspace import resolve


@pytest.fixture
def root(workspace, alice):
    """Alice's workspace folder (created by the first call)."""
    return workspace / str(alice.pk)


class TestWriteReadList:
    def test_write_then_read(self, ok, root):
        written = ok("files.write", {"path": "notes/today.md", "content": "# Today\nhéllo\n"})
        assert written == {"path": "notes/today.md", "size_bytes": 15, "created": True}
        assert (root / "notes" / "today.md").read_text() == "# Today\nhéllo\n"
        read = ok("files.read", {"path": "notes/today.md"})
        assert read == {
            "path": "notes/today.md",
            "size_bytes": 15,
            "content": "# Today\nhéllo\n",
            "offset": 0,
            "next_offset": None,
        }

    def test_overwrite_leaves_no_temporary_files(self, ok, root):
        ok("files.write", {"path": "a.txt", "content": "one"})
        assert ok("files.write", {"path": "a.txt", "content": "two"})["created"] is False
        assert os.listdir(root) == ["a.txt"] and (root / "a.txt").read_text() == "two"

    def test_append(self, ok, root):
        assert ok("files.append", {"path": "log.txt", "content": "a\n"})["created"] is True
        assert ok("files.append", {"path": "log.txt", "content": "b\n"}) == {
            "path": "log.txt",
            "size_bytes": 4,
            "created": False,
        }
        assert (root / "log.txt").read_text() == "a\nb\n"

    def test_read_in_pages(self, ok):
        ok("files.write", {"path": "long.txt", "content": "abcdefghij"})
        page = ok("files.read", {"path": "long.txt", "offset": 2, "max_chars": 5})
        assert (page["content"], page["next_offset"]) == ("cdefg", 7)
        assert ok("files.read", {"path": "long.txt", "offset": 7})["next_offset"] is None

    def test_list(self, ok, root):
        ok("files.write", {"path": "b.txt", "content": "12345"})
        ok("files.write", {"path": "a/inner.txt", "content": ""})
        os.symlink(root / "b.txt", root / "link")
        assert ok("files.list", {}) == {
            "path": ".",
            "entries": [
                {"name": "a", "type": "folder"},
                {"name": "b.txt", "type": "file", "size_bytes": 5},
                {"name": "link", "type": "link"},
            ],
            "total": 3,
        }
        assert ok("files.list", {"path": "a"})["entries"] == [
            {"name": "inner.txt", "type": "file", "size_bytes": 0}
        ]

    def test_an_empty_workspace(self, ok):
        assert ok("files.list", {}) == {"path": ".", "entries": [], "total": 0}

    @pytest.mark.parametrize(
        ("skill", "arguments", "error"),
        [
            ("files.read", {"path": "missing.txt"}, "file 'missing.txt' not found"),
            ("files.read", {"path": "folder"}, "'folder' is a directory, not a file"),
            ("files.read", {"path": "binary.bin"}, "'binary.bin' is not a UTF-8 text file"),
            ("files.list", {"path": "nowhere"}, "folder 'nowhere' not found"),
            ("files.list", {"path": "binary.bin"}, "folder 'binary.bin' is a file, not a folder"),
            ("files.write", {"path": "folder", "content": "x"}, "cannot write 'folder': "),
            (
                "files.write",
                {"path": "binary.bin/x", "content": "x"},
                "cannot write 'binary.bin/x': ",
            ),
            (
                "files.write",
                {"path": "dir/", "content": "x"},
                "path 'dir/' names a directory, not a file",
            ),
        ],
    )
    def test_what_cannot_be_done(self, call, root, skill, arguments, error):
        (root / "folder").mkdir(parents=True)
        (root / "binary.bin").write_bytes(b"\xff\xfe\x00")
        outcome = call(skill, arguments)
        assert outcome.error.startswith(error), outcome.error

    def test_replayed_reads_and_writes_answer_as_the_first_time(self, call, ok, root):
        calls = [
            ("files.write", {"path": "a.txt", "content": "one"}),
            ("files.list", {}),
            ("files.read", {"path": "a.txt"}),
        ]
        firsts = [call(skill, arguments, tool_call_id=skill) for skill, arguments in calls]
        ok("files.write", {"path": "a.txt", "content": "two, written since"})
        ok("files.write", {"path": "b.txt", "content": "new"})
        for (skill, arguments), first in zip(calls, firsts, strict=True):
            again = call(skill, arguments, tool_call_id=skill)
            assert again.replayed and again.data == first.data, skill
        assert (root / "a.txt").read_text() == "two, written since"

    def test_replayed_append_appends_once(self, call, root):
        call("files.append", {"path": "log.txt", "content": "once\n"}, tool_call_id="c1")
        again = call("files.append", {"path": "log.txt", "content": "once\n"}, tool_call_id="c1")
        assert again.replayed and (root / "log.txt").read_text() == "once\n"

    def test_users_have_separate_workspaces(self, ok, bob, workspace):
        ok("files.write", {"path": "secret.txt", "content": "alice's"})
        assert ok("files.list", {}, user=bob)["entries"] == []
        ok("files.write", {"path": "secret.txt", "content": "bob's"}, user=bob)
        assert (workspace / str(bob.pk) / "secret.txt").read_text() == "bob's"
        assert ok("files.read", {"path": "secret.txt"})["content"] == "alice's"


class TestSizeLimit:
    @pytest.fixture(autouse=True)
    def small_files(self, settings):
        settings.SKILLS_MAX_FILE_BYTES = 10

    def test_write_over_the_limit(self, call, root):
        outcome = call("files.write", {"path": "big.txt", "content": "x" * 11})
        assert outcome.error == "'big.txt' would be 11 bytes; the limit is 10 bytes"
        assert not (root / "big.txt").exists()

    def test_the_limit_counts_bytes_not_characters(self, call):
        assert "6 bytes" not in call("files.write", {"path": "a", "content": "ééééé"}).error
        assert "12 bytes" in call("files.write", {"path": "b", "content": "éééééé"}).error

    def test_append_past_the_limit(self, ok, call, root):
        ok("files.write", {"path": "log.txt", "content": "12345678"})
        outcome = call("files.append", {"path": "log.txt", "content": "abc"})
        assert outcome.error == "'log.txt' would be 11 bytes; the limit is 10 bytes"
        assert (root / "log.txt").read_text() == "12345678"

    def test_read_of_a_file_over_the_limit(self, call, ok, root):
        ok("files.list", {})
        (root / "huge.txt").write_text("y" * 11)
        assert call("files.read", {"path": "huge.txt"}).error == (
            "'huge.txt' would be 11 bytes; the limit is 10 bytes"
        )


HOSTILE = [
    ("../escape.txt", "'..' is not allowed in paths"),
    ("notes/../../escape.txt", "'..' is not allowed in paths"),
    ("notes/../inside.txt", "'..' is not allowed in paths"),
    ("..\\escape.txt", "'..' is not allowed in paths"),
    ("/etc/passwd", "absolute paths are not allowed"),
    ("\\\\server\\share", "absolute paths are not allowed"),
    ("C:/Windows/win.ini", "absolute paths are not allowed"),
    ("n" * 256 + ".txt", "a file or folder name is too long"),
    (("€" * 80 + "/") * 5 + "x", "the path is too long"),  # 405 characters, 1206 bytes
]
# Text no database can store is refused with the arguments, before any handler runs.
UNSTORABLE = [
    ("a\x00b.txt", "arguments: text must not contain NUL characters"),
    ("bad\udc80.txt", "arguments: text must be valid Unicode (no unpaired surrogates)"),
]


@pytest.mark.parametrize("skill", ["files.read", "files.write", "files.append", "files.list"])
@pytest.mark.parametrize(("path", "error"), HOSTILE, ids=[repr(p[:20]) for p, _ in HOSTILE])
def test_hostile_paths_are_refused(call, workspace, skill, path, error):
    arguments = (
        {"path": path} if skill in ("files.read", "files.list") else {"path": path, "content": "x"}
    )
    outcome = call(skill, arguments)
    assert (outcome.ok, outcome.error_kind) == (False, "failed")
    assert outcome.error.startswith(error), outcome.error
    assert not (workspace.parent / "escape.txt").exists()


@pytest.mark.parametrize(("path", "problem"), UNSTORABLE, ids=["NUL", "surrogate"])
def test_unstorable_paths_are_invalid_arguments(call, workspace, path, problem):
    outcome = call("files.write", {"path": path, "content": "x"})
    assert (outcome.error_kind, outcome.problems) == ("invalid_arguments", (problem,))
    assert not workspace.exists()


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("a\x00b", "paths must not contain NUL bytes"),
        ("a\nb", "paths must not contain control characters or line breaks (U+000A LINE FEED"),
        ("a\u2028b", "paths must not contain control characters or line breaks (U+2028 LINE SEPARATOR"),
        ("bad\udc80", "the path is not valid text"),
    ],
)
def test_the_workspace_checks_such_text_itself_too(alice, path, error):
    with pytest.raises(SkillError, match=re.escape(error)):
        resolve(alice, path)


class TestSymlinks:
    @pytest.fixture
    def outside(self, tmp_path):
        secret = tmp_path / "outside" / "secret.txt"
        secret.parent.mkdir()
        secret.write_text("not yours")
        return secret

    def test_a_link_to_a_file_outside_is_refused(self, call, ok, root, outside):
        ok("files.list", {})
        os.symlink(outside, root / "innocent.txt")
        for skill in ("files.read", "files.write", "files.append"):
            outcome = call(
                skill,
                {"path": "innocent.txt", "content": "gotcha"}
                if skill != "files.read"
                else {"path": "innocent.txt"},
            )
            assert outcome.error == "path 'innocent.txt' leads outside your workspace", skill
        assert outside.read_text() == "not yours"

    def test_a_link_to_a_folder_outside_is_refused(self, call, ok, root, outside):
        ok("files.list", {})
        os.symlink(outside.parent, root / "docs")
        assert (
            call("files.list", {"path": "docs"}).error == "path 'docs' leads outside your workspace"
        )
        assert call("files.read", {"path": "docs/secret.txt"}).error.endswith(
            "outside your workspace"
        )
        assert call("files.write", {"path": "docs/new.txt", "content": "x"}).error.endswith(
            "outside your workspace"
        )
        assert not (outside.parent / "new.txt").exists()

    def test_a_link_into_another_users_workspace_is_refused(self, call, ok, root, bob, workspace):
        ok("files.write", {"path": "bobs.txt", "content": "bob's"}, user=bob)
        ok("files.list", {})
        os.symlink(workspace / str(bob.pk), root / "bob")
        assert call("files.read", {"path": "bob/bobs.txt"}).error.endswith("outside your workspace")

    def test_a_dangling_link_pointing_outside_is_refused(self, call, ok, root, tmp_path):
        ok("files.list", {})
        os.symlink(tmp_path / "not-there-yet.txt", root / "later.txt")
        outcome = call("files.write", {"path": "later.txt", "content": "x"})
        assert outcome.error.endswith("outside your workspace")
        assert not (tmp_path / "not-there-yet.txt").exists()

    def test_a_loop_of_links_is_a_plain_refusal(self, call, ok, root, caplog):
        ok("files.list", {})
        os.symlink(root / "a", root / "b")
        os.symlink(root / "b", root / "a")
        for skill, arguments in [
            ("files.read", {"path": "a"}),
            ("files.read", {"path": "b/inside.txt"}),
            ("files.write", {"path": "a", "content": "x"}),
            ("files.append", {"path": "b", "content": "x"}),
            ("files.list", {"path": "a"}),
        ]:
            outcome = call(skill, arguments)
            assert outcome.error == f"path {arguments['path']!r} is a loop of links", skill
            assert str(root) not in outcome.as_tool_content()  # no server path for the model
        assert "failed unexpectedly" not in caplog.text

    def test_a_link_that_stays_inside_is_fine(self, ok, root):
        ok("files.write", {"path": "real.txt", "content": "hello"})
        os.symlink(root / "real.txt", root / "alias.txt")
        assert ok("files.read", {"path": "alias.txt"}) == {
            "path": "real.txt",
            "size_bytes": 5,
            "content": "hello",
            "offset": 0,
            "next_offset": None,
        }
