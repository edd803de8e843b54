"""The lab page in a real browser: code blocks run in the terminal, the terminal fitted (again once a VM that booted
with the console open runs), a slow boot called one, Check's cooldown, Start again, the console closed by signing
out in another tab, and an author's table laid out as a table."""

from __future__ import annotations

import base64
import re

import pytest

from labs.tests.test_browser import (  # noqa: F401 (fixtures)
    browser,
    impatient_portal,
    in_a_thread,
    live_portal,
    student_page,
)

# How many pixels of a PNG (base64) are light: text drawn on the terminal's black.
LIT_PIXELS = """async (png) => {
  const image = new Image();
  image.src = "data:image/png;base64," + png;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.width;
  canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  let lit = 0;
  for (let i = 0; i < data.length; i += 4) {
    lit += data[i] + data[i + 1] + data[i + 2] > 300 ? 1 : 0;
  }
  return lit;
}"""

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_run_in_terminal_fit_check_cooldown_and_start_again(student_a, lab_a, live_portal, browser):  # noqa: F811
    from playwright.sync_api import expect

    from labs.models import Lab

    in_a_thread(
        lambda: Lab.objects.filter(id=lab_a.id).update(
            instructions="# Linux basics\n\n```sh\necho hello world > ~/hello.txt\necho ran-$((20+3))\n```\n"
        )
    )
    context, page = student_page(browser, live_portal.url)
    page.set_viewport_size({"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"/labs/{lab_a.id}/")
    page.click("#start-button")
    expect(page.locator("#console-status")).to_have_attribute("data-state", "connected", timeout=90_000)

    # Fitted to its box when it connects, not left at 80×24.
    cols = page.evaluate("window.portalTerminal.cols")
    assert cols > 80, cols
    # A row is tall enough for what hangs lowest in the font: a line of underscores (drawn here only) shows.
    page.evaluate("window.portalTerminal.write('\\x1b[2J\\x1b[H' + '_'.repeat(40) + '\\r\\n')")
    first_row = page.locator("#terminal .xterm-rows > div").first
    expect(first_row).to_have_text("_" * 40)
    assert page.evaluate(LIT_PIXELS, base64.b64encode(first_row.screenshot()).decode()) > 100

    # "Run in terminal" types the code block into the console.
    page.click(".instructions .code-run")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("ran-23")

    # On a phone's width the key row sends what its keyboard lacks (Tab completes, Ctrl+C interrupts).
    page.set_viewport_size({"width": 390, "height": 844})
    expect(page.locator("#key-bar")).to_be_visible()
    page.click("#terminal")
    page.keyboard.type("sleep 30")
    page.click("#key-bar [data-key='ctrl-c']")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("^C")
    assert page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)") <= 390
    page.set_viewport_size({"width": 1280, "height": 900})
    expect(page.locator("#key-bar")).to_be_hidden()

    # Check: the button counts the cooldown down instead of letting a press be refused.
    page.click("#check-button")
    expect(page.locator("#results-list li.result.passed")).to_have_count(2, timeout=60_000)
    check = page.locator("#check-button")
    expect(check).to_be_disabled()
    expect(check).to_have_text(re.compile(r"Check \(\d+ s\)"))
    expect(check).to_be_enabled(timeout=20_000)
    expect(check).to_have_text("Check")
    expect(page.locator("#action-message")).to_have_text("")

    # Stop: the history's Ended cell fills in, and Start again is offered in place.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-button")
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-stopped\b"), timeout=90_000)
    expect(page.locator("#history [data-history-attempt] .history-ended time")).to_have_text(
        re.compile(r"\w+ \d+, \d{4}, \d+:\d\d [AP]M UTC")
    )  # as the server writes the Started cell
    expect(page.locator("#ended")).not_to_contain_text("Reload")
    page.click("#start-again-button")
    expect(page.locator("#attempt-heading")).to_have_text("Attempt 2", timeout=60_000)
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-running\b"), timeout=90_000)
    expect(page.locator("#console-status")).to_have_attribute("data-state", "connected", timeout=90_000)

    # Signing out in another tab closes this one's console: it says so, and offers no typing any more.
    other = context.new_page()
    other.goto("/")
    other.click("form.inline-form [type=submit]")
    expect(page.locator("#console-status")).to_have_text("You are signed out. Reload the page to sign in again.")
    expect(page.locator("#console-mode")).to_have_text("")
    expect(page.locator("#paste-button")).to_be_hidden()
    assert not [e for e in errors if "Content Security Policy" not in e], errors
    context.close()


def test_an_instructions_table_is_ruled_and_keeps_its_words_whole(student_a, lab_a, live_portal, browser):  # noqa: F811
    from labs.models import Lab

    table = "| mode | meaning |\n|---|---|\n| `600` | " + "only the owner reads and writes it, " * 6 + "|\n"
    in_a_thread(lambda: Lab.objects.filter(id=lab_a.id).update(instructions=table))
    context, page = student_page(browser, live_portal.url)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/labs/{lab_a.id}/")
    heading = page.locator(".instructions th").first
    lines = "th => { const r = document.createRange(); r.selectNodeContents(th); return r.getClientRects().length; }"
    assert heading.evaluate(lines) == 1  # "mode", not "mod" over "e"
    assert heading.evaluate("th => getComputedStyle(th).borderBottomStyle") == "solid"
    assert page.locator(".instructions table").get_attribute("tabindex") == "0"
    context.close()


def test_a_vm_slow_to_boot_is_said_to_boot_and_its_console_takes_the_windows_size_once_it_runs(
    student_a,
    lab_a,
    impatient_portal,  # noqa: F811
    kubesim_server,
    browser,  # noqa: F811
):
    from playwright.sync_api import expect

    context, page = student_page(browser, impatient_portal.url)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/labs/{lab_a.id}/")
    frames: list[str] = []
    page.on("websocket", lambda socket: socket.on("framereceived", lambda frame: frames.append(str(frame))))

    def wait_for_frame(text: str) -> None:
        for _ in range(100):  # the bridge answers a size within a few tenths of a second
            if any(text in frame for frame in frames):
                return
            page.wait_for_timeout(100)
        raise AssertionError(f"no {text} among {frames[-5:]}")

    # The guest's agent answers nothing yet (a booting VM): the size told on connect cannot be set.
    kubesim_server.admin.inject_fault(code=503, verbs=["get"], resources=["virtualmachineinstances/portforward"])
    try:
        page.click("#start-button")
        expect(page.locator("#console-status")).to_have_attribute("data-state", "connected", timeout=90_000)
        wait_for_frame('"resized", "via": "none"')
        # Slow, but not waiting for room in the cluster: the VM runs, and boots in the console.
        expect(page.locator("#slow-start")).to_have_text(
            "Your VM is taking longer than usual to boot; the terminal shows how far it has got."
        )
        expect(page.locator("#attempt-state")).not_to_have_class(re.compile(r"\bstate-running\b"))
    finally:
        kubesim_server.admin.clear_faults()
    expect(page.locator("#attempt-state")).to_have_class(re.compile(r"\bstate-running\b"), timeout=60_000)
    wait_for_frame('"resized", "via": "agent"')
    rows, cols = page.evaluate("[window.portalTerminal.rows, window.portalTerminal.cols]")
    page.click("#terminal")
    page.keyboard.type("stty size; echo sized-$((1+1))")
    page.keyboard.press("Enter")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("sized-2")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text(f"{rows} {cols}")
    context.close()
