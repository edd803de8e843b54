/*
 * The staff's class view of a lab: its table (#class-view) is pushed over /ws/labs/<id>/class/ whenever a student's
 * attempt or Check changes (and each minute, for the times left), and replaced in place. Reconnects with backoff.
 */
"use strict";

(function () {
  const status = document.getElementById("class-view-updated");
  if (!status) {
    return;
  }
  const RETRY_MAX_MS = 15000;
  let failures = 0;

  function show(live) {
    status.textContent = live ? status.dataset.live : status.dataset.offline;
    status.dataset.state = live ? "on" : "off";
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + status.dataset.socket);
    socket.addEventListener("open", () => {
      failures = 0;
      show(true);
    });
    socket.addEventListener("message", (event) => {
      let message = null;
      try {
        message = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (message.type === "class.view") {
        const old = document.getElementById("class-view");
        old.insertAdjacentHTML("afterend", message.html);
        old.remove();
      }
    });
    socket.addEventListener("close", (event) => {
      show(false);
      if (event.code === 4401 || event.code === 4404) {
        return; // signed out, or no longer staff of this course: a reload says which
      }
      failures += 1;
      const delay = Math.min(RETRY_MAX_MS, 250 * 2 ** Math.min(failures, 6)) * (0.5 + Math.random() / 2);
      window.setTimeout(connect, delay);
    });
  }

  connect();
})();
