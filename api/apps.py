"""App configuration for the REST API: connects the login guard to Django's authentication signals."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = _("API")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from api import login_guard

        login_guard.connect_signals()
