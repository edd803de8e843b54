/*
 * A lab page whose Start is held back by something that can change elsewhere (the student has as many labs going
 * as the institution allows, and may stop one in another tab; the lab opens at a set time) looks again by itself:
 * data-recheck-in seconds after it was drawn (the server says when: every minute, or as the opening time comes
 * near), and each time it is shown again. It asks for the page itself: once that offers Start (or shows an attempt
 * under way) it reloads, else it takes over the new reason's words and the new page's data-recheck-in. A page that
 * cannot be reached is tried again a minute later.
 */
"use strict";

(function () {
  const refusal = document.getElementById("start-refusal");
  if (!refusal || !refusal.dataset.recheckIn) {
    return;
  }
  const RETRY_SECONDS = 60;
  const LONGEST_SECONDS = 86400; // setTimeout cannot wait much longer than 24 days; the server never asks for more
  let asking = false;
  let timer = null;

  function later(seconds) {
    window.clearTimeout(timer);
    timer = window.setTimeout(recheck, 1000 * Math.min(Math.max(1, seconds || RETRY_SECONDS), LONGEST_SECONDS));
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
        later(parseInt(fresh.dataset.recheckIn, 10));
        return;
      }
    } catch (error) {
      // offline or the portal restarting: asked again a minute later
    } finally {
      asking = false;
    }
    later(RETRY_SECONDS);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      recheck();
    }
  });
  later(parseInt(refusal.dataset.recheckIn, 10));
})();
