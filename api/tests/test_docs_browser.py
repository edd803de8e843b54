"""The API docs page renders in a real browser under the portal's Content Security Policy, with no violation:
Swagger UI comes from the pinned sidecar package and its start script is a file, not inline code."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

CHROMIUM = Path("/usr/bin/chromium")


def test_swagger_ui_renders_the_schema_without_csp_violations(live_server):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium).")
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            problems: list[str] = []
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            response = page.goto(f"{live_server.url}/api/docs/")
            assert response is not None and response.status == 200
            assert "script-src 'self'" in response.headers["content-security-policy"]
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("Lab portal API", timeout=30_000)
            expect(page.locator(".opblock-summary-path").first).to_be_visible()
            assert [p for p in problems if "Content Security Policy" in p or "Refused" in p] == []
            assert problems == []
        finally:
            browser.close()
