"""App configuration for grading."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class GradingConfig(AppConfig):
    name = "grading"
    verbose_name = _("Grading")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from labs.signals import attempt_final_grading, attempt_socket_opened

        attempt_final_grading.connect(grade_before_teardown, dispatch_uid="grading.final")
        attempt_socket_opened.connect(latest_run_message, dispatch_uid="grading.latest_run")


def grade_before_teardown(sender, *, attempt, trigger: str, **kwargs) -> None:
    from grading.services import grading_run_final

    grading_run_final(attempt=attempt, trigger=trigger)


def latest_run_message(sender, *, attempt, **kwargs) -> list[dict]:
    """The attempt's latest run for its newly opened events socket (none before its agent answered)."""
    from grading.selectors import grading_run_payload

    if attempt.agent_ready_at is None:
        return []
    run = attempt.runs.prefetch_related("results").order_by("-created_at", "-id").first()
    return [] if run is None else [{"type": "grading.update", "run": grading_run_payload(run)}]
