"""Security settings: the Content Security Policy (strict scripts, xterm-compatible styles, WebSocket to self),
cookies, HSTS and redirects in production, CSRF and session rotation.

Production values are read from a subprocess started with ``PORTAL_ENV=production``, the way the portal runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from conftest import PASSWORD

BASE_DIR = Path(__file__).resolve().parents[2]
TEMPLATE_DIRS = [BASE_DIR / "templates", *BASE_DIR.glob("*/templates")]


def production_settings(**overrides: str) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PORTAL_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": "postgres://portal@db.invalid:5432/portal",
        "REDIS_URL": "redis://redis.invalid:6379/0",
        "ALLOWED_HOSTS": "portal.example.org,.labs.example.org",
        **overrides,
    }
    script = (
        "import json, django; from django.conf import settings; django.setup(); names = ["
        "'DEBUG', 'SESSION_COOKIE_SECURE', 'SESSION_COOKIE_HTTPONLY', 'SESSION_COOKIE_SAMESITE', "
        "'SESSION_COOKIE_NAME', 'CSRF_COOKIE_SECURE', 'CSRF_COOKIE_SAMESITE', 'SECURE_SSL_REDIRECT', "
        "'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_PROXY_SSL_HEADER', "
        "'SECURE_CONTENT_TYPE_NOSNIFF', 'X_FRAME_OPTIONS', 'CONTENT_SECURITY_POLICY', 'MIDDLEWARE', "
        "'PASSWORD_HASHERS', 'SESSION_COOKIE_AGE']; "
        "print(json.dumps({n: getattr(settings, n) for n in names}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "DJANGO_SETTINGS_MODULE": "portal.settings"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def production() -> dict:
    return production_settings()


def test_production_cookies_are_secure_httponly_samesite_and_host_prefixed(production):
    assert production["DEBUG"] is False
    assert production["SESSION_COOKIE_SECURE"] is True and production["CSRF_COOKIE_SECURE"] is True
    assert production["SESSION_COOKIE_HTTPONLY"] is True
    assert production["SESSION_COOKIE_SAMESITE"] == "Lax" and production["CSRF_COOKIE_SAMESITE"] == "Lax"
    assert production["SESSION_COOKIE_NAME"].startswith("__Host-")
    assert 0 < production["SESSION_COOKIE_AGE"] <= 24 * 3600


def test_production_forces_https_with_hsts(production):
    assert production["SECURE_SSL_REDIRECT"] is True
    assert production["SECURE_HSTS_SECONDS"] >= 31536000 and production["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert production["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert production["SECURE_CONTENT_TYPE_NOSNIFF"] is True and production["X_FRAME_OPTIONS"] == "DENY"
    assert "django.contrib.auth.hashers.MD5PasswordHasher" not in (production["PASSWORD_HASHERS"] or [])


def test_production_csp_allows_only_secure_websockets_to_the_portals_own_hosts(production):
    directives = production["CONTENT_SECURITY_POLICY"]["DIRECTIVES"]
    assert "csp.middleware.CSPMiddleware" in production["MIDDLEWARE"]
    assert directives["connect-src"] == [
        "'self'",
        "wss://portal.example.org",
        "wss://*.labs.example.org",
    ]
    assert directives["script-src"] == ["'self'"]


def parse_csp(header: str) -> dict[str, list[str]]:
    policy = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            policy[words[0]] = words[1:]
    return policy


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/accounts/login/", "/api/docs/", "/healthz"])
def test_every_response_carries_the_csp(url):
    response = Client().get(url)
    assert response.status_code < 500
    policy = parse_csp(response["Content-Security-Policy"])
    # Scripts: only files served by the portal itself; no inline code, no eval, no CDN.
    assert policy["script-src"] == ["'self'"]
    assert policy["default-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]
    # The console's WebSockets go back to the portal only.
    assert policy["connect-src"][0] == "'self'"
    assert all(re.match(r"^wss?://[^/]+$", source) for source in policy["connect-src"][1:])
    assert "ws://testserver:*" in policy["connect-src"]
    # Browsers reject an IPv6 literal as a CSP source; the test settings allow [::1], which must be left out.
    assert not any("[" in source for source in policy["connect-src"])


def test_inline_styles_are_allowed_only_because_the_vendored_xterm_needs_them():
    """xterm.js injects <style> elements (DOM renderer, scrollbar); without 'unsafe-inline' in style-src the
    terminal would not size or colour itself. If a future xterm stops doing that, tighten the policy."""
    from django.conf import settings

    xterm = (BASE_DIR / "static" / "vendor" / "xterm" / "xterm.js").read_text(errors="replace")
    style_src = settings.CONTENT_SECURITY_POLICY["DIRECTIVES"]["style-src"]
    injects_styles = 'createElement("style")' in xterm or "createElement('style')" in xterm
    assert injects_styles == ("'unsafe-inline'" in style_src)
    assert "'unsafe-inline'" not in settings.CONTENT_SECURITY_POLICY["DIRECTIVES"]["script-src"]


def test_no_template_has_inline_script_or_event_handler_the_csp_would_block():
    offenders = []
    for directory in TEMPLATE_DIRS:
        for path in directory.rglob("*.html"):
            text = path.read_text()
            for match in re.finditer(r"<script\b([^>]*)>", text):
                attributes = match.group(1)
                data_block = re.search(r'type="application/(ld\+)?json"', attributes)
                if "src=" not in attributes and not data_block:
                    offenders.append(f"{path.relative_to(BASE_DIR)}: inline <script>")
            if re.search(r"\son[a-z]+\s*=\s*[\"']", text):
                offenders.append(f"{path.relative_to(BASE_DIR)}: inline event handler")
            if re.search(r"href\s*=\s*[\"']javascript:", text, re.IGNORECASE):
                offenders.append(f"{path.relative_to(BASE_DIR)}: javascript: URL")
    assert offenders == []


@pytest.mark.django_db
def test_login_needs_the_csrf_token_and_rotates_the_session(student_a):
    client = Client(enforce_csrf_checks=True)
    assert client.post("/accounts/login/", {"username": "student_a", "password": PASSWORD}).status_code == 403
    page = client.get("/accounts/login/")
    token = page.cookies["csrftoken"].value
    client.get("/accounts/login/")  # a session may exist before signing in (e.g. the language choice)
    session = client.session
    session["language_note"] = "before"
    session.save()
    before = session.session_key
    response = client.post(
        "/accounts/login/", {"username": "student_a", "password": PASSWORD, "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert client.session.session_key != before
    cookie = response.cookies["sessionid"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax"
