/*
 * Start without leaving the lab page. The Start form is posted with fetch(); the answer brings the attempt panel
 * (with its #attempt-config), which takes the place of the Start card, and the attempt's row for the history
 * table; a "portal:panel" event tells console.js and attempt.js to take the panel over. A refusal is shown in the
 * Start card. Without JavaScript the form posts and the page reloads, with the same outcome.
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

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (waiting !== null) { // "Stop waiting"
      stopWaiting();
      retries = 0;
      refused(form.dataset.stoppedWaiting);
      ready();
      return;
    }
    button.disabled = true;
    button.textContent = form.dataset.starting;
    message.hidden = true;
    let response;
    let body = {};
    try {
      response = await window.portal.postForm(form);
      body = await response.json().catch(() => ({}));
    } catch (error) {
      refused(form.dataset.networkError);
      ready();
      return;
    }
    if (response.status === 201 && body.panel) {
      const history = document.getElementById("history");
      history.tBodies[0].insertAdjacentHTML("afterbegin", body.history_row);
      history.hidden = false;
      const empty = document.getElementById("history-empty");
      if (empty) {
        empty.remove();
      }
      swap("start-card", body.panel);
      document.dispatchEvent(new Event("portal:panel"));
      return;
    }
    if (body.code === "attempt_active") {
      // Started already (another tab): the page shows that attempt once reloaded.
      window.location.reload();
      return;
    }
    const retryAfter = parseInt(response.headers.get("Retry-After") || "", 10);
    if (WAIT_CODES.includes(body.code) && retryAfter > 0 && retries < AUTO_RETRIES) {
      waitThenRetry(body.error || response.statusText, retryAfter);
      return;
    }
    retries = 0;
    refused(format(form.dataset.failed, { message: body.error || response.statusText }));
    ready();
  });
})();
