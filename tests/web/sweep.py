"""Helpers for the route sweeps: every URL pattern of the site, and a fingerprint of the data.

The routes come from the root resolver, so a route added later is swept by the access and
CSRF tests without anyone remembering to list it there. Filling a route's URL arguments is
the one thing that needs knowledge: an argument this module does not know fails the test
loudly (teach the caller's `ids` about it) instead of the route being skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from django.apps import apps
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern

from skills.models import EgressAllow, SkillRule

_ARGUMENT = re.compile(r"<(?:\w+:)?(\w+)>")
_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>[^()]*\)")

# Every row of these apps is compared before and after a sweep. auth and admin are in so that
# a password, a staff flag or an admin log entry cannot change unnoticed; sessions are not
# (logging in and out is what some routes are for).
WATCHED_APPS = ("assistant", "orchestration", "skills", "django_q", "auth", "admin")


@dataclass(frozen=True)
class Route:
    template: str  # the full route without the leading slash: "conversations/<int:conversation_id>/"
    name: str  # "conversation_detail", "admin:index", or the template for an unnamed route

    @property
    def arguments(self) -> tuple[str, ...]:
        return tuple(_ARGUMENT.findall(self.template))

    @property
    def is_admin(self) -> bool:
        return self.template.startswith("admin/")

    def url(self, ids: dict) -> str:
        """The path with each argument taken from `ids`; an unknown argument fails the test."""
        unknown = [name for name in self.arguments if name not in ids]
        if unknown:
            pytest.fail(
                f"route {self.name!r} ({self.template}) takes {', '.join(unknown)}, which the "
                "sweep does not know how to fill: teach it, so the route is checked too"
            )
        return "/" + _ARGUMENT.sub(lambda match: str(ids[match[1]]), self.template)

    def __str__(self) -> str:
        return self.name


def all_routes() -> list[Route]:
    """Every URL pattern reachable from ROOT_URLCONF, includes (the admin's too) flattened."""
    return list(_walk(get_resolver(), prefix="", namespace=""))


def _walk(resolver: URLResolver, *, prefix: str, namespace: str):
    for entry in resolver.url_patterns:
        template = prefix + _template(entry.pattern)
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _walk(entry, prefix=template, namespace=inner)
        else:
            assert isinstance(entry, URLPattern)
            yield Route(template=template, name=f"{namespace}{entry.name}" if entry.name else template)


def _template(pattern) -> str:
    """path() syntax for a route; a re_path() made of literal text and plain named groups
    (the admin's app index and catch-all) is rewritten into it, anything cleverer fails."""
    if isinstance(pattern, RoutePattern):
        return str(pattern)
    assert isinstance(pattern, RegexPattern), pattern
    template = _NAMED_GROUP.sub(r"<\1>", str(pattern)).removeprefix("^").removesuffix("$")
    if re.search(r"[\\()\[\]{}*+?|^$]", template.replace("<", "").replace(">", "")):
        raise AssertionError(f"the sweep cannot fill the regex route {str(pattern)!r}: teach sweep.py")
    return template


def approval_ids(user) -> dict[str, int]:
    """A rule and an allow-list entry of `user`'s: what the Approvals page's routes
    (rule_id, entry_id) revoke and remove."""
    rule = SkillRule.objects.create(owner=user, skill="email.send", policy="allow", recipient_domain="example.org")
    allowed = EgressAllow.objects.create(owner=user, entry="friend@example.org")
    return {"rule_id": rule.pk, "entry_id": allowed.pk}


def approval_ids_missing() -> dict[str, int]:
    """Ids no rule or allow-list entry has (past every row that exists)."""
    def past(model) -> int:
        return (model.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1000

    return {"rule_id": past(SkillRule), "entry_id": past(EgressAllow)}


def snapshot() -> dict[str, list[dict]]:
    """Every row (every field) of the watched apps' models, in primary-key order.

    Stronger than row counts: a turn that was paused and got resumed, or a pause that got
    answered, changes no count but shows here.
    """
    return {
        model._meta.label: list(model.objects.order_by("pk").values())
        for app in WATCHED_APPS
        for model in apps.get_app_config(app).get_models()
    }


def changes(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> list[str]:
    """The models whose rows differ, with the counts, for a readable assertion message."""
    return [
        f"{label}: {len(rows)} → {len(after[label])} rows"
        + ("" if len(rows) != len(after[label]) else " (edited)")
        for label, rows in before.items()
        if rows != after[label]
    ]
