"""Attempts (one KubeVirt VM each) with their lifecycle state, and the tenants' namespaces they run in."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from labs.models.labs import Lab
from labs.wording import in_language
from portal.models import Tenant


class AttemptState(models.TextChoices):
    REQUESTED = "requested", _("Requested")
    PROVISIONING = "provisioning", _("Provisioning")
    STARTING = "starting", _("Starting")
    RUNNING = "running", _("Running")
    STOPPING = "stopping", _("Stopping")
    STOPPED = "stopped", _("Stopped")
    FAILED = "failed", _("Failed")
    EXPIRED = "expired", _("Expired")


# States in which an attempt holds (or is about to hold) a VM: they count against quotas and against the
# one-active-attempt rule.
ACTIVE_STATES = (
    AttemptState.REQUESTED,
    AttemptState.PROVISIONING,
    AttemptState.STARTING,
    AttemptState.RUNNING,
    AttemptState.STOPPING,
)
FINAL_STATES = (AttemptState.STOPPED, AttemptState.FAILED, AttemptState.EXPIRED)


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
    # The page's language when the student pressed Start: the workers write this attempt's failure reason and
    # progress messages in it (they have no request to take a language from).
    language = models.CharField(_("language"), max_length=15, blank=True)
    stop_reason = models.CharField(_("stop reason"), max_length=40, blank=True)

    requested_at = models.DateTimeField(_("requested"), default=timezone.now)
    provisioned_at = models.DateTimeField(_("VM created"), null=True, blank=True)
    pending_at = models.DateTimeField(_("VMI pending"), null=True, blank=True)
    scheduling_at = models.DateTimeField(_("VMI scheduling"), null=True, blank=True)
    scheduled_at = models.DateTimeField(_("VMI scheduled"), null=True, blank=True)
    vmi_running_at = models.DateTimeField(_("VMI running"), null=True, blank=True)
    agent_ready_at = models.DateTimeField(_("agent ready"), null=True, blank=True)
    # When a page of the student last had the attempt open (its events socket, stamped while connected): for the
    # lab's stop when left (``Lab.idle_stop_minutes``). Null until a page opened it.
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

    def time_left(self, now=None) -> timedelta | None:
        if not self.expires_at:
            return None
        return max(self.expires_at - (now or timezone.now()), timedelta(0))


class TenantNamespace(models.Model):
    """The portal's bookkeeping for a tenant's namespace on the cluster: when it was set up (and with which
    quota), and when the sync and the sweep last read it."""

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
