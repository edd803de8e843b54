"""App configuration for what reads several apps: dashboards, health probes, metrics and the demo data."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = _("Operations")
