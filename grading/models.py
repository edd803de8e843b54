"""Grading runs, per-check results, and the grade per student and lab (with an instructor override)."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from grading.evaluation import apply_penalty, pattern_timeout_feedback
from labs.models import Attempt, Check, Lab

# Messages for GradingRun.error_code, as students and staff read them; the technical detail stays in ``error``.
RUN_ERROR_MESSAGES = {
    "vm_not_running": _("The lab's virtual machine is not running."),
    "attempt_not_running": _("The attempt was not running any more when its checks were due."),
    "agent_not_answering": _(
        "The grading agent in the virtual machine is not answering. Wait a moment and check again."
    ),
    "agent_timeout": _("The checks did not finish in time."),
    "agent_token_rejected": _("The grading agent refused the portal's credentials. Ask your instructor for help."),
    "agent_busy": _("The grading agent is busy. Check again in a few seconds."),
    "agent_bad_response": _("The grading agent gave an answer the portal could not read."),
    "cluster_unavailable": _("The cluster could not be reached. Try again later."),
    "no_checks": _("This lab has no checks to run."),
    "interrupted": _("The check was interrupted before it finished. Check again."),
    "replaced_by_final_run": _("Replaced by the final check when the attempt ended."),
    "time_limit": _("The checks did not finish in time."),
    "internal_error": _("The portal failed while checking. Check again, or ask your instructor."),
    "queue_unavailable": _("The check could not be queued. Try again in a minute."),
}


class RunState(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    ERROR = "error", _("Error")


class RunTrigger(models.TextChoices):
    STUDENT = "student", _("Student pressed Check")
    EXPIRY = "expiry", _("Final run at expiry")
    STOP = "stop", _("Final run at stop")
    REGRADE = "regrade", _("Regrade")
    STAFF = "staff", _("Run by staff")


class GradingRun(models.Model):
    attempt = models.ForeignKey(Attempt, verbose_name=_("attempt"), on_delete=models.CASCADE, related_name="runs")
    state = models.CharField(_("state"), max_length=10, choices=RunState.choices, default=RunState.QUEUED)
    trigger = models.CharField(_("trigger"), max_length=10, choices=RunTrigger.choices, default=RunTrigger.STUDENT)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("requested by"),
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    # A regrade re-evaluates the stored outputs of this run against the current checks.
    regrade_of = models.ForeignKey(
        "self", verbose_name=_("regrade of"), on_delete=models.SET_NULL, null=True, blank=True, related_name="regrades"
    )
    created_at = models.DateTimeField(_("requested"), auto_now_add=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    # When the guest produced the outputs this run scores: lateness is judged on it. A regrade re-evaluates old
    # outputs, so it carries the original run's time rather than its own.
    measured_at = models.DateTimeField(_("work measured at"), null=True, blank=True)
    score = models.DecimalField(_("score"), max_digits=8, decimal_places=2, null=True, blank=True)
    max_score = models.DecimalField(_("max score"), max_digits=8, decimal_places=2, null=True, blank=True)
    late_penalty_percent = models.DecimalField(
        _("late penalty (%)"), max_digits=5, decimal_places=2, default=Decimal("0")
    )
    # A stable cause (e.g. "vm_not_running", "agent_timeout") shown to people through a translated message;
    # ``error`` keeps the technical detail for staff.
    error_code = models.CharField(_("error code"), max_length=40, blank=True)
    error = models.TextField(_("error"), blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("grading run")
        verbose_name_plural = _("grading runs")
        constraints = [
            models.UniqueConstraint(
                fields=["attempt"],
                condition=Q(state__in=["queued", "running"]),
                name="grading_one_unfinished_run_per_attempt",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.attempt} run {self.pk} ({self.state})"

    @property
    def is_finished(self) -> bool:
        return self.state in (RunState.DONE, RunState.ERROR)

    @property
    def error_message(self) -> str:
        """The failure in plain, translated words (the technical detail stays in ``error``)."""
        if not self.error_code and not self.error:
            return ""
        return str(RUN_ERROR_MESSAGES.get(self.error_code, _("The check could not be completed.")))

    @property
    def effective_score(self) -> Decimal | None:
        """The raw score less the late penalty (``score`` holds the points earned, before any penalty)."""
        if self.score is None:
            return None
        return apply_penalty(score=self.score, penalty_percent=self.late_penalty_percent)


class CheckResult(models.Model):
    run = models.ForeignKey(GradingRun, verbose_name=_("run"), on_delete=models.CASCADE, related_name="results")
    check_ref = models.ForeignKey(
        Check, verbose_name=_("check"), on_delete=models.SET_NULL, null=True, blank=True, related_name="results"
    )
    check_title = models.CharField(_("check"), max_length=200)
    order = models.PositiveIntegerField(_("order"), default=0)
    passed = models.BooleanField(_("passed"), default=False)
    points = models.DecimalField(_("points"), max_digits=6, decimal_places=2, default=Decimal("0"))
    max_points = models.DecimalField(_("max points"), max_digits=6, decimal_places=2, default=Decimal("0"))
    exit_code = models.IntegerField(_("exit code"), null=True, blank=True)
    timed_out = models.BooleanField(_("timed out"), default=False)
    stdout = models.TextField(_("output"), blank=True)
    stderr = models.TextField(_("errors"), blank=True)
    output_truncated = models.BooleanField(_("output truncated"), default=False)
    duration_ms = models.PositiveIntegerField(_("duration (ms)"), default=0)
    feedback = models.TextField(_("feedback"), blank=True)
    # The words for this case are put together when read, in the reader's language (feedback_text).
    pattern_timeout_seconds = models.FloatField(
        _("pattern time limit (s)"),
        null=True,
        blank=True,
        help_text=_("Set when the expected-output pattern ran out of time: the check was not judged."),
    )

    class Meta:
        ordering = ["run", "order", "id"]
        verbose_name = _("check result")
        verbose_name_plural = _("check results")

    def __str__(self) -> str:
        return f"{self.check_title}: {'pass' if self.passed else 'fail'}"

    @property
    def feedback_text(self) -> str:
        """What the student reads under the check, in the active language: nothing on a pass, else the hint, a
        default, or why it was not judged."""
        if self.passed:
            return ""
        if self.pattern_timeout_seconds is not None:
            return pattern_timeout_feedback(self.pattern_timeout_seconds)
        return self.feedback or str(_("This check did not pass."))


class Grade(models.Model):
    lab = models.ForeignKey(Lab, verbose_name=_("lab"), on_delete=models.CASCADE, related_name="grades")
    student = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("student"), on_delete=models.CASCADE, related_name="grades"
    )
    source_run = models.ForeignKey(
        GradingRun, verbose_name=_("counted run"), on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    score = models.DecimalField(_("score"), max_digits=8, decimal_places=2, null=True, blank=True)
    max_score = models.DecimalField(_("max score"), max_digits=8, decimal_places=2, null=True, blank=True)
    late = models.BooleanField(_("late"), default=False)
    override_score = models.DecimalField(_("override score"), max_digits=8, decimal_places=2, null=True, blank=True)
    override_reason = models.TextField(_("override reason"), blank=True)
    overridden_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("overridden by"),
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    overridden_at = models.DateTimeField(_("overridden at"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        ordering = ["lab", "student"]
        verbose_name = _("grade")
        verbose_name_plural = _("grades")
        constraints = [models.UniqueConstraint(fields=["lab", "student"], name="grade_unique_lab_student")]

    def __str__(self) -> str:
        return f"{self.student} — {self.lab}: {self.final_score}"

    @property
    def is_overridden(self) -> bool:
        return self.override_score is not None

    @property
    def final_score(self) -> Decimal | None:
        return self.override_score if self.override_score is not None else self.score


class LabRegrade(models.Model):
    """A lab-wide regrade that staff asked for, carried out by a Celery task; its outcome shows on the lab report."""

    lab = models.ForeignKey(Lab, verbose_name=_("lab"), on_delete=models.CASCADE, related_name="lab_regrades")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("requested by"),
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    # queued until the task has done the whole regrade (in one transaction), then done or error; never running.
    state = models.CharField(_("state"), max_length=10, choices=RunState.choices, default=RunState.QUEUED)
    attempts_requested = models.PositiveIntegerField(_("attempts to regrade"), default=0)
    attempts_regraded = models.PositiveIntegerField(_("attempts regraded"), default=0)
    runs_reevaluated = models.PositiveIntegerField(_("runs re-evaluated"), default=0)
    runs_queued = models.PositiveIntegerField(_("runs in the guest"), default=0)
    error = models.TextField(_("error"), blank=True)
    created_at = models.DateTimeField(_("requested"), auto_now_add=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("lab regrade")
        verbose_name_plural = _("lab regrades")

    def __str__(self) -> str:
        return f"{self.lab} regrade {self.pk} ({self.state})"
