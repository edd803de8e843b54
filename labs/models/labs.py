"""Lab templates and their checks."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from labs.patterns import pattern_problem
from labs.sizes import LabSize
from portal.models import Course


class GradePolicy(models.TextChoices):
    BEST = "best", _("Best run")
    LAST = "last", _("Last run")


# A lab that stops attempts nobody has open waits at least this long: a page reloading, a laptop waking or a
# train going through a tunnel must not cost a student their VM.
IDLE_STOP_MIN_MINUTES = 5


class Lab(models.Model):
    course = models.ForeignKey(Course, verbose_name=_("course"), on_delete=models.CASCADE, related_name="labs")
    title = models.CharField(_("title"), max_length=200)
    instructions = models.TextField(_("instructions (Markdown)"), blank=True)
    image = models.CharField(
        _("VM image"), max_length=300, help_text=_("containerDisk image, e.g. quay.io/containerdisks/fedora:41")
    )
    size = models.CharField(_("size"), max_length=20, choices=LabSize.choices, default=LabSize.SMALL)
    nested_virtualization = models.BooleanField(
        _("nested virtualisation"),
        default=False,
        help_text=_("Pass the host CPU model through; only for labs that run VMs inside the VM."),
    )
    extra_cloud_init = models.TextField(
        _("extra cloud-init"), blank=True, help_text=_("A #cloud-config YAML mapping merged into the VM's cloud-init.")
    )
    time_limit_minutes = models.PositiveIntegerField(
        _("time limit (minutes)"), default=60, validators=[MinValueValidator(5), MaxValueValidator(24 * 60)]
    )
    idle_stop_minutes = models.PositiveIntegerField(
        _("stop when left (minutes)"),
        default=0,
        validators=[MaxValueValidator(24 * 60)],
        help_text=_(
            "Stop a running attempt once no page of its student has had it open for this long: its work is "
            "checked once more, then the VM and what was left in it are deleted. At least 5; 0 never stops "
            "an attempt for that."
        ),
    )
    opens_at = models.DateTimeField(_("opens"), null=True, blank=True)
    due_at = models.DateTimeField(_("due"), null=True, blank=True)
    late_penalty_percent_per_day = models.DecimalField(
        _("late penalty (% per day)"),
        max_digits=5,
        decimal_places=2,
        default=0,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
    )
    late_cutoff_at = models.DateTimeField(
        _("late cutoff"), null=True, blank=True, help_text=_("No credit for work graded after this time.")
    )
    attempt_limit = models.PositiveIntegerField(_("attempt limit"), default=0, help_text=_("0 means unlimited."))
    grade_policy = models.CharField(
        _("grade policy"), max_length=10, choices=GradePolicy.choices, default=GradePolicy.BEST
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        ordering = ["course", "due_at", "title"]
        verbose_name = _("lab")
        verbose_name_plural = _("labs")

    def __str__(self) -> str:
        return self.title

    def clean(self) -> None:
        errors: dict[str, str | Promise] = {}
        if self.opens_at and self.due_at and self.due_at < self.opens_at:
            errors["due_at"] = _("The due date must come after the opening date.")
        if self.late_cutoff_at and self.due_at and self.late_cutoff_at < self.due_at:
            errors["late_cutoff_at"] = _("The late cutoff must come after the due date.")
        if problem := extra_cloud_init_problem(self.extra_cloud_init):
            errors["extra_cloud_init"] = problem
        if 0 < self.idle_stop_minutes < IDLE_STOP_MIN_MINUTES:
            errors["idle_stop_minutes"] = _("At least %(minutes)d minutes, or 0 to never stop an attempt for that.") % {
                "minutes": IDLE_STOP_MIN_MINUTES
            }
        if errors:
            raise ValidationError(errors)

    def is_open(self, now=None) -> bool:
        now = now or timezone.now()
        if self.opens_at and now < self.opens_at:
            return False
        closes = self.late_cutoff_at or (self.due_at if not self.late_penalty_percent_per_day else None)
        return not (closes and now > closes)


def extra_cloud_init_problem(text: str) -> str:
    """Why a lab's extra cloud-init cannot be merged into its VMs' cloud-init ('' when it can): YAML, the shape of
    the keys the portal merges, size. Asked when the lab is saved and before a start."""
    from guest.cloud_init import parse_extra_cloud_config

    try:
        parse_extra_cloud_config(text)
    except ValueError as exc:
        return str(exc)
    return ""


class StdoutMatch(models.TextChoices):
    NONE = "none", _("Ignore output")
    CONTAINS = "contains", _("Output contains")
    REGEX = "regex", _("Output matches regular expression")


class Check(models.Model):
    lab = models.ForeignKey(Lab, verbose_name=_("lab"), on_delete=models.CASCADE, related_name="checks")
    order = models.PositiveIntegerField(_("order"), default=0)
    title = models.CharField(_("title"), max_length=200)
    command = models.TextField(_("command run in the guest"))
    expected_exit_code = models.IntegerField(
        _("expected exit code"), null=True, blank=True, default=0, help_text=_("Leave empty to ignore the exit code.")
    )
    stdout_match = models.CharField(
        _("output expectation"), max_length=10, choices=StdoutMatch.choices, default=StdoutMatch.NONE
    )
    stdout_pattern = models.TextField(_("output pattern"), blank=True)
    points = models.DecimalField(
        _("points"), max_digits=6, decimal_places=2, default=1, validators=[MinValueValidator(0)]
    )
    timeout_s = models.PositiveIntegerField(
        _("timeout (seconds)"), default=30, validators=[MinValueValidator(1), MaxValueValidator(600)]
    )
    hint = models.TextField(_("hint shown on failure"), blank=True)

    class Meta:
        ordering = ["lab", "order", "id"]
        verbose_name = _("check")
        verbose_name_plural = _("checks")

    def __str__(self) -> str:
        return self.title

    def clean(self) -> None:
        if self.stdout_match != StdoutMatch.NONE and not self.stdout_pattern:
            raise ValidationError({"stdout_pattern": _("Give the pattern the output is compared with.")})
        if self.stdout_match == StdoutMatch.REGEX:
            problem = pattern_problem(self.stdout_pattern)
            if problem:
                raise ValidationError({"stdout_pattern": problem})
        if self.stdout_match == StdoutMatch.NONE and self.expected_exit_code is None:
            raise ValidationError(_("A check needs an expected exit code, an output expectation, or both."))
