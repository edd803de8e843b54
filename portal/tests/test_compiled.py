"""Compiled queries give the rows the ORM gives, build their SQL once, and refuse what they cannot compile."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import connection
from django.db.models import F, QuerySet
from django.db.models.sql.compiler import SQLCompiler, SQLUpdateCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conftest import make_lab
from grading.tests.builders import make_attempt
from labs.models import Attempt, AttemptState
from portal.compiled import CompiledQuery, CompileError, FieldsUpdate

pytestmark = pytest.mark.django_db


def students_attempts(*, student_id: int, state: str) -> QuerySet[Attempt]:
    return (Attempt.objects.filter(student_id=student_id, state=state)
            .annotate(lab_idle_stop_minutes=F("lab__idle_stop_minutes"))
            .select_related("lab__course", "tenant").order_by("number"))


def same_row(compiled: Attempt, orm: Attempt) -> None:
    """Every field, the related objects and the annotation, as the ORM's instance has them."""
    for field in Attempt._meta.concrete_fields:
        assert getattr(compiled, field.attname) == getattr(orm, field.attname), field.name
    assert compiled.lab.course.title == orm.lab.course.title
    assert compiled.tenant.namespace == orm.tenant.namespace
    assert compiled.lab_idle_stop_minutes == orm.lab_idle_stop_minutes
    assert compiled._state.db == orm._state.db and compiled._state.adding is False


def test_rows_are_the_orms_rows_with_related_objects_annotations_and_converted_values(lab_a, student_a, student_b,
                                                                                       course_a):
    idle_lab = make_lab(course_a, title="Idle", idle_stop_minutes=15)
    texts = {"en": "Booting", "de": "Startet"}  # a JSONField: its converter must run
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=1)
    make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=2, status_message_texts=texts)
    make_attempt(lab=idle_lab, student=student_a, state=AttemptState.RUNNING, number=1,
                 expires_at=timezone.now() + timedelta(minutes=5))
    compiled = CompiledQuery(students_attempts, student_id=int, state=str)

    for student, state in ((student_a, AttemptState.STOPPED), (student_a, AttemptState.RUNNING),
                           (student_b, AttemptState.STOPPED)):
        orm = list(students_attempts(student_id=student.pk, state=state))
        rows = compiled.list(student_id=student.pk, state=state)
        assert len(rows) == len(orm)
        for row, expected in zip(rows, orm, strict=True):
            same_row(row, expected)
    stopped = compiled.list(student_id=student_a.pk, state=AttemptState.STOPPED)
    assert [row.number for row in stopped] == [1, 2]
    assert stopped[1].status_message_texts == texts
    assert compiled.first(student_id=student_a.pk, state=AttemptState.RUNNING).lab_idle_stop_minutes == 15
    assert compiled.first(student_id=student_b.pk, state=AttemptState.RUNNING) is None


def test_the_sql_is_built_once_and_each_call_is_one_query(lab_a, student_a):
    attempt = make_attempt(lab=lab_a, student=student_a)
    compiled = CompiledQuery(lambda *, attempt_id: Attempt.objects.filter(id=attempt_id).select_related("lab")[:1],
                             attempt_id=int)
    assert compiled.first(attempt_id=attempt.pk) == attempt
    with mock.patch.object(SQLCompiler, "as_sql", autospec=True, side_effect=SQLCompiler.as_sql) as as_sql:
        with CaptureQueriesContext(connection) as queries:
            assert compiled.first(attempt_id=attempt.pk).lab == lab_a
            assert compiled.first(attempt_id=attempt.pk + 1000) is None
        # The ORM's own query compiles every time.
        assert Attempt.objects.filter(id=attempt.pk).first() == attempt
    assert len(queries) == 2
    assert as_sql.call_count == 1


def test_concurrent_first_calls_build_the_sql_once(db):
    builds = []

    def rows(*, student_id: int) -> QuerySet[Attempt]:
        builds.append(threading.get_ident())
        return Attempt.objects.filter(student_id=student_id)

    compiled = CompiledQuery(rows, student_id=int)
    barrier = threading.Barrier(4)
    def build() -> None:
        barrier.wait()
        compiled._compiled.get("default", lambda: compiled._build("default"))

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1


def test_parameters_must_be_given_all_and_of_their_type(lab_a, student_a):
    compiled = CompiledQuery(students_attempts, student_id=int, state=str)
    with pytest.raises(TypeError, match="expected the parameters"):
        compiled.list(student_id=student_a.pk)
    with pytest.raises(TypeError, match="expected the parameters"):
        compiled.list(student_id=student_a.pk, state="running", lab_id=lab_a.pk)
    with pytest.raises(TypeError, match="'student_id': expected int"):
        compiled.list(student_id=str(student_a.pk), state="running")
    with pytest.raises(TypeError, match="'student_id': expected int"):
        compiled.list(student_id=True, state="running")
    since = CompiledQuery(lambda *, since: Attempt.objects.filter(requested_at__gte=since), since=datetime)
    with pytest.raises(TypeError, match="an aware datetime"):
        since.list(since=datetime(2026, 1, 1))  # noqa: DTZ001 - the naive value is the point
    with pytest.raises(CompileError, match="only int, str, datetime"):  # refused where it is declared
        CompiledQuery(lambda *, ids: Attempt.objects.filter(id__in=ids), ids=list)


def test_a_datetime_parameter_compares_as_the_orms(lab_a, student_a):
    now = timezone.now()
    old = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=1,
                       requested_at=now - timedelta(hours=2))
    new = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=2, requested_at=now)
    since = CompiledQuery(lambda *, since: Attempt.objects.filter(requested_at__gte=since).order_by("id"),
                          since=datetime)
    assert since.list(since=now - timedelta(hours=1)) == [new]
    assert since.list(since=(now - timedelta(hours=3)).astimezone(UTC)) == [old, new]


def test_a_parameter_the_orm_changes_on_its_way_to_the_sql_is_refused_at_first_use(lab_a):
    # icontains wraps the value in % signs: its place among the parameters cannot be found, so nothing is run.
    compiled = CompiledQuery(lambda *, text: Attempt.objects.filter(vm_name__icontains=text), text=str)
    with pytest.raises(CompileError, match="'text' does not reach"):
        compiled.list(text="vm")
    values = CompiledQuery(lambda *, lab_id: Attempt.objects.filter(lab_id=lab_id).values("id"), lab_id=int)
    with pytest.raises(CompileError, match="model instances"):
        values.list(lab_id=lab_a.pk)


def test_a_conditional_update_changes_the_rows_it_matches_and_counts_them(lab_a, course_a, student_a):
    requested = make_attempt(lab=lab_a, student=student_a, state=AttemptState.REQUESTED, number=1)
    running = make_attempt(lab=make_lab(course_a, title="Other"), student=student_a, state=AttemptState.RUNNING)
    requested_only = FieldsUpdate(
        lambda *, attempt_id: Attempt.objects.filter(id=attempt_id, state=AttemptState.REQUESTED), attempt_id=int)
    now = timezone.now()

    def claim(*, attempt_id: int) -> int:
        return requested_only.run({"state": AttemptState.PROVISIONING, "provisioned_at": now, "updated_at": now},
                                  attempt_id=attempt_id)

    assert claim(attempt_id=running.pk) == 0  # not in the state it claims from
    with mock.patch.object(SQLUpdateCompiler, "as_sql", autospec=True) as as_sql:
        assert claim(attempt_id=requested.pk) == 1
        assert claim(attempt_id=requested.pk) == 0  # claimed once only
    assert as_sql.call_count == 0  # built by the first run
    requested.refresh_from_db()
    running.refresh_from_db()
    assert (requested.state, requested.provisioned_at, requested.updated_at) == (
        AttemptState.PROVISIONING, now, now)
    assert running.state == AttemptState.RUNNING and running.provisioned_at is None


def _row(attempt: Attempt) -> dict:
    attempt.refresh_from_db()
    return {field.attname: getattr(attempt, field.attname) for field in Attempt._meta.concrete_fields}


def test_a_fields_update_writes_what_the_orms_update_writes_for_each_set_of_fields(lab_a, course_a, student_a):
    """Pairs of attempts alike (stopped ones: a student has one active attempt per lab), one changed by the ORM and
    one by the compiled update, with sets of fields that differ call to call: a JSONField's dict, datetimes, NULLs, a
    foreign key's id. Each set's SQL is built once."""
    other_lab = make_lab(course_a, title="Other")
    apply = FieldsUpdate(lambda *, attempt_id, state: Attempt.objects.filter(id=attempt_id, state=state),
                         attempt_id=int, state=str)
    now = timezone.now()
    changes = [
        {"phase": "Scheduling", "node_name": "node01", "updated_at": now},
        {"status_message": "Booting", "status_message_texts": {"en": "Booting", "de": "Startet"},
         "vmi_running_at": now - timedelta(seconds=3), "updated_at": now},
        {"phase": "Running", "node_name": "node01", "updated_at": now + timedelta(seconds=1)},  # a set seen before
        {"status_message": "", "status_message_texts": {}, "provisioned_at": None, "lab_id": other_lab.pk},
    ]
    for number, values in enumerate(changes, start=1):
        by_orm = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=2 * number,
                              provisioned_at=now)
        compiled = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED, number=2 * number + 1,
                                provisioned_at=now)
        assert Attempt.objects.filter(id=by_orm.pk, state=AttemptState.STOPPED).update(**values) == 1
        assert apply.run(values, attempt_id=compiled.pk, state=AttemptState.STOPPED) == 1
        expected, got = _row(by_orm), _row(compiled)
        own = {"id", "number", "vm_name", "requested_at", "updated_at"} - values.keys()  # each attempt's own
        for name in own:
            expected.pop(name), got.pop(name)
        assert got == expected
        # Not in the state it is written from: nothing changes.
        assert apply.run(values, attempt_id=compiled.pk, state=AttemptState.FAILED) == 0
    with mock.patch.object(SQLUpdateCompiler, "as_sql", autospec=True, side_effect=SQLUpdateCompiler.as_sql) as as_sql:
        for values in changes:
            apply.run(values, attempt_id=compiled.pk, state=AttemptState.STOPPED)
    assert as_sql.call_count == 0  # every set of fields (and of NULLs) built once, by its first run


def test_a_fields_update_takes_plain_values_only(lab_a, student_a):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STARTING)
    apply = FieldsUpdate(lambda *, attempt_id: Attempt.objects.filter(id=attempt_id), attempt_id=int)
    with pytest.raises(TypeError, match="plain values"):
        apply.run({"number": F("number") + 1}, attempt_id=attempt.pk)
    with pytest.raises(TypeError, match="plain values"):
        apply.run({"lab": lab_a}, attempt_id=attempt.pk)
    with pytest.raises(ValueError, match="at least one field"):
        apply.run({}, attempt_id=attempt.pk)
    with pytest.raises(TypeError, match="attempt_id"):
        apply.run({"phase": "Running"}, attempt_id=str(attempt.pk))
    attempt.refresh_from_db()
    assert attempt.phase != "Running"


def test_the_student_lab_lookup_is_scoped_like_the_orms(lab_a, lab_b, student_a, student_b, ta_a):
    from grading.selectors.access import lab_get_for_student
    from portal.errors import NotFound

    assert lab_get_for_student(user=student_a, lab_id=lab_a.pk).course.tenant == lab_a.course.tenant
    for user, lab in ((student_a, lab_b), (student_b, lab_a), (ta_a, lab_a)):
        with pytest.raises(NotFound):
            lab_get_for_student(user=user, lab_id=lab.pk)
