/*
 * Start without leaving the lab page: pressing Start posts the form with fetch(). The answer brings the attempt
 * panel (with its #attempt-config), which takes the place of the Start card, and the attempt's row for the history
 * table; a "portal:panel" event hands the panel to attempt.js, which follows the attempt on its own socket
 * (/ws/attempts/<id>/events/), and to console.js. A refusal is shown in the Start card. Without JavaScript the form
 * posts and the page reloads, with the same outcome.
 *
 * A refusal for want of room (a class starting together, the institution's capacity full) says when to come back
 * (Retry-After, spread by the server so that a refused class does not return in the same second): the page waits
 * that long, counting down, and tries again by itself, up to AUTO_RETRIES times; the button stops the waiting.
 */
"use strict";

(function () {
  const form = document.getElementById("start-form");
  if (!form) {
    return;
  }
  const button = document.getElementById("start-button");
  const message = document.getElementById("start-message");
  const format = window.portal.format;
  const label = button.textContent;
  // Refusals worth waiting out: the portal or the institution is full for now, or the portal too busy to answer.
  const WAIT_CODES = ["too_many_starts", "quota_full", "portal_busy"];
  const AUTO_RETRIES = 5;
  let retries = 0;
  let waiting = null; // the countdown's interval while the page waits to try again

  function refused(text) {
    message.textContent = text;
    message.hidden = false;
  }

  function ready() {
    button.disabled = false;
    button.textContent = label;
  }

  function stopWaiting() {
    window.clearInterval(waiting);
    waiting = null;
    form.classList.remove("waiting");
  }

  function waitThenRetry(error, seconds) {
    retries += 1;
    let left = seconds;
    // The message is announced once (role="alert"); the countdown inside it changes silently, not every second.
    const count = document.createElement("span");
    count.setAttribute("aria-live", "off");
    count.textContent = String(left);
    const [before, after = ""] = format(form.dataset.retrying, { message: error }).split("%(seconds)s");
    message.replaceChildren(before, count, after);
    message.hidden = false;
    button.disabled = false;
    button.textContent = form.dataset.stopWaiting;
    form.classList.add("waiting");
    waiting = window.setInterval(() => {
      left -= 1;
      if (left > 0) {
        count.textContent = String(left);
        return;
      }
      stopWaiting();
      form.requestSubmit();
    }, 1000);
  }

  function swap(id, html) {
    const old = document.getElementById(id);
    old.insertAdjacentHTML("afterend", html);
    old.remove();
  }

  // The Start's answer: { ok, code, error, retryAfter, body }.
  async function requestStart() {
    const response = await window.portal.postForm(form);
    const body = await response.json().catch(() => ({}));
    return {
      ok: response.status === 201 && Boolean(body.panel),
      code: body.code,
      error: body.error || response.statusText,
      retryAfter: parseInt(response.headers.get("Retry-After") || "", 10),
      body,
    };
  }

  function showAttempt(body) {
    const history = document.getElementById("history");
    history.tBodies[0].insertAdjacentHTML("afterbegin", body.history_row);
    history.hidden = false;
    const empty = document.getElementById("history-empty");
    if (empty) {
      empty.remove();
    }
    swap("start-card", body.panel);
    // From here attempt.js follows the attempt, on the attempt's own socket.
    document.dispatchEvent(new CustomEvent("portal:panel"));
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (waiting !== null) { // "Stop waiting"
      stopWaiting();
      retries = 0;
      refused(form.dataset.stoppedWaiting);
      ready();
      return;
    }
    if (button.disabled) {
      return; // a Start is on its way already
    }
    button.disabled = true;
    button.textContent = form.dataset.starting;
    message.hidden = true;
    let outcome;
    try {
      outcome = await requestStart();
    } catch (error) {
      refused(form.dataset.networkError);
      ready();
      return;
    }
    if (outcome.ok) {
      showAttempt(outcome.body);
      return;
    }
    if (outcome.code === "attempt_active") {
      // Started already (another tab): the page shows that attempt once reloaded.
      window.location.reload();
      return;
    }
    if (WAIT_CODES.includes(outcome.code) && outcome.retryAfter > 0 && retries < AUTO_RETRIES) {
      waitThenRetry(outcome.error, outcome.retryAfter);
      return;
    }
    retries = 0;
    refused(format(form.dataset.failed, { message: outcome.error }));
    ready();
  });
})();
