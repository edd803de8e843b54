"""Every page type in a real browser, as each persona sees it: axe-core finds no serious or critical
violation, nothing scrolls sideways at 390 or 360 px, and a screenshot at 1280 and 390 px lands in
``artifacts/pages/`` (with ``figures.json``: each page's axe counts and width) for a person to look at."""

from __future__ import annotations

import json
import re

import pytest

from labs.services.namespaces import tenant_namespace_refused
from labs.tests.test_browser import ARTIFACTS, browser, in_a_thread, live_portal  # noqa: F401 (fixtures)
from tests.browser.live import REPO_ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

AXE = REPO_ROOT / "static" / "vendor" / "axe-core" / "axe.min.js"
SHOTS = ARTIFACTS / "pages"
PASSWORD = "correct-horse-battery-staple"
LONG_TITLE = "Configuring" + "X" * 189  # 200 characters with nowhere to break
WIDTHS = (1280, 390)
NARROWEST = 360
PAGE_ERRORS: list[str] = []  # scripts' errors on any page of the tour


def axe_violations(page) -> list[dict]:
    """axe-core's violations on the page as it stands: [{id, impact, nodes}]."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    return page.evaluate("""async () => {
        const results = await axe.run(document, {resultTypes: ["violations"]});
        return results.violations.map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.length,
                                             targets: v.nodes.slice(0, 3).map(n => n.target.join(" "))}));
    }""")


def page_width(page) -> int:
    return page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)")


class Tour:
    """Visits pages and keeps what it measured on each."""

    def __init__(self) -> None:
        self.figures: dict[str, dict] = {}
        SHOTS.mkdir(parents=True, exist_ok=True)

    def visit(self, page, name: str, path: str | None, settle=None) -> None:
        figures: dict = {}
        for width in (*WIDTHS, NARROWEST):
            page.set_viewport_size({"width": width, "height": 844 if width < 1000 else 800})
            if path is not None:
                page.goto(path)
            page.wait_for_load_state("load")
            if settle is not None:
                settle(page)
            page.wait_for_timeout(300)  # a resize observer's fit, a socket's first message
            figures[f"width_at_{width}"] = page_width(page)
            if width in WIDTHS:
                page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
                violations = axe_violations(page)
                figures[f"axe_{width}"] = violations
        self.figures[name] = figures

    def write(self) -> None:
        summary = {
            name: {
                **{
                    f"serious_or_critical_at_{width}": sum(
                        v["nodes"] for v in f[f"axe_{width}"] if v["impact"] in ("serious", "critical")
                    )
                    for width in WIDTHS
                },
                **{f"all_at_{width}": sum(v["nodes"] for v in f[f"axe_{width}"]) for width in WIDTHS},
                "rules": sorted({f"{v['id']} ({v['impact']})" for v in f["axe_1280"] + f["axe_390"]}),
                "width_at_390": f["width_at_390"],
                "width_at_360": f["width_at_360"],
            }
            for name, f in self.figures.items()
        }
        (SHOTS / "figures.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))

    def problems(self) -> list[str]:
        found = []
        for name, f in self.figures.items():
            for width in WIDTHS:
                found += [
                    f"{name} @{width}: {v['id']} ({v['impact']}) at {v['targets']}"
                    for v in f[f"axe_{width}"]
                    if v["impact"] in ("serious", "critical")
                ]
            for width in (390, NARROWEST):
                if f[f"width_at_{width}"] > width:
                    found.append(f"{name}: {f[f'width_at_{width}']} px wide in a {width} px viewport")
        return found


def log_in(browser, base_url: str, username: str | None):  # noqa: F811
    context = browser.new_context(base_url=base_url, bypass_csp=True)  # axe is injected as a script
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.on("pageerror", lambda error: PAGE_ERRORS.append(f"{page.url}: {error}"))
    page.on(
        "console",
        lambda message: (
            PAGE_ERRORS.append(f"{page.url}: {message.text}")
            if message.type == "error" and "Content Security Policy" not in message.text
            else None
        ),
    )
    if username is not None:
        page.goto("/accounts/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("#login-button")
        page.wait_for_url(re.compile(r"^(?!.*/accounts/login/).*$"))
    return context, page


def test_every_page_type_is_accessible_fits_a_phone_and_is_photographed(
    student_a,
    ta_a,
    instructor_a,
    lab_a,
    course_a,
    live_portal,  # noqa: F811
    browser,  # noqa: F811
):
    from playwright.sync_api import expect

    from conftest import make_lab
    from portal.models import User

    long_lab = in_a_thread(lambda: make_lab(course_a, title=LONG_TITLE))
    in_a_thread(lambda: User.objects.filter(id=instructor_a.id).update(is_staff=True))
    tour = Tour()
    base = live_portal.url

    anonymous, page = log_in(browser, base, None)
    tour.visit(page, "login", "/accounts/login/")
    anonymous.close()

    # The student: the dashboard, a lab not started (with a title that will not break), a running lab after Check.
    student, page = log_in(browser, base, "student_a")
    tour.visit(page, "student-dashboard", "/")
    tour.visit(page, "lab-before-start", f"/labs/{long_lab.id}/")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"/labs/{lab_a.id}/")
    page.click("#start-button")
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-running\b"), timeout=90_000)
    try:
        expect(page.locator("#console-status")).to_have_attribute("data-state", "connected", timeout=30_000)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nscript errors: {PAGE_ERRORS}") from None
    page.click("#terminal")
    page.keyboard.type("echo hello world > ~/hello.txt")
    page.keyboard.press("Enter")
    page.click("#check-button")
    expect(page.locator("#results-list li.result.passed")).to_have_count(2, timeout=60_000)
    attempt_path = page.locator("#history [data-history-attempt] a").first.get_attribute("href")
    attempt_id = int(re.search(r"/attempts/(\d+)/", attempt_path).group(1))

    def connected(page):
        expect(page.locator("#console-status")).to_have_attribute("data-state", "connected", timeout=30_000)

    tour.visit(page, "lab-running", f"/labs/{lab_a.id}/", settle=connected)
    tour.visit(page, "student-attempt", f"/attempts/{attempt_id}/", settle=connected)
    tour.visit(page, "my-grades", "/grades/mine/")
    tour.visit(page, "my-lab-grades", f"/grades/mine/labs/{lab_a.id}/")
    tour.visit(page, "time-zone", "/accounts/time-zone/")

    # The TA: reports, one student's grade, the attempt, watching the console, the recording.
    staff, ta_page = log_in(browser, base, "ta_a")
    tour.visit(ta_page, "staff-index", "/grades/")
    tour.visit(ta_page, "gradebook", f"/grades/courses/{course_a.id}/")
    tour.visit(ta_page, "lab-report", f"/grades/labs/{lab_a.id}/")
    tour.visit(ta_page, "student-lab-grade", f"/grades/labs/{lab_a.id}/students/{student_a.id}/")
    tour.visit(ta_page, "staff-attempt", f"/grades/attempts/{attempt_id}/")
    tour.visit(ta_page, "lab-staff", f"/labs/{lab_a.id}/")
    tour.visit(ta_page, "watch-console", f"/attempts/{attempt_id}/", settle=connected)
    tour.visit(ta_page, "recording", f"/attempts/{attempt_id}/recording/")
    staff.close()

    # Stop, then the lab page as it is left.
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"/labs/{lab_a.id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-button")
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-stopped\b"), timeout=90_000)
    tour.visit(page, "lab-after-stop", None)
    student.close()

    # The instructor in admin: the index, the ops dashboard, a lab's form, the audit log, a page refused.
    teacher, admin_page = log_in(browser, base, "instructor_a")
    tour.visit(admin_page, "admin-index", "/admin/")
    tour.visit(admin_page, "ops-dashboard", "/admin/ops/")
    tour.visit(admin_page, "admin-lab-form", f"/admin/labs/lab/{lab_a.id}/change/")
    tour.visit(admin_page, "course-audit", f"/courses/{course_a.id}/audit/")
    tour.visit(admin_page, "admin-tenants", "/admin/portal/tenant/")
    # The capacity page with the longest thing it shows: a namespace the cluster refuses, and the command to run.
    refused = 'virtualmachines.kubevirt.io is forbidden: User "system:serviceaccount:lab-portal:lab-portal" cannot'
    in_a_thread(lambda: tenant_namespace_refused(namespace=course_a.tenant.namespace, said=refused))
    tour.visit(admin_page, "capacity", "/admin/labs/attempt/capacity/")
    teacher.close()

    tour.write()
    assert not tour.problems(), "\n".join(tour.problems())
    # The refused page answers 403 on purpose; the browser notes that status like any other.
    errors = [e for e in PAGE_ERRORS if not ("/admin/portal/tenant/" in e and "status of 403" in e)]
    assert not errors, "\n".join(errors)
