"""Ranked memory search: PostgreSQL full-text search there, word matching elsewhere.

The search vector is computed per query rather than stored or indexed: a GIN index
would not migrate on SQLite, and one user's memories are few enough to scan.
"""

from __future__ import annotations

import operator
import re
from functools import reduce

from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db import connection
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

from skills.domains.memory.models import Memory

CONFIG = "english"
MAX_TERMS = 20
# Without full-text search, candidates are scored in Python: bound how many.
FALLBACK_CANDIDATES = 500
_WORD = re.compile(r"\w+")


def query_terms(query: str) -> list[str]:
    """The distinct words of `query`, lower-cased, at most MAX_TERMS of them."""
    words = [word.lower() for word in _WORD.findall(query)]
    return list(dict.fromkeys(words))[:MAX_TERMS]


def ranked(memories: QuerySet[Memory], terms: list[str], *, limit: int) -> list[Memory]:
    """Memories matching any term, best first, each with a `score` attribute."""
    if connection.vendor == "postgresql":
        return _postgres(memories, terms, limit=limit)
    return _word_match(memories, terms, limit=limit)


def _postgres(memories: QuerySet[Memory], terms: list[str], *, limit: int) -> list[Memory]:
    vector = SearchVector("text", weight="A", config=CONFIG) + SearchVector(
        Cast("tags", TextField()), weight="B", config=CONFIG
    )
    # Any term may match (OR), so that more matching words rank higher instead of a
    # single missing word hiding a memory.
    query = reduce(operator.or_, (SearchQuery(term, config=CONFIG) for term in terms))
    return list(
        memories.annotate(document=vector, score=SearchRank(vector, query))
        .filter(document=query)
        .order_by("-score", "-created_at", "-id")[:limit]
    )


def _word_match(memories: QuerySet[Memory], terms: list[str], *, limit: int) -> list[Memory]:
    """Score = share of the query's words that start a word of the memory ("dentist"
    finds "dentists"): a crude stemmer, enough for the embedded default."""
    matches_any = reduce(
        operator.or_, (Q(text__icontains=term) | Q(tags__icontains=term) for term in terms)
    )
    scored = []
    for memory in memories.filter(matches_any)[:FALLBACK_CANDIDATES]:
        words = {word.lower() for word in _WORD.findall(f"{memory.text} {' '.join(memory.tags)}")}
        hits = sum(1 for term in terms if any(word.startswith(term) for word in words))
        if hits:
            memory.score = hits / len(terms)
            scored.append(memory)
    # Stable sort: among equal scores the queryset's newest-first order stays.
    scored.sort(key=lambda memory: memory.score, reverse=True)
    return scored[:limit]
