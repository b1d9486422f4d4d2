"""Reads that run with every push of the live page or every step of a turn, compiled to
SQL once per process.

Building a queryset and compiling it is most of what a short read costs Django: on the
2-core bench machine the latest turn's read took 0.8 ms of CPU to build and compile and
0.17 ms to run. A busy turn's page runs a handful of such reads for each render of its
panels (assistant/live.py), and the orchestrator reads its history before each of its
calls (records/history.py). A `CompiledRead` builds its queryset once per database, with
placeholder ids, and keeps the SQL and the converters Django applies to the rows; a call
then only substitutes the ids and runs it, and its rows are what the queryset's would be.

Only ids (and other integers: a turn's number) vary: every other value is part of the
query's shape and fixed when it is built.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import DEFERRED, Model, QuerySet

# Values told apart from every constant a query holds, within the range of a 32-bit
# positive integer field: outside its column's range, Django compiles a lookup on it to
# "matches nothing" (or "everything") instead of a parameter.
_PLACEHOLDER = 2_000_000_000


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple
    slots: tuple[tuple[int, int, type], ...]  # (position in params, index of the id that goes there, its type)
    names: tuple[str, ...]  # the columns, in order
    converters: tuple[tuple[int, tuple[Callable, ...], object], ...]  # (column, its converters, its expression)


class CompiledRead:
    """`build(*ids)` → a `values()` or `values_list()` queryset, compiled on first use.

        latest = CompiledRead(lambda conversation_id: Turn.objects.filter(
            conversation_id=conversation_id).order_by("-number").values_list("id", "status")[:1])
        latest(7)  # [(41, "running")]

    The ids must reach the SQL as parameters (a filter's value does), each at least once;
    building checks it."""

    def __init__(self, build: Callable[..., QuerySet], *, arity: int = 1):
        self.build = build
        self.arity = arity
        self._compiled: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def __call__(self, *ids: int) -> list[tuple]:
        """The rows, as tuples in the order of `names`."""
        if len(ids) != self.arity:
            raise TypeError(f"expected {self.arity} ids, got {len(ids)}")
        connection = connections[DEFAULT_DB_ALIAS]
        compiled = self._compiled_for(connection)
        params = list(compiled.params)
        for position, index, kind in compiled.slots:
            params[position] = ids[index] if kind is int else kind(ids[index])
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        if compiled.converters:
            rows = [_converted(row, compiled.converters, connection) for row in rows]
        return rows

    def names(self) -> tuple[str, ...]:
        return self._compiled_for(connections[DEFAULT_DB_ALIAS]).names

    def dicts(self, *ids: int) -> list[dict]:
        """The rows as `values()` gives them."""
        names = self.names()
        return [dict(zip(names, row, strict=True)) for row in self(*ids)]

    def instances(self, model: type[Model], *ids: int) -> list[Model]:
        """The rows as `model` instances holding just the columns read (as `only()` gives
        them): the queryset's `values_list` must name attnames ("turn_id", not "turn")."""
        names = self.names()
        return [instance(model, names, row) for row in self(*ids)]

    def _compiled_for(self, connection) -> _Compiled:
        return self._compiled.get(connection.vendor) or self._compile(connection)

    def _compile(self, connection) -> _Compiled:
        with self._lock:
            if (compiled := self._compiled.get(connection.vendor)) is not None:
                return compiled
            placeholders = [_PLACEHOLDER + index for index in range(self.arity)]
            queryset = self.build(*placeholders).using(connection.alias)
            query = queryset.query
            compiler = query.get_compiler(connection.alias)
            sql, params = compiler.as_sql()
            # An int, or on PostgreSQL a subclass naming its SQL type (a PositiveIntegerField's
            # value is passed as psycopg's Int4), which the id passed in it then keeps.
            slots = tuple((position, value - _PLACEHOLDER, type(value)) for position, value in enumerate(params)
                          if isinstance(value, int) and not isinstance(value, bool)
                          and _PLACEHOLDER <= value < _PLACEHOLDER + self.arity)
            missing = set(range(self.arity)) - {index for _, index, _ in slots}
            if missing:
                raise ValueError(f"{self.build!r}: ids {sorted(missing)} are not parameters of its SQL")
            names = tuple(query.selected or (*query.extra_select, *query.values_select, *query.annotation_select))
            fields = [column[0] for column in compiler.select[:compiler.col_count]]
            if len(fields) != len(names):
                raise ValueError(f"{self.build!r}: {len(fields)} columns for {len(names)} names")
            converters = tuple((column, tuple(functions), expression)
                               for column, (functions, expression) in compiler.get_converters(fields).items())
            compiled = self._compiled[connection.vendor] = _Compiled(
                sql=sql, params=tuple(params), slots=slots, names=names, converters=converters)
            return compiled


def attnames(model: type[Model]) -> tuple[str, ...]:
    """Every column of `model`, for a `values_list` whose `instances` are whole rows."""
    return tuple(f.attname for f in model._meta.concrete_fields)


def instance(model: type[Model], names: tuple[str, ...], values: tuple) -> Model:
    """A `model` instance from `values` of the attnames `names` (the rest deferred), as
    Django loads a row of an `only()` queryset."""
    if len(values) != len(names):
        raise ValueError(f"{len(values)} values for {len(names)} names")
    in_field_order, columns = _layout(model, names)
    return model.from_db(DEFAULT_DB_ALIAS, in_field_order, [DEFERRED if column is None else values[column]
                                                            for column in columns])


@functools.cache
def _layout(model: type[Model], names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """`model`'s attnames, in its field order (as `from_db` takes a row), and for each the
    position of its value among `names` (None: not read, deferred). Once per read and model."""
    fields = model._meta.concrete_fields
    return tuple(f.attname for f in fields), tuple(names.index(f.attname) if f.attname in names else None for f in fields)


def _converted(row: tuple, converters, connection) -> tuple:
    """`row` with its values converted as Django's compiler converts them (its
    `apply_converters`, with this thread's connection)."""
    row = list(row)
    for column, functions, expression in converters:
        value = row[column]
        for function in functions:
            value = function(value, expression, connection)
        row[column] = value
    return tuple(row)
