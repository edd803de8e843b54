"""On a phone, a staff table that scrolls in its own box keeps every word whole rather than breaking names and
times mid-word to squeeze into the screen."""

from __future__ import annotations

import pytest
from django.test import Client

from labs.tests.test_browser import browser, in_a_thread  # noqa: F401 (fixtures)
from portal.services import audit_record
from tests.browser.live import REPO_ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every word (between spaces and dashes) of every cell of a scrolling table whose letters sit on two lines.
BROKEN_WORDS = """() => {
    const broken = [];
    for (const cell of document.querySelectorAll(".table-scroll .table th, .table-scroll .table td")) {
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node; (node = walker.nextNode()); ) {
            for (const word of node.data.matchAll(/[^\\s\\-–—]+/g)) {
                const range = document.createRange();
                range.setStart(node, word.index);
                range.setEnd(node, word.index + word[0].length);
                if (new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size > 1) broken.push(word[0]);
            }
        }
    }
    return broken;
}"""


def test_the_audit_log_keeps_names_and_times_whole_at_390_px(instructor_a, course_a, lab_a, browser):  # noqa: F811
    def audit_page() -> str:
        instructor_a.full_name = "Aiko Tanaka-Yamamoto"
        instructor_a.save(update_fields=["full_name"])
        audit_record(
            actor=instructor_a, action="admin.lab.change", target=lab_a, tenant=course_a.tenant, course=course_a
        )
        client = Client()
        client.force_login(instructor_a)
        return client.get(f"/courses/{course_a.id}/audit/").content.decode()

    html = in_a_thread(audit_page)
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.route("http://portal.test/static/**", lambda route: route.fulfill(path=REPO_ROOT / route.request.url[19:]))
    page.route("http://portal.test/audit/", lambda route: route.fulfill(body=html, content_type="text/html"))
    page.goto("http://portal.test/audit/")
    assert "Tanaka" in page.inner_text(".audit-log")
    assert page.evaluate(BROKEN_WORDS) == []
    page.close()
