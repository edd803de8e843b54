"""The lab page (instructions, Start, the live attempt panel, history) and an attempt's own page."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from labs.access import (
    attempt_get_for_user,
    attempts_for_student,
    attempts_going_for_student,
    lab_get_for_student,
)
from labs.models import ACTIVE_STATES, Attempt, Lab
from labs.selectors import attempt_status_payload, attempts_counted_against_limit
from labs.services.quota import per_student_cap_message
from labs.services.start import lab_closed_message
from labs.views.instructions import render_instructions
from labs.views.strings import PROGRESS_STEPS, attempt_page_strings
from labs.wording import cluster_notice
from portal.errors import NotFound
from portal.http import AuthenticatedRequest
from portal.models import STAFF_ROLES
from portal.selectors import course_role
from portal.views import PageView


def attempt_page_config(*, attempt: Attempt, is_student: bool, is_staff: bool) -> dict[str, Any]:
    """Everything the attempt panel's script needs, handed over as a JSON data block (no inline script)."""
    return {
        "attempt_id": attempt.id,
        "initial": attempt_status_payload(attempt),
        "urls": {
            "events": f"/ws/attempts/{attempt.id}/events/",
            "console": f"/ws/attempts/{attempt.id}/console/",
            "stop": reverse("labs:attempt_stop", args=[attempt.id]),
            "extend": reverse("labs:attempt_extend", args=[attempt.id]),
            "check": reverse("labs:attempt_check", args=[attempt.id]),
        },
        "slow_start_seconds": settings.ATTEMPT_SLOW_START_NOTICE_SECONDS,
        "check_interval_seconds": settings.GRADING_MIN_INTERVAL_SECONDS,
        "is_student": is_student,
        "can_take_control": is_staff and not is_student,
        "strings": attempt_page_strings(),
    }


def lab_start_fragments(*, request: HttpRequest, attempt: Attempt) -> dict[str, str]:
    """The attempt panel and history row an answered Start puts in place without reloading (static/js/start.js)."""
    # Given the CSRF token, the only thing they need of the context processors, they render from a plain context.
    context = {
        "attempt": attempt,
        "is_student": True,
        "show_terminal": True,
        "progress_steps": PROGRESS_STEPS,
        "page_config": attempt_page_config(attempt=attempt, is_student=True, is_staff=False),
        "csrf_token": get_token(request),
    }
    return {
        "panel": render_to_string("labs/_attempt_panel.html", context),
        "history_row": render_to_string("labs/_attempt_history_row.html", context),
    }


@dataclass(frozen=True)
class StartRefusal:
    """Why Start is not offered, and in how many seconds the page should look again (None: not by itself)."""

    message: str = ""
    recheck_in: int | None = None
    going: tuple[Attempt, ...] = ()  # the student's labs that hold the per-student cap, to link to


# How often a lab page whose Start is held back by something that may change elsewhere asks again while shown.
START_RECHECK_SECONDS = 60
# A lab that opens later than this is asked about again only as its time comes near (at most a day apart).
START_RECHECK_NEAR_SECONDS = 3600
START_RECHECK_LONGEST_SECONDS = 86400


def lab_start_refusal(*, user, lab: Lab, attempts: list[Attempt]) -> StartRefusal:
    """Why Start is not offered right now, in the student's words; the service decides for real on the press."""
    if any(a.state in ACTIVE_STATES for a in attempts):
        return StartRefusal(_("You already have an attempt in progress."))
    now = timezone.now()
    if closed := lab_closed_message(lab=lab, actor=user, now=now):
        recheck_in = None
        if lab.opens_at and now < lab.opens_at:  # opens by itself: look again then, or sooner
            until_open = math.ceil((lab.opens_at - now).total_seconds())
            if until_open > START_RECHECK_NEAR_SECONDS:
                recheck_in = min(until_open - START_RECHECK_NEAR_SECONDS, START_RECHECK_LONGEST_SECONDS)
            else:
                recheck_in = min(until_open, START_RECHECK_SECONDS)
        return StartRefusal(closed, recheck_in=recheck_in)
    if lab.attempt_limit and attempts_counted_against_limit(student=user, lab=lab) >= lab.attempt_limit:
        return StartRefusal(_("You have used all %(limit)d attempts for this lab.") % {"limit": lab.attempt_limit})
    message = per_student_cap_message(student=user, tenant=lab.course.tenant)
    if not message:
        return StartRefusal()
    # Stopping a lab in another tab or on another page brings Start back here.
    return StartRefusal(message, recheck_in=START_RECHECK_SECONDS, going=tuple(attempts_going_for_student(user=user)))


class LabDetailView(PageView):
    """A student's lab page; course staff get the instructions and the attempts they may watch."""

    def get(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        try:
            lab = lab_get_for_student(user=request.user, lab_id=lab_id)
        except NotFound:
            return self._staff_page(request, lab_id)
        attempts = list(attempts_for_student(user=request.user, lab=lab))
        current = next((a for a in attempts if a.state in ACTIVE_STATES), None)
        context = {
            "lab": lab,
            "instructions": render_instructions(lab.instructions, title=lab.title),
            "attempts": attempts,
            "current": current,
            "start_refusal": lab_start_refusal(user=request.user, lab=lab, attempts=attempts),
            "progress_steps": PROGRESS_STEPS,
            "page_config": attempt_page_config(attempt=current, is_student=True, is_staff=False)
            if current is not None
            else None,
            # A degraded cluster is said in plain words, never left to look like a stuck progress bar.
            "cluster_notice": cluster_notice(
                state=current.state if current is not None else None,
                namespace=current.namespace if current is not None else lab.course.tenant.namespace,
            ),
        }
        return render(request, "labs/lab_detail.html", context)

    def _staff_page(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        """Course staff's version of the page, served by grading's subclass (``grading.views``)."""
        raise Http404


class AttemptDetailView(PageView):
    """One attempt: its progress and terminal while active (read-only for staff), its timeline and results."""

    def get(self, request: AuthenticatedRequest, attempt_id: int) -> HttpResponse:
        attempt = attempt_get_for_user(user=request.user, attempt_id=attempt_id)
        lab = attempt.lab
        is_student = attempt.student_id == request.user.id
        is_staff = course_role(user=request.user, course=lab.course) in STAFF_ROLES  # labs.access let in no one else
        context = {
            "lab": lab,
            "attempt": attempt,
            "is_student": is_student,
            "is_staff": is_staff,
            "active": attempt.state in ACTIVE_STATES,
            # In the student's words ("your VM"): course staff read the cluster's state on the operations pages.
            "cluster_notice": cluster_notice(state=attempt.state, namespace=attempt.namespace)
            if is_student and attempt.state in ACTIVE_STATES
            else None,
            "progress_steps": PROGRESS_STEPS,
            "page_config": attempt_page_config(attempt=attempt, is_student=is_student, is_staff=is_staff),
        }
        return render(request, "labs/attempt_detail.html", context)
