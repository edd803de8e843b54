"""Grading pages: staff reports (gradebook, lab report, attempt detail, override, regrade, CSV), a student's own
grades, and grading's part of labs' pages (the staff's lab page with its class view, and the Check button);
staff pages answer 404 to anyone who does not teach that course."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.html import escape, format_html
from django.utils.http import content_disposition_header
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from grading import selectors, services
from grading.forms import GradeOverrideForm
from grading.models import GradingRun
from grading.selectors.class_view import class_view
from grading.selectors.reports import GradebookRow
from labs import access
from labs.models import Attempt
from labs.views.actions import AttemptActionView
from labs.views.instructions import render_instructions
from labs.views.pages import LabDetailView
from portal.errors import ApplicationError, NotFound, PermissionDenied
from portal.http import AuthenticatedRequest
from portal.models import STAFF_ROLES
from portal.selectors import course_get_for_user, staff_courses_for_user
from portal.views import PageView


class MyGradesView(PageView):
    def get(self, request: AuthenticatedRequest) -> HttpResponse:
        courses = selectors.student_grades(user=request.user)
        return render(request, "grading/my_grades.html", {"courses": courses})


class MyLabRunsView(PageView):
    def get(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        lab = access.lab_get_for_student(user=request.user, lab_id=lab_id)
        report = selectors.student_lab_runs(user=request.user, lab=lab)
        return render(request, "grading/my_lab.html", {"report": report, "lab": lab})


class StaffIndexView(PageView):
    """The courses the user teaches; somebody who teaches none goes to their own grades."""

    def get(self, request: AuthenticatedRequest) -> HttpResponse:
        courses = list(staff_courses_for_user(user=request.user).select_related("tenant").order_by("code", "term"))
        if not courses:
            return redirect("grading:my_grades")
        return render(request, "grading/index.html", {"courses": courses})


def format_score(value: Decimal) -> str:
    """Like the ``floatformat:"-2"`` filter: whole numbers without decimals, others with two."""
    return str(int(value)) if value == value.to_integral_value() else f"{value:.2f}"


def gradebook_cells_html(book: selectors.Gradebook) -> list[tuple[GradebookRow, SafeString, str]]:
    """Each row with its cells as HTML and its total, built here because a template loop over a large class is
    too slow. Each link's name says whose grade for which lab, for a screen reader's list of links."""
    late_label, override_label = escape(_("late")), escape(_("override"))
    late = format_html(' <span class="badge badge-late">{}</span>', late_label)
    override = format_html(' <span class="badge badge-override">{}</span>', override_label)
    missing = '<span class="muted">—</span>'
    not_graded = escape(_("Not graded"))
    link_name = escape(_("Grade of %(student)s for %(lab)s: %(grade)s"))
    labs = []
    for lab in book.labs:
        # Each lab's student_lab URL is reversed once, around a stand-in id that each cell replaces.
        url = reverse("grading:student_lab", kwargs={"lab_id": lab.pk, "student_id": 987_654_321})
        head, _slot, tail = url.rpartition("987654321")
        labs.append((escape(head), escape(tail), escape(lab.title)))
    rows = []
    for row in book.rows:
        student_id = row.student.pk
        student_name = escape(row.student.full_name or row.student.username)
        parts = []
        for cell, (url_head, url_tail, lab_title) in zip(row.cells, labs, strict=True):
            score = format_score(cell.final) if cell.final is not None else None
            grade = [score or not_graded]
            if cell.late:
                grade.append(late_label)
            if cell.overridden:
                grade.append(override_label)
            name = link_name % {"student": student_name, "lab": lab_title, "grade": " ".join(grade)}
            parts.append(f'<td class="grade"><a href="{url_head}{student_id}{url_tail}" aria-label="{name}">')
            parts.append(score or missing)
            if cell.late:
                parts.append(late)
            if cell.overridden:
                parts.append(override)
            parts.append("</a></td>")
        rows.append((row, mark_safe("".join(parts)), format_score(row.total)))  # noqa: S308  escaped above
    return rows


class GradebookView(PageView):
    def get(self, request: AuthenticatedRequest, course_id: int) -> HttpResponse:
        course = course_get_for_user(user=request.user, course_id=course_id, roles=STAFF_ROLES)
        book = selectors.course_gradebook(course=course)
        context = {"book": book, "rows": gradebook_cells_html(book)}
        return render(request, "grading/gradebook.html", context)


class _Echo:
    """A write-only buffer handing each CSV line straight back, so rows stream without collecting."""

    def write(self, value: str) -> str:
        return value


def csv_stream(rows: Iterable[list[str]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield "\ufeff"  # a BOM, so Excel opens UTF-8 (Japanese names included) without garbling it
    for row in rows:
        yield writer.writerow(row)


class GradebookExportView(PageView):
    def get(self, request: AuthenticatedRequest, course_id: int) -> StreamingHttpResponse:
        course = course_get_for_user(user=request.user, course_id=course_id, roles=STAFF_ROLES)
        response = StreamingHttpResponse(
            csv_stream(selectors.gradebook_csv_rows(course=course)), content_type="text/csv; charset=utf-8"
        )
        stem = "-".join(p for p in (slugify(course.code), slugify(course.term)) if p) or f"course-{course.pk}"
        response["Content-Disposition"] = content_disposition_header(True, f"grades-{stem}.csv")
        response["Cache-Control"] = "no-store"
        return response


class LabReportView(PageView):
    def get(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        lab = access.lab_get_for_staff(user=request.user, lab_id=lab_id)
        return render(request, "grading/lab_report.html", {"report": selectors.lab_report(lab=lab)})


class LabRegradeView(PageView):
    def post(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        lab = access.lab_get_for_staff(user=request.user, lab_id=lab_id)
        regrade, created = services.lab_regrade_request(actor=request.user, lab=lab)
        if created:
            messages.success(
                request,
                ngettext(
                    "Regrade queued for %(count)d attempt. Its outcome appears under Regrades when it is done.",
                    "Regrade queued for %(count)d attempts. Its outcome appears under Regrades when it is done.",
                    regrade.attempts_requested,
                )
                % {"count": regrade.attempts_requested},
            )
        else:
            messages.info(request, _("A regrade of this lab is already queued; it will use the current checks."))
        return redirect("grading:lab_report", lab_id=lab.pk)


class AttemptDetailView(PageView):
    def get(self, request: AuthenticatedRequest, attempt_id: int) -> HttpResponse:
        attempt = access.attempt_get_for_staff(user=request.user, attempt_id=attempt_id)
        return render(request, "grading/attempt_detail.html", {"detail": selectors.attempt_detail(attempt=attempt)})


class AttemptRegradeView(PageView):
    def post(self, request: AuthenticatedRequest, attempt_id: int) -> HttpResponse:
        attempt = access.attempt_get_for_staff(user=request.user, attempt_id=attempt_id)
        outcome = services.grading_regrade(actor=request.user, attempt=attempt)
        messages.success(request, _("Regraded %(runs)d runs.") % {"runs": len(outcome.reevaluated)})
        if outcome.queued is not None:
            messages.info(request, _("The attempt is still running: its checks run again in the virtual machine."))
        elif outcome.guest_run_skipped:
            messages.warning(request, _("A check is already in progress, so the checks were not run again."))
        return redirect("grading:attempt_detail", attempt_id=attempt.pk)


class StudentLabGradeView(PageView):
    """One student's grade for one lab, their attempts at it and the override form."""

    def _context(self, request: AuthenticatedRequest, lab_id: int, student_id: int) -> dict[str, Any]:
        lab = access.lab_get_for_staff(user=request.user, lab_id=lab_id)
        student = selectors.course_student_get(course=lab.course, student_id=student_id)
        grade = selectors.grade_of_student(lab=lab, student=student)
        return {"lab": lab, "student": student, "grade": grade, "max_score": selectors.lab_max_points(lab=lab)}

    def _render(
        self, request: AuthenticatedRequest, context: dict[str, Any], form: GradeOverrideForm, *, status: int = 200
    ) -> HttpResponse:
        # Read only when the page is shown: a saved override redirects without them.
        attempts = selectors.student_lab_attempts(lab=context["lab"], student=context["student"])
        return render(request, "grading/override.html", {**context, "form": form, "attempts": attempts}, status=status)

    def get(self, request: AuthenticatedRequest, lab_id: int, student_id: int) -> HttpResponse:
        context = self._context(request, lab_id, student_id)
        grade = context["grade"]
        initial = {"score": grade.override_score} if grade is not None and grade.is_overridden else {}
        return self._render(request, context, GradeOverrideForm(initial=initial, max_score=context["max_score"]))

    def post(self, request: AuthenticatedRequest, lab_id: int, student_id: int) -> HttpResponse:
        context = self._context(request, lab_id, student_id)
        form = GradeOverrideForm(request.POST, max_score=context["max_score"])
        if not form.is_valid():
            return self._render(request, context, form, status=400)
        score = None if form.cleaned_data["remove"] else form.cleaned_data["score"]
        try:
            services.grade_override(
                actor=request.user,
                lab=context["lab"],
                student=context["student"],
                score=score,
                reason=form.cleaned_data["reason"],
            )
        except ApplicationError as exc:
            if isinstance(exc, NotFound | PermissionDenied):
                raise
            form.add_error(None, exc.message)
            return self._render(request, context, form, status=exc.status_code)
        messages.success(request, _("The grade of %(student)s was updated.") % {"student": context["student"]})
        return redirect("grading:gradebook", course_id=context["lab"].course_id)


class LabPageView(LabDetailView):
    """The lab page; course staff get the instructions and the class view of the attempts they may watch."""

    def _staff_page(self, request: AuthenticatedRequest, lab_id: int) -> HttpResponse:
        lab = access.lab_get_for_staff(user=request.user, lab_id=lab_id)
        rows = class_view(lab=lab)
        if request.GET.get("part") == "class":  # the table alone (the page's socket pushes the same rendering)
            return render(request, "labs/_class_view.html", {"lab": lab, "rows": rows})
        context = {"lab": lab, "instructions": render_instructions(lab.instructions, title=lab.title), "rows": rows}
        return render(request, "labs/lab_staff.html", context)


class AttemptCheckView(AttemptActionView):
    """The Check button: queue a grading run; results arrive on the attempt's events socket."""

    success_message = gettext_lazy("Checking your work; the results appear on this page.")

    def act(self, request: AuthenticatedRequest, attempt: Attempt) -> GradingRun:
        return services.grading_run_request(actor=request.user, attempt=attempt)

    def json_answer(self, done: Any) -> JsonResponse:
        return JsonResponse({"run": selectors.grading_run_payload(done)}, status=202)
