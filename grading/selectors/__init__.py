"""Reads of grading, always tenant- and role-scoped: access lookups, run payloads, reports and CSV rows.

Split by subject (``access``, ``attempts``, ``runs``, ``reports``); the names below are the public contract.
"""

from grading.selectors.access import (
    attempt_get_for_grading,
    attempt_get_for_staff,
    attempts_visible_to,
    course_student_get,
    lab_get_for_staff,
    lab_get_for_student,
    labs_for_staff,
    run_get_for_user,
    staff_course_get,
    student_role_shown,
)
from grading.selectors.attempts import AttemptDetail, attempt_detail, attempt_timeline, student_lab_attempts
from grading.selectors.reports import (
    Gradebook,
    GradeCell,
    LabReport,
    course_gradebook,
    csv_text,
    grade_of_student,
    gradebook_csv_rows,
    lab_report,
    score_distribution,
    student_grades,
    student_lab_runs,
)
from grading.selectors.runs import RUN_ERROR_MESSAGES, grading_run_payload, result_feedback, run_error_message

__all__ = [
    "RUN_ERROR_MESSAGES",
    "AttemptDetail",
    "GradeCell",
    "Gradebook",
    "LabReport",
    "attempt_detail",
    "attempt_get_for_grading",
    "attempt_get_for_staff",
    "attempt_timeline",
    "attempts_visible_to",
    "course_gradebook",
    "course_student_get",
    "csv_text",
    "grade_of_student",
    "gradebook_csv_rows",
    "grading_run_payload",
    "lab_get_for_staff",
    "lab_get_for_student",
    "lab_report",
    "labs_for_staff",
    "result_feedback",
    "run_error_message",
    "run_get_for_user",
    "score_distribution",
    "staff_course_get",
    "student_role_shown",
    "student_grades",
    "student_lab_attempts",
    "student_lab_runs",
]
