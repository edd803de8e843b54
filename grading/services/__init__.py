"""Every write of grading, by subject (``run_requests`` for the Check button, ``runs``, ``final``, ``grades`` with
overrides, ``regrades``); the names below are the public contract other apps import."""

from grading.services.final import grading_run_final
from grading.services.grades import grade_override
from grading.services.regrades import grading_regrade, lab_regrade_execute, lab_regrade_request, lab_regrades_fail_stale
from grading.services.run_requests import grading_run_request
from grading.services.runs import grading_run_execute, grading_runs_fail_stale

__all__ = [
    "grade_override",
    "grading_regrade",
    "grading_run_execute",
    "grading_run_final",
    "grading_run_request",
    "grading_runs_fail_stale",
    "lab_regrade_execute",
    "lab_regrade_request",
    "lab_regrades_fail_stale",
]
