"""Page speed: the student dashboard and the TA gradebook with 500 students × 10 labs, against PostgreSQL.

Each page is requested through Django's test client (the whole middleware stack, the real templates) by a
logged-in student and TA of a 500-student course, and, side by side, of a 50-student course with the same labs:
the query count must be the same at both sizes (DESIGN §9: constant query count; p95 ≤ 300 ms). ``/healthz``
through the same client is the floor the framework itself costs.

Every student has one finished, graded attempt per lab (a grading run with a result per check, and a grade);
the measured student also has a running attempt, so the dashboard shows both kinds.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from bench.common import emit, log, machine, seed_course, setup_django, summary_ms

STUDENTS = 500
SMALL_STUDENTS = 50
LABS = 10
CHECKS_PER_LAB = 3
REQUESTS = 40
MIN_REQUESTS = 10
SECONDS_PER_PAGE = 15  # a slow page gets fewer samples (at least MIN_REQUESTS) so the run stays within budget
WARMUP = 3
TARGET_P95_MS = 300


def seed_history(seeded, *, rng: random.Random) -> None:
    """One stopped, graded attempt per student and lab, with per-check results: what a term leaves behind."""
    from django.utils import timezone

    from grading.models import CheckResult, Grade, GradingRun, RunState, RunTrigger
    from labs.models import Attempt, AttemptState, Check

    now = timezone.now()
    checks = {lab.id: list(Check.objects.filter(lab=lab).order_by("order")) for lab in seeded.labs}
    attempts = Attempt.objects.bulk_create(
        [
            Attempt(
                lab=lab,
                student=student,
                tenant=seeded.tenant,
                state=AttemptState.STOPPED,
                vm_name=f"bench-{lab.id}-{student.id}",
                namespace=seeded.tenant.namespace,
                requested_at=now - timedelta(days=2),
                provisioned_at=now - timedelta(days=2),
                agent_ready_at=now - timedelta(days=2),
                ended_at=now - timedelta(days=2, minutes=-50),
                stop_reason="student",
            )
            for student in seeded.students
            for lab in seeded.labs
        ],
        batch_size=2000,
    )
    runs = GradingRun.objects.bulk_create(
        [
            GradingRun(
                attempt=attempt,
                state=RunState.DONE,
                trigger=RunTrigger.STOP,
                started_at=now - timedelta(days=2),
                finished_at=now - timedelta(days=2),
                measured_at=now - timedelta(days=2),
                score=Decimal(rng.randint(0, CHECKS_PER_LAB)),
                max_score=Decimal(CHECKS_PER_LAB),
            )
            for attempt in attempts
        ],
        batch_size=2000,
    )
    results = []
    for run, attempt in zip(runs, attempts, strict=True):
        passed_count = int(run.score)
        for index, check in enumerate(checks[attempt.lab_id]):
            passed = index < passed_count
            results.append(
                CheckResult(
                    run=run,
                    check_ref=check,
                    check_title=check.title,
                    order=check.order,
                    passed=passed,
                    points=Decimal(1 if passed else 0),
                    max_points=Decimal(1),
                    exit_code=0 if passed else 1,
                    stdout="ok\n" if passed else "",
                    duration_ms=rng.randint(5, 80),
                )
            )
    CheckResult.objects.bulk_create(results, batch_size=5000)
    Grade.objects.bulk_create(
        [
            Grade(
                lab_id=attempt.lab_id,
                student_id=attempt.student_id,
                source_run=run,
                score=run.score,
                max_score=run.max_score,
            )
            for run, attempt in zip(runs, attempts, strict=True)
        ],
        batch_size=2000,
    )


def give_running_attempt(seeded, student) -> None:
    from django.utils import timezone

    from labs.models import Attempt, AttemptState

    now = timezone.now()
    Attempt.objects.create(
        lab=seeded.labs[0],
        student=student,
        tenant=seeded.tenant,
        number=2,
        state=AttemptState.RUNNING,
        vm_name=f"bench-live-{student.id}",
        namespace=seeded.tenant.namespace,
        requested_at=now - timedelta(minutes=5),
        agent_ready_at=now - timedelta(minutes=4),
        expires_at=now + timedelta(minutes=55),
    )


def measure(client, url: str, *, requests: int = REQUESTS) -> dict[str, Any]:
    """Latency of ``requests`` GETs after a warm-up, and the queries one request makes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(WARMUP):
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    queries = len(captured)
    durations: list[float] = []
    deadline = time.perf_counter() + SECONDS_PER_PAGE
    while len(durations) < requests and (len(durations) < MIN_REQUESTS or time.perf_counter() < deadline):
        started = time.perf_counter()
        response = client.get(url)
        durations.append(time.perf_counter() - started)
        assert response.status_code == 200
    return {"queries": queries, "bytes": len(response.content), **summary_ms(durations)}


def page_urls(seeded) -> dict[str, str]:
    from django.urls import reverse

    return {
        "student_dashboard": reverse("dashboard"),
        "gradebook": reverse("grading:gradebook", args=[seeded.course.id]),
    }


def main() -> None:
    setup_django()
    from django.test import Client

    from portal.heap import freeze_startup_objects

    rng = random.Random(9)
    log(f"seeding {SMALL_STUDENTS} and {STUDENTS} students × {LABS} labs")
    sizes = {}
    for students, name in ((SMALL_STUDENTS, "Bench Small College"), (STUDENTS, "Bench Large University")):
        seeded = seed_course(students=students, labs=LABS, name=name, checks_per_lab=CHECKS_PER_LAB)
        seed_history(seeded, rng=rng)
        give_running_attempt(seeded, seeded.students[0])
        sizes[students] = seeded
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # fresh statistics, as a database that has lived a term would have
    # This process serves the pages as daphne would, and daphne freezes what its startup allocated (portal.heap):
    # so does this one, its seeding included, before the first request.
    freeze_startup_objects()

    figures: dict[str, dict[str, Any]] = {"student_dashboard": {}, "gradebook": {}}
    for students, seeded in sizes.items():
        urls = page_urls(seeded)
        log(f"measuring {students} students")
        student_client = Client()
        student_client.force_login(seeded.students[0])
        figures["student_dashboard"][str(students)] = measure(student_client, urls["student_dashboard"])
        ta_client = Client()
        ta_client.force_login(seeded.ta)
        figures["gradebook"][str(students)] = measure(ta_client, urls["gradebook"])
    floor = measure(Client(), "/healthz")

    large, small = str(STUDENTS), str(SMALL_STUDENTS)
    verdicts = {}
    for page, by_size in figures.items():
        verdicts[page] = {
            "constant_queries": by_size[large]["queries"] == by_size[small]["queries"],
            "p95_ms": by_size[large]["p95_ms"],
            "meets_p95_target": by_size[large]["p95_ms"] <= TARGET_P95_MS,
        }
    emit(
        {
            "benchmark": "pages",
            "description": f"student dashboard and TA gradebook, {STUDENTS} students x {LABS} labs, Django test "
            "client against PostgreSQL; baseline: the same pages with "
            f"{SMALL_STUDENTS} students, and /healthz as the framework floor",
            "target": {"queries": "constant in the number of students", "p95_ms": TARGET_P95_MS},
            "figures": {page: by_size[large] for page, by_size in figures.items()},
            "baseline": {
                **{page: by_size[small] for page, by_size in figures.items()},
                "healthz_floor": floor,
            },
            "verdict": verdicts,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
