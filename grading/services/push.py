"""``grading.update`` messages to the attempt's channel-layer group, sent after commit and never waited for."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.utils import translation

from grading.models import CheckResult, GradingRun
from labs.models import Attempt
from labs.services.events import CLASS_CHANGED_HOLD_SECONDS, attempt_group, lab_class_group, send_to_group

logger = logging.getLogger(__name__)


def push_run_on_commit(*, run: GradingRun, results: Sequence[CheckResult] | None = None) -> None:
    """After commit, send the run's payload in every language (``runs``, and ``run`` in the default one) to
    ``attempt-<id>``; ``results`` saves reading them when the caller holds them."""
    run_id, attempt_id = run.pk, run.attempt_id
    attempt = run.attempt if GradingRun._meta.get_field("attempt").is_cached(run) else None
    lab_id = attempt.lab_id if attempt is not None and "lab_id" not in attempt.get_deferred_fields() else None

    def push() -> None:
        from grading.selectors import grading_run_payload

        try:
            if results is None:
                fresh = GradingRun.objects.filter(pk=run_id).prefetch_related("results").first()
                if fresh is None:
                    return
                source, rows = fresh, None
            else:
                source, rows = run, results
            payloads = {}
            for language, _name in settings.LANGUAGES:
                with translation.override(language):
                    payloads[language] = grading_run_payload(source, results=rows)
            default = payloads.get(settings.LANGUAGE_CODE) or next(iter(payloads.values()))
            send_to_group(attempt_group(attempt_id), {"type": "grading.update", "run": default, "runs": payloads})
        except Exception:
            # The run is stored whatever happens here; the page shows it on its next load.
            logger.warning("grading run %s: could not push the update to attempt-%s", run_id, attempt_id, exc_info=True)
        try:
            # The lab's class views show the last Check's score and what still fails.
            lab = lab_id or Attempt.objects.filter(pk=attempt_id).values_list("lab_id", flat=True).first()
            if lab is not None:
                send_to_group(lab_class_group(lab), {"type": "class.changed"}, hold=CLASS_CHANGED_HOLD_SECONDS)
        except Exception:
            logger.warning("grading run %s: could not tell the class view", run_id, exc_info=True)

    transaction.on_commit(push)
