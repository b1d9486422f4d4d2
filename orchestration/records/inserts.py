"""The INSERT of the rows nearly every step appends (events, the orchestrator's
messages, the model's answers) and of a wave's new agents, written out instead of built by `bulk_create`.

Building it was most of appending: Django compiles an expression per value (the
messages' numbering subquery) and, on PostgreSQL, passes a plain batch as UNNEST arrays
that psycopg escapes in Python. Three events cost 0.7 ms of a worker's CPU that way,
0.25 ms here. The values are still converted by their fields, so what is stored is what
the ORM would store; these rows are only ever inserted (no save(), no signals)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import models, transaction
from django.utils import timezone

# A value computed by the statement: (obj, its position in the statement) → (SQL, its params)
Computed = Callable[[models.Model, int], tuple[str, list]]


def insert(objs: Sequence[models.Model], names: Sequence[str], *, computed: dict[str, Computed] | None = None) -> None:
    """INSERT `objs` (of one model): the fields `names`, each as its field converts it,
    or as `computed` says (one parameter at most, so that a batch stays within the
    database's limit on them); auto_now_add fields take now. Each object gets its id,
    in as few statements as that limit allows, inside the caller's transaction."""
    if not objs:
        return
    model = type(objs[0])
    computed = computed or {}
    connection = transaction.get_connection()
    quote = connection.ops.quote_name
    fields = [model._meta.get_field(name) for name in names]
    # The names come from the model's metadata, quoted; every value is a parameter.
    columns = ", ".join(quote(field.column) for field in fields)
    head = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES "  # nosec B608
    returning = f" RETURNING {quote(model._meta.pk.column)}"
    now = timezone.now()
    size = connection.ops.bulk_batch_size(fields, objs)  # SQLite's limit on parameters
    for start in range(0, len(objs), size):
        batch = objs[start:start + size]
        rows, params = [], []
        for position, obj in enumerate(batch):
            values = []
            for field in fields:
                if field.name in computed:
                    sql, extra = computed[field.name](obj, position)
                    values.append(sql)
                    params += extra
                    continue
                if getattr(field, "auto_now_add", False):
                    setattr(obj, field.attname, now)
                values.append("%s")
                params.append(field.get_db_prep_save(getattr(obj, field.attname), connection))
            rows.append(f"({', '.join(values)})")
        with connection.cursor() as cursor:
            cursor.execute(head + ", ".join(rows) + returning, params)
            ids = cursor.fetchall()
        for obj, (pk,) in zip(batch, ids, strict=True):
            obj.pk = pk
            obj._state.adding, obj._state.db = False, connection.alias


LLM_CALL_FIELDS = ("turn", "dispatch", "key", "model", "response", "prompt_tokens", "completion_tokens",
                   "cached_tokens", "cost_usd", "duration_ms", "created_at")


def llm_call_record(call: models.Model) -> models.Model:
    """Store a model's answer (an LLMCall): its key is unique in its turn, so a step that
    another delivery stored first raises IntegrityError here, as `create` would."""
    insert([call], LLM_CALL_FIELDS)
    return call
