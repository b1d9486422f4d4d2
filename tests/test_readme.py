"""README.md and docs/*.md link only to what the repository holds: a relative link must
name a file or folder in it (the contracts once pointed at `../shared/DESIGN.md`, which
a clone does not have); web addresses are left alone."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR).resolve()
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Inline links and images `[text](target "title")`, reference definitions `[name]: target`,
# autolinks `<scheme:...>`, and HTML `href` / `src` attributes.
LINK_PATTERNS = [
    re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"),
    re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M),
    re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", re.I),
    re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""", re.I),
]
WEB_SCHEMES = {"http", "https", "mailto"}


def links(document: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)  # code blocks hold commands, not links
    return [match.group(1) for pattern in LINK_PATTERNS for match in pattern.finditer(text)]


def outside_the_repository(document: Path, target: str) -> str | None:
    """Why `target`, linked from `document`, is not something in the repository; None if it is."""
    parts = urlsplit(target)
    if parts.scheme in WEB_SCHEMES:
        return None
    if parts.scheme or parts.netloc:
        return f"{parts.scheme or 'network'} link"
    if not parts.path:
        return None  # an anchor in the same document
    path = (document.parent / unquote(parts.path)).resolve()
    if not path.is_relative_to(ROOT):
        return "outside the repository"
    if not path.exists():
        return "no such file in the repository"
    return None


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_link_stays_in_the_repository(document: Path):
    wrong = {target: why for target in links(document) if (why := outside_the_repository(document, target))}
    assert wrong == {}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_no_path_names_a_folder_beside_the_repository(document: Path):
    """A path in backquotes is no link, but a reader follows it the same way."""
    assert not re.findall(r"\.\./shared|DESIGN\.md", document.read_text())


def test_the_contracts_are_linked_from_the_readme():
    assert "(docs/design.md)" in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "design.md").is_file()


@pytest.mark.parametrize("target, why", [
    ("../shared/DESIGN.md", "outside the repository"),
    ("docs/missing.md", "no such file in the repository"),
    ("/etc/passwd", "outside the repository"),
    ("file:///etc/passwd", "file link"),
    ("docs/design.md#5-limits-and-continue", None),
    ("#two-commands", None),
    ("https://example.com/", None),
])
def test_what_counts_as_outside(target, why):
    assert outside_the_repository(ROOT / "README.md", target) == why


def test_links_are_found_in_each_form(tmp_path):
    document = tmp_path / "x.md"
    document.write_text('[a](one.md) ![b](two.png "t")\n[ref]: three.md\n<https://four/>\n'
                        '<a href="five.md">5</a>\n```sh\n[not](a-link.md)\n```\n')
    assert sorted(links(document)) == ["five.md", "https://four/", "one.md", "three.md", "two.png"]
