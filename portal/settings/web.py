"""The HTTP side: the REST API and its schema, rate limits, sign-in throttling and the Content Security Policy."""

from __future__ import annotations

from portal.settings.base import ALLOWED_HOSTS, PRODUCTION
from portal.settings.env import env_int, env_str

REST_FRAMEWORK = {
    # Token first: an anonymous API request is then answered 401 with a WWW-Authenticate challenge.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "api.parsers.JSONParserBoundedDepth",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "api.views.common.PortalPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lab portal API",
    "DESCRIPTION": "Courses, labs, attempts on KubeVirt VMs, grading runs and grades.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from the pinned sidecar package, served by whitenoise: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "AttemptStateEnum": "labs.models.AttemptState",
        "RunStateEnum": "grading.models.RunState",
    },
}

# Rate limits (portal.ratelimit): scope -> (requests, window in seconds). Refusals are 429 with Retry-After.
RATE_LIMITS = {
    # lab starts per user
    "attempt_start": (env_int("RATE_LIMIT_STARTS", 10), env_int("RATE_LIMIT_STARTS_WINDOW_SECONDS", 600)),
    # Check presses per attempt (grading also enforces GRADING_MIN_INTERVAL_SECONDS between two runs)
    "attempt_check": (env_int("RATE_LIMIT_CHECKS", 30), env_int("RATE_LIMIT_CHECKS_WINDOW_SECONDS", 600)),
    # failed sign-ins (HTML form, admin and API token) per client address, whatever the accounts
    "login_address": (
        env_int("RATE_LIMIT_LOGIN_FAILURES_PER_ADDRESS", 50),
        env_int("RATE_LIMIT_LOGIN_WINDOW_SECONDS", 900),
    ),
}
# Past LOGIN_FAILURES_BEFORE_DELAY failed sign-ins per (account, address), each try waits LOGIN_DELAY_SECONDS,
# doubled with every failure, at most LOGIN_DELAY_MAX_SECONDS (portal.login_throttle).
LOGIN_FAILURES_BEFORE_DELAY = env_int("LOGIN_FAILURES_BEFORE_DELAY", 5)
LOGIN_DELAY_SECONDS = env_int("LOGIN_DELAY_SECONDS", 2)
LOGIN_DELAY_MAX_SECONDS = env_int("LOGIN_DELAY_MAX_SECONDS", 900)
# Behind a proxy, the META key carrying the client's address (e.g. HTTP_X_REAL_IP); REMOTE_ADDR otherwise.
RATE_LIMIT_CLIENT_ADDRESS_HEADER = env_str("RATE_LIMIT_CLIENT_ADDRESS_HEADER", "REMOTE_ADDR")


def websocket_sources(hosts: list[str], *, secure_only: bool) -> list[str]:
    """ws:// and wss:// connect-src sources for ALLOWED_HOSTS (not 'self' to older browsers); any port outside
    production."""
    sources: list[str] = []
    for host in hosts:
        # CSP host sources cannot name IPv6 literals ([::1]); browsers reject the whole source as invalid.
        if host == "*" or not host or host.startswith("["):
            continue
        host = f"*{host}" if host.startswith(".") else host
        for scheme in ("wss",) if secure_only else ("ws", "wss"):
            sources.append(f"{scheme}://{host}" if secure_only else f"{scheme}://{host}:*")
    return sources


# Content Security Policy (django-csp): no inline or third-party script anywhere. Styles allow 'unsafe-inline'
# because xterm.js 6 (static/vendor/xterm) injects <style> elements for its DOM renderer and scrollbar.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'", *websocket_sources(ALLOWED_HOSTS, secure_only=PRODUCTION)],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
