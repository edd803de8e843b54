"""Prometheus metrics at ``/metrics``, gathered at scrape time from the database and Redis so that web, worker
and beat are all counted. The families and their access are listed in ``deploy/README.md`` (Metrics)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from grading.models import GradingRun, RunState
from labs.models import Attempt, AttemptState
from labs.services.stopping import StopReason
from ops.histograms import duration_histograms
from ops.pool_metrics import pool_families
from portal.metrics import (
    CLUSTER_API_ERRORS_KEY,
    CONSOLE_SESSIONS_KEY,
    REQUEST_FAILURE_REASONS,
    REQUEST_FAILURES_KEY,
    counters,
)
from portal.models import Tenant

logger = logging.getLogger(__name__)

METRICS_WINDOW_SECONDS = 3600

# Always exported, so that a reason's series exists (at 0) before its first stop.
STOP_REASONS = (StopReason.STUDENT, StopReason.STAFF, StopReason.EXPIRED, StopReason.LEFT)
START_PHASES: dict[str, tuple[str, str]] = {
    # phase label: (start timestamp field, end timestamp field) on Attempt
    "provision": ("requested_at", "provisioned_at"),
    "pending": ("provisioned_at", "pending_at"),
    "scheduling": ("pending_at", "scheduling_at"),
    "scheduled": ("scheduling_at", "scheduled_at"),
    "boot": ("scheduled_at", "vmi_running_at"),
    "agent": ("vmi_running_at", "agent_ready_at"),
    "total": ("requested_at", "agent_ready_at"),
}
START_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
GRADING_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class PortalCollector(Collector):
    """Reads attempts, grading runs, the sync heartbeat and the shared counters when Prometheus scrapes."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        sources = {
            "attempts": self._attempts,
            "start_phases": self._start_phases,
            "grading": self._grading,
            "sync": self._sync,
            "counters": self._counters,
            "pools": pool_families,
        }
        up = GaugeMetricFamily(
            "portal_metrics_source_up",
            "1 when the source of a metric family could be read at this scrape, else 0.",
            labels=["source"],
        )
        for name, part in sources.items():
            try:
                # Collected into a list first, so a source failing half-way yields none of its families.
                families = list(part(now))
            except Exception:  # one broken source must not hide the others
                logger.exception("Metrics: reading %s failed", name)
                up.add_metric([name], 0)
            else:
                up.add_metric([name], 1)
                yield from families
        yield up

    def _attempts(self, now) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "portal_attempts", "Attempts by tenant namespace and state.", labels=["tenant", "state"]
        )
        rows = list(Attempt.objects.values("tenant_id", "state").annotate(n=Count("id")).order_by())
        namespaces = dict(
            Tenant.objects.filter(id__in={row["tenant_id"] for row in rows}).values_list("id", "namespace")
        )
        totals = {state.value: 0 for state in AttemptState}
        for row in rows:
            family.add_metric([namespaces.get(row["tenant_id"], ""), row["state"]], row["n"])
            totals[row["state"]] = totals.get(row["state"], 0) + row["n"]
        yield family
        overall = GaugeMetricFamily("portal_attempts_by_state", "Attempts by state, all tenants.", labels=["state"])
        for state, value in totals.items():
            overall.add_metric([state], value)
        yield overall
        stopped = CounterMetricFamily(
            "portal_attempts_stopped",
            "Attempts stopped, by reason: student or staff (Stop), expired (time limit), "
            "left (no page of the student had it open for the lab's limit).",
            labels=["reason"],
        )
        reasons = {reason: 0 for reason in STOP_REASONS}
        for reason, count in (
            Attempt.objects.exclude(stop_reason="").values_list("stop_reason").annotate(n=Count("id")).order_by()
        ):
            reasons[reason] = reasons.get(reason, 0) + count
        for reason, value in reasons.items():
            stopped.add_metric([reason], value)
        yield stopped

    def _start_phases(self, now) -> Iterator[Metric]:
        window_start = now - timedelta(seconds=METRICS_WINDOW_SECONDS)
        histograms = duration_histograms(
            Attempt.objects.filter(requested_at__gte=window_start), spans=START_PHASES, buckets=START_BUCKETS
        )
        family = HistogramMetricFamily(
            "portal_attempt_phase_seconds",
            "Start latency per phase of the attempts requested in the last hour (provision: request to VM "
            "created; pending/scheduling/scheduled/boot: VMI phases; agent: VMI running to agent ready; total: "
            "request to running). VMI phase times come from the cluster in whole seconds; a span that reads "
            "negative because of that counts as 0.",
            labels=["phase"],
        )
        for phase, (series, total, _count) in histograms.items():
            family.add_metric([phase], buckets=series, sum_value=total)
        yield family

    def _grading(self, now) -> Iterator[Metric]:
        finished = CounterMetricFamily(
            "portal_grading_runs", "Finished grading runs by outcome and trigger.", labels=["outcome", "trigger"]
        )
        unfinished = GaugeMetricFamily(
            "portal_grading_runs_unfinished", "Grading runs queued or running.", labels=["state"]
        )
        pending = {RunState.QUEUED.value: 0, RunState.RUNNING.value: 0}
        for row in GradingRun.objects.values("state", "trigger").annotate(n=Count("id")).order_by():
            if row["state"] in pending:
                pending[row["state"]] += row["n"]
            else:
                finished.add_metric([row["state"], row["trigger"]], row["n"])
        for state, value in pending.items():
            unfinished.add_metric([state], value)
        yield finished
        yield unfinished

        recent = GradingRun.objects.filter(finished_at__gte=now - timedelta(seconds=METRICS_WINDOW_SECONDS))
        run_seconds = HistogramMetricFamily(
            "portal_grading_run_seconds",
            "Duration (started to finished) of the grading runs that finished in the last hour, by outcome.",
            labels=["outcome"],
        )
        for outcome in (RunState.DONE, RunState.ERROR):
            series, total, _count = duration_histograms(
                recent.filter(state=outcome), spans={"run": ("started_at", "finished_at")}, buckets=GRADING_BUCKETS
            )["run"]
            run_seconds.add_metric([outcome.value], buckets=series, sum_value=total)
        yield run_seconds
        series, total, _count = duration_histograms(
            recent, spans={"queue": ("created_at", "started_at")}, buckets=GRADING_BUCKETS
        )["queue"]
        queue_seconds = HistogramMetricFamily(
            "portal_grading_queue_seconds",
            "Wait from request to start of the grading runs that finished in the last hour.",
        )
        queue_seconds.add_metric([], buckets=series, sum_value=total)
        yield queue_seconds

    def _sync(self, now) -> Iterator[Metric]:
        from labs.sync_health import sync_heartbeat

        beat = sync_heartbeat()
        if beat.last_success is not None:
            yield GaugeMetricFamily(
                "portal_sync_last_success_timestamp_seconds",
                "When the attempt sync loop last finished a pass (Unix time).",
                value=beat.last_success.timestamp(),
            )
        if beat.last_error_at is not None:
            yield GaugeMetricFamily(
                "portal_sync_last_error_timestamp_seconds",
                "When an attempt sync pass last failed (Unix time).",
                value=beat.last_error_at.timestamp(),
            )

    def _counters(self, now) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "portal_cluster_api_errors",
            "Failed calls to the cluster API, all processes.",
            labels=["operation", "reason"],
        )
        for field, value in sorted(counters.read(CLUSTER_API_ERRORS_KEY).items()):
            operation, _sep, reason = field.partition("|")
            errors.add_metric([operation, reason], value)
        yield errors
        failures = CounterMetricFamily(
            "portal_requests_failed",
            "HTTP requests that failed inside the portal, by answer: portal_busy (503, no database connection in "
            "time) or server_error (500), all processes.",
            labels=["reason"],
        )
        failed = counters.read(REQUEST_FAILURES_KEY)
        for reason in REQUEST_FAILURE_REASONS:
            failures.add_metric([reason], failed.get(reason, 0))
        yield failures
        console = counters.read(CONSOLE_SESSIONS_KEY)
        opened, closed = console.get("opened", 0), console.get("closed", 0)
        yield CounterMetricFamily("portal_console_sessions_opened", "Browser console sessions opened.", value=opened)
        yield GaugeMetricFamily(
            "portal_console_sessions_active", "Browser console sessions open now.", value=max(0, opened - closed)
        )


registry = CollectorRegistry(auto_describe=False)
registry.register(PortalCollector())


def metrics_authorized(request: HttpRequest) -> bool:
    """A superuser's session, or the bearer token from METRICS_TOKEN (compared in constant time)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_active and user.is_superuser:
        return True
    token = settings.METRICS_TOKEN
    if not token:
        return False
    scheme, _sep, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.encode(), token.encode())


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_authorized(request):
        response = HttpResponse(
            "Metrics need `Authorization: Bearer <METRICS_TOKEN>` or a superuser's login.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
