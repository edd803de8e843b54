"""Reports for course staff and students: the course gradebook (also as CSV rows), a lab's report, a student's own
grades. Each runs a fixed number of queries whatever the class size."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, TypedDict

from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils.translation import gettext as _

from grading.models import CheckResult, Grade, GradingRun, LabRegrade, RunState
from grading.selectors.attempts import attempts_with_run_counts, runs_with_results
from labs.models import Attempt, Lab
from portal.models import Course, Membership, Role, User
from portal.selectors import courses_for_user, user_tenant_ids

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class _MaxPoints(TypedDict):
    max_points: Decimal | None


@dataclass(frozen=True, slots=True)
class GradeCell:
    """One student's standing at one lab."""

    final: Decimal | None
    computed: Decimal | None
    max_score: Decimal | None
    late: bool
    overridden: bool
    attempts: int


LAB_REPORT_REGRADES = 5


@dataclass(frozen=True, slots=True)
class GradebookRow:
    student: User
    cells: list[GradeCell]

    @property
    def total(self) -> Decimal:
        return sum((c.final for c in self.cells if c.final is not None), Decimal(0))


@dataclass(frozen=True)
class Gradebook:
    course: Course
    labs: list[WithAnnotations[Lab, _MaxPoints]]
    rows: list[GradebookRow]

    @property
    def max_total(self) -> Decimal:
        return sum((lab.max_points or Decimal(0) for lab in self.labs), Decimal(0))


def labs_with_max_points(labs: QuerySet[Lab]) -> list[WithAnnotations[Lab, _MaxPoints]]:
    return list(labs.annotate(max_points=Sum("checks__points")).order_by("due_at", "title", "id"))


def lab_max_points(*, lab: Lab) -> Decimal:
    return lab.checks.aggregate(total=Sum("points"))["total"] or Decimal(0)


def grade_of_student(*, lab: Lab, student: User) -> Grade | None:
    """The student's grade row for the lab (callers have checked access to both)."""
    return Grade.objects.filter(lab=lab, student=student).select_related("overridden_by").first()


def course_gradebook(*, course: Course) -> Gradebook:
    """Students × labs with the final grade and its flags, in four queries; rows are read as tuples."""
    labs = labs_with_max_points(Lab.objects.filter(course=course))
    students = (
        User.objects.filter(memberships__course=course, memberships__role=Role.STUDENT, tenant_id=course.tenant_id)
        .only("id", "username", "full_name", "email")
        .order_by("full_name", "username", "id")
    )
    lab_ids = [lab.pk for lab in labs]
    grades: dict[tuple[int, int], tuple] = {
        (lab_id, student_id): (score, max_score, late, override)
        for lab_id, student_id, score, max_score, late, override in Grade.objects.filter(
            lab_id__in=lab_ids
        ).values_list("lab_id", "student_id", "score", "max_score", "late", "override_score")
    }
    attempt_counts = {
        (lab_id, student_id): n
        for lab_id, student_id, n in Attempt.objects.filter(lab__course=course)
        .values("lab_id", "student_id")
        .annotate(n=Count("id"))
        .values_list("lab_id", "student_id", "n")
    }
    rows = []
    for student in students:
        cells = []
        for lab_id in lab_ids:
            key = (lab_id, student.pk)
            score, max_score, late, override = grades.get(key, (None, None, False, None))
            cells.append(
                GradeCell(
                    final=override if override is not None else score,
                    computed=score,
                    max_score=max_score,
                    late=late,
                    overridden=override is not None,
                    attempts=attempt_counts.get(key, 0),
                )
            )
        rows.append(GradebookRow(student=student, cells=cells))
    return Gradebook(course=course, labs=labs, rows=rows)


# Characters that make spreadsheet programs read a cell as a formula (OWASP "CSV injection"), with the
# full-width forms that Japanese input methods produce.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")


def csv_text(value: object) -> str:
    """A text cell that a spreadsheet shows as text, never evaluates."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def _csv_number(value: Decimal | None) -> str:
    return "" if value is None else f"{value:.2f}"


def gradebook_csv_rows(*, course: Course) -> Iterator[list[str]]:
    """The gradebook as rows: identity columns, then per lab its final score and its flags, then the total."""
    book = course_gradebook(course=course)
    header = [_("Username"), _("Full name"), _("Email")]
    for lab in book.labs:
        title = csv_text(lab.title)
        header += [f"{title} (/{_csv_number(lab.max_points or Decimal(0))})", _("%(lab)s: flags") % {"lab": title}]
    header.append(_("Total (/%(max)s)") % {"max": _csv_number(book.max_total)})
    yield header
    late, overridden = _("late"), _("override")
    for row in book.rows:
        cells = [csv_text(row.student.username), csv_text(row.student.full_name), csv_text(row.student.email)]
        for cell in row.cells:
            flags = [flag for flag, on in ((late, cell.late), (overridden, cell.overridden)) if on]
            cells += [_csv_number(cell.final), " ".join(flags)]
        cells.append(_csv_number(row.total))
        yield cells


@dataclass(frozen=True)
class CheckPassRate:
    order: int
    title: str
    passed: int
    total: int

    @property
    def percent(self) -> int:
        return round(self.passed * 100 / self.total) if self.total else 0


def check_pass_rates(*, lab: Lab, student_ids: set[int]) -> list[CheckPassRate]:
    """Per check, how many of the students passed it in their latest scored run, of those whose run ran it."""
    # Oldest first, so that each student's later run replaces the earlier one in the dict.
    latest = dict(
        GradingRun.objects.filter(attempt__lab=lab, state=RunState.DONE, attempt__student_id__in=student_ids)
        .order_by("created_at", "id")
        .values_list("attempt__student_id", "id")
    )
    rows = (
        CheckResult.objects.filter(run_id__in=latest.values())
        .values("order", title=F("check_title"))
        .annotate(passed=Count("id", filter=Q(passed=True)), total=Count("id"))
        .order_by("order", "title")
    )
    return [CheckPassRate(**row) for row in rows]


@dataclass(frozen=True)
class DistributionBucket:
    low_percent: int
    high_percent: int
    count: int


@dataclass
class LabReport:
    lab: Lab
    max_points: Decimal
    attempts: list[Attempt]  # annotated with runs_done, runs_error
    grades: list[Grade]
    enrolled: int
    distribution: list[DistributionBucket] = field(default_factory=list)
    mean_percent: float | None = None
    median_percent: float | None = None
    regrades: list[LabRegrade] = field(default_factory=list)  # the latest lab-wide regrades, newest first
    check_rates: list[CheckPassRate] = field(default_factory=list)

    @property
    def graded(self) -> int:
        return sum(1 for g in self.grades if g.final_score is not None)

    @property
    def distribution_peak(self) -> int:
        return max((b.count for b in self.distribution), default=0)

    @property
    def distribution_bars(self) -> list[dict]:
        """Where the report's picture draws each band's bar: x, and top y and height on a 120-unit scale."""
        peak = self.distribution_peak or 1
        bars = []
        for i, bucket in enumerate(self.distribution):
            height = round(bucket.count * 120 / peak)
            bars.append({"bucket": bucket, "x": 12 + i * 40, "height": height, "y": 140 - height})
        return bars


def score_distribution(*, percents: list[float]) -> list[DistributionBucket]:
    """Counts per 10% band; 100% falls in the top band."""
    counts = [0] * 10
    for percent in percents:
        counts[min(int(max(percent, 0) // 10), 9)] += 1
    return [DistributionBucket(low_percent=i * 10, high_percent=i * 10 + 10, count=n) for i, n in enumerate(counts)]


def lab_report(*, lab: Lab) -> LabReport:
    max_points = lab_max_points(lab=lab)
    attempts = list(
        attempts_with_run_counts(Attempt.objects.filter(lab=lab).select_related("student")).order_by(
            "student__full_name", "student__username", "number", "id"
        )
    )
    enrolled_ids = set(
        Membership.objects.filter(course_id=lab.course_id, role=Role.STUDENT).values_list("user_id", flat=True)
    )
    enrolled_grades = Grade.objects.filter(lab=lab, student_id__in=enrolled_ids).select_related("student")
    grades = list(enrolled_grades.order_by("student__full_name"))
    percents = [float(g.final_score / max_points * 100) for g in grades if g.final_score is not None and max_points > 0]
    return LabReport(
        lab=lab,
        max_points=max_points,
        attempts=attempts,
        grades=grades,
        enrolled=len(enrolled_ids),
        distribution=score_distribution(percents=percents),
        mean_percent=round(statistics.fmean(percents), 1) if percents else None,
        median_percent=round(statistics.median(percents), 1) if percents else None,
        regrades=list(LabRegrade.objects.filter(lab=lab).select_related("requested_by")[:LAB_REPORT_REGRADES]),
        check_rates=check_pass_rates(lab=lab, student_ids=enrolled_ids),
    )


@dataclass(frozen=True)
class StudentLabGrade:
    lab: WithAnnotations[Lab, _MaxPoints]
    grade: Grade | None


@dataclass(frozen=True)
class StudentCourseGrades:
    course: Course
    labs: list[StudentLabGrade]


def student_grades(*, user: User) -> list[StudentCourseGrades]:
    """The user's grades in every course they take as a student (three queries)."""
    courses = list(courses_for_user(user=user, roles=(Role.STUDENT,)).order_by("code", "term"))
    labs = labs_with_max_points(Lab.objects.filter(course__in=courses))
    grades = {g.lab_id: g for g in Grade.objects.filter(student=user, lab__in=labs)}
    by_course: dict[int, list[StudentLabGrade]] = {c.pk: [] for c in courses}
    for lab in labs:
        by_course[lab.course_id].append(StudentLabGrade(lab=lab, grade=grades.get(lab.pk)))
    return [StudentCourseGrades(course=c, labs=by_course[c.pk]) for c in courses]


@dataclass
class StudentLabRuns:
    lab: Lab
    grade: Grade | None
    runs: list[GradingRun]


def student_lab_runs(*, user: User, lab: Lab) -> StudentLabRuns:
    """Every run of the user's attempts at the lab, with each check's feedback."""
    runs = runs_with_results(
        GradingRun.objects.filter(
            attempt__lab=lab, attempt__student=user, attempt__tenant_id__in=user_tenant_ids(user=user)
        ).select_related("attempt")
    )
    return StudentLabRuns(lab=lab, grade=Grade.objects.filter(lab=lab, student=user).first(), runs=runs)
