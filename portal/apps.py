"""App configuration for the portal's core domain."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = _("Portal")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from portal import converters, pg_timestamps, prepared

        converters.register()  # before any URLconf is loaded

        connection_created.connect(prepared.install, dispatch_uid="portal.prepared")
        connection_created.connect(pg_timestamps.install, dispatch_uid="portal.pg_timestamps")
