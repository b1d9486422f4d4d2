"""memory.*: save facts for later and find them again, ranked by relevance."""

from __future__ import annotations

from skills.base import Domain, Skill, SkillError
from skills.domains import schema
from skills.domains.common import iso
from skills.domains.memory.models import TEXT_MAX, Memory
from skills.domains.memory.search import query_terms, ranked
from skills.quotas import rows_reserve

MAX_TAGS = 10


def memory_save(user, *, text: str, tags: list[str] = ()) -> dict:
    rows_reserve(user=user, domain="memory")
    memory = Memory.objects.create(
        owner=user, text=text, tags=list(dict.fromkeys(tag.lower() for tag in tags))
    )
    return {"memory": _data(memory)}


def memory_search(user, *, query: str, tag: str = "", limit: int = 10) -> dict:
    terms = query_terms(query)
    if not terms:
        raise SkillError("the query has no words to search for")
    memories = Memory.objects.filter(owner=user)
    if tag:
        # Tags are restricted to [a-z0-9_-], so their JSON text is the tag in quotes.
        memories = memories.filter(tags__icontains=f'"{tag.lower()}"')
    found = ranked(memories, terms, limit=limit)
    return {"memories": [_data(memory, score=memory.score) for memory in found]}


def _data(memory: Memory, *, score: float | None = None) -> dict:
    data = {
        "id": memory.pk,
        "text": memory.text,
        "tags": memory.tags,
        "typed_by_user": memory.typed_by_user,
        "created_at": iso(memory.created_at),
    }
    if score is not None:
        data["score"] = round(score, 4)
    return data


_TAG = {
    "type": "string",
    "description": "A tag: letters, digits, - and _.",
    "pattern": "^[A-Za-z0-9_-]+$",
    "maxLength": 40,
}

DOMAIN = Domain(
    name="memory",
    description="Long-term notes about the user: save facts and find them again by their words.",
    skills=(
        Skill(
            name="memory.save",
            description="Remember a fact or note for later, with optional tags.",
            parameters=schema.params(
                {
                    "text": schema.text("What to remember.", max_length=TEXT_MAX, min_length=1),
                    "tags": {
                        "type": "array",
                        "description": "Short labels such as 'health' or 'work'.",
                        "items": _TAG,
                        "maxItems": MAX_TAGS,
                    },
                },
                required=("text",),
            ),
            handler=memory_save,
            effect=lambda arguments, result: f"saved memory “{arguments['text'][:80]}”",
        ),
        Skill(
            name="memory.search",
            description="Find saved memories by words, best match first (each with a score).",
            parameters=schema.params(
                {
                    "query": schema.text("Words to look for.", max_length=500, min_length=1),
                    "tag": {**_TAG, "description": "Only memories with this tag."},
                    "limit": schema.integer(
                        "At most this many memories.", minimum=1, maximum=50, default=10
                    ),
                },
                required=("query",),
            ),
            handler=memory_search,
            read_only=True,
            outside=lambda arguments, result: [
                f"memory {memory['id']} (saved by an agent)" for memory in result.get("memories", [])
                if not memory.get("typed_by_user")],
        ),
    ),
)
