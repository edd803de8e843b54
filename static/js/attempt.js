/*
 * The attempt panel: live status over /ws/attempts/<id>/events/ (no polling), the start progress with times,
 * the countdown to expiry, the cluster notice, and the Extend / Check / Stop buttons (fetch with the CSRF token).
 * Reads its configuration from the JSON block #attempt-config; announces state changes to console.js with a
 * "portal:attempt" event on document.
 */
"use strict";

(function () {
  function pageTimeFormat() {
    const root = document.documentElement;
    const options = { timeStyle: "medium" };
    if (root.dataset.timeZone) {
      options.timeZone = root.dataset.timeZone;
    }
    try {
      return new Intl.DateTimeFormat(root.lang || undefined, options);
    } catch (error) {  // a zone this browser does not know: its own clock rather than no times at all
      return new Intl.DateTimeFormat(root.lang || undefined, { timeStyle: "medium" });
    }
  }

  function pageDateTimeFormat() {
    const root = document.documentElement;
    // As the server writes a history row's times ("Dec 4, 2026, 5:53 AM UTC").
    const options = { year: "numeric", month: "short", day: "numeric", hour: "numeric", minute: "2-digit",
                      timeZoneName: "short" };
    try {
      return new Intl.DateTimeFormat(root.lang || undefined, { ...options, timeZone: root.dataset.timeZone });
    } catch (error) {
      return new Intl.DateTimeFormat(root.lang || undefined, options);
    }
  }

  function init(event) {
    const configElement = document.getElementById("attempt-config");
    if (!configElement) {
      return;
    }
    const config = JSON.parse(configElement.textContent);
    const S = config.strings;
    const FINAL_STATES = ["stopped", "failed", "expired"];
    // An attempt's states only move forward, in this order (the final ones last). Updates come from several
    // processes (the web's, each worker's), so one may arrive after a newer one: a state behind the one shown is
    // such a late update, and changes nothing.
    const STATE_ORDER = ["requested", "provisioning", "starting", "running", "stopping"];
    const stateRank = (state) => (STATE_ORDER.includes(state) ? STATE_ORDER.indexOf(state) : STATE_ORDER.length);
    const RETRY_MAX_MS = 30000;

    const byId = (id) => document.getElementById(id);
    const format = window.portal.format;
    // The page's clock (its tenant's time zone, as the server rendered the page's other times in), not the browser's.
    const timeFormat = pageTimeFormat();
    const pluralRules = new Intl.PluralRules(document.documentElement.lang || undefined);

    let attempt = config.initial;
    let latestRun = null;
    // Until when grading holds the next Check back (its minimum interval between two runs): the button counts it
    // down rather than letting a press be refused.
    let checkReadyAt = 0;
    const checkButtonLabel = byId("check-button") ? byId("check-button").textContent : "";
    const dateTimeFormat = pageDateTimeFormat();

    // ---- rendering -------------------------------------------------------------------------------------

    function setText(element, text) {
      if (element) {
        element.textContent = text;
      }
    }

    function show(element, visible) {
      if (element) {
        element.hidden = !visible;
      }
    }

    function renderProgress(payload) {
      const stamps = payload.timestamps || {};
      const requested = stamps.requested ? Date.parse(stamps.requested) : null;
      let currentMarked = false;
      // Cluster timestamps have whole-second precision, so a phase may appear to precede the request by a
      // fraction of a second: elapsed times never go below zero nor below the step before.
      let previousElapsed = 0;
      document.querySelectorAll("#progress [data-step]").forEach((item) => {
        const value = stamps[item.dataset.step];
        const timeElement = item.querySelector(".step-time");
        const elapsedElement = item.querySelector(".step-elapsed");
        item.classList.remove("current");
        if (value) {
          const at = Date.parse(value);
          item.classList.add("done");
          timeElement.dateTime = value;
          timeElement.textContent = timeFormat.format(new Date(at));
          const elapsed = Math.max(previousElapsed, requested !== null ? (at - requested) / 1000 : 0);
          previousElapsed = elapsed;
          elapsedElement.textContent =
            item.dataset.step === "requested" ? "" : format(S.elapsed, { seconds: elapsed.toFixed(1) });
        } else {
          item.classList.remove("done");
          timeElement.textContent = "";
          elapsedElement.textContent = "";
          if (!currentMarked && !FINAL_STATES.includes(payload.state) && payload.state !== "stopping") {
            item.classList.add("current");
            currentMarked = true;
          }
        }
      });
    }

    // A stop the student did not ask for says why beside the state, as the server draws the row: "no page had it
    // open" for a lab stopped as left (the page comes back to it once its socket reconnects).
    function renderStopReason(stateElement, payload) {
      const reason = (S.stop_reasons || {})[payload.stop_reason] || "";
      let note = stateElement.parentElement.querySelector(".stop-reason");
      if (reason && !note) {
        note = document.createElement("small");
        note.className = "muted stop-reason";
        stateElement.after(" ", note);
      }
      if (note) {
        note.textContent = reason;
        note.hidden = !reason;
      }
    }

    function renderAttempt(payload) {
      if (!payload || payload.id !== config.attempt_id) {
        return;
      }
      if (attempt && attempt.id === payload.id && stateRank(payload.state) < stateRank(attempt.state)) {
        return;
      }
      attempt = payload;
      const stateElement = byId("attempt-state");
      if (stateElement) {
        stateElement.className = "state state-" + payload.state;
        stateElement.textContent = S.states[payload.state] || payload.state;
      }
      renderProgress(payload);
      document.querySelectorAll(`[data-history-attempt="${payload.id}"] .state`).forEach((element) => {
        element.className = "state state-" + payload.state;
        element.textContent = S.states[payload.state] || payload.state;
        renderStopReason(element, payload);
      });
      const endedAt = payload.timestamps && payload.timestamps.ended;
      document.querySelectorAll(`[data-history-attempt="${payload.id}"] .history-ended`).forEach((cell) => {
        if (endedAt && !cell.querySelector("time")) {
          const time = document.createElement("time");
          time.dateTime = endedAt;
          time.textContent = dateTimeFormat.format(new Date(Date.parse(endedAt)));
          cell.replaceChildren(time);
        }
      });
      renderSlowStart();
      const failure = byId("failure");
      setText(failure, format(S.failed, { reason: payload.failure_reason || payload.message || "" }));
      show(failure, payload.state === "failed");
      // A VM that never ran has no output to read nor work to check: the reason and Start again stand alone.
      const neverRan = payload.state === "failed" && !(payload.timestamps || {}).vmi_running;
      show(byId("terminal-section"), !neverRan);
      show(byId("results"), !neverRan);
      const ended = FINAL_STATES.includes(payload.state);
      const endedElement = byId("ended");
      const startAgain = byId("start-again-form");
      setText(endedElement, S.ended + (config.is_student && !startAgain ? " " + S.start_again : ""));
      show(endedElement, ended && payload.state !== "failed");
      show(startAgain, ended);

      renderCheckButton();
      const stopButton = byId("stop-button");
      if (stopButton) {
        stopButton.disabled = ended || payload.state === "stopping";
      }
      document.querySelectorAll(".attempt-controls form").forEach((form) => {
        show(form, !ended && (form.dataset.action !== "extend" || Boolean(payload.can_extend)));
      });
      renderCountdown();
      document.dispatchEvent(new CustomEvent("portal:attempt", { detail: payload }));
    }

    function renderCheckButton() {
      const checkButton = byId("check-button");
      if (!checkButton) {
        return;
      }
      const wait = Math.ceil((checkReadyAt - Date.now()) / 1000);
      checkButton.textContent = wait > 0 ? format(S.check_wait, { seconds: wait }) : checkButtonLabel;
      checkButton.disabled = attempt.state !== "running" || runInProgress() || wait > 0;
    }

    function holdCheckFor(seconds) {
      checkReadyAt = Math.max(checkReadyAt, Date.now() + seconds * 1000);
      renderCheckButton();
    }

    function runInProgress() {
      return Boolean(latestRun && !latestRun.finished);
    }

    function renderRun(run) {
      if (!run || run.attempt_id !== config.attempt_id) {
        return;
      }
      if (latestRun && latestRun.id > run.id) {
        return; // an older run's late update
      }
      if (!latestRun || latestRun.id !== run.id) {
        // A new run (this tab's press or another's) holds the next one back from when it was asked for.
        const since = (Date.now() - Date.parse(run.created_at)) / 1000;
        const left = config.check_interval_seconds - (Number.isFinite(since) ? Math.max(0, since) : 0);
        holdCheckFor(Math.min(config.check_interval_seconds, left));
      }
      latestRun = run;
      const summary = byId("results-summary");
      const list = byId("results-list");
      summary.classList.remove("muted", "error");
      if (run.state === "queued") {
        summary.textContent = S.check_queued;
      } else if (run.state === "running") {
        summary.textContent = S.check_running;
      } else if (run.state === "error") {
        summary.textContent = format(S.check_error, { message: run.error || "" });
        summary.classList.add("error");
      } else {
        let text = format(S.score, { score: run.effective_score ?? run.score ?? 0, max: run.max_score ?? 0 });
        if (run.late_penalty_percent) {
          text += " · " + format(S.late_penalty, { percent: run.late_penalty_percent });
        }
        summary.textContent = text;
      }
      list.replaceChildren();
      (run.results || []).forEach((result) => {
        const item = document.createElement("li");
        item.className = "result " + (result.passed ? "passed" : "failed");
        item.dataset.check = String(result.check_id);
        const mark = document.createElement("span");
        mark.className = "result-mark";
        mark.textContent = result.passed ? "✓" : "✗";
        mark.setAttribute("aria-label", result.passed ? S.passed : S.not_passed);
        const title = document.createElement("span");
        title.className = "result-title";
        title.textContent = result.title;
        const points = document.createElement("span");
        points.className = "result-points";
        const max = result.max_points ?? 0;
        const plural = S.points[pluralRules.select(Number(max))] || S.points.other;
        points.textContent = format(plural, { points: result.points ?? 0, max: max });
        item.append(mark, " ", title, " ", points);
        if (result.timed_out) {
          const badge = document.createElement("span");
          badge.className = "badge";
          badge.textContent = S.timed_out;
          item.append(" ", badge);
        }
        if (result.feedback) {
          const feedback = document.createElement("p");
          feedback.className = "result-feedback";
          feedback.textContent = result.feedback;
          item.append(feedback);
        }
        list.append(item);
      });
      renderCheckButton();
    }

    function renderSlowStart() {
      // The server says so when it pushes an update; a start stuck without updates is judged here too.
      const starting = ["requested", "provisioning", "starting"].includes(attempt.state);
      const requested = attempt.timestamps && attempt.timestamps.requested;
      const late = starting && requested && (Date.now() - Date.parse(requested)) / 1000 > config.slow_start_seconds;
      const slow = byId("slow-start");
      // A VM that runs is not waiting for room: it boots, and its console shows that.
      setText(slow, attempt.timestamps && attempt.timestamps.vmi_running ? S.slow_boot : S.slow_start);
      show(slow, starting && Boolean(attempt.slow_start || late));
    }

    function tick() {
      renderCountdown();
      renderCheckButton();
      renderSlowStart();
    }

    function renderCountdown() {
      const element = byId("countdown");
      if (!element) {
        return;
      }
      if (!attempt.expires_at || FINAL_STATES.includes(attempt.state) || attempt.state === "stopping") {
        element.textContent = "";
        return;
      }
      const left = Math.max(0, Math.floor((Date.parse(attempt.expires_at) - Date.now()) / 1000));
      if (left === 0) {
        element.textContent = S.expired;
        element.classList.add("urgent");
        return;
      }
      const hours = Math.floor(left / 3600);
      const minutes = Math.floor((left % 3600) / 60);
      const seconds = String(left % 60).padStart(2, "0");
      const time = hours ? `${hours}:${String(minutes).padStart(2, "0")}:${seconds}` : `${minutes}:${seconds}`;
      element.textContent = format(S.time_left, { time });
      element.classList.toggle("urgent", left < 300);
    }

    // ---- live updates --------------------------------------------------------------------------------

    function socketUrl(path) {
      return (window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + path;
    }

    let failures = 0;
    function connectEvents() {
      // A notice on the page may have ended since it was drawn: the socket is then asked for the present one.
      const notice = byId("cluster-notice");
      const socket = new WebSocket(socketUrl(config.urls.events + (notice && !notice.hidden ? "?notice=1" : "")));
      const indicator = byId("live-indicator");
      socket.addEventListener("open", () => {
        failures = 0;
        indicator.textContent = S.live_connected;
        indicator.className = "live on";
      });
      socket.addEventListener("message", (event) => {
        let message;
        try {
          message = JSON.parse(event.data);
        } catch (error) {
          return;
        }
        if (message.type === "attempt.update") {
          renderAttempt(message.attempt);
        } else if (message.type === "grading.update") {
          renderRun(message.run);
        } else if (message.type === "cluster.notice") {
          // Said to the student only, as the server renders it: staff read the cluster's state on the ops pages.
          const notice = byId("cluster-notice");
          setText(notice, message.notice);
          show(notice, config.is_student && Boolean(message.notice));
        }
      });
      socket.addEventListener("close", (event) => {
        indicator.className = "live off";
        if (event.code === 4401 || event.code === 4404) {
          indicator.textContent = event.code === 4401 ? S.console.signed_out : S.console.refused;
          return;
        }
        indicator.textContent = S.live_reconnecting;
        failures += 1;
        // Exponential backoff with jitter: a restarted server is not hit by every page at once.
        const delay = Math.min(RETRY_MAX_MS, 500 * 2 ** Math.min(failures, 6)) * (0.5 + Math.random() / 2);
        window.setTimeout(connectEvents, delay);
      });
    }

    // ---- actions -------------------------------------------------------------------------------------

    async function submitAction(form) {
      const message = byId("action-message");
      const button = form.querySelector("button");
      if (form.dataset.action === "stop" && !window.confirm(S.confirm_stop)) {
        return;
      }
      button.disabled = true;
      message.textContent = "";
      message.classList.remove("error");
      try {
        const response = await window.portal.postForm(form);
        const body = await response.json().catch(() => ({}));
        if (response.status === 429 && form.dataset.action === "check") {
          // Pressed in another tab a moment ago: wait it out on the button, not as an error.
          holdCheckFor(Number(response.headers.get("Retry-After")) || config.check_interval_seconds);
        } else if (!response.ok) {
          message.textContent = format(S.action_failed, { message: body.error || response.statusText });
          message.classList.add("error");
        }
        if (body.attempt) {
          renderAttempt(body.attempt);
        }
        if (body.run) {
          renderRun(body.run);
        }
      } catch (error) {
        message.textContent = S.network_error;
        message.classList.add("error");
      } finally {
        button.disabled = false;
        renderAttempt(attempt);
      }
    }

    document.querySelectorAll("#attempt-panel form[data-action]").forEach((form) => {
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        submitAction(form);
      });
    });

    renderAttempt(attempt);
    window.setInterval(tick, 1000);
    connectEvents();
  }

  // On a lab page before Start, the panel arrives later (static/js/start.js announces it with "portal:panel").
  if (document.getElementById("attempt-config")) {
    init();
  } else {
    document.addEventListener("portal:panel", init, { once: true });
  }
})();
