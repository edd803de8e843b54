"""Warm pools: a lab's policy for keeping VMs booted ahead of its students' Starts, and the pool's VMs."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from labs.models import Attempt, Lab
from labs.wording import in_language
from portal.models import Tenant

# Past this a pool is a fleet: the tenant's quota bounds it anyway.
POOL_MAX_SIZE = 500


class PoolMode(models.TextChoices):
    OFF = "off", _("Off")
    ALWAYS = "always", _("Always warm")
    SCHEDULED = "scheduled", _("Scheduled")


class LabPool(models.Model):
    """How many VMs of a lab to keep booted and when. Misses are counted here; hits are the claimed pool VMs."""

    lab = models.OneToOneField(Lab, verbose_name=_("lab"), on_delete=models.CASCADE, related_name="pool")
    mode = models.CharField(_("warm pool"), max_length=10, choices=PoolMode.choices, default=PoolMode.OFF)
    size = models.PositiveIntegerField(_("VMs kept ready"), default=0, validators=[MaxValueValidator(POOL_MAX_SIZE)])
    starts_at = models.DateTimeField(_("warm from"), null=True, blank=True)
    ends_at = models.DateTimeField(_("warm until"), null=True, blank=True)
    # Starts of the lab that found no ready pool VM while the pool was meant to be warm.
    misses = models.PositiveIntegerField(_("misses"), default=0, editable=False)
    # The figures of pool VM rows pruned after POOL_VM_RETENTION_DAYS: their hits and idle VM-seconds.
    pruned_hits = models.PositiveIntegerField(default=0, editable=False)
    pruned_idle_seconds = models.FloatField(default=0.0, editable=False)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("warm pool")
        verbose_name_plural = _("warm pools")

    def __str__(self) -> str:
        return str(self.lab)

    def clean(self) -> None:
        if self.mode == PoolMode.SCHEDULED:
            if not self.starts_at or not self.ends_at:
                raise ValidationError(_("A scheduled pool needs a start and an end."))
            if self.ends_at <= self.starts_at:
                raise ValidationError({"ends_at": _("The end must come after the start.")})
            if self.ends_at <= timezone.now():
                raise ValidationError(
                    {"ends_at": _("This time has passed, so the pool would keep no VM ready: give a later end.")}
                )
        if self.mode != PoolMode.OFF and not self.size:
            raise ValidationError({"size": _("Give the number of VMs to keep ready, or switch the pool off.")})

    def target(self, now: datetime) -> int:
        """How many unclaimed VMs the pool should hold now: none when off, outside its schedule or the lab closed."""
        # A scheduled pool warms up before the lab opens (the class begins at the opening): that is not "closed".
        opens_later = bool(self.lab.opens_at and now < self.lab.opens_at)
        if self.mode == PoolMode.OFF or not self.lab.is_open(now) and not opens_later:
            return 0
        if self.mode == PoolMode.SCHEDULED:
            if not self.starts_at or not self.ends_at or not self.starts_at <= now < self.ends_at:
                return 0
        return self.size


def pool_vm_recipe(lab: Lab) -> str:
    """A digest of the lab's settings that go into its VMs: image, size, CPU model, extra cloud-init."""
    recipe = json.dumps([lab.image, lab.size, lab.nested_virtualization, lab.extra_cloud_init])
    return hashlib.sha256(recipe.encode("utf-8")).hexdigest()


class PoolVmState(models.TextChoices):
    BOOTING = "booting", _("Booting")
    READY = "ready", _("Ready")
    CLAIMED = "claimed", _("Claimed")
    DELETED = "deleted", _("Deleted")


# Unclaimed pool VMs: they hold the tenant's quota.
POOL_HOLDING_STATES = (PoolVmState.BOOTING, PoolVmState.READY)


class PoolVm(models.Model):
    """One VM of a lab's warm pool, booted with a pool token until an attempt claims it."""

    pool = models.ForeignKey(LabPool, verbose_name=_("pool"), on_delete=models.CASCADE, related_name="vms")
    # Denormalised from pool.lab.course.tenant: the claim and the quota filter on it.
    tenant = models.ForeignKey(Tenant, verbose_name=_("tenant"), on_delete=models.CASCADE, related_name="pool_vms")
    lab = models.ForeignKey(Lab, verbose_name=_("lab"), on_delete=models.CASCADE, related_name="pool_vms")
    state = models.CharField(
        _("state"), max_length=10, choices=PoolVmState.choices, default=PoolVmState.BOOTING, db_index=True
    )
    vm_name = models.CharField(_("VM name"), max_length=63, blank=True)
    namespace = models.CharField(_("namespace"), max_length=63)
    # What the VM was made from (``pool_vm_recipe``): one made before the lab's VM settings changed is not claimed.
    recipe = models.CharField(max_length=64, blank=True)
    # The token the VM booted with; replaced in the guest by the attempt's at the claim.
    agent_token = models.CharField(max_length=128, editable=False)
    vcpus = models.PositiveIntegerField(_("vCPUs"))
    memory_mib = models.PositiveIntegerField(_("guest memory (MiB)"))
    launcher_memory_mib = models.PositiveIntegerField(_("requested memory (MiB)"))
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    vmi_running_at = models.DateTimeField(_("VMI running"), null=True, blank=True)
    ready_at = models.DateTimeField(_("agent ready"), null=True, blank=True)
    # When its agent was last asked: a ready VM is asked only every POOL_READY_CHECK_SECONDS.
    checked_at = models.DateTimeField(_("agent last asked"), null=True, blank=True)
    claimed_at = models.DateTimeField(_("claimed"), null=True, blank=True)
    ended_at = models.DateTimeField(_("deleted"), null=True, blank=True)
    attempt = models.OneToOneField(
        Attempt, verbose_name=_("attempt"), null=True, blank=True, on_delete=models.SET_NULL, related_name="pool_vm"
    )
    end_reason = models.CharField(_("why it ended"), max_length=40, blank=True)
    # What the cluster says keeps it from booting (or why its VMI failed), in each language; empty while all is well.
    problem_texts = models.JSONField(_("cluster problem in each language"), default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name = _("pool VM")
        verbose_name_plural = _("pool VMs")
        indexes = [models.Index(fields=["lab", "state"], name="poolvm_lab_state")]

    def __str__(self) -> str:
        return self.vm_name or f"pool VM {self.pk}"

    @property
    def problem(self) -> str:
        return in_language(self.problem_texts, next(iter(self.problem_texts.values()), ""))

    def idle_seconds(self, now: datetime) -> float:
        """How long it was up unclaimed: from creation to its claim or deletion (or now)."""
        end = self.claimed_at or self.ended_at or now
        return max(0.0, (end - self.created_at).total_seconds())
