"""The student's whole path in a real browser: Debian's chromium driven by Playwright against a live portal
(daphne, a Celery worker with beat, kubesim, PostgreSQL and Redis). A screenshot lands in ``artifacts/``."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.db import connection

from tests.browser.live import REPO_ROOT, LivePortal, subprocess_database_url
from tests.run_isolation import delete_run_keys

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

TOKYO = ZoneInfo("Asia/Tokyo")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO_ROOT / "artifacts"


def start_live_portal(kubesim_server, workdir, extra_env: dict[str, str] | None = None) -> LivePortal:
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        pytest.fail("The browser test needs the production wiring: DATABASE_URL (PostgreSQL) and REDIS_URL.")
    # Tasks queued by earlier tests must not reach this test's worker.
    delete_run_keys()
    return LivePortal(
        database_url=subprocess_database_url(),
        redis_url=settings.REDIS_URL,
        kubeconfig=kubesim_server.kubeconfig,
        workdir=workdir,
        extra_env=extra_env,
    ).start()


@pytest.fixture
def live_portal(transactional_db, kubesim_server, tmp_path):
    portal = start_live_portal(kubesim_server, tmp_path / "portal")
    yield portal
    portal.stop()
    print(portal.logs())


@pytest.fixture
def impatient_portal(transactional_db, kubesim_server, tmp_path):
    """A portal that calls a start slow after 2 s and gives up on an unpullable image after 4 s."""
    portal = start_live_portal(
        kubesim_server,
        tmp_path / "portal",
        extra_env={
            "ATTEMPT_SLOW_START_NOTICE_SECONDS": "2",
            "ATTEMPT_FAILURE_GRACE_SECONDS": "4",
        },
    )
    yield portal
    portal.stop()
    print(portal.logs())


@pytest.fixture
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def known_unrelated_console_error(text: str) -> bool:
    """Chromium rejecting the settings' IPv6 loopback WebSocket source in the CSP is not this page's error (the
    rest of the policy applies)."""
    return "Content Security Policy" in text and "invalid source" in text


def in_a_thread(work):
    """Run ``work`` (database access) in a thread of its own: Playwright's event loop runs in the test's thread,
    where Django refuses synchronous queries."""

    def run():
        try:
            return work()
        finally:
            connection.close()  # the thread's own connection, not left for the garbage collector

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def terminal_text(page) -> str:
    return page.locator("#terminal .xterm-rows").inner_text()


def log_in_as_student_a(page) -> None:
    page.goto("/accounts/login/")
    page.fill("#id_username", "student_a")
    page.fill("#id_password", "correct-horse-battery-staple")
    page.click("#login-button")


def student_page(browser, base_url: str):
    """A new browser context on ``base_url`` with student_a logged in: (context, page)."""
    context = browser.new_context(base_url=base_url)
    context.set_default_timeout(30_000)
    page = context.new_page()
    log_in_as_student_a(page)
    return context, page


# The terminal's lines as written, wrapped rows joined (what a reflow keeps together).
LOGICAL_LINES = """() => {
  const buffer = window.portalTerminal.buffer.active;
  const lines = [];
  for (let i = 0; i < buffer.length; i++) {
    const line = buffer.getLine(i);
    const text = line.translateToString(true);
    if (line.isWrapped && lines.length) {
      lines[lines.length - 1] += text;
    } else {
      lines.push(text);
    }
  }
  return lines;
}"""


def test_student_starts_a_lab_types_in_two_tabs_and_checks(student_a, ta_a, lab_a, tenant_a, live_portal, browser):
    # Rows first: Playwright runs an event loop in this thread, where Django refuses synchronous queries.
    from playwright.sync_api import expect

    from portal.models import Tenant

    # The browser's own clock is UTC here: the page must draw its times in the tenant's.
    in_a_thread(lambda: Tenant.objects.filter(id=tenant_a.id).update(time_zone="Asia/Tokyo"))
    context = browser.new_context(base_url=live_portal.url, viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_portal.url)
    context.set_default_timeout(30_000)
    page = context.new_page()
    console_errors: list[str] = []
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)

    # Log in and find the lab on the dashboard.
    log_in_as_student_a(page)
    expect(page.locator("h1").first).to_have_text("My labs")
    page.click(f"tr[data-lab='{lab_a.id}'] a")
    # The lab page's scripts have run (a Start pressed before start.js takes the form posts it and reloads, which
    # works too but is not what this test follows).
    page.wait_for_url(f"**/labs/{lab_a.id}/")
    page.wait_for_load_state("load")
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)

    # Start, and watch the progress reach running with each step's time, on the same page (no reload).
    page.evaluate("window.sameDocument = true")
    page.click("#start-button")
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-running\b"), timeout=90_000)
    assert page.evaluate("window.sameDocument === true")
    expect(page.locator("#start-card")).to_have_count(0)
    for step in ("requested", "provisioned", "scheduled", "vmi_running", "agent_ready"):
        item = page.locator(f"#progress [data-step='{step}']")
        expect(item).to_have_class(re.compile(r"\bdone\b"))
        expect(item.locator(".step-time")).not_to_be_empty()
    expect(page.locator("#progress [data-step='agent_ready'] .step-elapsed")).to_have_text(re.compile(r"\+\d+\.\d s"))
    expect(page.locator("#progress .step-elapsed").first).to_have_text("")
    for elapsed in page.locator("#progress .step-elapsed").all_inner_texts()[1:]:
        assert re.fullmatch(r"\+\d+\.\d s", elapsed), elapsed  # never negative
    # Times drawn by the script and by the server are in the tenant's clock, written alike ("9:24:06 PM").
    requested = page.locator("#progress [data-step='requested'] .step-time")
    at = datetime.fromisoformat(requested.get_attribute("datetime").replace("Z", "+00:00")).astimezone(TOKYO)
    assert " ".join(requested.inner_text().split()) == f"{at:%-I:%M:%S %p}"
    expect(page.locator("#history [data-history-attempt] time").first).to_have_text(
        re.compile(rf"\w+\.? {at.day}, {at.year}, {at:%-I:%M %p} JST")
    )
    expect(page.locator("#history [data-history-attempt] .state")).to_have_text("Running")
    expect(page.locator("#countdown")).to_have_text(re.compile(r"\d+:\d\d"))
    expect(page.locator("#live-indicator")).to_have_class(re.compile(r"\bon\b"))
    assert any("/start/" in url for url in posts), posts  # Start is the HTTP POST
    assert any(re.search(r"/ws/attempts/\d+/events/", url) for url in sockets), sockets  # then the attempt's socket

    # Type into xterm and see the shell's answer.
    expect(page.locator("#console-status")).to_have_attribute("data-state", "connected", timeout=30_000)
    expect(page.locator("#console-mode")).to_have_attribute("data-mode", "rw")
    page.click("#terminal")
    page.keyboard.type("echo hello-$RANDOM")
    page.keyboard.press("Enter")
    # The typed line reads hello-$RANDOM; only the shell's answer has digits there.
    expect(page.locator("#terminal .xterm-rows")).to_contain_text(re.compile(r"hello-\d+"))
    marker = re.search(r"hello-\d+", terminal_text(page)).group(0)

    # The guest's terminal takes the window's size through its agent, on connect and on every window resize,
    # without a line typed into the shell; "Fit terminal" does the same on demand and says so.
    def guest_size_is_the_windows(tag: str) -> None:
        rows, cols = page.evaluate("[window.portalTerminal.rows, window.portalTerminal.cols]")
        page.keyboard.type(f"stty size; echo size-{tag}-$((1+1))")
        page.keyboard.press("Enter")
        expect(page.locator("#terminal .xterm-rows")).to_contain_text(f"{rows} {cols}")
        expect(page.locator("#terminal .xterm-rows")).to_contain_text(f"size-{tag}-2")

    guest_size_is_the_windows("connect")
    page.set_viewport_size({"width": 1000, "height": 700})
    page.wait_for_timeout(1000)  # the page tells the bridge once the window settles; the bridge debounces too
    guest_size_is_the_windows("resized")
    page.click("#fit-button")
    expect(page.locator("#console-notice")).to_contain_text("The VM's terminal is now")
    assert "stty rows" not in terminal_text(page)
    page.set_viewport_size({"width": 1400, "height": 1000})

    # A second tab shows the same screen (scrollback), and both tabs keep working.
    second = context.new_page()
    second.goto(f"/labs/{lab_a.id}/")
    expect(second.locator("#console-status")).to_have_attribute("data-state", "connected")
    expect(second.locator("#terminal .xterm-rows")).to_contain_text(marker)
    second.click("#terminal")
    second.keyboard.type("echo hello world > ~/hello.txt; echo second-tab-$((40+2))")
    second.keyboard.press("Enter")
    for tab in (page, second):
        expect(tab.locator("#terminal .xterm-rows")).to_contain_text("second-tab-42")
        expect(tab.locator("#console-status")).to_have_attribute("data-state", "connected")

    # Scrollback written at one width and replayed in a narrower tab is drawn at the width it was written at, then
    # reflowed: a carriage return and a cursor move written for the wide screen land where they did there.
    cols = page.evaluate("window.portalTerminal.cols")
    page.click("#terminal")
    page.keyboard.type(f"printf '%0{cols - 10}d\\r\\e[5C\\x59Z\\n' 0")
    page.keyboard.press("Enter")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("00000YZ")
    narrow = context.new_page()
    narrow.set_viewport_size({"width": 390, "height": 844})
    narrow.goto(f"/labs/{lab_a.id}/")
    expect(narrow.locator("#console-status")).to_have_attribute("data-state", "connected")
    narrow.wait_for_function(f"window.portalTerminal.cols < {cols - 10}")
    logical_lines = narrow.evaluate(LOGICAL_LINES)
    assert any(line.startswith("00000YZ" + "0" * 10) for line in logical_lines), logical_lines[-8:]
    narrow.close()

    # Paste through the clipboard button reaches the guest like typing does (bash's bracketed paste waits for
    # Enter, as it should: a pasted newline must not run a command by surprise).
    page.evaluate("navigator.clipboard.writeText('echo pasted-$((50+5))')")
    page.click("#paste-button")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("echo pasted-$((50+5))")
    page.keyboard.press("Enter")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("pasted-55")

    # Check, and see the per-check results arrive on the page.
    page.click("#check-button")
    results = page.locator("#results-list li.result")
    expect(results).to_have_count(2, timeout=60_000)
    expect(page.locator("#results-list li.result.passed")).to_have_count(2)
    expect(page.locator("#results-summary")).to_contain_text("3 / 3")
    expect(results.locator(".result-points")).to_have_text(["1 / 1 point", "2 / 2 points"])  # plural by the maximum
    expect(second.locator("#results-list li.result.passed")).to_have_count(2)

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-lab-page.png"), full_page=True)
    second.screenshot(path=str(ARTIFACTS / "browser-second-tab.png"), full_page=True)
    assert not [e for e in console_errors if not known_unrelated_console_error(e)], console_errors

    # The course's TA watches the same screen read-only, and replays the recording.
    attempt_path = page.locator("#history [data-history-attempt] a").first.get_attribute("href")
    staff = browser.new_context(base_url=live_portal.url, viewport={"width": 1400, "height": 1000})
    staff.set_default_timeout(30_000)
    ta = staff.new_page()
    ta.goto("/accounts/login/")
    ta.fill("#id_username", "ta_a")
    ta.fill("#id_password", "correct-horse-battery-staple")
    ta.click("#login-button")
    ta.goto(attempt_path)
    expect(ta.locator("#console-mode")).to_have_attribute("data-mode", "ro")
    expect(ta.locator("#terminal .xterm-rows")).to_contain_text("pasted-55")
    expect(ta.locator("#take-control-button")).to_be_visible()
    expect(ta.locator("#paste-button")).to_be_hidden()  # pasting is typing: not offered to a watcher
    expect(page.locator("#console-notice")).to_contain_text("watching this console")
    ta.click("#terminal")
    ta.keyboard.type("echo from-ta")
    expect(ta.locator("#console-notice")).to_contain_text("read-only")
    page.click("#terminal")
    page.keyboard.type("echo last-$((60+6))")
    page.keyboard.press("Enter")
    expect(ta.locator("#terminal .xterm-rows")).to_contain_text("last-66")
    assert "from-ta" not in terminal_text(page)

    # Take control: the TA types, the student's console is read-only meanwhile, and both pages say so.
    ta.click("#take-control-button")
    expect(ta.locator("#console-mode")).to_have_attribute("data-mode", "rw")
    expect(ta.locator("#watch-banner")).to_contain_text("You have the keyboard")
    expect(page.locator("#console-mode")).to_have_attribute("data-mode", "ro")
    expect(page.locator("#console-mode")).to_contain_text("has the keyboard")
    expect(page.locator("#key-bar")).to_be_hidden()
    page.click("#terminal")
    page.keyboard.type("echo blocked-$((1+1))")
    expect(page.locator("#console-notice")).to_contain_text("has the keyboard")
    ta.click("#terminal")
    ta.keyboard.type("echo ta-typed-$((2+3))")
    ta.keyboard.press("Enter")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("ta-typed-5")
    assert "blocked" not in terminal_text(page)
    ta.screenshot(path=str(ARTIFACTS / "browser-staff-has-the-keyboard.png"), full_page=True)
    page.screenshot(path=str(ARTIFACTS / "browser-student-read-only.png"), full_page=True)
    ta.click("#release-control-button")
    expect(page.locator("#console-mode")).to_have_attribute("data-mode", "rw")
    expect(ta.locator("#console-mode")).to_have_attribute("data-mode", "ro")
    expect(ta.locator("#watch-banner")).to_contain_text("read-only")

    ta.click("#recording-link")
    expect(ta.locator("#play-button")).to_be_enabled()  # once the recording has loaded, not before
    ta.click("#play-button")
    expect(ta.locator("#player .xterm-rows")).to_contain_text(marker, timeout=60_000)
    ta.screenshot(path=str(ARTIFACTS / "browser-recording-replay.png"), full_page=True)
    staff.close()
    context.close()


@pytest.fixture
def unpullable_lab(lab_a):
    lab_a.image = "quay.io/containerdisks/missing-image:1"  # kubesim cannot pull images matching "missing"
    lab_a.save(update_fields=["image"])
    return lab_a


def test_a_start_that_cannot_pull_its_image_says_it_is_slow_then_why_it_failed(
    student_a, unpullable_lab, impatient_portal, browser
):
    from playwright.sync_api import expect

    lab_a = unpullable_lab
    context, page = student_page(browser, impatient_portal.url)
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    page.goto(f"/labs/{lab_a.id}/")
    page.click("#start-button")
    expect(page.locator("#progress [data-step='provisioned']")).to_have_class(re.compile(r"\bdone\b"))
    # A VM that never runs has no console to open: the page waits for it without a socket.
    expect(page.locator("#console-status")).to_have_attribute("data-state", "waiting")
    # Nor is the student told they only watch it: what they may do is the portal's to say once it connects.
    expect(page.locator("#console-mode")).to_have_text("")
    expect(page.locator("#slow-start")).to_be_visible()
    expect(page.locator("#slow-start")).to_contain_text("longer than usual")
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-failed\b"), timeout=60_000)
    expect(page.locator("#failure")).to_be_visible()
    expect(page.locator("#failure")).to_contain_text(re.compile(r"could not start: .*\S"))
    expect(page.locator("#slow-start")).to_be_hidden()
    expect(page.locator("#check-button")).to_be_hidden()
    expect(page.locator("#console-status")).to_have_attribute("data-state", "ended")
    assert any("/events/" in url for url in sockets) and not any("/console/" in url for url in sockets), sockets
    expect(page.locator("#fit-button")).to_be_hidden()
    # The VM never ran: no empty terminal or check results beside the reason.
    expect(page.locator("#terminal-section")).to_be_hidden()
    expect(page.locator("#results")).to_be_hidden()
    # The row's end, drawn by the page, reads as its start, written by the server.
    row = page.locator("[data-history-attempt] time")
    expect(row).to_have_count(2)
    written = re.compile(r"[A-Z][a-z]{2} \d{1,2}, \d{4}, \d{1,2}:\d{2} [AP]M UTC")
    assert all(written.fullmatch(text) for text in row.all_inner_texts()), row.all_inner_texts()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-failed-start.png"), full_page=True)
    # Back later, the student still reads why, above Start.
    page.reload()
    expect(page.locator("#last-failure")).to_contain_text(re.compile(r"Attempt 1 failed\. .*could not be downloaded"))
    expect(page.locator("#start-button")).to_be_visible()
    context.close()


def test_a_refused_start_says_why_on_the_page_and_can_be_tried_again(student_a, lab_a, live_portal, browser):
    from playwright.sync_api import expect

    from conftest import make_person
    from labs.models import Attempt, AttemptState
    from portal.models import Role, Tenant

    def capacity(vms: int) -> None:
        in_a_thread(lambda: Tenant.objects.filter(id=lab_a.course.tenant_id).update(max_concurrent_vms=vms))

    def classmate_holds_a_vm() -> None:
        holder = make_person(username="holder", tenant=lab_a.course.tenant, course=lab_a.course, role=Role.STUDENT)
        Attempt.objects.create(lab=lab_a, student=holder, tenant=holder.tenant, state=AttemptState.RUNNING)

    in_a_thread(classmate_holds_a_vm)
    capacity(1)  # the institution's capacity is used up
    context, page = student_page(browser, live_portal.url)
    context.clock.install()  # the page's own clock, to be moved on instead of waiting out the server's Retry-After
    page.goto(f"/labs/{lab_a.id}/")
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    page.evaluate("window.sameDocument = true")
    page.click("#start-button")
    message = page.locator("#start-message")
    expect(message).to_be_visible()
    expect(message).to_contain_text("capacity is full")
    # Full for now: the page says when it tries again, counting down, and the button stops the waiting.
    expect(message).to_contain_text(re.compile(r"Trying again by itself in \d+ s\."))
    expect(page.locator("#start-button")).to_have_text("Stop waiting")
    # The count goes down each second, in a part of the alert that is not announced again each time.
    countdown = message.locator("span[aria-live=off]")
    first = int(countdown.inner_text())
    assert 30 <= first <= 60  # the portal's Retry-After (RETRY_AFTER_RANGE)
    page.clock.run_for(3_000)
    expect(countdown).to_have_text(str(first - 3))
    page.click("#start-button")
    expect(message).to_have_text("Not trying again. Press Start when you want to try.")
    expect(page.locator("#start-button")).to_be_enabled()
    expect(page.locator("#start-button")).to_have_text("Start the lab")
    capacity(5)
    page.clock.run_for(90_000)  # nothing is tried once the waiting stopped, though there would be room now
    assert not in_a_thread(lambda: Attempt.objects.filter(lab=lab_a, student=student_a).exists())
    assert page.evaluate("window.sameDocument === true")

    capacity(1)
    page.click("#start-button")  # refused again, and waiting again
    expect(message).to_contain_text("Trying again by itself in")
    capacity(5)  # capacity freed: when its time comes the page starts the lab by itself
    page.clock.run_for(90_000)  # past any Retry-After the portal gives (RETRY_AFTER_RANGE)
    expect(page.locator("#attempt-panel")).to_be_visible()
    expect(page.locator("#start-message")).to_have_count(0)
    assert page.evaluate("window.sameDocument === true")
    assert in_a_thread(lambda: Attempt.objects.filter(lab=lab_a, student=student_a).count()) == 1
    assert any("/start/" in url for url in posts), posts
    context.close()


def test_start_is_posted_over_http_and_the_panel_follows_the_attempt_on_its_own_socket(
    student_a, lab_a, live_portal, kubesim_server, browser
):
    from playwright.sync_api import expect

    from labs.models import Attempt

    context, page = student_page(browser, live_portal.url)
    posts: list[str] = []
    sockets: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    page.on("websocket", lambda socket: sockets.append(socket.url))
    page.goto(f"/labs/{lab_a.id}/")
    page.evaluate("window.sameDocument = true")
    page.click("#start-button")
    expect(page.locator("#attempt-panel")).to_be_visible()
    expect(page.locator("#live-indicator")).to_have_class(re.compile(r"\bon\b"))  # the attempt's own socket
    assert any(url.endswith(f"/labs/{lab_a.id}/start/") for url in posts), posts
    attempt_id = in_a_thread(lambda: Attempt.objects.get(lab=lab_a).id)
    # With "?notice=1" when the page was drawn with a notice (before the portal's first sync pass, say).
    assert any(re.search(rf"/ws/attempts/{attempt_id}/events/(\?notice=1)?$", url) for url in sockets), sockets
    assert not any("/ws/labs/" in url for url in sockets), sockets

    # The cluster stops answering while the page is open: the sync's next pass puts the notice up, and takes it down
    # once the cluster answers again (a steady namespace is listed every ATTEMPT_RESYNC_SECONDS), without a reload.
    notice = page.locator("#cluster-notice")
    kubesim_server.admin.inject_fault(code=503)
    try:
        expect(notice).to_contain_text("The cluster is not answering", timeout=60_000)
        expect(notice).to_be_visible()
    finally:
        kubesim_server.admin.clear_faults()
    expect(notice).to_be_hidden(timeout=60_000)
    assert page.evaluate("window.sameDocument === true")
    context.close()


def test_a_start_the_portal_was_too_busy_to_answer_is_tried_again_by_the_page(student_a, lab_a, live_portal, browser):
    """``portal.views.server_error`` answers 503
    ``portal_busy`` with Retry-After when no database connection came free in time; the lab page waits that out and
    tries again by itself, as for full capacity. The first Start is answered as the portal answers then (its
    handler's own body), the second reaches the portal."""
    from playwright.sync_api import expect

    from labs.models import Attempt

    busy = {
        "error": "The portal is very busy right now and could not answer. Try again in a few seconds.",
        "code": "portal_busy",
    }
    answered: list[str] = []

    def start_route(route):
        if not answered:
            answered.append("busy")
            route.fulfill(
                status=503, headers={"Retry-After": "4", "Content-Type": "application/json"}, body=json.dumps(busy)
            )
        else:
            answered.append("portal")
            route.continue_()

    context, page = student_page(browser, live_portal.url)
    context.clock.install()
    page.route(f"**/labs/{lab_a.id}/start/", start_route)
    page.goto(f"/labs/{lab_a.id}/")
    page.click("#start-button")
    message = page.locator("#start-message")
    expect(message).to_contain_text("very busy")
    expect(message).to_contain_text(re.compile(r"Trying again by itself in \d+ s\."))
    assert int(message.locator("span[aria-live=off]").inner_text()) == 4
    page.clock.run_for(5_000)
    expect(page.locator("#attempt-panel")).to_be_visible()
    assert answered == ["busy", "portal"]
    assert in_a_thread(lambda: Attempt.objects.filter(lab=lab_a).count()) == 1
    context.close()


def test_at_the_per_student_cap_the_lab_page_offers_start_once_the_other_lab_has_ended(
    student_a, lab_a, course_a, live_portal, browser
):
    from playwright.sync_api import expect

    from conftest import make_lab
    from labs.models import Attempt, AttemptState
    from portal.models import Tenant

    def setup():
        Tenant.objects.filter(id=course_a.tenant_id).update(max_vms_per_student=1)
        other = make_lab(course_a, title="Networking")
        return other, Attempt.objects.create(
            lab=other, student=student_a, tenant=course_a.tenant, state=AttemptState.STOPPING
        )

    _other_lab, going = in_a_thread(setup)
    context, page = student_page(browser, live_portal.url)
    context.clock.install()
    page.goto(f"/labs/{lab_a.id}/")
    refusal = page.locator("#start-refusal")
    expect(refusal).to_contain_text("and it is stopping: try again once it has ended")
    page.evaluate("window.sameDocument = true")

    # The other lab is still there (running again, say): the words change in place, the page stays.
    in_a_thread(lambda: Attempt.objects.filter(id=going.id).update(state=AttemptState.RUNNING))
    page.clock.run_for(61_000)
    expect(refusal).to_contain_text("Stop it to start this one.")
    assert page.evaluate("window.sameDocument === true")

    # Stopped in another tab: coming back to this one brings Start, without waiting for the next minute.
    in_a_thread(lambda: Attempt.objects.filter(id=going.id).update(state=AttemptState.STOPPED))
    page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    expect(page.locator("#start-button")).to_be_visible()
    expect(page.locator("#start-refusal")).to_have_count(0)
    context.close()


def pushed(attempt_id: int, **changes) -> None:
    """The attempt changed (``changes``) and its update was pushed, as the lifecycle does after a commit."""
    from labs.models import Attempt
    from labs.selectors import attempt_status_payload
    from labs.services.events import attempt_group, send_to_group

    Attempt.objects.filter(id=attempt_id).update(**changes)
    payload = attempt_status_payload(Attempt.objects.get(id=attempt_id))
    send_to_group(attempt_group(attempt_id), {"type": "attempt.update", "attempt": payload})


def lab_page_following(student, lab, state: str, live_portal, browser):
    """An attempt of ``lab`` in ``state`` and the student's lab page, its socket following the attempt."""
    from playwright.sync_api import expect

    from labs.models import Attempt

    attempt = in_a_thread(
        lambda: Attempt.objects.create(lab=lab, student=student, tenant=lab.course.tenant, state=state)
    )
    context, page = student_page(browser, live_portal.url)
    page.goto(f"/labs/{lab.id}/")
    expect(page.locator("#live-indicator")).to_have_class(re.compile(r"\bon\b"))
    return attempt, context, page


def test_a_lab_stopped_as_left_says_so_on_the_page_that_comes_back_to_it(student_a, lab_a, live_portal, browser):
    from playwright.sync_api import expect

    from labs.models import AttemptState

    attempt, context, page = lab_page_following(student_a, lab_a, AttemptState.STARTING, live_portal, browser)
    row = page.locator(f"#history [data-history-attempt='{attempt.id}']")
    expect(row.locator(".state")).to_have_text("Starting")
    expect(row.locator(".stop-reason")).to_have_count(0)

    # As the page gets it when its socket is back after the stop.
    in_a_thread(lambda: pushed(attempt.id, state=AttemptState.STOPPED, stop_reason="left"))
    expect(row.locator(".state")).to_have_text("Stopped")
    expect(row.locator(".stop-reason")).to_have_text("no page had it open")
    context.close()


def test_a_late_update_from_another_process_does_not_take_the_page_back(student_a, lab_a, live_portal, browser):
    from playwright.sync_api import expect

    from labs.models import AttemptState

    attempt, context, page = lab_page_following(student_a, lab_a, AttemptState.PROVISIONING, live_portal, browser)
    state = page.locator("#attempt-state")
    expect(state).to_have_text("Provisioning")
    # Every state the page shows from now on, in order.
    page.evaluate("""() => {
      window.shown = [];
      const element = document.getElementById("attempt-state");
      new MutationObserver(() => window.shown.push(element.textContent)).observe(
        element, {childList: true, characterData: true, subtree: true});
    }""")
    in_a_thread(lambda: pushed(attempt.id, state=AttemptState.STOPPING))  # the student stopped it (the web's push)
    expect(state).to_have_text("Stopping")
    # The worker's "provisioning", sent after it (it was held, or its process was slow): behind what the page shows.
    in_a_thread(lambda: pushed(attempt.id, state=AttemptState.PROVISIONING))
    in_a_thread(lambda: pushed(attempt.id, state=AttemptState.STOPPED))
    expect(state).to_have_text("Stopped")
    assert "Provisioning" not in page.evaluate("window.shown"), page.evaluate("window.shown")
    context.close()


def test_a_student_abroad_takes_the_browsers_time_zone_for_every_page(student_a, lab_a, tenant_a, live_portal, browser):
    from playwright.sync_api import expect

    from portal.models import Tenant

    due = datetime(2026, 12, 5, 14, 59, tzinfo=ZoneInfo("UTC"))  # 23:59 in Tokyo, 9:59 in New York

    def tokyo_and_due() -> None:
        Tenant.objects.filter(id=tenant_a.id).update(time_zone="Asia/Tokyo")
        type(lab_a).objects.filter(id=lab_a.id).update(due_at=due)

    in_a_thread(tokyo_and_due)
    context = browser.new_context(base_url=live_portal.url, timezone_id="America/New_York")
    context.set_default_timeout(30_000)
    page = context.new_page()
    console_errors: list[str] = []
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
    log_in_as_student_a(page)
    page.goto(f"/labs/{lab_a.id}/")
    expect(page.locator("html")).to_have_attribute("data-time-zone", "Asia/Tokyo")
    expect(page.locator("body")).to_contain_text("Dec 5, 2026, 11:59 PM JST")

    # The header's zone leads to the page, which offers the browser's own zone.
    page.click("a.time-zone-link")
    page.wait_for_url("**/accounts/time-zone/**")
    offer = page.locator("#use-browser-zone")
    expect(offer).to_have_text("Use this browser’s time zone (America/New_York)")
    offer.click()
    expect(page.locator("#id_time_zone")).to_have_value("America/New_York")
    expect(page.locator("#browser-zone")).to_be_hidden()
    page.click("#time-zone-form button[type=submit]")

    # Back on the lab page, which is now in New York's clock, and says so.
    page.wait_for_url(f"**/labs/{lab_a.id}/")
    expect(page.locator(".messages")).to_contain_text("Dates and times are now shown in America/New_York.")
    expect(page.locator("html")).to_have_attribute("data-time-zone", "America/New_York")
    expect(page.locator("body")).to_contain_text("Dec 5, 2026, 9:59 AM EST")
    # Nothing left to offer: the chosen zone is the browser's.
    page.click("a.time-zone-link")
    expect(page.locator("#id_time_zone")).to_have_value("America/New_York")
    expect(page.locator("#browser-zone")).to_be_hidden()
    assert [text for text in console_errors if not known_unrelated_console_error(text)] == []
    context.close()
