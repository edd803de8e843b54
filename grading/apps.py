"""App configuration for grading."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class GradingConfig(AppConfig):
    name = "grading"
    verbose_name = _("Grading")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from labs.signals import attempt_final_grading

        attempt_final_grading.connect(grade_before_teardown, dispatch_uid="grading.final")


def grade_before_teardown(sender, *, attempt, trigger: str, **kwargs) -> None:
    from grading.services import grading_run_final

    grading_run_final(attempt=attempt, trigger=trigger)
