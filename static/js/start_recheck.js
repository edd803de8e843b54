/*
 * A lab page whose Start is held back by something that can change elsewhere (the student has as many labs going
 * as the institution allows, and may stop one in another tab; the lab opens at a set time) looks again by itself:
 * data-recheck-in seconds after it was drawn and then every minute while it is shown, and each time it is shown
 * again. It asks for the page itself: once that offers Start (or shows an attempt under way) it reloads, else it
 * takes over the new reason's words. A page that cannot be reached is tried at the next turn.
 */
"use strict";

(function () {
  const refusal = document.getElementById("start-refusal");
  if (!refusal || !refusal.dataset.recheckIn) {
    return;
  }
  const EVERY_MS = 60 * 1000;
  let asking = false;
  let timer = null;

  function later(ms) {
    window.clearTimeout(timer);
    timer = window.setTimeout(recheck, ms);
  }

  async function recheck() {
    if (document.hidden) {
      return; // asked again once the page is shown
    }
    if (asking) {
      return;
    }
    asking = true;
    try {
      const response = await fetch(window.location.href, {
        headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store",
      });
      if (response.ok && response.url.split("#")[0] === window.location.href.split("#")[0]) {
        const page = new DOMParser().parseFromString(await response.text(), "text/html");
        const fresh = page.getElementById("start-refusal");
        if (!fresh) {
          window.location.reload(); // Start is offered now, or an attempt is under way
          return;
        }
        if (fresh.textContent !== refusal.textContent) {
          refusal.textContent = fresh.textContent;
        }
        if (!fresh.dataset.recheckIn) {
          return; // no longer something that changes by itself (every attempt used, the lab closed)
        }
      }
    } catch (error) {
      // offline or the portal restarting: the next turn asks again
    } finally {
      asking = false;
    }
    later(EVERY_MS);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      recheck();
    }
  });
  later(1000 * parseInt(refusal.dataset.recheckIn, 10));
})();
