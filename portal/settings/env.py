"""Typed readers of environment variables: an unset or empty variable gives the default, a malformed one fails
at start with a message naming it."""

from __future__ import annotations

import os
from typing import overload

from django.core.exceptions import ImproperlyConfigured


@overload
def env_str(name: str) -> str | None: ...
@overload
def env_str(name: str, default: str) -> str: ...
def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_required(name: str) -> str:
    value = env_str(name)
    if value is None:
        raise ImproperlyConfigured(f"The environment variable {name} is required when PORTAL_ENV=production.")
    return value


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {value!r}.")


def env_int(name: str, default: int) -> int:
    value = env_str(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, not {value!r}.") from exc


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_log_level(name: str, default: str) -> str:
    value = (env_str(name) or default).strip().upper()
    if value not in LOG_LEVELS:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(LOG_LEVELS)}, not {env_str(name)!r}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    value = env_str(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]
