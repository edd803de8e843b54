/*
 * Start without leaving the lab page. The page opens its lab socket (/ws/labs/<id>/events/) as it loads, and
 * pressing Start sends {"type": "start"} on it: the answer (start.answer) brings the attempt panel (with its
 * #attempt-config), which takes the place of the Start card, and the attempt's row for the history table; the same
 * socket then carries the attempt's updates, and a "portal:panel" event hands it to attempt.js with the panel
 * (console.js takes the panel over too). Where the socket is not open (not yet, or lost), the Start form is posted
 * with fetch() instead and answered the same way. A refusal is shown in the Start card. Without JavaScript the form
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

  // ---- the lab socket ------------------------------------------------------------------------------------
  let socket = null; // open and not handed over yet
  let pending = null; // the Start sent on it, waiting for its answer: { resolve }
  let handedOver = false;
  let socketFailures = 0;
  const SOCKET_RETRY_MAX_MS = 30000;

  function openSocket() {
    if (handedOver || !form.dataset.socket || !("WebSocket" in window)) {
      return;
    }
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const candidate = new WebSocket(scheme + window.location.host + form.dataset.socket);
    candidate.addEventListener("open", () => {
      socket = candidate;
      socketFailures = 0;
      form.dataset.socketState = "open";
    });
    candidate.addEventListener("message", (event) => {
      if (handedOver || pending === null) {
        return;
      }
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (message.type === "start.answer" || message.type === "start.refused") {
        const answer = pending;
        pending = null;
        answer.resolve({ socketAnswer: message });
      }
    });
    candidate.addEventListener("close", (event) => {
      if (socket === candidate) {
        socket = null;
        form.dataset.socketState = "closed";
      }
      if (pending !== null) { // no answer came: ask over HTTP (a Start that did happen is refused as active there)
        const answer = pending;
        pending = null;
        answer.resolve({ lost: true });
      }
      if (handedOver || event.code === 4401 || event.code === 4404) {
        return;
      }
      socketFailures += 1;
      const delay = Math.min(SOCKET_RETRY_MAX_MS, 500 * 2 ** Math.min(socketFailures, 6)) * (0.5 + Math.random() / 2);
      window.setTimeout(openSocket, delay);
    });
  }

  function startOverSocket() {
    return new Promise((resolve) => {
      pending = { resolve };
      try {
        socket.send(JSON.stringify({ type: "start" }));
      } catch (error) { // closing under our feet: ask over HTTP
        pending = null;
        resolve({ lost: true });
      }
    });
  }

  // The HTTP Start's answer in the socket's terms: { ok, code, error, retryAfter, body }.
  async function startOverHttp() {
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

  async function requestStart() {
    if (socket !== null && socket.readyState === WebSocket.OPEN) {
      const outcome = await startOverSocket();
      if (outcome.socketAnswer) {
        const message = outcome.socketAnswer;
        return {
          ok: message.type === "start.answer",
          code: message.code,
          error: message.error,
          retryAfter: parseInt(message.retry_after || "", 10),
          body: message,
          socket: message.type === "start.answer" ? socket : null,
        };
      }
    }
    return startOverHttp();
  }

  function showAttempt(body, answeredOn) {
    const history = document.getElementById("history");
    history.tBodies[0].insertAdjacentHTML("afterbegin", body.history_row);
    history.hidden = false;
    const empty = document.getElementById("history-empty");
    if (empty) {
      empty.remove();
    }
    swap("start-card", body.panel);
    // From here attempt.js follows the attempt: on the socket the answer came on, or on the attempt's own.
    handedOver = true;
    if (!answeredOn && socket !== null) {
      socket.close();
    }
    document.dispatchEvent(new CustomEvent("portal:panel", { detail: { socket: answeredOn || null } }));
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
    if (pending !== null) {
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
      showAttempt(outcome.body, outcome.socket);
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

  openSocket();
})();
