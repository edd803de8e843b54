"""Queries whose SQL Django builds once per process and database, then runs again with new values.

Building a query costs Django more than running it: the lab lookup of every Start (a join on the student's
membership, its course and tenant) takes ~0.7 ms to build and compile against ~0.3 ms for PostgreSQL to answer, and a
class pressing Start together pays that on every query of every start, in the web process and the worker alike. A
``CompiledQuery`` is written as an ordinary QuerySet in a function of its parameters, so it reads and scopes as every
other query does; it is built once, with stand-in values, into its SQL, and each call runs that SQL with the real
values in their places.

Only plain values may be parameters (``int``, ``str``, aware ``datetime``): Django passes those to the database as
they are (a datetime adapted as the backend wants it, which a call does the same way), which is what lets a
stand-in's place in the parameters be found. A parameter of another type is refused where the query is declared.
Each stand-in must land in the SQL's parameters (not folded into its text); building refuses a query where one does
not, so a query that cannot be compiled fails the first time it is used, in the tests, rather than giving wrong
rows.

A ``FieldsUpdate`` writes the fields a call names on the rows a QuerySet chooses as above: Django builds its SQL once
per set of fields, and each value is prepared by its own field at every call, so any plain value a field takes (a
JSONField's dict, a NULL) may be set, and a write whose fields change from call to call (what a list of VMIs changed
about an attempt) is built once per set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from django.db import connections, router, transaction
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators
from django.db.models.sql import UpdateQuery

M = TypeVar("M", bound=Model)

# Stand-ins: values no real parameter takes, each of its own, of the parameter's type. Integers stay well inside an
# IntegerField's range (Django 5 turns an out-of-range integer lookup into an empty result, with no parameter).
_INT_STAND_IN = 2_000_000_000
_STR_STAND_IN = "\x1fcompiled-query-parameter-{}\x1f"
_DATETIME_STAND_IN = datetime(1901, 2, 3, tzinfo=UTC)
_TYPES = (int, str, datetime)


class CompileError(Exception):
    """The query cannot be compiled: a parameter does not reach the SQL's parameters as it was given."""


def _stand_ins(types: dict[str, type]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for index, (name, kind) in enumerate(types.items()):
        if kind is int:
            values[name] = _INT_STAND_IN + index
        elif kind is str:
            values[name] = _STR_STAND_IN.format(index)
        elif kind is datetime:
            values[name] = _DATETIME_STAND_IN + timedelta(seconds=index)
        else:
            raise CompileError(f"parameter {name!r}: only {', '.join(t.__name__ for t in _TYPES)} can be compiled")
    return values


def _adapt(value: Any, connection: Any) -> Any:
    """A value as Django passes it to ``connection``'s database: datetimes are adapted (SQLite's as text)."""
    return connection.ops.adapt_datetimefield_value(value) if isinstance(value, datetime) else value


def _slots(params: tuple | list, stand_ins: dict[str, Any], connection: Any) -> dict[str, tuple[int, ...]]:
    """Where each stand-in sits among the SQL's parameters (it may sit in several places)."""
    slots = {}
    for name, stand_in in stand_ins.items():
        value = _adapt(stand_in, connection)
        places = tuple(index for index, param in enumerate(params)
                       if type(param) is type(value) and param == value)
        if not places:
            raise CompileError(f"parameter {name!r} does not reach the SQL's parameters as given")
        slots[name] = places
    return slots


def _check_values(types: dict[str, type], values: dict[str, Any]) -> None:
    if values.keys() != types.keys():
        raise TypeError(f"expected the parameters {sorted(types)}, got {sorted(values)}")
    for name, value in values.items():
        kind = types[name]
        # bool is an int, but a field would not pass it on as one; a naive datetime would be read in another zone.
        if type(value) is bool or not isinstance(value, kind) or (kind is datetime and value.tzinfo is None):
            raise TypeError(f"parameter {name!r}: expected {'an aware ' if kind is datetime else ''}"
                            f"{kind.__name__}, got {value!r}")


@dataclass(frozen=True)
class _Statement:
    sql: str
    params: tuple
    slots: dict[str, tuple[int, ...]]

    def params_for(self, values: dict[str, Any], connection: Any) -> list:
        params = list(self.params)
        for name, places in self.slots.items():
            value = _adapt(values[name], connection)
            for place in places:
                params[place] = value
        return params


@dataclass(frozen=True)
class _Select(_Statement):
    """A SELECT and how Django turns its rows into model instances (``ModelIterable``), kept from its compiler."""

    model: type[Model]
    converters: tuple  # (position, converters, column) for the columns that have any
    init_list: tuple[str, ...]
    model_slice: slice
    related_populators: tuple
    annotations: tuple[tuple[str, int], ...]


class _Compiled:
    """A query's parameters and stand-ins (checked as it is declared), its model, and what is built once per key (the
    database alias, so the vendor; for an update also its set of fields), under a lock so that threads build it
    once."""

    def __init__(self, queryset: Callable[..., QuerySet], types: dict[str, type]) -> None:
        self.types = types
        self.stand_ins = _stand_ins(types)
        self._queryset = queryset
        self._model: type[Model] | None = None
        self._built: dict[Any, Any] = {}
        self._lock = threading.Lock()

    @property
    def model(self) -> type[Model]:
        """The model the query reads or writes, for the database router."""
        if self._model is None:
            self._model = self._queryset(**self.stand_ins).model
        return self._model

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        built = self._built.get(key)
        if built is None:
            with self._lock:
                built = self._built.get(key)
                if built is None:
                    built = self._built[key] = build()
        return built


class CompiledQuery(Generic[M]):
    """A SELECT of model instances: ``queryset(**parameters)`` returns the QuerySet (ordered and sliced as it should
    run), ``parameters`` names each parameter's type. ``list(**values)`` runs it; ``first(**values)`` returns its
    first row or None (the QuerySet decides the order: nothing is added)."""

    def __init__(self, queryset: Callable[..., QuerySet[M]], **parameters: type) -> None:
        self._queryset = queryset
        self._compiled = _Compiled(queryset, parameters)

    def _build(self, alias: str) -> _Select:
        stand_ins = self._compiled.stand_ins
        queryset = self._queryset(**stand_ins)
        if queryset._result_cache is not None or queryset._prefetch_related_lookups or queryset._fields is not None:
            raise CompileError("only a plain QuerySet of model instances can be compiled")
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        klass_info, select = compiler.klass_info, compiler.select
        fields = klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        columns = tuple(column for column, _sql, _alias in select[: compiler.col_count])
        connection = connections[alias]
        # What turns a column's value into the field's (Django's SQLCompiler.get_converters): the backend's and the
        # field's own, the same for every connection of the alias; each call passes its own connection to them.
        converters = tuple((position, converters, column) for position, column in enumerate(columns)
                           if (converters := (*connection.ops.get_db_converters(column),
                                              *column.get_db_converters(connection))))
        return _Select(
            sql=sql, params=tuple(params), slots=_slots(params, stand_ins, connection), model=klass_info["model"],
            converters=converters,
            init_list=tuple(column[0].target.attname for column in select[start:end]), model_slice=slice(start, end),
            related_populators=tuple(get_related_populators(klass_info, select, alias)),
            annotations=tuple((compiler.annotation_col_map or {}).items()),
        )

    def list(self, **values: Any) -> list[M]:
        _check_values(self._compiled.types, values)
        alias = router.db_for_read(self._compiled.model)
        select: _Select = self._compiled.get(alias, lambda: self._build(alias))
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute(select.sql, select.params_for(values, connection))
            rows = cursor.fetchall()
        if not rows:
            return []
        objects = []
        for row in rows:
            if select.converters:
                row = list(row)
                for position, converters, column in select.converters:
                    value = row[position]
                    for converter in converters:
                        value = converter(value, column, connection)
                    row[position] = value
            instance = select.model.from_db(alias, select.init_list, row[select.model_slice])
            for populator in select.related_populators:
                populator.populate(row, instance)
            for name, position in select.annotations:
                setattr(instance, name, row[position])
            objects.append(instance)
        return objects

    def first(self, **values: Any) -> M | None:
        rows = self.list(**values)
        return rows[0] if rows else None


def _same_param(ours: Any, django: Any) -> bool:
    """A prepared value as Django passed it: equal, or the same adapter around an equal value (psycopg's Jsonb has no
    equality of its own)."""
    if type(ours) is not type(django):
        return False
    if ours == django:
        return True
    return hasattr(ours, "obj") and ours.obj == django.obj


@dataclass(frozen=True)
class _FieldsStatement(_Statement):
    fields: tuple  # (name as given, model field) of the values set (not NULL), in the order of their parameters


class FieldsUpdate:
    """An UPDATE of the fields a call names, on the rows ``rows(**parameters)`` selects; ``run(values, **parameters)``
    returns the number of rows changed. Django builds the SQL once per set of fields (and which of them are set to
    NULL) and database alias; at each call every value is prepared by its
    field as ``QuerySet.update`` prepares it (a JSONField's dict as JSON, a datetime as the backend wants it). Only
    plain values: no expressions, no model instances."""

    def __init__(self, rows: Callable[..., QuerySet], **parameters: type) -> None:
        self._rows = rows
        self._compiled = _Compiled(rows, parameters)

    def _build(self, alias: str, values: dict[str, Any]) -> _FieldsStatement:
        stand_ins = self._compiled.stand_ins
        connection = connections[alias]
        query = self._rows(**stand_ins).query.chain(UpdateQuery)
        query.add_update_values(values)
        if query.related_updates:
            raise CompileError("an update of related models cannot be compiled")
        # add_update_values keeps the order of ``values``: each (field, model, value) is the value of the same name.
        fields = tuple((name, field) for name, (field, _model, value) in zip(values, query.values, strict=True)
                       if value is not None)
        if any(hasattr(field, "get_placeholder") for _name, field in fields):
            raise CompileError("a field with its own placeholder cannot be compiled")
        sql, params = query.get_compiler(alias).as_sql()
        ours = [field.get_db_prep_save(values[name], connection=connection) for name, field in fields]
        if len(params) < len(ours) or not all(map(_same_param, ours, params)):
            raise CompileError("the values do not reach the SQL's parameters as their fields prepare them")
        rest = params[len(ours):]
        slots = {name: tuple(place + len(ours) for place in places)
                 for name, places in _slots(rest, stand_ins, connection).items()}
        return _FieldsStatement(sql=sql, params=tuple(params), slots=slots, fields=fields)

    def run(self, values: dict[str, Any], **parameters: Any) -> int:
        """Set ``values`` (field name → value) on the rows; returns the number of rows changed."""
        if not values:
            raise ValueError("an update needs at least one field")
        for name, value in values.items():
            if hasattr(value, "resolve_expression") or isinstance(value, Model):
                raise TypeError(f"field {name!r}: only plain values can be compiled, got {value!r}")
        _check_values(self._compiled.types, parameters)
        alias = router.db_for_write(self._compiled.model)
        shape = (alias, tuple((name, value is None) for name, value in values.items()))
        statement: _FieldsStatement = self._compiled.get(shape, lambda: self._build(alias, values))
        connection = connections[alias]
        params = statement.params_for(parameters, connection)
        for place, (name, field) in enumerate(statement.fields):
            params[place] = field.get_db_prep_save(values[name], connection=connection)
        with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
            cursor.execute(statement.sql, params)
            return cursor.rowcount
