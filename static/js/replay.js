/*
 * A small asciicast v2 player for console recordings: xterm.js writes each output event at its recorded time
 * (scaled by the chosen speed, long pauses optionally cut to 2 s). Reads #replay-config.
 */
"use strict";

(function () {
  const configElement = document.getElementById("replay-config");
  const container = document.getElementById("player");
  if (!configElement || !container || typeof Terminal === "undefined") {
    return;
  }
  const config = JSON.parse(configElement.textContent);
  const IDLE_LIMIT_SECONDS = 2;

  const playButton = document.getElementById("play-button");
  const pauseButton = document.getElementById("pause-button");
  const restartButton = document.getElementById("restart-button");
  const speedSelect = document.getElementById("speed-select");
  const skipIdle = document.getElementById("skip-idle");
  const position = document.getElementById("player-position");
  const markers = document.getElementById("player-markers");

  let header = { width: 80, height: 24 };
  let events = [];
  let index = 0;
  let timer = null;
  let playing = false;

  const term = new Terminal({ cols: 120, rows: 30, scrollback: 10000, disableStdin: true, convertEol: false });
  term.open(container);

  function parse(text) {
    const lines = text.split("\n").filter((line) => line.trim() !== "");
    header = JSON.parse(lines[0]);
    events = [];
    for (const line of lines.slice(1)) {
      try {
        const [time, kind, data] = JSON.parse(line);
        if (typeof time === "number" && typeof data === "string") {
          events.push({ time, kind, data });
        }
      } catch (error) {
        // A line cut short by a crash ends the recording; keep what came before.
      }
    }
    startSize();
  }

  function startSize() {
    term.resize(Math.max(header.width || 80, 80), Math.max(header.height || 24, 24));
  }

  function showPosition() {
    const total = events.length ? events[events.length - 1].time : 0;
    const now = index > 0 ? events[index - 1].time : 0;
    position.textContent = `${now.toFixed(1)} s / ${total.toFixed(1)} s`;
  }

  function apply(event) {
    if (event.kind === "o") {
      term.write(event.data);
    } else if (event.kind === "r") {
      // asciicast v2's resize: what follows was written at the guest's new size.
      const [cols, rows] = event.data.split("x").map(Number);
      if (cols > 0 && rows > 0) {
        term.resize(cols, rows);
      }
    } else if (event.kind === "m") {
      const item = document.createElement("div");
      item.textContent = `${event.time.toFixed(1)} s: ${event.data}`;
      markers.append(item);
    }
  }

  function step() {
    timer = null;
    if (!playing || index >= events.length) {
      setPlaying(false);
      return;
    }
    apply(events[index]);
    index += 1;
    showPosition();
    if (index >= events.length) {
      setPlaying(false);
      return;
    }
    let gap = events[index].time - events[index - 1].time;
    if (skipIdle.checked) {
      gap = Math.min(gap, IDLE_LIMIT_SECONDS);
    }
    timer = window.setTimeout(step, (gap * 1000) / Number(speedSelect.value));
  }

  function setPlaying(value) {
    playing = value;
    playButton.hidden = value;
    pauseButton.hidden = !value;
    if (!value && timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    }
  }

  function restart() {
    setPlaying(false);
    term.reset();
    startSize();
    markers.replaceChildren();
    index = 0;
    showPosition();
  }

  playButton.addEventListener("click", () => {
    if (index >= events.length) {
      restart();
    }
    setPlaying(true);
    step();
  });
  pauseButton.addEventListener("click", () => setPlaying(false));
  restartButton.addEventListener("click", restart);

  fetch(config.cast_url, { credentials: "same-origin" })
    .then((response) => {
      if (!response.ok) {
        throw new Error(response.statusText);
      }
      return response.text();
    })
    .then((text) => {
      parse(text);
      showPosition();
      playButton.disabled = false;
      restartButton.disabled = false;
    })
    .catch((error) => {
      position.textContent = String(error);
    });
})();
