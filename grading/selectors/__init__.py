"""Reads of grading, always tenant- and role-scoped, by subject (``attempts``, ``runs``, ``reports``, and
``class_view``); the names below are the public contract."""

from grading.selectors.attempts import attempt_detail, course_student_get, student_lab_attempts
from grading.selectors.reports import (
    Gradebook,
    course_gradebook,
    grade_of_student,
    gradebook_csv_rows,
    lab_max_points,
    lab_report,
    student_grades,
    student_lab_runs,
)
from grading.selectors.runs import grading_run_payload, run_get_for_user

__all__ = [
    "Gradebook",
    "attempt_detail",
    "course_gradebook",
    "course_student_get",
    "grade_of_student",
    "gradebook_csv_rows",
    "grading_run_payload",
    "lab_max_points",
    "lab_report",
    "run_get_for_user",
    "student_grades",
    "student_lab_attempts",
    "student_lab_runs",
]
