"""The attempt page's script strings, translated on the server and handed to the page as JSON data."""

from __future__ import annotations

import functools

from django.utils.translation import get_language, gettext_lazy, ngettext
from django.utils.translation import gettext as _

from labs.models import AttemptState

# The start's milestones as the page lists them; keys are attempt_status_payload()["timestamps"] keys.
PROGRESS_STEPS = [
    ("requested", gettext_lazy("Requested")),
    ("provisioned", gettext_lazy("VM created")),
    ("scheduled", gettext_lazy("Scheduled on a node")),
    ("vmi_running", gettext_lazy("VM running")),
    ("agent_ready", gettext_lazy("Ready")),
]


def attempt_page_strings() -> dict[str, object]:
    """The strings in the active language, built once per language and process; callers only read them."""
    return _strings_in(get_language())


@functools.lru_cache(maxsize=16)
def _strings_in(language: str | None) -> dict[str, object]:
    # ``language`` is the active one (the cache key); gettext below reads it from the same place.
    return {
        "states": {value: str(label) for value, label in AttemptState.choices},
        "steps": {key: str(label) for key, label in PROGRESS_STEPS},
        "elapsed": _("+%(seconds)s s"),
        "slow_start": _(
            "Starting is taking longer than usual. The cluster may be busy; your VM will start as soon as "
            "there is room."
        ),
        "slow_boot": _("Your VM is taking longer than usual to boot; the terminal shows how far it has got."),
        "failed": _("The lab could not start: %(reason)s"),
        "time_left": _("Time left: %(time)s"),
        "expired": _("Time is up."),
        "extensions_left": _("Extensions left: %(count)s"),
        "ended": _("This attempt has ended."),
        # Beside the state in the attempt's history row, as the lab page draws it (labs/_attempt_history_row.html).
        "stop_reasons": {"left": _("no page had it open")},
        "start_again": _("Reload the page to start a new attempt."),
        # The Check button while grading holds a next press back: "Check (7 s)".
        "check_wait": _("Check (%(seconds)s s)"),
        "confirm_stop": _("Stop the lab? Your VM will be deleted; your work is checked one last time first."),
        "action_failed": _("That did not work: %(message)s"),
        "network_error": _("The portal could not be reached. Check your connection and try again."),
        "check_queued": _("Checking…"),
        "check_running": _("Running the checks…"),
        "check_error": _("The check could not be completed: %(message)s"),
        "score": _("Score: %(score)s / %(max)s"),
        "late_penalty": _("Late penalty: %(percent)s%%"),
        "passed": _("Passed"),
        "not_passed": _("Not passed"),
        # By the maximum's plural category in the page's language (Intl.PluralRules): "0 / 1 point", "0 / 2 points".
        "points": {
            category: ngettext("%(points)s / %(max)s point", "%(points)s / %(max)s points", count)
            for category, count in (("one", 1), ("other", 2))
        },
        "timed_out": _("Timed out"),
        "live_connected": _("Live updates on"),
        "live_reconnecting": _("Live updates interrupted; reconnecting…"),
        "console": {
            "connecting": _("Connecting to the console…"),
            "waiting": _("Waiting for the VM to start; the console opens as soon as it runs…"),
            "connected": _("Connected"),
            "lost": _("The connection to the VM's console was lost. Reconnecting…"),
            "failed": _("The VM has failed; its console is not available."),
            "ended": _("The VM is gone; this attempt has ended."),
            "disconnected": _("Disconnected from the portal. Reconnecting…"),
            "refused": _("You may not use this console."),
            "signed_out": _("You are signed out. Reload the page to sign in again."),
            "read_only": _("Read-only: you are watching this console."),
            "read_write": _("You can type in this console."),
            "keyboard_held": _("Read-only: %(who)s (course staff) has the keyboard."),
            "lagging": _("Your browser is falling behind the output; the screen will be redrawn."),
        },
        "notices": {
            "read_only": _("This console is read-only for you. Use “Take control” to type."),
            "input_too_large": _("That paste is too large; paste less at a time."),
            "input_rate": _("Typing too fast: some input was dropped."),
            "not_connected": _("The console is not connected; your input was not sent."),
            "bad_message": _("The portal did not understand a message from this page."),
            "not_allowed": _("You may not do that."),
            "too_slow": _("Your browser could not keep up with the output; reload the page."),
            "staff_watching": _("%(who)s (course staff) is watching this console."),
            "control_taken": _(
                "%(who)s (course staff) has taken the keyboard: you can watch, and type again once they hand it back."
            ),
            "keyboard_held": _("%(who)s (course staff) has the keyboard; what you typed was not sent."),
            "control_released": _("%(who)s (course staff) has handed the keyboard back."),
        },
        "fit_typed": _("Typed “%(command)s” into the terminal."),
        "fit_set": _("The VM's terminal is now %(cols)s columns by %(rows)s rows."),
        "fit_failed": _("The VM did not answer, so its terminal size was not set."),
        "copied": _("Copied to the clipboard."),
        "clipboard_unavailable": _(
            "The browser did not allow access to the clipboard; use Ctrl+Shift+C / Ctrl+Shift+V."
        ),
    }
