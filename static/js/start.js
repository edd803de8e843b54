/*
 * Start without leaving the lab page. The Start form is posted with fetch(); the answer brings the attempt panel
 * (with its #attempt-config), which takes the place of the Start card, and the attempt's row for the history
 * table; a "portal:panel" event tells console.js and attempt.js to take the panel over. A refusal is shown in the
 * Start card. Without JavaScript the form posts and the page reloads, with the same outcome.
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

  function refused(text) {
    message.textContent = text;
    message.hidden = false;
  }

  function swap(id, html) {
    const old = document.getElementById(id);
    old.insertAdjacentHTML("afterend", html);
    old.remove();
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const label = button.textContent;
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
      button.disabled = false;
      button.textContent = label;
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
    refused(format(form.dataset.failed, { message: body.error || response.statusText }));
    button.disabled = false;
    button.textContent = label;
  });
})();
