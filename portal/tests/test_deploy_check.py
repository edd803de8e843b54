"""``manage.py check --deploy`` with production settings reports nothing, and production refuses to start
without its secrets."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]


def production_env(**overrides: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PORTAL_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/portal"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "ALLOWED_HOSTS": "portal.example.org",
    }
    env.update(overrides)
    return {name: value for name, value in env.items() if value}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_with_production_settings_is_clean(kubesim_server):
    # The deploy checks include the cluster preflight, so production settings point at a cluster: kubesim.
    env = production_env(KUBECONFIG=str(kubesim_server.kubeconfig))
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNINGS" not in output and "ERRORS" not in output, output


@pytest.mark.parametrize("missing", ["SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS"])
def test_production_refuses_to_start_without_its_secrets(missing):
    result = manage("check", env=production_env(**{missing: ""}))
    assert result.returncode != 0
    assert missing in result.stderr
