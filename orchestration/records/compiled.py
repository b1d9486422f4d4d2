"""Statements that run with every push of the live page or every step of a turn,
compiled to SQL once per process.

Building a queryset and compiling it is most of what a short statement costs Django: on
the 2-core bench machine the latest turn's read took 0.8 ms of CPU to build and compile
and 0.17 ms to run, and locking a turn's row (with its conversation) 1.2 ms against 0.3
for its SQL. A busy turn's page runs a handful of such reads for each render of its
panels (assistant/live.py); each step of a turn runs a few reads, locks and conditional
UPDATEs (engine/, lifecycle/). A compiled statement builds its queryset once per
database, with a `Param` where each call's value goes, and keeps the SQL, where each
value goes in it and how it is prepared there (as the field it is compared with or
stored in prepares it), and for a read the converters Django applies to the rows. A
call then only puts the values in and runs it: its rows, or the rows it changed, are
the queryset's.

    latest = CompiledRead(lambda conversation_id: Turn.objects.filter(
        conversation_id=conversation_id).order_by("-number").values_list("id", "status")[:1])
    latest(7)  # [(41, "running")]

    release = CompiledUpdate(lambda p: (Turn.objects.filter(pk=p.turn_id, lease_token=p.token),
                                        {"lease_token": "", "lease_expires_at": None}))
    release(turn_id=41, token="...")  # 1: the rows it changed

Only the values vary: the statement's shape (which filters, which columns, how many
values an `__in` takes) is fixed when it is built, so a caller whose shape varies keeps
one statement per shape (lifecycle/dispatches.py `transition`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import DEFERRED, Field, Model, QuerySet
from django.db.models.expressions import BaseExpression, Col, CombinedExpression, Expression
from django.db.models.lookups import Lookup
from django.db.models.sql import Query, UpdateQuery
from django.db.models.sql.where import WhereNode
from django.db.transaction import TransactionManagementError


class Param(Expression):
    """A value each run of a compiled statement is given: `%s` in its SQL. `key` names
    it (a position for CompiledRead's ids, a keyword for CompiledUpdate's values). It
    is prepared as the column it is compared with or stored in prepares a value, else
    as `output_field` does (a value inside a CASE), else passed as it is (a number
    added to a counter)."""

    def __init__(self, key: int | str, output_field: Field | None = None):
        super().__init__(output_field=output_field)
        self.key = key

    def resolve_expression(self, *args, **kwargs):
        return self  # one object wherever it went, so the compiled SQL's parameters can be found

    def as_sql(self, compiler, connection):
        return "%s", [self]

    def get_group_by_cols(self):
        return []

    def __repr__(self) -> str:
        return f"Param({self.key!r})"


class Params:
    """`p.name` (or `p["name"]`) is the Param of that name: how a CompiledUpdate's build
    asks for its values."""

    def __getattr__(self, name: str) -> Param:
        if name.startswith("__"):
            raise AttributeError(name)
        return Param(name)

    def __getitem__(self, name: str) -> Param:
        return Param(name)


Prepare = Callable[[object, object], object]  # (value, connection) → the parameter passed


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple
    slots: tuple[tuple[int, int | str, Prepare | None], ...]  # (position in params, the value's key, its preparation)
    names: tuple[str, ...] = ()  # a read's columns, in order
    locks: bool = False  # a read that locks its rows (select_for_update): only inside a transaction
    converters: tuple[tuple[int, tuple[Callable, ...], object], ...] = ()  # (column, its converters, its expression)

    def bound(self, values: dict, connection) -> list:
        params = list(self.params)
        for position, key, prepare in self.slots:
            value = values[key]
            params[position] = value if prepare is None else prepare(value, connection)
        return params


class _Statement:
    """Compiled once per database (the SQL differs), under a lock, on first use."""

    def __init__(self, build: Callable):
        self.build = build
        self._compiled: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def _compiled_for(self, connection) -> _Compiled:
        if (compiled := self._compiled.get(connection.vendor)) is not None:
            return compiled
        with self._lock:
            if (compiled := self._compiled.get(connection.vendor)) is None:
                compiled = self._compiled[connection.vendor] = self._compile(connection)
            return compiled

    def _compile(self, connection) -> _Compiled:
        raise NotImplementedError


class CompiledRead(_Statement):
    """`build(*ids)` → a `values()` or `values_list()` queryset, compiled on first use.

    The ids must reach the SQL as parameters (a filter's value does), each at least once;
    building checks it."""

    def __init__(self, build: Callable[..., QuerySet], *, arity: int = 1):
        super().__init__(build)
        self.arity = arity

    def __call__(self, *ids) -> list[tuple]:
        """The rows, as tuples in the order of `names`."""
        if len(ids) != self.arity:
            raise TypeError(f"expected {self.arity} ids, got {len(ids)}")
        connection = connections[DEFAULT_DB_ALIAS]
        compiled = self._compiled_for(connection)
        if compiled.locks and connection.get_autocommit():  # as the queryset would refuse it
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, compiled.bound(dict(enumerate(ids)), connection))
            rows = cursor.fetchall()
        if compiled.converters:
            rows = [_converted(row, compiled.converters, connection) for row in rows]
        return rows

    def names(self) -> tuple[str, ...]:
        return self._compiled_for(connections[DEFAULT_DB_ALIAS]).names

    def dicts(self, *ids) -> list[dict]:
        """The rows as `values()` gives them."""
        names = self.names()
        return [dict(zip(names, row, strict=True)) for row in self(*ids)]

    def instances(self, model: type[Model], *ids) -> list[Model]:
        """The rows as `model` instances holding just the columns read (as `only()` gives
        them): the queryset's `values_list` must name attnames ("turn_id", not "turn").
        Columns of related rows ("turn__conversation__title") make those rows' instances,
        cached on the relation as `select_related` caches them (None where the row is
        missing: a nullable key's outer join)."""
        names = self.names()
        return [instance(model, names, row) for row in self(*ids)]

    def _compile(self, connection) -> _Compiled:
        queryset = self.build(*[Param(index) for index in range(self.arity)]).using(connection.alias)
        query = queryset.query
        compiler = query.get_compiler(connection.alias)
        sql, params = compiler.as_sql()
        slots = _slots(self.build, params, _preparations(query), range(self.arity))
        names = tuple(query.selected or (*query.extra_select, *query.values_select, *query.annotation_select))
        fields = [column[0] for column in compiler.select[:compiler.col_count]]
        if len(fields) != len(names):
            raise ValueError(f"{self.build!r}: {len(fields)} columns for {len(names)} names")
        converters = tuple((column, tuple(functions), expression)
                           for column, (functions, expression) in compiler.get_converters(fields).items())
        return _Compiled(sql=sql, params=tuple(params), slots=slots, names=names, converters=converters,
                         locks=query.select_for_update)


class CompiledUpdate(_Statement):
    """`build(p)` → (a queryset, {field: value}): `queryset.update(**values)`, compiled
    on first use; the values of the call's keywords go where `build` put `p.<keyword>`.
    A call returns the number of rows it changed, as `update()` does, inside the
    caller's transaction."""

    def __call__(self, **values) -> int:
        connection = connections[DEFAULT_DB_ALIAS]
        compiled = self._compiled_for(connection)
        keys = {key for _, key, _ in compiled.slots}
        if values.keys() != keys:
            raise TypeError(f"{self.build!r} takes the values {sorted(keys)}, not {sorted(values)}")
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, compiled.bound(values, connection))
            return cursor.rowcount

    def _compile(self, connection) -> _Compiled:
        queryset, values = self.build(Params())
        query = queryset.using(connection.alias).query.chain(UpdateQuery)
        query.clear_ordering(force=True)
        query.add_update_values(values)
        if query.related_updates:
            raise ValueError(f"{self.build!r}: an update of several tables")
        saved = {value.key: _saving(field) for field, _, value in query.values if isinstance(value, Param)}
        sql, params = query.get_compiler(connection.alias).as_sql()
        keys = {value.key for value in params if isinstance(value, Param)}
        return _Compiled(sql=sql, params=tuple(params), slots=_slots(self.build, params, {
            **_preparations(query), **saved}, keys))


def _slots(build, params, preparations: dict, keys) -> tuple:
    slots = tuple((position, value.key, preparations.get(value.key, _own(value)))
                  for position, value in enumerate(params) if isinstance(value, Param))
    if missing := set(keys) - {key for _, key, _ in slots}:
        raise ValueError(f"{build!r}: ids {sorted(missing, key=str)} are not parameters of its SQL")
    return slots


def _own(param: Param) -> Prepare | None:
    field = param._output_field_or_none
    return None if field is None else _compared(field)


def _saving(field: Field) -> Prepare:
    return lambda value, connection: field.get_db_prep_save(value, connection)


def _compared(field: Field) -> Prepare:
    """As a lookup prepares a value it compares `field` with (Lookup.get_prep_lookup,
    then FieldGetDbPrepValueMixin.get_db_prep_lookup): a turn's number, a
    PositiveIntegerField, goes to PostgreSQL as psycopg's Int4, a time as SQLite keeps it."""
    return lambda value, connection: field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)


def _preparations(query: Query) -> dict:
    """Param key → how its value is prepared, from where it sits in `query`: compared with a
    column (a filter, a When's condition, inside a subquery) or added to one (F() + p)."""
    found: dict = {}

    def walk(node) -> None:
        if isinstance(node, Lookup):
            if isinstance(node.lhs, Col):
                for rhs in node.rhs if isinstance(node.rhs, list | tuple) else (node.rhs,):
                    if isinstance(rhs, Param):
                        found.setdefault(rhs.key, _compared(node.lhs.output_field))
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, CombinedExpression):
            for param, other in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
                if isinstance(param, Param) and isinstance(other, Col):
                    found.setdefault(param.key, _compared(other.output_field))
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, WhereNode):
            for child in node.children:
                walk(child)
        elif isinstance(node, Query):
            walk(node.where)
            for annotation in node.annotations.values():
                walk(annotation)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)
        elif isinstance(node, BaseExpression):
            for source in node.get_source_expressions():
                walk(source)

    walk(query)
    return found


def attnames(model: type[Model]) -> tuple[str, ...]:
    """Every column of `model`, for a `values_list` whose `instances` are whole rows."""
    return tuple(f.attname for f in model._meta.concrete_fields)


def related_attnames(model: type[Model], path: str) -> tuple[str, ...]:
    """Every column of the row `model`'s relation `path` ("turn__conversation") reaches,
    named for a `values_list` whose `instances` carry it."""
    for name in path.split("__"):
        model = model._meta.get_field(name).related_model
    return tuple(f"{path}__{name}" for name in attnames(model))


def instance(model: type[Model], names: tuple[str, ...], values: tuple) -> Model:
    """A `model` instance from `values` of the attnames `names` (the rest deferred), as
    Django loads a row of an `only()` queryset; names of related rows' columns
    ("turn__number") make those rows, cached on their relations."""
    if len(values) != len(names):
        raise ValueError(f"{len(values)} values for {len(names)} names")
    return _built(_plan(model, names), values)


@dataclass(frozen=True)
class _Plan:
    model: type[Model]
    attnames: tuple[str, ...]  # the model's, in field order (as from_db takes a row)
    columns: tuple[int | None, ...]  # for each, its position among the read's names (None: deferred)
    pk: int | None  # the position of its primary key's value among the read's names, if read
    related: tuple[tuple[Field, _Plan], ...]  # the relations read with it


@functools.cache
def _plan(model: type[Model], names: tuple[str, ...], prefix: str = "") -> _Plan:
    """How a row of the read's `names` becomes `model`'s instance (the one `prefix` names
    in it) and its related ones. Once per read and model."""
    own = {name[len(prefix):]: index for index, name in enumerate(names)
           if name.startswith(prefix) and "__" not in name[len(prefix):]}
    fields = model._meta.concrete_fields
    paths = sorted({name[len(prefix):].split("__", 1)[0] for name in names
                    if name.startswith(prefix) and "__" in name[len(prefix):]})
    related = tuple((model._meta.get_field(path), _plan(model._meta.get_field(path).related_model, names,
                                                        f"{prefix}{path}__")) for path in paths)
    return _Plan(model=model, attnames=tuple(f.attname for f in fields),
                 columns=tuple(own.get(f.attname) for f in fields), pk=own.get(model._meta.pk.attname), related=related)


def _built(plan: _Plan, values: tuple) -> Model | None:
    if plan.pk is not None and values[plan.pk] is None:
        return None  # the related row an outer join did not find
    row = [DEFERRED if column is None else values[column] for column in plan.columns]
    obj = plan.model.from_db(DEFAULT_DB_ALIAS, plan.attnames, row)
    for field, related in plan.related:
        field.set_cached_value(obj, _built(related, values))
    return obj


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
