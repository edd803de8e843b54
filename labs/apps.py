"""App configuration for labs and attempts."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class LabsConfig(AppConfig):
    name = "labs"
    verbose_name = _("Labs")

    def ready(self) -> None:
        from labs import checks  # noqa: F401  (registers the cluster preflight as a deploy check)
