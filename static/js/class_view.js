/*
 * The staff's class view of a lab: its table (#class-view) is fetched again every few seconds while the page is
 * visible, so states, times left, scores and who is stuck stay current without a reload.
 */
"use strict";

(function () {
  const every = Number((document.getElementById("class-view-updated") || {}).dataset?.every || 15) * 1000;

  async function refresh() {
    if (document.hidden) {
      return;
    }
    try {
      const url = new URL(window.location.href);
      url.searchParams.set("part", "class");
      const response = await fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (response.ok) {
        const old = document.getElementById("class-view");
        old.insertAdjacentHTML("afterend", await response.text());
        old.remove();
      }
    } catch (error) {
      // The next refresh tries again; the table shown stays as it was.
    }
  }

  window.setInterval(refresh, every);
})();
