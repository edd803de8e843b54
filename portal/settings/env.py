"""Typed readers of environment variables: an unset or empty variable gives the default, a malformed one fails
at start with a message naming it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar, overload

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


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


def _env_parsed(name: str, default: T, parse: Callable[[str], T], expected: str) -> T:
    value = env_str(name)
    if value is None:
        return default
    try:
        return parse(value)
    except (KeyError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name} must be {expected}, not {value!r}.") from exc


def env_bool(name: str, default: bool) -> bool:
    return _env_parsed(name, default, lambda value: BOOLEANS[value.strip().lower()], "true or false")


def env_int(name: str, default: int) -> int:
    return _env_parsed(name, default, int, "an integer")


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
