"""The portal's bookkeeping for each tenant's namespace on the cluster."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from portal.models import Tenant


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
