"""App configuration for the portal's core domain."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = _("Portal")

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import pre_save
        from django.urls import register_converter

        from portal import api_tokens, converters, login_throttle, prepared
        from portal.models import User

        register_converter(converters.IdConverter, "id")  # before any URLconf is loaded

        connection_created.connect(prepared.install, dispatch_uid="portal.prepared")
        login_throttle.connect_signals()
        pre_save.connect(api_tokens.revoke_on_credentials_change, sender=User, dispatch_uid="portal.api_tokens")
