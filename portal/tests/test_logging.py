"""Log levels as configured from the environment: the portal's own messages at LOG_LEVEL, Celery's per-task lines
(the attempt sync sends one every few seconds) only when TASK_LOG_LEVEL asks for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
NAMES = ["", "labs.tasks", "celery.beat", "celery.worker.strategy", "celery.app.trace"]


def configured(**environment: str) -> subprocess.CompletedProcess:
    script = (
        "import json, logging, django; django.setup(); "
        f"print(json.dumps({{n: logging.getLevelName(logging.getLogger(n).getEffectiveLevel()) for n in {NAMES!r}}}))"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("LOG_LEVEL", "TASK_LOG_LEVEL")}
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **environment, "DJANGO_SETTINGS_MODULE": "portal.settings"},
    )


def levels(**environment: str) -> dict[str, str]:
    result = configured(**environment)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_celerys_per_task_lines_are_quiet_unless_asked_for():
    default = levels()
    assert default[""] == default["labs.tasks"] == "INFO"
    assert {default[name] for name in NAMES[2:]} == {"WARNING"}
    asked = levels(TASK_LOG_LEVEL="INFO", LOG_LEVEL="DEBUG")
    assert asked[""] == "DEBUG" and {asked[name] for name in NAMES[2:]} == {"INFO"}


def test_a_level_is_read_in_any_case_and_a_misspelt_one_is_refused_by_name():
    assert levels(LOG_LEVEL="warning")[""] == "WARNING"
    for name in ("LOG_LEVEL", "TASK_LOG_LEVEL"):
        result = configured(**{name: "LOUD"})
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr
        assert f"{name} must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'LOUD'" in result.stderr


def test_a_request_warning_is_written_once_in_development():
    # Django's own console handler (DEBUG only) and the root's would each write it.
    script = (
        "import logging, django; django.setup(); "
        "logging.getLogger('django.request').warning('Not Found: /nowhere-%s', 42)"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("LOG_LEVEL", "DATABASE_URL")}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PORTAL_ENV": "development", "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "portal.settings"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("Not Found: /nowhere-42") == 1, result.stderr
