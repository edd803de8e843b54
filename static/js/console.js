/*
 * The browser terminal: xterm.js wired to the console bridge at /ws/attempts/<id>/console/.
 * Output arrives as binary frames and is acknowledged once drawn (the bridge's flow control); keystrokes go
 * out as binary frames (KubeVirt drops text frames). JSON text frames carry control messages.
 * A serial line cannot learn the window's size: the page tells the bridge its fitted size (on connect, once the
 * attempt runs, on window resize, on "Fit terminal"), which sets it on the guest through the lab agent; only when the agent cannot and
 * the student clicked Fit does the bridge type ` stty rows R cols C` instead. Scrollback is replayed at the size
 * it was written at, then refitted (xterm.js reflows it). Reads #attempt-config; listens for "portal:attempt" from attempt.js, and
 * opens the console socket only once the attempt says its console is ready (its VMI runs): a class pressing
 * Start together does not open a hundred consoles that could only wait.
 */
"use strict";

(function () {
  function init() {
    const configElement = document.getElementById("attempt-config");
    const container = document.getElementById("terminal");
    if (!configElement || !container || typeof Terminal === "undefined") {
      return;
    }
    const config = JSON.parse(configElement.textContent);
    const S = config.strings;
    const FINAL_STATES = ["stopped", "failed", "expired"];
    // Drawn output is acknowledged in steps of this size. The bridge only holds back output when a browser is
    // a whole window (about a megabyte) behind, so a small unacknowledged rest never matters, and typing (one
    // echoed byte at a time) costs no acknowledgement messages at all.
    const ACK_EVERY_BYTES = 16384;
    const INPUT_CHUNK_BYTES = 4096;
    const RETRY_MAX_MS = 15000;

    const byId = (id) => document.getElementById(id);
    const format = window.portal.format;
    const encoder = new TextEncoder();

    const term = new Terminal({
      cursorBlink: true,
      scrollback: 5000,
      fontSize: 14,
      fontFamily: "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace",
      lineHeight: 1.1, // at 1, DejaVu Sans Mono's rows at 14 px cut its underscores off
      rightClickSelectsWord: true,
    });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(container);
    fit.fit();

    const statusElement = byId("console-status");
    const modeElement = byId("console-mode");
    const noticeElement = byId("console-notice");
    const takeControl = byId("take-control-button");
    const releaseControl = byId("release-control-button");

    let socket = null;
    let failures = 0;
    let mode = null; // "rw" or "ro" as the portal's hello says; nothing is claimed before it
    let canTakeControl = false;
    let keyboard = null; // the member of staff holding the keyboard, as the bridge says
    let freshConnection = false;
    let drawn = 0;
    let acked = 0;
    let attemptOver = false;
    let started = false;
    let noticeTimer = null;
    let replayLeft = 0; // scrollback bytes still to draw at the size they were written at
    let fitAsked = false;
    let sizedWhenRunning = false;
    let resizeTimer = null;

    function setStatus(text, state) {
      statusElement.textContent = text;
      statusElement.dataset.state = state || "";
    }

    function notice(text) {
      noticeElement.textContent = text;
      window.clearTimeout(noticeTimer);
      noticeTimer = window.setTimeout(() => {
        noticeElement.textContent = "";
      }, 6000);
    }

    function renderMode() {
      if (mode === null) {
        modeElement.textContent = "";
      } else if (mode === "rw") {
        modeElement.textContent = S.console.read_write;
      } else {
        modeElement.textContent = keyboard ? format(S.console.keyboard_held, { who: keyboard }) : S.console.read_only;
      }
      modeElement.dataset.mode = mode || "";
      takeControl.hidden = !(canTakeControl && mode === "ro");
      releaseControl.hidden = !(canTakeControl && mode === "rw");
      // Pasting is typing: offered to whoever may type (a watcher has Copy, and Take control when staff).
      byId("paste-button").hidden = attemptOver || mode !== "rw";
      // A member of staff's banner says whether they watch or hold the keyboard (the student watches meanwhile).
      const banner = byId("watch-banner");
      if (banner && mode !== null) {
        banner.textContent = mode === "rw" ? banner.dataset.readWrite : banner.dataset.readOnly;
      }
      byId("key-bar").hidden = attemptOver || mode !== "rw";
      // The instructions' "Run in terminal" buttons (instructions.js) are offered while typing is.
      document.body.classList.toggle("terminal-writable", !attemptOver && mode === "rw");
    }

    function sendAck() {
      if (socket && socket.readyState === WebSocket.OPEN && drawn > acked) {
        acked = drawn;
        socket.send(JSON.stringify({ type: "ack", bytes: drawn }));
      }
    }

    function written(size) {
      drawn += size;
      if (drawn - acked >= ACK_EVERY_BYTES) {
        sendAck();
      }
    }

    function sendInput(bytes) {
      if (!socket || socket.readyState !== WebSocket.OPEN) {
        notice(S.notices.not_connected);
        return false;
      }
      if (mode !== "rw") {
        if (mode === null) {
          notice(S.notices.not_connected);
        } else {
          notice(keyboard ? format(S.notices.keyboard_held, { who: keyboard }) : S.notices.read_only);
        }
        return false;
      }
      for (let offset = 0; offset < bytes.length; offset += INPUT_CHUNK_BYTES) {
        socket.send(bytes.subarray(offset, offset + INPUT_CHUNK_BYTES));
      }
      return true;
    }

    // Fit the window and tell the bridge, which sets the guest's size (only the keyboard holder's counts).
    function fitAndTell(explicit) {
      if (replayLeft > 0) {
        return; // the replay's end fits and tells
      }
      fit.fit();
      if (mode === "rw" && socket && socket.readyState === WebSocket.OPEN) {
        fitAsked = fitAsked || explicit;
        socket.send(JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols, explicit: explicit }));
      }
    }

    // The scrollback that follows was written at the guest's size: draw it at that size, then fit, and xterm
    // reflows it to this window rather than showing lines wrapped for another width.
    function startReplay(message) {
      if (message.cols && message.rows) {
        term.resize(message.cols, message.rows);
      }
      replayLeft = message.replay || 0;
      if (replayLeft <= 0) {
        fitAndTell(false);
      }
    }

    function handleControl(message) {
      switch (message.type) {
        case "hello":
          if (freshConnection) {
            // The bridge replays the scrollback next: start from a clean screen so nothing shows twice.
            term.reset();
            freshConnection = false;
          }
          mode = message.mode;
          canTakeControl = Boolean(message.can_take_control);
          keyboard = message.keyboard || null;
          renderMode();
          startReplay(message);
          break;
        case "resized":
          if (fitAsked) {
            fitAsked = false;
            if (message.via === "typed") {
              notice(format(S.fit_typed, { command: message.command }));
            } else {
              notice(format(message.via === "agent" ? S.fit_set : S.fit_failed, message));
            }
          }
          break;
        case "status":
          setStatus(S.console[message.state] || message.state, message.state);
          break;
        case "reset":
          term.reset();
          startReplay(message);
          break;
        case "lagging":
          notice(S.console.lagging);
          break;
        case "notice":
          notice(format(S.notices[message.code] || message.code, { who: message.who || "" }));
          break;
        default:
          break;
      }
    }

    function socketUrl(path) {
      return (window.location.protocol === "https:" ? "wss://" : "ws://") + window.location.host + path;
    }

    function connect() {
      if (attemptOver) {
        return;
      }
      socket = new WebSocket(socketUrl(config.urls.console));
      socket.binaryType = "arraybuffer";
      socket.addEventListener("open", () => {
        failures = 0;
        drawn = 0;
        acked = 0;
        freshConnection = true;
        setStatus(S.console.connecting, "connecting");
      });
      socket.addEventListener("message", (event) => {
        if (typeof event.data === "string") {
          try {
            handleControl(JSON.parse(event.data));
          } catch (error) {
            // A malformed control message is not worth breaking the terminal for.
          }
          return;
        }
        const bytes = new Uint8Array(event.data);
        const replayed = replayLeft > 0 && (replayLeft -= bytes.length) <= 0;
        term.write(bytes, () => {
          written(bytes.length);
          if (replayed) {
            fitAndTell(false);
          }
        });
      });
      socket.addEventListener("close", (event) => {
        socket = null;
        if (event.code === 4401 || event.code === 4404) {
          mode = null; // nothing may be typed here any more: no mode, Paste or Run in terminal
          renderMode();
          setStatus(event.code === 4401 ? S.console.signed_out : S.console.refused, "refused");
          return;
        }
        if (event.code === 4008) {
          setStatus(S.notices.too_slow, "lost");
        }
        if (attemptOver) {
          setStatus(S.console.ended, "ended");
          return;
        }
        setStatus(S.console.disconnected, "disconnected");
        failures += 1;
        const delay = Math.min(RETRY_MAX_MS, 250 * 2 ** Math.min(failures, 6)) * (0.5 + Math.random() / 2);
        window.setTimeout(connect, delay);
      });
    }

    term.onData((data) => sendInput(encoder.encode(data)));
    term.onBinary((data) => sendInput(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));

    async function copySelection() {
      const text = term.getSelection();
      if (!text) {
        return;
      }
      try {
        await navigator.clipboard.writeText(text);
        notice(S.copied);
      } catch (error) {
        notice(S.clipboard_unavailable);
      }
    }

    async function pasteClipboard() {
      try {
        const text = await navigator.clipboard.readText();
        if (text) {
          // Through xterm, so bracketed paste mode is honoured and onData sends it.
          term.paste(text);
        }
      } catch (error) {
        notice(S.clipboard_unavailable);
      }
      term.focus();
    }

    // Ctrl+Shift+C copies; Ctrl+Shift+V falls through to the browser's paste into xterm (as in desktop
    // terminals). Ctrl+C with a selection copies too; without one it stays the interrupt it always was.
    term.attachCustomKeyEventHandler((event) => {
      if (event.type !== "keydown" || !event.ctrlKey || event.altKey || event.metaKey) {
        return true;
      }
      if (event.code === "KeyC" && (event.shiftKey || term.hasSelection())) {
        copySelection();
        event.preventDefault();
        return false;
      }
      if (event.code === "KeyV" && event.shiftKey) {
        return false;
      }
      return true;
    });

    byId("copy-button").addEventListener("click", () => {
      copySelection();
      term.focus();
    });
    byId("paste-button").addEventListener("click", pasteClipboard);
    byId("fit-button").addEventListener("click", () => {
      if (mode !== "rw") {
        fit.fit();
        notice(mode === null ? S.notices.not_connected : S.notices.read_only);
      } else {
        fitAndTell(true);
      }
      term.focus();
    });
    // A window being resized refits at once; the guest is told once it settles.
    window.addEventListener("resize", () => {
      if (replayLeft <= 0) {
        fit.fit();
      }
      window.clearTimeout(resizeTimer);
      resizeTimer = window.setTimeout(() => fitAndTell(false), 250);
    });
    // The key row for phone keyboards, which have no Esc, Tab or Ctrl.
    const KEYS = { esc: "\x1b", tab: "\t", "ctrl-c": "\x03", "ctrl-d": "\x04", up: "\x1b[A", down: "\x1b[B" };
    byId("key-bar").addEventListener("click", (event) => {
      const key = event.target.closest("[data-key]");
      if (key && sendInput(encoder.encode(KEYS[key.dataset.key]))) {
        term.focus();
      }
    });
    // "Run in terminal" on a code block of the instructions: typed as the student would type it.
    document.addEventListener("portal:type", (event) => {
      if (sendInput(encoder.encode(event.detail.text))) {
        term.focus();
      }
    });
    takeControl.addEventListener("click", () => {
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ type: "take_control" }));
      }
    });
    releaseControl.addEventListener("click", () => {
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ type: "release_control" }));
      }
    });

    document.addEventListener("portal:attempt", (event) => {
      const state = event.detail.state;
      if (!started && event.detail.console === "ready") {
        started = true;
        connect();
      } else if (state === "running" && !sizedWhenRunning) {
        // The size is set through the lab agent, which answers only once the attempt runs: a console opened
        // while the VM booted is sized again now.
        sizedWhenRunning = true;
        fitAndTell(false);
      } else if (!started && event.detail.console === "ended") {
        setStatus(S.console.ended, "ended"); // a page opened on a stopping attempt: nothing to wait for
      }
      if (FINAL_STATES.includes(state)) {
        attemptOver = true;
        setStatus(S.console.ended, "ended");
        // The last screen stays readable (and copyable); nothing can be typed any more.
        mode = "ro";
        canTakeControl = false;
        renderMode();
        modeElement.textContent = "";
        byId("fit-button").hidden = true;
        byId("paste-button").hidden = true;
        if (socket) {
          socket.close(1000);
        }
      }
    });

    // Playwright and curious students can reach the terminal from the devtools console.
    window.portalTerminal = term;
    renderMode();
    // attempt.js, loaded next, announces the attempt as the page has it; that (or a later update) connects.
    setStatus(S.console.waiting, "waiting");
    term.focus();
  }

  // On a lab page before Start, the panel arrives later (static/js/start.js announces it with "portal:panel").
  if (document.getElementById("attempt-config")) {
    init();
  } else {
    document.addEventListener("portal:panel", init, { once: true });
  }
})();
