"""Data migrations of the grading app, run forward over rows written the way older code wrote them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import translation

from grading.models import CheckResult, GradingRun, RunState
from grading.tests.builders import make_attempt
from labs.models import AttemptState

BEFORE, AFTER = ("grading", "0005_lab_regrade"), ("grading", "0006_check_result_pattern_timeout")
ENGLISH = (
    "This check could not be judged: its expected-output pattern took longer than 0.25 s to match the "
    "output. Tell your instructor, who needs to simplify the pattern; it counts as not passed until then."
)
JAPANESE = (
    "このチェックは判定できませんでした: 期待する出力のパターンが出力との照合に 2 秒以上かかりました。"
    "パターンを簡単にする必要があるので担当教員に知らせてください。それまでは不合格として扱われます。"
)


def migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


@pytest.mark.django_db(transaction=True)
def test_stored_pattern_timeout_words_become_the_time_limit(lab_a, student_a):
    attempt = make_attempt(lab=lab_a, student=student_a, state=AttemptState.STOPPED)
    run = GradingRun.objects.create(attempt=attempt, state=RunState.DONE)
    rows = {
        "english": CheckResult(run=run, check_title="a", order=1, feedback=ENGLISH),
        "japanese": CheckResult(run=run, check_title="b", order=2, feedback=JAPANESE),
        "hint": CheckResult(run=run, check_title="c", order=3, feedback="Look again at step 3."),
        "passed": CheckResult(run=run, check_title="d", order=4, passed=True, feedback=""),
    }
    CheckResult.objects.bulk_create(rows.values())
    migrate(BEFORE)  # the column goes; the rows stay as older code left them
    try:
        migrate(AFTER)
    finally:
        migrate(AFTER)  # whatever happened, the next tests get the current schema
    after = {name: CheckResult.objects.get(pk=row.pk) for name, row in rows.items()}
    assert (after["english"].pattern_timeout_seconds, after["english"].feedback) == (0.25, "")
    assert (after["japanese"].pattern_timeout_seconds, after["japanese"].feedback) == (2.0, "")
    assert (after["hint"].pattern_timeout_seconds, after["hint"].feedback) == (None, "Look again at step 3.")
    assert after["passed"].pattern_timeout_seconds is None
    with translation.override("en"):
        assert "0.25 s" in after["english"].feedback_text
