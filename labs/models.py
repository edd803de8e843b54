"""Labs with their checks, attempts (one KubeVirt VM each) and tenant namespaces; warm pools are labs.pool_models'."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from labs.patterns import pattern_problem
from labs.sizes import LabSize
from labs.wording import in_language
from portal.models import Course, Tenant


class GradePolicy(models.TextChoices):
    BEST = "best", _("Best run")
    LAST = "last", _("Last run")


# A lab that stops attempts nobody has open waits at least this long: a page reloading, a laptop waking or a
# train going through a tunnel must not cost a student their VM.
IDLE_STOP_MIN_MINUTES = 5
# [registry[:port]/]path[:tag][@digest], as container runtimes parse an image; anything else never pulls.
IMAGE_REFERENCE = RegexValidator(
    r"\A(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,})?\Z",
    _("Give an image such as quay.io/containerdisks/fedora:41: lower-case letters, digits and . _ - / : @, no spaces."),
)


class Lab(models.Model):
    course = models.ForeignKey(Course, verbose_name=_("course"), on_delete=models.CASCADE, related_name="labs")
    title = models.CharField(_("title"), max_length=200)
    instructions = models.TextField(
        _("instructions (Markdown)"),
        blank=True,
        help_text=_(
            "Headings, lists, tables, code blocks (students get Copy and Run in terminal on each), links and "
            "images. Other HTML (scripts, styles, forms, frames) and javascript: links are removed."
        ),
    )
    image = models.CharField(
        _("VM image"),
        max_length=300,
        validators=[IMAGE_REFERENCE],
        help_text=_("containerDisk image, e.g. quay.io/containerdisks/fedora:41"),
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
    """Why a lab's extra cloud-init cannot be merged into its VMs' ('' when it can); asked at save and at start."""
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
    command = models.TextField(
        _("command run in the guest"),
        help_text=_(
            "Run by bash as root in /home/student (also $HOME), with no input, and stopped at the timeout, which "
            "fails the check. To run a command as the student: runuser -u student -- COMMAND"
        ),
    )
    expected_exit_code = models.IntegerField(
        _("expected exit code"), null=True, blank=True, default=0, help_text=_("Leave empty to ignore the exit code.")
    )
    stdout_match = models.CharField(
        _("output expectation"), max_length=10, choices=StdoutMatch.choices, default=StdoutMatch.NONE
    )
    stdout_pattern = models.TextField(
        _("output pattern"),
        blank=True,
        help_text=_(
            "Compared with standard output only (never standard error). Contains: this exact text, case included. "
            "Regular expression: Python's syntax, found anywhere in the output; ^ and $ match at each line."
        ),
    )
    points = models.DecimalField(
        _("points"), max_digits=6, decimal_places=2, default=1, validators=[MinValueValidator(0)]
    )
    timeout_s = models.PositiveIntegerField(
        _("timeout (seconds)"), default=30, validators=[MinValueValidator(1), MaxValueValidator(600)]
    )
    hint = models.TextField(
        _("hint shown on failure"),
        blank=True,
        help_text=_("What the student reads when the check fails; without a hint: “This check did not pass.”"),
    )

    class Meta:
        ordering = ["lab", "order", "id"]
        verbose_name = _("check")
        verbose_name_plural = _("checks")

    def __str__(self) -> str:
        return self.title

    def clean(self) -> None:
        if self.stdout_match != StdoutMatch.NONE and not self.stdout_pattern:
            raise ValidationError({"stdout_pattern": _("Give the pattern the output is compared with.")})
        if self.stdout_match == StdoutMatch.NONE and self.stdout_pattern:
            raise ValidationError(
                {"stdout_match": _("Choose how the output is compared with the pattern, or clear it.")}
            )
        if self.stdout_match == StdoutMatch.REGEX and (problem := pattern_problem(self.stdout_pattern)):
            raise ValidationError({"stdout_pattern": problem})
        if self.stdout_match == StdoutMatch.NONE and self.expected_exit_code is None:
            raise ValidationError(_("A check needs an expected exit code, an output expectation, or both."))


class AttemptState(models.TextChoices):
    REQUESTED = "requested", _("Requested")
    PROVISIONING = "provisioning", _("Provisioning")
    STARTING = "starting", _("Starting")
    RUNNING = "running", _("Running")
    STOPPING = "stopping", _("Stopping")
    STOPPED = "stopped", _("Stopped")
    FAILED = "failed", _("Failed")
    EXPIRED = "expired", _("Expired")


FINAL_STATES = (AttemptState.STOPPED, AttemptState.FAILED, AttemptState.EXPIRED)
# States in which an attempt holds (or is about to hold) a VM: counted by the quotas and the one-active rule.
ACTIVE_STATES = tuple(state for state in AttemptState if state not in FINAL_STATES)


class Attempt(models.Model):
    lab = models.ForeignKey(Lab, verbose_name=_("lab"), on_delete=models.PROTECT, related_name="attempts")
    student = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("student"), on_delete=models.PROTECT, related_name="attempts"
    )
    # Denormalised from lab.course.tenant: quota checks and scoping read it without joins.
    tenant = models.ForeignKey(Tenant, verbose_name=_("tenant"), on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField(_("attempt number"), default=1)
    state = models.CharField(
        _("state"), max_length=20, choices=AttemptState.choices, default=AttemptState.REQUESTED, db_index=True
    )
    # Server-generated, deterministic from the id (see labs.kubevirt.names); never from user input.
    vm_name = models.CharField(_("VM name"), max_length=63, blank=True)
    namespace = models.CharField(_("namespace"), max_length=63, blank=True)
    agent_token = models.CharField(max_length=128, blank=True, editable=False)
    vcpus = models.PositiveIntegerField(_("vCPUs"), default=1)
    memory_mib = models.PositiveIntegerField(_("guest memory (MiB)"), default=2048)
    launcher_cpu_millicores = models.PositiveIntegerField(_("requested CPU (millicores)"), default=0)
    launcher_memory_mib = models.PositiveIntegerField(_("requested memory (MiB)"), default=0)

    phase = models.CharField(_("VMI phase"), max_length=30, blank=True)
    node_name = models.CharField(_("node"), max_length=253, blank=True)
    failure_reason = models.TextField(_("failure reason"), blank=True)
    # The same in each of the portal's languages, {code: text} (labs.wording); shown in the reader's language.
    failure_reason_texts = models.JSONField(_("failure reason in each language"), default=dict, blank=True)
    # The page's language at Start: the workers, who have no request, write this attempt's messages in it.
    language = models.CharField(_("language"), max_length=15, blank=True)
    stop_reason = models.CharField(_("stop reason"), max_length=40, blank=True)

    requested_at = models.DateTimeField(_("requested"), default=timezone.now)
    provisioned_at = models.DateTimeField(_("VM created"), null=True, blank=True)
    pending_at = models.DateTimeField(_("VMI pending"), null=True, blank=True)
    scheduling_at = models.DateTimeField(_("VMI scheduling"), null=True, blank=True)
    scheduled_at = models.DateTimeField(_("VMI scheduled"), null=True, blank=True)
    vmi_running_at = models.DateTimeField(_("VMI running"), null=True, blank=True)
    agent_ready_at = models.DateTimeField(_("agent ready"), null=True, blank=True)
    # When a page of the student last had it open (its events socket stamps it), for ``Lab.idle_stop_minutes``.
    last_seen_at = models.DateTimeField(_("last seen open"), null=True, blank=True)
    stopping_at = models.DateTimeField(_("stopping"), null=True, blank=True)
    ended_at = models.DateTimeField(_("ended"), null=True, blank=True)
    # The VMI the attempt is following; a different one after Running means the VM restarted (its disk reset).
    vmi_uid = models.CharField(_("VMI uid"), max_length=64, blank=True)
    # What the cluster says while the VM is not running yet (no room, image pull trouble), shown as progress.
    status_message = models.TextField(_("cluster message"), blank=True)
    status_message_texts = models.JSONField(_("cluster message in each language"), default=dict, blank=True)
    # When the portal asked the cluster to delete the VM; the attempt ends once the VMI is gone.
    vm_deleted_at = models.DateTimeField(_("VM deletion requested"), null=True, blank=True)
    # Claimed before the final grading run at stop or expiry, so a redelivered task never grades twice.
    final_grading_at = models.DateTimeField(_("final grading started"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True, db_index=True)
    extensions = models.PositiveIntegerField(_("extensions"), default=0)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        constraints = [
            models.UniqueConstraint(
                fields=["lab", "student"],
                condition=Q(state__in=[s.value for s in ACTIVE_STATES]),
                name="attempt_one_active_per_student_lab",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "state"], name="attempt_tenant_state"),
            models.Index(fields=["lab", "student", "-requested_at"], name="attempt_lab_student_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.lab} #{self.number} — {self.student}"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def failure_reason_shown(self) -> str:
        """Why the attempt failed, in the active language (the reader's) when it was written in it."""
        return in_language(self.failure_reason_texts, self.failure_reason)

    @property
    def status_message_shown(self) -> str:
        """What the cluster is waiting for, in the active language when it was written in it."""
        return in_language(self.status_message_texts, self.status_message)

    def time_left(self) -> timedelta | None:
        if not self.expires_at:
            return None
        return max(self.expires_at - timezone.now(), timedelta(0))


class TenantNamespace(models.Model):
    """The portal's bookkeeping for a tenant's namespace: when it was set up, when sync and sweep last read it."""

    tenant = models.OneToOneField(
        Tenant, verbose_name=_("tenant"), on_delete=models.CASCADE, related_name="cluster_namespace"
    )
    namespace = models.CharField(_("namespace"), max_length=63, unique=True)
    bootstrapped_at = models.DateTimeField(_("set up"), null=True, blank=True)
    # A digest of the namespace objects last applied; a change in the tenant's quotas re-applies them.
    bootstrap_digest = models.CharField(max_length=64, blank=True)
    listed_at = models.DateTimeField(_("VMIs last listed"), null=True, blank=True)
    swept_at = models.DateTimeField(_("last swept"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    last_error_at = models.DateTimeField(_("last error at"), null=True, blank=True)

    class Meta:
        ordering = ["namespace"]
        verbose_name = _("tenant namespace")
        verbose_name_plural = _("tenant namespaces")

    def __str__(self) -> str:
        return self.namespace


# Last: the pool models import Lab and Attempt from this module.
from labs.pool_models import LabPool, PoolMode, PoolVm, PoolVmState  # noqa: E402, F401
